"""Tests of tools/hf_import.py and tools/hf_export.py (Hugging Face <-> nlptrain HDF5).

Run: python3 -m pytest -q -rs tests/python/test_hf_interop.py (CTest sets NLPTRAIN_BIN and
NLPTRAIN_SOURCE_DIR; by hand the binary defaults to <source>/build/nlptrain).

1. Random GPT2LMHeadModel saved as safetensors (single and sharded), float16 safetensors and
   pytorch_model.bin: import -> export gives bitwise-equal tensors and the same config.json, loads in
   transformers with no missing/unexpected keys, and importing the export gives an identical HDF5.
2. nlptrain's logits (gradients mode, on the imported file) equal transformers' logits on the
   exported directory (float32, relative norm error <= 1e-5, printed).
3. A checkpoint trained by nlptrain from scratch exports to a directory transformers loads, with the
   same logits.
4. Random BertForSequenceClassification (and BertForMaskedLM) round trip bitwise and load; a BERT file
   without hf_config_json exports from its root attributes; nlptrain's BERT logits (doc_cls on an
   imported model; doc_cls and mlm checkpoints trained from scratch) equal transformers' on the export.
5. Bad input: non-zero exit, a message naming the path, no output (and no temporary file) left.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nlp_run as nr

np = pytest.importorskip("numpy", reason="NLPTRAIN_ALL_SKIPPED: numpy is not installed")
h5py = pytest.importorskip("h5py", reason="NLPTRAIN_ALL_SKIPPED: h5py is not installed")
torch = pytest.importorskip("torch", reason="NLPTRAIN_ALL_SKIPPED: torch is not installed")
transformers = pytest.importorskip("transformers", reason="NLPTRAIN_ALL_SKIPPED: transformers is not installed")
pytest.importorskip("safetensors", reason="NLPTRAIN_ALL_SKIPPED: safetensors is not installed")
from safetensors.numpy import load_file as st_load, save_file as st_save  # noqa: E402

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])
TOOLS = SOURCE / "tools"
IMPORT = TOOLS / "hf_import.py"
EXPORT = TOOLS / "hf_export.py"
LOGITS_TOL = 1e-5

torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
transformers.logging.set_verbosity_error()


# ---- helpers ----------------------------------------------------------------------------------------

def run_nlptrain(*args, cwd=None):
    cmd = [nr.binary(), *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=nr.mpi_env(), cwd=cwd)
    if p.returncode != 0:
        raise AssertionError(f"nlptrain failed ({p.returncode}): {' '.join(cmd)}\n"
                             f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}")
    return p


# Most calls run the tools' main() in this process (importing torch and transformers once, not per
# call); the tests marked `sub` (and all of them with NLPTRAIN_HF_SUBPROCESS=1) run the scripts.
ALL_SUBPROCESS = os.environ.get("NLPTRAIN_HF_SUBPROCESS") == "1"


def _in_process(tool: Path, args) -> subprocess.CompletedProcess:
    import contextlib
    import importlib
    import io

    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    mod = importlib.import_module(tool.stem)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = mod.main_wrapper(mod.TOOL, mod.main, [str(a) for a in args])
        except SystemExit as e:  # argparse: --help, usage errors
            rc = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess([tool.name, *map(str, args)], rc, out.getvalue(), err.getvalue())


def run_tool(tool, *args, check=True, sub=False):
    if sub or ALL_SUBPROCESS:
        p = subprocess.run([sys.executable, str(tool), *map(str, args)], capture_output=True, text=True,
                           timeout=600)
    else:
        p = _in_process(tool, args)
    if check and p.returncode != 0:
        raise AssertionError(f"{tool.name} {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def hf_import(src, out, check=True, sub=False):
    return run_tool(IMPORT, src, out, check=check, sub=sub)


def hf_export(src, out, *extra, check=True, sub=False):
    return run_tool(EXPORT, src, out, *extra, check=check, sub=sub)


def perturb_(model, seed):
    """Non-trivial LayerNorm weights and biases (random init leaves them 1 and 0)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "ln" in name.lower() and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith(".bias"):
                p.copy_(0.05 * noise)
    return model.eval()


def gpt2_model(seed=0, vocab_size=101, n_positions=32):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=vocab_size, n_positions=n_positions,
                     bos_token_id=0, eos_token_id=0, task_specific_params={"x": {"max_length": 7}})
    torch.manual_seed(seed)
    return perturb_(GPT2LMHeadModel(cfg), seed + 1)


def bert_model(cls_name="BertForSequenceClassification", seed=0):
    from transformers import BertConfig
    cfg = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=24, type_vocab_size=2, num_labels=3)
    torch.manual_seed(seed)
    return perturb_(getattr(transformers, cls_name)(cfg), seed + 1)


def weights_of(model) -> dict:
    """The tensors a Hugging Face checkpoint of `model` holds: the state_dict without tied copies."""
    params = {n for n, _ in model.named_parameters()}
    sd = model.state_dict()
    all_params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    keep = params | {n for n in sd if n not in all_params}
    return {n: sd[n].detach().to(torch.float32).numpy() for n in sd if n in keep}


