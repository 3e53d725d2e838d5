"""Bad-input matrix: every case is a run that must stop with
  * a non-zero exit status (mpirun's, so at least one rank failed and the others were taken down),
  * within 30 s (a hang fails the test),
  * a message on stderr naming the file, key or value at fault,
  * the earlier run's output in output.dir (log, metrics, config, checkpoints) byte-identical and no
    temporary or partial file left behind.
Cases run on 2 ranks through mpirun unless they need otherwise. The README's "Errors" section lists the
checks these cases exercise."""
import os
import shutil
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest

import nlp_run as nr

LIMIT_S = 30
V = 64   # vocab_size of the tiny models
T = 16   # sequence length
N = 8    # examples per dataset

GPT = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", f"--model.vocab_size={V}",
       f"--model.n_positions={T}", f"--data.seq_len={T}", "--run.threads=1"]
BERT = ["--model.type=bert", f"--model.vocab_size={V}", "--model.hidden_size=32",
        "--model.num_hidden_layers=1", "--model.num_attention_heads=2", "--model.intermediate_size=64",
        f"--model.max_position_embeddings={T}", "--model.num_labels=3", "--run.threads=1"]
TRAIN = ["--train.steps=2", "--train.batch_size=2", "--train.lr=1e-3", "--data.shuffle=false"]


# ---- data and helpers ---------------------------------------------------------------------------------

def ids(rows=N, seed=0):
    return np.random.default_rng(seed).integers(0, V, size=(rows, T)).astype(np.int32)


def h5write(path, **cols):
    with h5py.File(path, "w") as f:
        for k, v in cols.items():
            f.create_dataset(k, data=v)
    return path


def snapshot(d):
    """relative path -> bytes of every file under d (empty dict when d does not exist), except the run
    lock nlptrain.lock: every run takes it first and writes its host and pid there (not output)."""
    d = Path(d)
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and p.name != "nlptrain.lock"}


@pytest.fixture(scope="module")
def previous(tmp_path_factory):
    """Output of an earlier successful run: log.txt, metrics.jsonl, config.ini, summary.json and two
    checkpoints. Each case copies it into its output.dir first and checks it afterwards."""
    d = tmp_path_factory.mktemp("previous")
    data = h5write(d / "data.h5", input_ids=ids())
    out = d / "out"
    nr.run(GPT + TRAIN + [f"--data.train={data}", f"--output.dir={out}", "--checkpoint.interval=1"],
           ranks=1, timeout=120)
    assert (out / "checkpoints" / "step_00000002.h5").exists()
    assert (out / "metrics.jsonl").stat().st_size > 0
    return out


class Case:
    """One bad-input run: args (after the binary), expected stderr substrings, ranks, an optional
    wrapper command put in front of the binary, and whether output.dir holds an earlier run."""

    def __init__(self, args, expect, ranks=2, wrapper=None, env=None, keep_output=True, launcher=None):
        self.args, self.expect, self.ranks = [str(a) for a in args], [str(e) for e in expect], ranks
        self.wrapper, self.env, self.keep_output = wrapper, env or {}, keep_output
        self.launcher = launcher or []  # in front of mpirun


def run_case(case, out=None, previous=None, during=None):
    """Runs the case, checks exit status, time and messages; with `out` and `previous`, output.dir is
    seeded with the earlier run and must be unchanged afterwards. Returns the CompletedProcess."""
    seeded = out is not None and previous is not None and case.keep_output
    if seeded:
        shutil.copytree(previous, out)
    before = snapshot(out) if out is not None else {}
    # Into the earlier run's folder a new run needs output.overwrite (else it is refused for that):
    # the bad input must stop it before the earlier run is moved aside.
    cmd = case.launcher + ["mpirun", "-np", str(case.ranks)] + (case.wrapper or []) + [nr.binary()] + case.args + (
        ["--output.overwrite=true"] if seeded else [])
    env = nr.mpi_env()
    env.update(case.env)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env=env, start_new_session=True)
    helper = threading.Thread(target=during, args=(proc,), daemon=True) if during else None
    if helper:
        helper.start()
    try:
        stdout, stderr = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        pytest.fail(f"no exit within {LIMIT_S} s (hang): {' '.join(cmd)}")
    elapsed = time.monotonic() - t0
    if helper:
        helper.join(5)
    p = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    print(f"exit status {proc.returncode} after {elapsed:.1f} s; stderr:\n{stderr}")  # shown with -rP
    assert p.returncode != 0, f"exit status 0: {' '.join(cmd)}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr}"
    assert elapsed < LIMIT_S
    for e in case.expect:
        assert e in stderr, f"'{e}' not in stderr:\n{stderr}\nstdout:\n{stdout[-2000:]}"
    assert "internal error" not in stderr, stderr
    if out is not None:
        after = snapshot(out)
        leftovers = [k for k in after if ".tmp" in k]
        assert not leftovers, f"temporary files left: {leftovers}"
        if case.keep_output:
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            assert not changed, f"earlier output changed or added: {changed}"
    return p


