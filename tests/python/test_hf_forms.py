"""Every checkpoint form transformers' from_pretrained loads for BERT and GPT-2, imported with
tools/hf_import.py and run by nlptrain (gradients mode) for every task, against from_pretrained of the
same directory in float64: loss, outputs and every parameter gradient (norm-wise relative error
<= 1e-4, the bound of test_bert_parity.py / test_gpt2_parity.py, whose helpers this reuses).

Forms (saved by transformers from small random configs, no download):
  BERT:  BertModel (no 'bert.' prefix) with and without pooler, BertForPreTraining, BertForMaskedLM,
         BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering;
  GPT-2: GPT2Model (no 'transformer.' prefix), GPT2LMHeadModel;
  files: model.safetensors, sharded safetensors (model.safetensors.index.json), pytorch_model.bin,
         float16 and bfloat16 weights.
The tensors a file lacks for the task (head, pooler) are initialised by nlptrain; gradients mode
writes their values under initialized/. That set must equal transformers' missing_keys, the tensors
nlptrain reports unused must equal its unexpected_keys, the initial values must follow transformers'
scheme (normal(0, initializer_range) matrices, zero biases, unit LayerNorm), and transformers is then
given nlptrain's initial values so that both compute with the same weights.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import transformers

import hf_gpt2 as H
import nlp_run as nr
import test_bert_parity as P
import test_gpt2_parity as G

sys.path.insert(0, str(nr.SOURCE_DIR / "tools"))
import hf_import  # noqa: E402

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

TOL = 1e-4
NL = P.NL
BERT_FORMS = ["BertModel", "BertModel_nopooler", "BertForPreTraining", "BertForMaskedLM",
              "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering"]
TASKS = ["doc_cls", "ner", "qa", "mlm"]  # pair_cls is doc_cls's model (BertForSequenceClassification)
TIED = ("cls.predictions.decoder.",)  # tied to the word embeddings / cls.predictions.bias


def perturb_round_(model, seed):
    """Non-trivial LayerNorm and bias values; every value float32-representable."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "LayerNorm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * noise.to(p.dtype))
            p.copy_(p.float().to(p.dtype))
    return model.eval()


def bert_form(form):
    # BertForQuestionAnswering's qa_outputs has num_labels rows: 2 (start, end)
    config = transformers.BertConfig(num_labels=2 if form == "BertForQuestionAnswering" else NL,
                                     attn_implementation="eager", **P.CFG)
    torch.manual_seed(3)
    if form == "BertModel_nopooler":
        model = transformers.BertModel(config, add_pooling_layer=False)
    else:
        model = getattr(transformers, form)(config)
    return perturb_round_(model, 4)


def gpt2_form(form):
    config = H.make_config(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=32)
    torch.manual_seed(5)
    return perturb_round_(getattr(transformers, form)(config), 6)


def save(model, d: Path, storage: str) -> Path:
    """The model directory as transformers writes it (bin: the old torch.save format with the whole
    state_dict, tied copies included)."""
    if storage == "safetensors":
        model.save_pretrained(d)
    elif storage == "sharded":
        model.save_pretrained(d, max_shard_size="20KB")
        assert (d / "model.safetensors.index.json").exists() and not (d / "model.safetensors").exists()
    elif storage in ("float16", "bfloat16"):
        model.to(getattr(torch, storage)).save_pretrained(d)
        model.float()
    elif storage == "bin":
        d.mkdir(parents=True)
        model.config.to_json_file(str(d / "config.json"))
        torch.save(dict(model.state_dict()), d / "pytorch_model.bin")
    else:
        raise ValueError(storage)
    return d


_CACHE: dict = {}


def imported(tmp_factory, family, form, storage):
    """(model directory, imported HDF5), made once per (form, storage)."""
    key = (form, storage)
    if key not in _CACHE:
        root = tmp_factory.mktemp(f"{form}_{storage}")
        model = bert_form(form) if family == "bert" else gpt2_form(form)
        src = save(model, root / "src", storage)
        h5 = root / "weights.h5"
        hf_import.main([str(src), str(h5), "--quiet"])
        _CACHE[key] = (src, h5)
    return _CACHE[key]


def log_list(stdout: str, what: str) -> set[str]:
    return set(re.findall(rf"model: {what}: (\S+)", stdout))


def check_initial_values(init: dict, std: float):
    """transformers' BertPreTrainedModel._init_weights: Linear weights normal(0, initializer_range),
    biases 0, LayerNorm weight 1 and bias 0."""
    for name, v in init.items():
        if "LayerNorm" in name:
            want = 1.0 if name.endswith("weight") else 0.0
            assert np.all(v == want), name
        elif name.endswith("bias"):
            assert np.all(v == 0), name
        else:
            assert v.ndim == 2 and abs(v.mean()) < 0.5 * std and 0.6 * std < v.std() < 1.4 * std, \
                (name, v.mean(), v.std())