def save_bin_dir(model, d: Path, extra: dict | None = None) -> Path:
    """An old-style directory: config.json + pytorch_model.bin with the full state_dict (tied
    lm_head.weight included), optionally plus extra tensors (e.g. attn.bias buffers)."""
    d.mkdir(parents=True)
    model.config.to_json_file(str(d / "config.json"))
    sd = dict(model.state_dict())
    sd.update(extra or {})
    torch.save(sd, d / "pytorch_model.bin")
    return d


def read_exported(d: Path) -> dict:
    if (d / "model.safetensors").exists():
        return st_load(str(d / "model.safetensors"))
    sd = torch.load(d / "pytorch_model.bin", weights_only=True)
    return {k: v.numpy() for k, v in sd.items()}


def h5_contents(path) -> tuple[dict, dict]:
    """({dataset: (dtype, shape, array)}, {attribute: (type, dtype, value)}) of every object."""
    ds, at = {}, {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                ds[name] = (obj.dtype.str, obj.shape, obj[()])
            for k, v in obj.attrs.items():
                at[f"{name}@{k}"] = (type(v).__name__, getattr(v, "dtype", None), v)
        for k, v in f.attrs.items():
            at[f"/@{k}"] = (type(v).__name__, getattr(v, "dtype", None), v)
        f.visititems(visit)
    return ds, at


def assert_same_h5(a, b):
    da, aa = h5_contents(a)
    db, ab = h5_contents(b)
    assert sorted(da) == sorted(db)
    for k in da:
        assert da[k][:2] == db[k][:2], k
        assert np.array_equal(da[k][2], db[k][2]), k
    assert sorted(aa) == sorted(ab)
    for k in aa:
        assert aa[k][:2] == ab[k][:2], (k, aa[k], ab[k])
        assert np.array_equal(aa[k][2], ab[k][2]), (k, aa[k], ab[k])


def assert_loads_cleanly(d: Path, cls=None):
    """from_pretrained with no missing / unexpected / mismatched keys; returns the model (eval)."""
    cls = cls or transformers.AutoModelForCausalLM
    model, info = cls.from_pretrained(str(d), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    assert not info.get("error_msgs"), info
    return model.eval()


def rel_err(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def leftovers(folder: Path, expected) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in set(expected))


def nlptrain_logits(tmp: Path, weights: Path, ids: np.ndarray) -> np.ndarray:
    data = tmp / "logits_data.h5"
    with h5py.File(data, "w") as f:
        f.create_dataset("input_ids", data=ids.astype(np.int32))
    out = tmp / "grad_out"
    run_nlptrain("--run.mode=gradients", "--data.padding=max_length", f"--model.weights={weights}", f"--data.train={data}",
                 f"--train.batch_size={ids.shape[0]}", f"--output.dir={out}", "--data.shuffle=false",
                 "--model.embd_pdrop=0", "--model.attn_pdrop=0", "--model.resid_pdrop=0", "--run.threads=1")
    with h5py.File(out / "gradients.h5", "r") as f:
        logits = f["logits"][()]
    assert logits.dtype == np.float32 and logits.shape[:2] == ids.shape, logits.shape
    return logits


def hf_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.as_tensor(ids, dtype=torch.long)).logits.numpy()


# ---- 0. help -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tool", [IMPORT, EXPORT], ids=["import", "export"])
def test_help(tool):
    p = run_tool(tool, "--help", sub=True)
    assert p.returncode == 0 and "usage:" in p.stdout


# ---- 1. GPT-2 round trip ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2():
    return gpt2_model()


@pytest.mark.parametrize("variant", ["safetensors", "sharded", "bin", "float16", "bfloat16"])
def test_gpt2_round_trip(tmp_path, gpt2, variant):
    src = tmp_path / "src"
    expected = weights_of(gpt2)
    if variant == "safetensors":
        gpt2.save_pretrained(src)
    elif variant == "sharded":
        gpt2.save_pretrained(src, max_shard_size="100KB")
        assert (src / "model.safetensors.index.json").exists() and not (src / "model.safetensors").exists()
    elif variant in ("float16", "bfloat16"):
        dt = getattr(torch, variant)
        gpt2_model().to(dt).save_pretrained(src)
        expected = {k: torch.from_numpy(v).to(dt).to(torch.float32).numpy() for k, v in expected.items()}
    else:
        # old-style: full state_dict with the tied lm_head.weight and the causal-mask buffers
        n = gpt2.config.n_positions
        mask = torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n)
        extra = {f"transformer.h.{i}.attn.bias": mask for i in range(gpt2.config.n_layer)}
        extra.update({f"transformer.h.{i}.attn.masked_bias": torch.tensor(-1e4) for i in range(2)})
        save_bin_dir(gpt2, src, extra)
    orig_config = json.loads((src / "config.json").read_text())

    sub = variant == "safetensors"  # the scripts themselves, once
    h5 = tmp_path / "model.h5"
    p = hf_import(src, h5, sub=sub)
    if variant == "bin":
        assert "dropped 'lm_head.weight'" in p.stderr
        assert "skipped 4 buffer(s)" in p.stderr and "'transformer.h.0.attn.bias'" in p.stderr
    if variant in ("float16", "bfloat16"):
        assert f"{variant} tensor(s) to float32" in p.stderr

    # the HDF5 layout: float32 tensors named like the state_dict, config as root attributes
    with h5py.File(h5, "r") as f:
        assert sorted(f.keys()) == sorted(expected)
        for k, v in expected.items():
            assert f[k].dtype == np.float32 and np.array_equal(f[k][()], v), k
        a = f.attrs
        sdt = h5py.check_string_dtype(a.get_id("model_type").dtype)
        assert a["model_type"] == "gpt2" and sdt.encoding == "utf-8" and sdt.length is None  # variable-length
        for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions"):
            assert a[k].dtype == np.int64 and a[k] == orig_config[k], k
        for k in ("layer_norm_epsilon", "attn_pdrop", "initializer_range"):
            assert a[k].dtype == np.float64 and a[k] == orig_config[k], k
        assert a["tie_word_embeddings"].dtype == np.int64 and a["tie_word_embeddings"] == 1
        assert a["architectures"] == "GPT2LMHeadModel"
        assert json.loads(a["hf_config_json"]) == orig_config

    out = tmp_path / "export"
    hf_export(h5, out, sub=sub)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    got = read_exported(out)
    assert sorted(got) == sorted(expected)
    for k, v in expected.items():
        assert got[k].dtype == np.float32 and np.array_equal(got[k], v), k
    config = json.loads((out / "config.json").read_text())
    if variant in ("float16", "bfloat16"):  # the exported weights are float32, and config.json says so
        assert orig_config.get("dtype") == variant and config.pop("dtype") == "float32"
        orig_config.pop("dtype")
    assert config == orig_config

    model = assert_loads_cleanly(out)
    for k, v in expected.items():
        assert np.array_equal(model.state_dict()[k].numpy(), v), k
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()

    again = tmp_path / "again.h5"
    hf_import(out, again)
    if variant in ("float16", "bfloat16"):  # the export says dtype float32: everything else is the same
        with h5py.File(h5, "r+") as f:
            cfg = json.loads(f.attrs["hf_config_json"])
            cfg["dtype"] = "float32"
            f.attrs["hf_config_json"] = json.dumps(cfg, indent=2) + "\n"
            f.attrs["dtype"] = "float32"
    assert_same_h5(h5, again)