# ---- INI ----------------------------------------------------------------------------------------------

def ini_case(tmp_path, text, expect_extra, mode="w"):
    ini = tmp_path / "bad.ini"
    if mode == "wb":
        ini.write_bytes(text)
    else:
        ini.write_text(text)
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    return Case([ini] + GPT + TRAIN + [f"--data.train={data}", f"--output.dir={tmp_path / 'out'}"],
                [str(ini)] + expect_extra)


INI_CASES = {
    # a line that is neither [section] nor key = value; line 3 named
    "ini_syntax": ("[train]\nsteps = 2\nlr 0.1\n", ["line 3", "lr 0.1"]),
    "ini_section_header": ("[train\nsteps = 2\n", ["line 1", "[train"]),
    "ini_unknown_section": ("[trainer]\nsteps = 2\n", ["trainer", "line 1"]),
    "ini_unknown_key": ("[train]\nlearning_rate = 0.1\n", ["train.learning_rate", "0.1", "line 2"]),
    "ini_key_outside_section": ("steps = 2\n", ["'steps'", "section"]),
    "ini_wrong_type_int": ("[train]\nsteps = many\n", ["train.steps", "many", "line 2"]),
    "ini_wrong_type_bool": ("[data]\nshuffle = maybe\n", ["data.shuffle", "maybe"]),
    "ini_out_of_range": ("[model]\nembd_pdrop = 1.5\n", ["model.embd_pdrop", "1.5", "[0, 1)"]),
    "ini_bad_choice": ("[train]\nschedule = cosine_with_restarts\n",
                       ["train.schedule", "cosine_with_restarts", "linear"]),
    # n_embd = 32 from the command line, n_head = 3 in the file: 32 is not divisible by 3
    "ini_conflicting_keys": ("[model]\nn_head = 3\n", ["model.n_embd", "model.n_head", "= 3"]),
    "ini_conflicting_task_model": ("[run]\ntask = ner\n", ["run.task", "ner", "model.type", "gpt2"]),
    "ini_duplicate_key": ("[train]\nsteps = 2\nlr = 0.1\nsteps = 5\n",
                          ["duplicate", "train.steps", "'5'", "line 4", "line 2"]),
}


@pytest.mark.parametrize("name", sorted(INI_CASES))
def test_ini(name, tmp_path, previous):
    text, expect = INI_CASES[name]
    case = ini_case(tmp_path, text, expect)
    if name.startswith("ini_conflicting_keys"):
        case.args = [a for a in case.args if a != "--model.n_head=2"]
    run_case(case, tmp_path / "out", previous)


def test_ini_not_text(tmp_path, previous):
    # An HDF5 file given where the INI belongs (`nlptrain data.h5`): binary, NUL bytes.
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    case = Case([data] + GPT + TRAIN + [f"--output.dir={tmp_path / 'out'}"],
                [str(data), "not a text file"])
    run_case(case, tmp_path / "out", previous)


def test_ini_invalid_utf8(tmp_path, previous):
    case = ini_case(tmp_path, b"[train]\nsteps = 2\xff\xfe\n", ["not a text file", "line 2"], mode="wb")
    run_case(case, tmp_path / "out", previous)


def test_ini_missing(tmp_path, previous):
    ini = tmp_path / "nope.ini"
    case = Case([ini] + GPT + TRAIN + [f"--output.dir={tmp_path / 'out'}"], [str(ini), "not found"])
    run_case(case, tmp_path / "out", previous)