def run_bert(tmp_path, h5, task, cols, extra=()):
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    out = tmp_path / "out"
    p = nr.run(["--model.type=bert", f"--run.task={task}", "--run.mode=gradients", "--data.padding=max_length", f"--model.weights={h5}",
                f"--data.train={data}", f"--train.batch_size={P.B}", f"--output.dir={out}",
                "--run.threads=1", *extra])
    return p, out / "gradients.h5"


def bert_case(tmp_path, tmp_path_factory, report, form, storage, task):
    src, h5 = imported(tmp_path_factory, "bert", form, storage)
    cols = P.make_batch(task, np.random.default_rng(5))
    # num_labels from the file's classifier when it has one (as from_pretrained), else given
    file_classifier = form in ("BertForSequenceClassification", "BertForTokenClassification")
    labels = [] if task in ("qa", "mlm") or file_classifier else [f"--model.num_labels={NL}"]
    p, grads = run_bert(tmp_path, h5, task, cols, labels)
    if task in ("doc_cls", "ner"):
        src_text = "(from 'classifier.weight' of shape [5, 32]" if file_classifier else "(model.num_labels"
        assert f"model: num_labels = {NL} {src_text}" in p.stdout, p.stdout

    cls = P.HEADS[task]
    model, info = cls.from_pretrained(str(src), output_loading_info=True, dtype=torch.float64,
                                      attn_implementation="eager", num_labels=2 if task == "qa" else NL)
    model.eval()
    missing = {k for k in info["missing_keys"] if not k.startswith(TIED)}
    unexpected = {k for k in info["unexpected_keys"] if not k.startswith(TIED)}
    with h5py.File(grads) as g:
        init = {k: g["initialized"][k][()] for k in g["initialized"]} if "initialized" in g else {}
    assert set(init) == missing, (sorted(init), sorted(missing))
    assert log_list(p.stdout, r"new tensor, not in the weights file \(initialised\)") == missing
    assert log_list(p.stdout, "unused tensor in the weights file") == unexpected
    if form.startswith("BertModel"):
        assert "read as a base-model checkpoint" in p.stdout
    check_initial_values(init, P.CFG.get("initializer_range", 0.02))
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, v in init.items():
            params[k].copy_(torch.from_numpy(v).to(torch.float64))
    worst = P.compare_with_transformers(model, task, cols, grads)
    top = max(worst, key=worst.get)
    report(f"\n[hf_forms] {form}/{storage} -> {task}: initialised {len(init)}, unused {len(unexpected)}, "
           f"max rel err {worst[top]:.2e} ({top})")
    assert worst[top] <= TOL, (top, worst[top])


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("form", BERT_FORMS)
def test_bert_form(tmp_path, tmp_path_factory, report, form, task):
    bert_case(tmp_path, tmp_path_factory, report, form, "safetensors", task)


BERT_STORAGE = [("BertModel", "sharded", "doc_cls"), ("BertModel", "bin", "ner"),
                ("BertModel_nopooler", "float16", "doc_cls"), ("BertModel", "bfloat16", "qa"),
                ("BertForMaskedLM", "bin", "mlm"), ("BertForPreTraining", "sharded", "mlm"),
                ("BertForSequenceClassification", "bfloat16", "doc_cls")]


@pytest.mark.parametrize("form,storage,task", BERT_STORAGE, ids=["-".join(c) for c in BERT_STORAGE])
def test_bert_storage(tmp_path, tmp_path_factory, report, form, storage, task):
    bert_case(tmp_path, tmp_path_factory, report, form, storage, task)


GPT2_CASES = [("GPT2Model", s) for s in ("safetensors", "sharded", "bin", "float16", "bfloat16")] + \
             [("GPT2LMHeadModel", s) for s in ("safetensors", "bin")]