def test_export_bin_format(tmp_path, gpt2):
    src = tmp_path / "src"
    gpt2.save_pretrained(src)
    hf_import(src, tmp_path / "m.h5")
    out = tmp_path / "export_bin"
    hf_export(tmp_path / "m.h5", out, "--format", "bin")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "pytorch_model.bin"]
    got = read_exported(out)
    expected = weights_of(gpt2)
    assert sorted(got) == sorted(expected)
    assert all(np.array_equal(got[k], v) for k, v in expected.items())
    assert_loads_cleanly(out)
    hf_import(out, tmp_path / "again.h5")
    assert_same_h5(tmp_path / "m.h5", tmp_path / "again.h5")


def test_untied_lm_head_kept_with_warning(tmp_path, gpt2):
    sd = dict(gpt2.state_dict())
    sd["lm_head.weight"] = sd["lm_head.weight"] + 1.0  # no longer equal to wte
    src = tmp_path / "src"
    src.mkdir()
    gpt2.config.to_json_file(str(src / "config.json"))
    torch.save(sd, src / "pytorch_model.bin")
    p = hf_import(src, tmp_path / "m.h5")
    assert "warning" in p.stderr and "lm_head.weight" in p.stderr and "nlptrain ties" in p.stderr
    with h5py.File(tmp_path / "m.h5", "r") as f:
        assert np.array_equal(f["lm_head.weight"][()], sd["lm_head.weight"].numpy())


# ---- 2. logits: nlptrain on the imported file vs transformers on the export ---------------------------

def test_gpt2_logits_match_transformers(tmp_path, gpt2, report):
    src = tmp_path / "src"
    gpt2.save_pretrained(src)
    h5 = tmp_path / "imported.h5"
    hf_import(src, h5)
    out = tmp_path / "export"
    hf_export(h5, out)
    model = assert_loads_cleanly(out)
    ids = np.random.default_rng(3).integers(0, gpt2.config.vocab_size, size=(2, 16))
    ours = nlptrain_logits(tmp_path, h5, ids)
    ref = hf_logits(model, ids)
    err = rel_err(ours, ref)
    report(f"\n[hf_interop] GPT-2 logits, nlptrain (imported) vs transformers (exported): rel err {err:.3e}")
    assert err <= LOGITS_TOL, err


# ---- 3. an nlptrain checkpoint exports to a loadable directory -------------------------------------------