# ---- HDF5 datasets ----------------------------------------------------------------------------------

def data_case(tmp_path, path, expect, model=GPT, extra=()):
    return Case(model + TRAIN + [f"--data.train={path}", f"--output.dir={tmp_path / 'out'}"] + list(extra),
                [str(path)] + expect)


def with_value(arr, where, value):
    arr = arr.copy()
    arr[where] = value
    return arr


def make_data(name, d):
    """(path, expected substrings besides the path, extra args) for the HDF5 dataset cases."""
    p = d / f"{name}.h5"
    late = (N - 1, 5)  # last row: read only after the first step; a check on read would miss it
    if name == "data_missing_file":
        return d / "nope.h5", ["no such file"], []
    if name == "data_not_hdf5":
        p.write_text("input_ids\n1 2 3\n")
        return p, ["not an HDF5 file"], []
    if name == "data_missing_dataset":
        h5write(p, ids=ids())
        return p, ["input_ids", "tokens", "ids"], []
    if name == "data_wrong_dtype":
        h5write(p, input_ids=ids().astype(np.float32))
        return p, ["input_ids", "float32", "int32"], []
    if name == "data_wrong_rank":
        h5write(p, input_ids=np.zeros((N, T, 2), np.int32))
        return p, ["input_ids", "[8, 16, 2]"], []
    if name == "data_wrong_seq_len":
        h5write(p, input_ids=np.zeros((N, T + 4), np.int32))
        return p, ["input_ids", "20", "data.seq_len"], []
    if name == "data_empty_rows":
        h5write(p, input_ids=np.zeros((0, T), np.int32))
        return p, ["input_ids", "[0, 16]"], []
    if name == "data_empty_stream":
        h5write(p, tokens=np.zeros((0,), np.int32))
        return p, ["tokens", "0 tokens"], []
    if name == "data_ragged_mask":
        h5write(p, input_ids=ids(), attention_mask=np.ones((N, T - 1), np.int32))
        return p, ["attention_mask", "[8, 15]"], []
    if name == "data_ragged_labels":
        h5write(p, input_ids=ids(), labels=ids(N - 1))
        return p, ["labels", "[7, 16]"], []
    if name == "data_token_ge_vocab":
        h5write(p, input_ids=with_value(ids(), late, V))
        return p, ["input_ids", "row 7", f"= {V}", "vocab_size"], []
    if name == "data_negative_id":
        h5write(p, input_ids=with_value(ids(), late, -1))
        return p, ["input_ids", "row 7", "= -1"], []
    if name == "data_stream_token_ge_vocab":
        toks = np.random.default_rng(1).integers(0, V, size=N * T + 1).astype(np.int32)
        toks[-1] = 1000
        h5write(p, tokens=toks)
        return p, ["tokens", "1000"], []
    if name == "data_negative_label":
        h5write(p, input_ids=ids(), labels=with_value(ids(), late, -5))
        return p, ["labels", "row 7", "= -5", "-100"], []
    if name == "data_mask_not_binary":
        h5write(p, input_ids=ids(), attention_mask=with_value(np.ones((N, T), np.int32), late, 2))
        return p, ["attention_mask", "row 7", "= 2"], []
    raise KeyError(name)


DATA_CASES = ["data_missing_file", "data_not_hdf5", "data_missing_dataset", "data_wrong_dtype",
              "data_wrong_rank", "data_wrong_seq_len", "data_empty_rows", "data_empty_stream",
              "data_ragged_mask", "data_ragged_labels", "data_token_ge_vocab", "data_negative_id",
              "data_stream_token_ge_vocab", "data_negative_label", "data_mask_not_binary"]


@pytest.mark.parametrize("name", DATA_CASES)
def test_dataset(name, tmp_path, previous):
    path, expect, extra = make_data(name, tmp_path)
    run_case(data_case(tmp_path, path, expect, extra=extra), tmp_path / "out", previous)


def test_eval_dataset_bad_token(tmp_path, previous):
    good = h5write(tmp_path / "good.h5", input_ids=ids())
    bad = h5write(tmp_path / "bad_eval.h5", input_ids=with_value(ids(), (N - 1, 0), V + 7))
    case = data_case(tmp_path, good, [], extra=[f"--data.eval={bad}"])
    case.expect = [str(bad), "input_ids", "row 7", str(V + 7)]
    run_case(case, tmp_path / "out", previous)