@pytest.mark.parametrize("form,storage", GPT2_CASES, ids=["-".join(c) for c in GPT2_CASES])
def test_gpt2_form(tmp_path, tmp_path_factory, report, form, storage):
    src, h5 = imported(tmp_path_factory, "gpt2", form, storage)
    model, info = transformers.GPT2LMHeadModel.from_pretrained(
        str(src), output_loading_info=True, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, mask, labels = G.small_batches(model.config.vocab_size)["right_padding"]
    data = H.write_dataset(tmp_path / "d.h5", ids, mask, labels)
    out = tmp_path / "out"
    p = nr.run(["--run.mode=gradients", "--data.padding=max_length", f"--model.weights={h5}", f"--data.train={data}",
                "--data.shuffle=false", f"--train.batch_size={ids.shape[0]}", f"--output.dir={out}",
                "--run.threads=1"])
    assert ("read as a base-model checkpoint" in p.stdout) == (form == "GPT2Model")
    assert "new tensor" not in p.stdout and "unused tensor" not in p.stdout, p.stdout
    got = H.read_gradients(out / "gradients.h5")
    assert not any(k.startswith("initialized/") for k in got)
    errs = G.compare_gradients(got, model, ids, mask, labels)
    G.summarise(report, f"hf_forms {form}/{storage}", errs)


def test_missing_base_tensor_names_both_names(tmp_path, tmp_path_factory):
    """A BertModel checkpoint without one encoder tensor: the error names the parameter and the
    unprefixed name looked for, and the file."""
    _, h5 = imported(tmp_path_factory, "bert", "BertModel", "safetensors")
    broken = tmp_path / "broken.h5"
    broken.write_bytes(Path(h5).read_bytes())
    with h5py.File(broken, "r+") as f:
        del f["encoder.layer.1.output.dense.weight"]
    cols = P.make_batch("doc_cls", np.random.default_rng(5))
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    p = nr.run(["--model.type=bert", "--run.task=doc_cls", "--run.mode=gradients", "--data.padding=max_length", f"--model.weights={broken}",
                f"--data.train={data}", f"--model.num_labels={NL}", f"--output.dir={tmp_path / 'o'}"], check=False)
    assert p.returncode != 0
    for s in (str(broken), "bert.encoder.layer.1.output.dense.weight", "'encoder.layer.1.output.dense.weight'"):
        assert s in p.stderr, (s, p.stderr)


# ---- num_labels from the weights (model.num_labels may still be given; a disagreement is an error) ------

def classifier_case(tmp_path, tmp_path_factory, task="doc_cls"):
    form = "BertForSequenceClassification" if task == "doc_cls" else "BertForTokenClassification"
    _, h5 = imported(tmp_path_factory, "bert", form, "safetensors")
    cols = P.make_batch(task, np.random.default_rng(5))
    data = tmp_path / "d.h5"
    with h5py.File(data, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    return h5, data


def nlptrain_args(task, h5, data, out):
    return ["--model.type=bert", f"--run.task={task}", "--run.mode=gradients", "--data.padding=max_length", f"--model.weights={h5}",
            f"--data.train={data}", f"--train.batch_size={P.B}", f"--output.dir={out}", "--run.threads=1"]


@pytest.mark.parametrize("ranks", [1, 2])
def test_num_labels_disagreement_is_an_error(tmp_path, tmp_path_factory, ranks):
    h5, data = classifier_case(tmp_path, tmp_path_factory, "ner")
    p = nr.run(nlptrain_args("ner", h5, data, tmp_path / "o") + ["--model.num_labels=4"], ranks=ranks, check=False)
    assert p.returncode != 0, p.stdout
    for s in ("model.num_labels = 4", "num_labels = 5", str(h5), "classifier.weight"):
        assert s in p.stderr, (s, p.stderr)
    # the same value is fine
    nr.run(nlptrain_args("ner", h5, data, tmp_path / "o2") + [f"--model.num_labels={NL}"])


def test_num_labels_dataset_disagreement_is_an_error(tmp_path, tmp_path_factory):
    """model.num_labels = 0 takes the dataset's num_labels, which must agree with the classifier."""
    h5, data = classifier_case(tmp_path, tmp_path_factory)
    with h5py.File(data, "r+") as f:
        f.attrs["num_labels"] = np.int64(3)
    p = nr.run(nlptrain_args("doc_cls", h5, data, tmp_path / "o") + ["--model.num_labels=0"], check=False)
    assert p.returncode != 0
    for s in (str(data), "num_labels = 3", str(h5), "num_labels = 5"):
        assert s in p.stderr, (s, p.stderr)
    with h5py.File(data, "r+") as f:
        f.attrs["num_labels"] = np.int64(NL)
    p = nr.run(nlptrain_args("doc_cls", h5, data, tmp_path / "o2") + ["--model.num_labels=0"])
    assert f"model: num_labels = {NL} (from 'classifier.weight'" in p.stdout


@pytest.mark.parametrize("attr", ["num_labels", "id2label"])
def test_num_labels_attribute_must_match_classifier(tmp_path, tmp_path_factory, attr):
    h5, data = classifier_case(tmp_path, tmp_path_factory)
    bad = tmp_path / "bad.h5"
    bad.write_bytes(Path(h5).read_bytes())
    with h5py.File(bad, "r+") as f:
        f.attrs[attr] = np.int64(4) if attr == "num_labels" else '["a", "b", "c", "d"]'
    p = nr.run(nlptrain_args("doc_cls", bad, data, tmp_path / "o"), check=False)
    assert p.returncode != 0
    for s in (str(bad), attr, "[5, 32]"):
        assert s in p.stderr, (s, p.stderr)