def test_checkpoint_exports(tmp_path, report):
    stream = tmp_path / "stream.h5"
    with h5py.File(stream, "w") as f:
        f.create_dataset("tokens", data=np.random.default_rng(5).integers(0, 100, size=800).astype(np.int32))
    run_dir = tmp_path / "run"
    run_nlptrain("--train.steps=2", "--checkpoint.interval=2", "--model.n_layer=2", "--model.n_head=2",
                 "--model.n_embd=32", "--model.vocab_size=100", "--model.n_positions=16",
                 "--data.seq_len=16", f"--data.train={stream}", f"--output.dir={run_dir}",
                 "--train.batch_size=2", "--run.threads=1")
    ckpt = run_dir / "checkpoints" / "step_00000002.h5"
    assert ckpt.is_file(), sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    with h5py.File(ckpt, "r") as f:
        assert "optimizer" in f and "nlptrain_step" in f.attrs and "hf_config_json" not in f.attrs
        weights = {k: f[k][()] for k, v in f.items() if isinstance(v, h5py.Dataset)}

    out = tmp_path / "export"
    p = hf_export(ckpt, out)
    assert "optimizer" in p.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == ["GPT2LMHeadModel"]
    assert (config["n_layer"], config["n_head"], config["n_embd"], config["vocab_size"],
            config["n_positions"]) == (2, 2, 32, 100, 16)
    assert config["layer_norm_epsilon"] == 1e-5 and config["tie_word_embeddings"] is True
    assert not any(k.startswith("nlptrain_") for k in config)
    got = read_exported(out)
    assert sorted(got) == sorted(weights) and all(np.array_equal(got[k], weights[k]) for k in weights)

    model = assert_loads_cleanly(out)
    ids = np.random.default_rng(9).integers(0, 100, size=(2, 16))
    ours = nlptrain_logits(tmp_path, ckpt, ids)
    err = rel_err(ours, hf_logits(model, ids))
    report(f"\n[hf_interop] GPT-2 logits, nlptrain checkpoint vs transformers (exported): rel err {err:.3e}")
    assert err <= LOGITS_TOL, err


def test_finetuned_checkpoint_with_base_config(tmp_path, gpt2):
    """Import -> train 2 steps in nlptrain -> export with --config = the original directory: the
    checkpoint lost hf_config_json, the original config.json comes back (plus nlptrain's n_ctx)."""
    src = tmp_path / "src"
    gpt2.save_pretrained(src)
    orig_config = json.loads((src / "config.json").read_text())
    h5 = tmp_path / "imported.h5"
    hf_import(src, h5)
    stream = tmp_path / "stream.h5"
    with h5py.File(stream, "w") as f:
        f.create_dataset("tokens", data=np.random.default_rng(4).integers(0, 101, size=600).astype(np.int32))
    run_dir = tmp_path / "run"
    run_nlptrain("--train.steps=2", "--checkpoint.interval=2", f"--model.weights={h5}", "--data.seq_len=16",
                 f"--data.train={stream}", f"--output.dir={run_dir}", "--train.batch_size=2", "--run.threads=1")
    ckpt = run_dir / "checkpoints" / "step_00000002.h5"
    out = tmp_path / "export"
    p = hf_export(ckpt, out, "--config", src, "--no-tokenizer")
    assert "warning" not in p.stderr, p.stderr
    config = json.loads((out / "config.json").read_text())
    assert {k: v for k, v in config.items() if k != "n_ctx"} == orig_config
    model = assert_loads_cleanly(out)
    with h5py.File(ckpt, "r") as f:
        wte = f["transformer.wte.weight"][()]
    assert np.array_equal(model.transformer.wte.weight.detach().numpy(), wte)
    assert not np.array_equal(wte, weights_of(gpt2)["transformer.wte.weight"])  # it did train


# ---- 4. BERT ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls_name", ["BertForSequenceClassification", "BertForMaskedLM"])
def test_bert_round_trip(tmp_path, cls_name):
    bert = bert_model(cls_name)
    src = tmp_path / "src"
    bert.save_pretrained(src)
    orig_config = json.loads((src / "config.json").read_text())
    expected = weights_of(bert)

    h5 = tmp_path / "bert.h5"
    hf_import(src, h5)
    with h5py.File(h5, "r") as f:
        assert sorted(f.keys()) == sorted(expected)
        assert all(np.array_equal(f[k][()], v) for k, v in expected.items())
        a = f.attrs
        assert a["model_type"] == "bert" and a["architectures"] == cls_name
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "vocab_size"):
            assert a[k].dtype == np.int64 and a[k] == orig_config[k], k
        for k in ("layer_norm_eps", "hidden_dropout_prob", "attention_probs_dropout_prob"):
            assert a[k].dtype == np.float64 and a[k] == orig_config[k], k
        assert a["num_labels"] == 3  # derived from id2label

    out = tmp_path / "export"
    hf_export(h5, out)
    got = read_exported(out)
    assert sorted(got) == sorted(expected)
    assert all(np.array_equal(got[k], v) for k, v in expected.items())
    assert json.loads((out / "config.json").read_text()) == orig_config
    model = assert_loads_cleanly(out, getattr(transformers, cls_name))
    ids = torch.as_tensor(np.random.default_rng(1).integers(0, 97, size=(2, 12)))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, bert(input_ids=ids).logits)

    hf_import(out, tmp_path / "again.h5")
    assert_same_h5(h5, tmp_path / "again.h5")