# ---- BERT task datasets ------------------------------------------------------------------------------

def bert_data(name, d):
    """(path, task, expected substrings besides the path)."""
    p = d / f"{name}.h5"
    x = ids()
    if name == "cls_label_ge_num_labels":
        h5write(p, input_ids=x, labels=with_value(np.zeros(N, np.int32), N - 1, 3))
        return p, "doc_cls", ["labels[7]", "= 3", "[0, 3)"]
    if name == "cls_negative_label":
        h5write(p, input_ids=x, labels=with_value(np.zeros(N, np.int32), N - 1, -2))
        return p, "doc_cls", ["labels[7]", "= -2"]
    if name == "cls_missing_labels":
        h5write(p, input_ids=x)
        return p, "pair_cls", ["labels", "pair_cls"]
    if name == "cls_labels_wrong_length":
        h5write(p, input_ids=x, labels=np.zeros(N - 2, np.int32))
        return p, "doc_cls", ["labels", "[6]"]
    if name == "pair_token_type_ge_vocab":
        h5write(p, input_ids=x, labels=np.zeros(N, np.int32),
                token_type_ids=with_value(np.zeros((N, T), np.int32), (N - 1, 3), 2))
        return p, "pair_cls", ["token_type_ids", "row 7", "= 2", "type_vocab_size"]
    if name == "ner_label_ge_num_labels":
        lab = np.full((N, T), -100, np.int32)
        lab[:, 1] = 0
        lab[N - 1, 4] = 5
        h5write(p, input_ids=x, labels=lab)
        return p, "ner", ["labels", "row 7", "= 5", "[0, 3)"]
    if name == "qa_start_outside_sequence":
        h5write(p, input_ids=x, start_positions=with_value(np.ones(N, np.int32), N - 1, T),
                end_positions=np.full(N, 2, np.int32))
        return p, "qa", ["start_positions[7]", f"= {T}", f"[0, {T})"]
    if name == "qa_end_negative":
        h5write(p, input_ids=x, start_positions=np.ones(N, np.int32),
                end_positions=with_value(np.full(N, 2, np.int32), N - 1, -3))
        return p, "qa", ["end_positions[7]", "= -3"]
    if name == "qa_end_before_start":
        h5write(p, input_ids=x, start_positions=with_value(np.ones(N, np.int32), N - 1, 9),
                end_positions=with_value(np.full(N, 2, np.int32), N - 1, 4))
        return p, "qa", ["end_positions[7] = 4", "start_positions[7] = 9"]
    if name == "qa_missing_end":
        h5write(p, input_ids=x, start_positions=np.ones(N, np.int32))
        return p, "qa", ["start_positions", "end_positions"]
    raise KeyError(name)


BERT_CASES = ["cls_label_ge_num_labels", "cls_negative_label", "cls_missing_labels",
              "cls_labels_wrong_length", "pair_token_type_ge_vocab", "ner_label_ge_num_labels",
              "qa_start_outside_sequence", "qa_end_negative", "qa_end_before_start", "qa_missing_end"]


@pytest.mark.parametrize("name", BERT_CASES)
def test_bert_dataset(name, tmp_path, previous):
    path, task, expect = bert_data(name, tmp_path)
    case = data_case(tmp_path, path, expect, model=BERT, extra=[f"--run.task={task}"])
    run_case(case, tmp_path / "out", previous)


# ---- weights ------------------------------------------------------------------------------------------

def weights_case(tmp_path, w, expect):
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    return Case(GPT + TRAIN + [f"--data.train={data}", f"--output.dir={tmp_path / 'out'}",
                               f"--model.weights={w}"], [str(w)] + expect)


def weights_copy(previous, d, name):
    w = d / name
    shutil.copy(previous / "checkpoints" / "step_00000002.h5", w)
    return w


W_TENSOR = "transformer.h.1.attn.c_attn.weight"