@pytest.mark.parametrize("keep_arch", [True, False], ids=["with_architectures", "inferred"])
def test_bert_export_from_attributes(tmp_path, keep_arch):
    """A BERT file as nlptrain will write it: tensors + root attributes, no hf_config_json."""
    bert = bert_model()
    src = tmp_path / "src"
    bert.save_pretrained(src)
    h5 = tmp_path / "bert.h5"
    hf_import(src, h5)
    with h5py.File(h5, "r+") as f:
        for k in list(f.attrs):
            if k in ("hf_config_json", "id2label", "label2id") or (k == "architectures" and not keep_arch):
                del f.attrs[k]
        f.attrs["nlptrain_step"] = np.int64(7)
        f.create_dataset("optimizer/exp_avg/classifier.weight", data=np.zeros((3, 32), np.float32))
    out = tmp_path / "export"
    p = hf_export(h5, out)
    if not keep_arch:
        assert "inferred" in p.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["model_type"] == "bert" and config["num_labels"] == 3 and "nlptrain_step" not in config
    assert config["is_decoder"] is False and config["tie_word_embeddings"] is True  # bools from 0/1
    assert config["layer_norm_eps"] == 1e-12
    model = assert_loads_cleanly(out, transformers.AutoModelForSequenceClassification)
    assert model.config.num_labels == 3
    ids = torch.as_tensor(np.random.default_rng(2).integers(0, 97, size=(2, 10)))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, bert(input_ids=ids).logits)


BERT_TINY = ["--model.type=bert", "--model.hidden_size=32", "--model.num_hidden_layers=2",
             "--model.num_attention_heads=2", "--model.intermediate_size=64",
             "--model.max_position_embeddings=16", "--model.vocab_size=50", "--run.threads=1"]


def write_bert_data(path: Path, task: str, n=8, t=12, vocab=50, seed=0) -> dict:
    """doc_cls: labels [N] (+ num_labels / id2label attributes); mlm: labels [N, T] given (-100 =
    ignore), so that nlptrain does no random masking. Padding and segment ids exercise the masks."""
    rng = np.random.default_rng(seed)
    cols = {"input_ids": rng.integers(5, vocab, size=(n, t)), "attention_mask": np.ones((n, t)),
            "token_type_ids": np.zeros((n, t))}
    cols["attention_mask"][1, -3:] = 0
    cols["token_type_ids"][:, t // 2:] = 1
    if task == "doc_cls":
        cols["labels"] = rng.integers(0, 3, size=n)
    else:
        labels = np.full((n, t), -100)
        pick = rng.random((n, t)) < 0.3
        labels[pick] = cols["input_ids"][pick]
        labels[:, 1] = cols["input_ids"][:, 1]
        cols["labels"] = labels
    with h5py.File(path, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v.astype(np.int32))
        if task == "doc_cls":
            f.attrs["num_labels"] = np.int64(3)
            f.attrs["id2label"] = json.dumps(["a", "b", "c"])
    return cols


def nlptrain_bert_logits(tmp: Path, weights: Path, task: str, data: Path, extra=()):
    """Logits from nlptrain's gradients mode, and for mlm the flat positions they belong to (its MLM
    head scores the masked positions only); None otherwise."""
    out = tmp / f"grad_{task}"
    run_nlptrain("--run.mode=gradients", "--data.padding=max_length", "--model.type=bert", f"--run.task={task}", f"--model.weights={weights}",
                 f"--data.train={data}", "--train.batch_size=2", f"--output.dir={out}", "--data.shuffle=false",
                 "--run.threads=1", *extra)
    with h5py.File(out / "gradients.h5", "r") as f:
        return f["logits"][()], (f["masked_positions"][()] if "masked_positions" in f else None)


def hf_bert_logits(model, cols: dict, rows=2) -> np.ndarray:
    with torch.no_grad():
        return model(**{k: torch.as_tensor(cols[k][:rows], dtype=torch.long)
                        for k in ("input_ids", "attention_mask", "token_type_ids")}).logits.numpy()


def test_bert_logits_match_transformers(tmp_path, report):
    """An imported random BertForSequenceClassification: nlptrain (doc_cls) vs transformers on the export."""
    bert = bert_model()
    src = tmp_path / "src"
    bert.save_pretrained(src)
    h5 = tmp_path / "bert.h5"
    hf_import(src, h5)
    out = tmp_path / "export"
    hf_export(h5, out)
    model = assert_loads_cleanly(out, transformers.AutoModelForSequenceClassification)
    data = tmp_path / "data.h5"
    cols = write_bert_data(data, "doc_cls", vocab=97)
    ours, _ = nlptrain_bert_logits(tmp_path, h5, "doc_cls", data, ["--model.num_labels=3"])
    ref = hf_bert_logits(model, cols)
    err = rel_err(ours, ref)
    report(f"\n[hf_interop] BERT doc_cls logits, nlptrain (imported) vs transformers (exported): rel err {err:.3e}")
    assert err <= LOGITS_TOL, err


@pytest.mark.parametrize("task", ["doc_cls", "mlm"])
def test_bert_checkpoint_exports(tmp_path, task, report):
    """A BERT checkpoint trained by nlptrain from scratch: exported from its root attributes alone."""
    data = tmp_path / "data.h5"
    cols = write_bert_data(data, task)
    run_dir = tmp_path / "run"
    labels = ["--model.num_labels=3"] if task == "doc_cls" else []
    run_nlptrain(*BERT_TINY, *labels, f"--run.task={task}", "--train.steps=2", "--checkpoint.interval=2",
                 "--train.batch_size=2", f"--data.train={data}", f"--output.dir={run_dir}")
    ckpt = run_dir / "checkpoints" / "step_00000002.h5"
    with h5py.File(ckpt, "r") as f:
        assert "optimizer" in f and "hf_config_json" not in f.attrs
        weights = {k: f[k][()] for k, v in f.items() if isinstance(v, h5py.Dataset)}
    out = tmp_path / "export"
    hf_export(ckpt, out)
    config = json.loads((out / "config.json").read_text())
    cls_name = {"doc_cls": "BertForSequenceClassification", "mlm": "BertForMaskedLM"}[task]
    assert config["model_type"] == "bert" and config["architectures"] == [cls_name]
    assert (config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]) == (32, 2, 50)
    assert config["layer_norm_eps"] == 1e-12 and not any(k.startswith("nlptrain_") for k in config)
    got = read_exported(out)
    assert sorted(got) == sorted(weights) and all(np.array_equal(got[k], weights[k]) for k in weights)
    model = assert_loads_cleanly(out, getattr(transformers, cls_name))
    if task == "doc_cls":
        assert model.config.num_labels == 3
    ours, positions = nlptrain_bert_logits(tmp_path, ckpt, task, data, labels)
    ref = hf_bert_logits(model, cols)
    if task == "mlm":
        assert np.array_equal(positions, np.flatnonzero(cols["labels"][:2].reshape(-1) != -100))
        ref = ref.reshape(-1, ref.shape[-1])[positions]
    err = rel_err(ours, ref)
    report(f"\n[hf_interop] BERT {task} logits, nlptrain checkpoint vs transformers (exported): rel err {err:.3e}")
    assert err <= LOGITS_TOL, err


# ---- 4b. base-model checkpoints (BertModel, GPT2Model: no 'bert.' / 'transformer.' prefix) --------------

@pytest.mark.parametrize("cls_name", ["BertModel", "GPT2Model"])
def test_base_model_round_trip(tmp_path, cls_name):
    """A base-model checkpoint keeps its names through import and export (bitwise, same config.json)
    and the export loads as that class."""
    if cls_name == "GPT2Model":
        model = gpt2_model().transformer
        model.config.architectures = None
    else:
        model = bert_model("BertModel")
        model.config.pad_token_id = None  # no padding_idx: the attribute says -1, config.json null
    src = tmp_path / "src"
    model.save_pretrained(src)
    orig_config = json.loads((src / "config.json").read_text())
    assert orig_config["architectures"] == [cls_name]
    expected = weights_of(model)
    assert not any(k.startswith(("bert.", "transformer.")) for k in expected)
    h5 = tmp_path / "base.h5"
    hf_import(src, h5)
    if cls_name == "BertModel":
        assert orig_config["pad_token_id"] is None
        with h5py.File(h5, "r") as f:
            assert f.attrs["pad_token_id"] == -1
    out = tmp_path / "export"
    p = hf_export(h5, out, "--no-tokenizer")
    assert "warning" not in p.stderr, p.stderr
    got = read_exported(out)
    assert sorted(got) == sorted(expected) and all(np.array_equal(got[k], v) for k, v in expected.items())
    assert json.loads((out / "config.json").read_text()) == orig_config
    assert_loads_cleanly(out, getattr(transformers, cls_name))
    hf_import(out, tmp_path / "again.h5")
    assert_same_h5(h5, tmp_path / "again.h5")


def test_finetuned_from_base_model_exports(tmp_path, report):
    """doc_cls fine-tuned from a BertModel checkpoint without pooler: the checkpoint exports as
    BertForSequenceClassification (pooler and classifier included), which transformers loads with
    no missing key and which gives nlptrain's logits."""
    from transformers import BertConfig, BertModel
    cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=16, type_vocab_size=2)
    torch.manual_seed(0)
    base = perturb_(BertModel(cfg, add_pooling_layer=False), 1)
    src = tmp_path / "src"
    base.save_pretrained(src)
    h5 = tmp_path / "base.h5"
    hf_import(src, h5)
    data = tmp_path / "data.h5"
    cols = write_bert_data(data, "doc_cls")
    run_dir = tmp_path / "run"
    p = run_nlptrain("--model.type=bert", "--run.task=doc_cls", f"--model.weights={h5}", "--model.num_labels=3",
                     "--train.steps=2", "--checkpoint.interval=2", "--train.batch_size=2", "--run.threads=1",
                     f"--data.train={data}", f"--output.dir={run_dir}")
    assert "read as a base-model checkpoint" in p.stdout
    for n in ("bert.pooler.dense.weight", "classifier.weight"):
        assert f"new tensor, not in the weights file (initialised): {n}" in p.stdout
    ckpt = run_dir / "checkpoints" / "step_00000002.h5"
    out = tmp_path / "export"
    hf_export(ckpt, out)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"] and config["num_labels"] == 3
    model = assert_loads_cleanly(out, transformers.BertForSequenceClassification)
    ours, _ = nlptrain_bert_logits(tmp_path, ckpt, "doc_cls", data, ["--model.num_labels=3"])
    err = rel_err(ours, hf_bert_logits(model, cols))
    report(f"\n[hf_interop] doc_cls fine-tuned from BertModel, logits vs transformers (exported): rel err {err:.3e}")
    assert err <= LOGITS_TOL, err