def test_weights_wrong_shape(tmp_path, previous):
    w = weights_copy(previous, tmp_path, "w.h5")
    with h5py.File(w, "a") as f:
        del f[W_TENSOR]
        f.create_dataset(W_TENSOR, data=np.zeros((32, 95), np.float32))
    case = weights_case(tmp_path, w, [W_TENSOR, "[32, 95]", "[32, 96]"])
    run_case(case, tmp_path / "out", previous)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_weights_not_finite(value, tmp_path, previous):
    w = weights_copy(previous, tmp_path, "w.h5")
    with h5py.File(w, "a") as f:
        a = f[W_TENSOR][()]
        a[3, 17] = float(value)
        f[W_TENSOR][...] = a
        # A non-finite value that was written as such (a diverged run's checkpoint): its checksum is
        # valid, so the finiteness check is what catches it.
        f[W_TENSOR].attrs["nlptrain_crc32"] = np.int64(zlib.crc32(a.astype("<f4").tobytes()))
    case = weights_case(tmp_path, w, [W_TENSOR, f"value {value} at [3, 17]"])
    run_case(case, tmp_path / "out", previous)


def test_weights_other_model_type(tmp_path, previous):
    # BERT weights given to a GPT-2 run (model.type left at gpt2)
    w = tmp_path / "bert.h5"
    with h5py.File(w, "w") as f:
        f.attrs["model_type"] = "bert"
        f.create_dataset("bert.embeddings.word_embeddings.weight", data=np.zeros((V, 32), np.float32))
    case = weights_case(tmp_path, w, ["model_type", "bert", "gpt2"])
    run_case(case, tmp_path / "out", previous)


def test_weights_missing_tensor(tmp_path, previous):
    w = weights_copy(previous, tmp_path, "w.h5")
    with h5py.File(w, "a") as f:
        del f["transformer.ln_f.bias"]
    case = weights_case(tmp_path, w, ["transformer.ln_f.bias"])
    run_case(case, tmp_path / "out", previous)


def test_weights_not_hdf5(tmp_path, previous):
    w = tmp_path / "w.h5"
    w.write_bytes(b"\x00" * 4096)
    case = weights_case(tmp_path, w, ["not an HDF5 file"])
    run_case(case, tmp_path / "out", previous)


# A damaged global heap collection (the blocks holding variable-length strings): libhdf5 1.10 loops
# forever decoding one whose free-space object has size 0, so reading a string attribute such as
# model_type or id2label hung the run on every rank. Found by tests/fuzz/fuzz_h5file; the first case
# uses that input itself. nlptrain reads files through a driver that checks collections first.
HANG_INPUT = nr.SOURCE_DIR / "tests" / "fuzz" / "corpus" / "h5file" / "regress-hang-vlen-string-attr-corrupt-global-heap"


def test_weights_damaged_global_heap(tmp_path, previous):
    w = tmp_path / "w.h5"
    shutil.copy(HANG_INPUT, w)
    case = weights_case(tmp_path, w, ["attribute 'model_type'", "damaged global heap collection"])
    run_case(case, tmp_path / "out", previous)


def bert_cls_data(path, id2label=None):
    h5write(path, input_ids=ids(), labels=np.arange(N, dtype=np.int32) % 3)
    if id2label is not None:
        with h5py.File(path, "a") as f:
            f.attrs["id2label"] = id2label  # a str: variable-length, in the global heap
    return path


def test_data_damaged_global_heap(tmp_path, previous):
    data = bert_cls_data(tmp_path / "d.h5", '["neg", "neu", "pos"]')
    nr.damage_global_heap(data)
    case = data_case(tmp_path, data, ["attribute 'id2label'", "damaged global heap collection"], model=BERT,
                     extra=["--run.task=doc_cls"])
    run_case(case, tmp_path / "out", previous)


def test_eval_data_damaged_global_heap(tmp_path, previous):
    train = bert_cls_data(tmp_path / "train.h5")
    ev = bert_cls_data(tmp_path / "eval.h5", '["neg", "neu", "pos"]')
    nr.damage_global_heap(ev)
    case = data_case(tmp_path, train, [str(ev), "attribute 'id2label'", "damaged global heap collection"],
                     model=BERT, extra=["--run.task=doc_cls", f"--data.eval={ev}"])
    case.expect.remove(str(train))
    run_case(case, tmp_path / "out", previous)


# ---- file system ------------------------------------------------------------------------------------

def world_readable_dir(tmp_path):
    """A folder every user can read (pytest's own tmp folders are private to root)."""
    d = Path(tempfile.mkdtemp(prefix="nlptrain-bad-"))
    os.chmod(d, 0o755)
    return d


def test_output_dir_not_writable(tmp_path, previous):
    d = world_readable_dir(tmp_path)
    try:
        data = h5write(d / "d.h5", input_ids=ids())
        os.chmod(data, 0o644)
        out = d / "out"
        shutil.copytree(previous, out)
        for p in [out] + list(out.rglob("*")):
            os.chmod(p, 0o555 if p.is_dir() else 0o444)
        launcher = []
        if os.geteuid() == 0:  # root writes anywhere: run mpirun and the ranks as nobody
            setpriv = shutil.which("setpriv")
            if not setpriv:
                pytest.skip("running as root and setpriv is absent: cannot make a folder unwritable")
            launcher = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "env", "HOME=/tmp"]
        case = Case(GPT + TRAIN + [f"--data.train={data}", f"--output.dir={out}"],
                    [str(out), "not writable", "Permission denied"], launcher=launcher, keep_output=False)
        before = snapshot(out)
        run_case(case)
        assert snapshot(out) == before
    finally:
        for p in [d] + list(d.rglob("*")):
            if p.is_dir():
                os.chmod(p, 0o755)
        shutil.rmtree(d, ignore_errors=True)


def test_output_dir_is_a_file(tmp_path):
    out = tmp_path / "out"
    out.write_text("not a folder\n")
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    run_case(Case(GPT + TRAIN + [f"--data.train={data}", f"--output.dir={out}"], [str(out)]))
    assert out.read_text() == "not a folder\n"


def test_disk_full_during_checkpoint(tmp_path, previous):
    """RLIMIT_FSIZE (ulimit -f, 1 KiB blocks) below a checkpoint's size: resuming from step 2, the
    checkpoint of step 3 cannot be written. The earlier checkpoints survive byte for byte, the temporary
    file is removed, and the run fails naming the file instead of dying of SIGXFSZ."""
    out = tmp_path / "out"
    shutil.copytree(previous, out)
    ckpt_size = (out / "checkpoints" / "step_00000002.h5").stat().st_size
    limit_kib = 64
    assert ckpt_size > 2 * limit_kib * 1024, ckpt_size
    before = snapshot(out)
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    wrapper = ["bash", "-c", f'ulimit -f {limit_kib} && exec "$0" "$@"']
    case = Case(GPT + ["--train.steps=3", "--train.batch_size=2", "--train.lr=1e-3", "--data.shuffle=false",
                       "--checkpoint.interval=1", "--train.resume=true", f"--data.train={data}",
                       f"--output.dir={out}"],
                [str(out / "checkpoints" / "step_00000003.h5"), "File too large"],
                wrapper=wrapper, env={"OMPI_MCA_btl": "self,tcp"}, keep_output=False)
    run_case(case, out)
    after = snapshot(out)
    for k in before:
        if k.startswith("checkpoints/"):
            assert after.get(k) == before[k], f"{k} changed"
    assert not (out / "checkpoints" / "step_00000003.h5").exists()
    assert sorted(k for k in after if k.startswith("checkpoints/")) == \
        ["checkpoints/step_00000001.h5", "checkpoints/step_00000002.h5"]
    # the resumed run appended its step 3 to the metrics; the earlier lines are intact
    assert after["metrics.jsonl"].startswith(before["metrics.jsonl"])


def test_checkpoint_dir_removed_mid_run(tmp_path):
    out = tmp_path / "out"
    ckdir = out / "checkpoints"
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    removed = []

    def remove_when_written(proc):
        # Once step 2 is there, remove the folder until it is gone: an rmtree that races with the
        # run writing the next checkpoint's temporary file can leave the folder behind.
        deadline = time.monotonic() + LIMIT_S
        triggered = False
        while time.monotonic() < deadline and proc.poll() is None:
            triggered = triggered or (ckdir / "step_00000002.h5").exists()
            if triggered:
                shutil.rmtree(ckdir, ignore_errors=True)
                if not ckdir.exists():
                    removed.append(True)
                    return
            time.sleep(0.005)

    case = Case(GPT + ["--train.steps=100000", "--train.batch_size=2", "--data.shuffle=false",
                       "--checkpoint.interval=1", "--run.log_interval=1000", f"--data.train={data}",
                       f"--output.dir={out}"], [str(ckdir)], keep_output=False)
    run_case(case, out, during=remove_when_written)
    assert removed, "the checkpoint folder was never removed"
    assert not ckdir.exists() or not any(ckdir.glob("*.tmp*"))