# ---- 4c. label names (id2label) ----------------------------------------------------------------------------

def predictions(out_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (out_dir / "predictions.jsonl").read_text().splitlines() if l]


def test_label_names_from_weights(tmp_path):
    """A classifier checkpoint with id2label, a dataset without label names: num_labels and the names
    come from the weights; predictions carry them, and a fine-tuned checkpoint exports them as
    config.json's id2label / label2id."""
    bert = bert_model()
    bert.config.id2label = {0: "négatif", 1: "neutre \"n\"", 2: "positif"}
    bert.config.label2id = {v: k for k, v in bert.config.id2label.items()}
    src = tmp_path / "src"
    bert.save_pretrained(src)
    h5 = tmp_path / "w.h5"
    hf_import(src, h5)
    names = ["négatif", 'neutre "n"', "positif"]
    with h5py.File(h5, "r") as f:
        assert json.loads(f.attrs["id2label"]) == names
    data = tmp_path / "data.h5"
    write_bert_data(data, "doc_cls", vocab=97)
    with h5py.File(data, "r+") as f:
        del f.attrs["id2label"], f.attrs["num_labels"]
    pred_dir = tmp_path / "pred"
    p = run_nlptrain("--model.type=bert", "--run.task=doc_cls", "--run.mode=predict", f"--model.weights={h5}",
                     f"--data.eval={data}", "--train.batch_size=4", f"--output.dir={pred_dir}", "--run.threads=1")
    assert f"model: num_labels = 3 (from 'classifier.weight' of shape [3, 32] in weights file '{h5}'; " \
           f"label names from weights file '{h5}')" in p.stdout, p.stdout
    rows = predictions(pred_dir)
    assert len(rows) == 8 and all(r["label_name"] == names[r["label"]] for r in rows), rows

    run_dir = tmp_path / "run"
    run_nlptrain("--model.type=bert", "--run.task=doc_cls", f"--model.weights={h5}", "--train.steps=1",
                 "--checkpoint.interval=1", "--train.batch_size=2", "--run.threads=1", f"--data.train={data}",
                 f"--output.dir={run_dir}")
    out = tmp_path / "export"
    hf_export(run_dir / "checkpoints" / "step_00000001.h5", out)
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": names[0], "1": names[1], "2": names[2]}
    assert config["label2id"] == {names[0]: 0, names[1]: 1, names[2]: 2}
    model = assert_loads_cleanly(out, transformers.AutoModelForSequenceClassification)
    assert model.config.id2label == {0: names[0], 1: names[1], 2: names[2]}


def test_label_names_from_dataset(tmp_path):
    """Fine-tuning a BertModel on a dataset with id2label: the exported classifier carries the
    dataset's names; the dataset's names win over the weights' (transformers' LABEL_i defaults)."""
    from transformers import BertModel
    torch.manual_seed(0)
    base = perturb_(BertModel(bert_model().config), 1)
    src = tmp_path / "src"
    base.save_pretrained(src)
    h5 = tmp_path / "w.h5"
    hf_import(src, h5)
    data = tmp_path / "data.h5"
    write_bert_data(data, "doc_cls", vocab=97)  # id2label ["a", "b", "c"]
    run_dir = tmp_path / "run"
    p = run_nlptrain("--model.type=bert", "--run.task=doc_cls", f"--model.weights={h5}", "--model.num_labels=0",
                     "--train.steps=1", "--checkpoint.interval=1", "--train.batch_size=2", "--run.threads=1",
                     f"--data.train={data}", f"--output.dir={run_dir}")
    assert f"label names from dataset '{data}'" in p.stdout
    ckpt = run_dir / "checkpoints" / "step_00000001.h5"
    with h5py.File(ckpt, "r") as f:
        assert json.loads(f.attrs["id2label"]) == ["a", "b", "c"]
    out = tmp_path / "export"
    hf_export(ckpt, out, "--config", src)  # the original config.json (id2label LABEL_0, LABEL_1)
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "a", "1": "b", "2": "c"} and config["label2id"] == {"a": 0, "b": 1, "c": 2}
    model = assert_loads_cleanly(out, transformers.BertForSequenceClassification)
    assert model.config.num_labels == 3


# ---- 5. bad input -------------------------------------------------------------------------------------------

def assert_failed(p, *names):
    assert p.returncode != 0, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    for n in names:
        assert str(n) in p.stderr, (n, p.stderr)


@pytest.fixture(scope="module")
def good_src(tmp_path_factory, gpt2):
    d = tmp_path_factory.mktemp("good") / "src"
    gpt2.save_pretrained(d)
    return d


def copy_src(good_src, dest: Path, files=("config.json", "model.safetensors")) -> Path:
    dest.mkdir()
    for name in files:
        (dest / name).write_bytes((good_src / name).read_bytes())
    return dest


def test_import_missing_config(tmp_path, good_src):
    src = copy_src(good_src, tmp_path / "src", ["model.safetensors"])
    out = tmp_path / "o.h5"
    assert_failed(hf_import(src, out, check=False, sub=True), src / "config.json")
    assert leftovers(tmp_path, ["src"]) == []