# ---- MPI ----------------------------------------------------------------------------------------------

def test_more_ranks_than_examples(tmp_path, previous):
    data = h5write(tmp_path / "d.h5", input_ids=ids(rows=3))
    case = Case(GPT + ["--train.steps=2", "--train.batch_size=1", f"--data.train={data}",
                       f"--output.dir={tmp_path / 'out'}"],
                [str(data), "3 examples", "4 ranks"], ranks=4)
    run_case(case, tmp_path / "out", previous)


def rank_dirs(tmp_path, texts):
    """One folder per rank with its own input.ini (same relative path, different contents: a node
    that sees another file), and a wrapper that starts each rank in its folder."""
    for r, text in enumerate(texts):
        (tmp_path / f"rank{r}").mkdir()
        (tmp_path / f"rank{r}" / "input.ini").write_text(text)
    return ["bash", "-c", f'cd "{tmp_path}/rank$OMPI_COMM_WORLD_RANK" && exec "$0" input.ini "$@"']


def test_ranks_disagree_on_ini(tmp_path, previous):
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    out = tmp_path / "out"
    base = f"[data]\ntrain = {data}\n[output]\ndir = {out}\n[train]\nsteps = 2\nbatch_size = 2\n"
    wrapper = rank_dirs(tmp_path, [base + "lr = 0.001\n", base + "lr = 0.002\n"])
    case = Case(GPT, ["input.ini", "train.lr", "0.001", "0.002", "rank 1"], wrapper=wrapper)
    run_case(case, out, previous)


def test_ranks_see_different_data_files(tmp_path, previous):
    # Each node has its own scratch path (allowed), but rank 1's copy is another file (other size).
    out = tmp_path / "out"
    texts = []
    for r, rows in enumerate([N, N + 4]):
        data = h5write(tmp_path / f"node{r}.h5", input_ids=ids(rows=rows))
        texts.append(f"[data]\ntrain = {data}\n[output]\ndir = {out}\n[train]\nsteps = 2\nbatch_size = 2\n")
    wrapper = rank_dirs(tmp_path, texts)
    case = Case(GPT, ["data.train", "node0.h5", "node1.h5", "bytes", "rank 1"], wrapper=wrapper)
    run_case(case, out, previous)


def test_node_local_copies_under_other_paths_are_accepted(tmp_path):
    # Not an error: job scripts copy inputs to node-local scratch, so the paths differ by node while
    # the files are the same (compared by size); output.dir may differ too (only rank 0 writes).
    texts = []
    for r in range(2):
        (tmp_path / f"scratch{r}").mkdir()
        data = h5write(tmp_path / f"scratch{r}" / "d.h5", input_ids=ids())
        texts.append(f"[data]\ntrain = {data}\n[output]\ndir = {tmp_path / f'scratch{r}' / 'out'}\n"
                     "[train]\nsteps = 2\nbatch_size = 2\n")
    cmd = ["mpirun", "-np", "2"] + rank_dirs(tmp_path, texts) + [nr.binary()] + GPT
    p = subprocess.run(cmd, capture_output=True, text=True, env=nr.mpi_env(), timeout=LIMIT_S)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    assert (tmp_path / "scratch0" / "out" / "metrics.jsonl").is_file()


def test_ranks_disagree_one_ini_invalid(tmp_path, previous):
    # rank 1 sees a broken file: its parse fails while rank 0's succeeds; every rank must stop
    data = h5write(tmp_path / "d.h5", input_ids=ids())
    out = tmp_path / "out"
    base = f"[data]\ntrain = {data}\n[output]\ndir = {out}\n[train]\nsteps = 2\nbatch_size = 2\n"
    wrapper = rank_dirs(tmp_path, [base, base + "lr = fast\n"])
    case = Case(GPT, ["input.ini", "train.lr", "fast", "rank 1"], wrapper=wrapper)
    run_case(case, out, previous)