def test_import_missing_dir(tmp_path):
    assert_failed(hf_import(tmp_path / "nope", tmp_path / "o.h5", check=False), tmp_path / "nope")
    assert leftovers(tmp_path, []) == []


def test_import_no_weights(tmp_path, good_src):
    src = copy_src(good_src, tmp_path / "src", ["config.json"])
    assert_failed(hf_import(src, tmp_path / "o.h5", check=False), src, "model.safetensors")
    assert leftovers(tmp_path, ["src"]) == []


@pytest.mark.parametrize("how", ["garbage", "truncated", "empty"])
def test_import_corrupt_safetensors(tmp_path, good_src, how):
    src = copy_src(good_src, tmp_path / "src")
    data = (src / "model.safetensors").read_bytes()
    bad = {"garbage": b"\x07not a safetensors file" * 50, "truncated": data[: len(data) // 2], "empty": b""}[how]
    (src / "model.safetensors").write_bytes(bad)
    out = tmp_path / "o.h5"
    out.write_bytes(b"previous content")  # an existing output is left untouched
    assert_failed(hf_import(src, out, check=False, sub=how == "garbage"), src / "model.safetensors")
    assert out.read_bytes() == b"previous content"
    assert leftovers(tmp_path, ["src", "o.h5"]) == []


def test_import_corrupt_bin(tmp_path, good_src):
    src = copy_src(good_src, tmp_path / "src", ["config.json"])
    (src / "pytorch_model.bin").write_bytes(b"PK\x03\x04 broken zip" * 20)
    assert_failed(hf_import(src, tmp_path / "o.h5", check=False), src / "pytorch_model.bin")
    assert leftovers(tmp_path, ["src"]) == []


def test_import_bad_config_json(tmp_path, good_src):
    src = copy_src(good_src, tmp_path / "src")
    (src / "config.json").write_text('{"model_type": "gpt2", ')
    assert_failed(hf_import(src, tmp_path / "o.h5", check=False), src / "config.json")
    assert leftovers(tmp_path, ["src"]) == []


def test_import_non_float_tensor(tmp_path, good_src):
    src = copy_src(good_src, tmp_path / "src", ["config.json"])
    tensors = st_load(str(good_src / "model.safetensors"))
    tensors["transformer.extra_ids"] = np.arange(4, dtype=np.int64)
    st_save(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    assert_failed(hf_import(src, tmp_path / "o.h5", check=False), "transformer.extra_ids", src / "model.safetensors")
    assert leftovers(tmp_path, ["src"]) == []


def test_import_missing_shard(tmp_path, gpt2):
    src = tmp_path / "src"
    gpt2.save_pretrained(src, max_shard_size="100KB")
    shards = sorted(src.glob("model-*.safetensors"))
    assert len(shards) > 1
    shards[-1].unlink()
    assert_failed(hf_import(src, tmp_path / "o.h5", check=False), shards[-1])
    assert leftovers(tmp_path, ["src"]) == []


def test_export_bad_input(tmp_path, good_src):
    # missing file, garbage file, an HDF5 file that is not a weights file
    out = tmp_path / "out"
    assert_failed(hf_export(tmp_path / "missing.h5", out, check=False, sub=True), tmp_path / "missing.h5")
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"\x89HDF\r\n\x1a\n but not really" * 10)
    assert_failed(hf_export(garbage, out, check=False), garbage)
    data = tmp_path / "data.h5"
    with h5py.File(data, "w") as f:
        f.create_dataset("input_ids", data=np.zeros((2, 4), np.int32))
    assert_failed(hf_export(data, out, check=False), data, "input_ids")
    no_type = tmp_path / "no_type.h5"
    with h5py.File(no_type, "w") as f:
        f.create_dataset("w", data=np.zeros(3, np.float32))
    assert_failed(hf_export(no_type, out, check=False), no_type, "model_type")
    assert leftovers(tmp_path, ["garbage.h5", "data.h5", "no_type.h5"]) == []


def test_export_refuses_mismatch_and_existing_dir(tmp_path, good_src):
    h5 = tmp_path / "m.h5"
    hf_import(good_src, h5)
    # tensors that do not fit the architecture: the check fails before anything is written
    with h5py.File(h5, "r+") as f:
        del f["transformer.ln_f.bias"]
    out = tmp_path / "out"
    assert_failed(hf_export(h5, out, check=False), "transformer.ln_f.bias", "missing")
    assert leftovers(tmp_path, ["m.h5"]) == []
    hf_import(good_src, h5)
    # an existing non-empty directory is left alone without --overwrite
    out.mkdir()
    (out / "tokenizer.json").write_text("{}")
    assert_failed(hf_export(h5, out, check=False), out)
    assert leftovers(out, ["tokenizer.json"]) == []
    (out / "pytorch_model.bin").write_bytes(b"stale")
    p = hf_export(h5, out, "--overwrite")
    assert "stale" in p.stderr
    assert leftovers(out, ["tokenizer.json", "config.json", "model.safetensors"]) == []
    assert_loads_cleanly(out)
    assert leftovers(tmp_path, ["m.h5", "out"]) == []
