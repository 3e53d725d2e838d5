"""Errors a new user meets after start-up (the inputs exist and parse, but do not fit together), on 2 ranks
under mpirun: each is printed once, names the key to change, every rank exits non-zero through
MPI_Finalize (no MPI_ABORT or ORTE_ERROR_LOG banner), and a fresh output.dir is left as it was found: a
folder the run created is removed, an empty one stays empty, a used one keeps what it held."""
import subprocess

import h5py
import numpy as np
import pytest

import nlp_run as nr

V = 64
TINY = ["--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16", f"--model.vocab_size={V}",
        "--model.n_positions=16", "--run.threads=1", "--train.steps=2", "--train.batch_size=2"]
BANNERS = ("MPI_ABORT", "MPI_Abort", "ORTE_ERROR_LOG", "PRTE_ERROR_LOG", "show_help")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    nr.pattern_stream(d / "stream.h5", windows=64, seed=3)
    nr.write_rows(d / "rows32.h5", np.random.default_rng(0).integers(0, V, (8, 32)))
    with h5py.File(d / "vocab100.h5", "w") as f:  # a dataset made with a larger tokenizer
        f.create_dataset("tokens", data=np.arange(600, dtype=np.int32) % V)
        f.attrs["vocab_size"] = np.int64(100)
    nr.write_rows(d / "cls.h5", np.random.default_rng(1).integers(0, V, (8, 16)), mask=np.ones((8, 16)),
                  labels=np.arange(8) % 3)
    return d


def mpirun(args, ranks=2):
    cmd = ["mpirun", "-np", str(ranks), nr.binary()] + [str(a) for a in args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=nr.mpi_env())


def once(p, message):
    assert p.returncode != 0, p.stdout
    assert p.stderr.count(message) == 1, p.stderr
    assert p.stderr.count("nlptrain: error") == 1, p.stderr
    for banner in BANNERS:
        assert banner not in p.stderr, p.stderr


CASES = {
    "stream seq_len": (["--data.train={d}/stream.h5", "--data.seq_len=32"],
                       "nlptrain: error: data.train = '{d}/stream.h5': sequence length 32 exceeds model.n_positions = 16 "
                       "(command line): set data.seq_len to at most 16 (now 32, command line), or raise "
                       "model.n_positions to 32"),
    "rows length": (["--data.train={d}/rows32.h5"],
                    "nlptrain: error: data.train = '{d}/rows32.h5': sequence length 32 exceeds model.n_positions = 16 "
                    "(command line): make its rows at most 16 tokens long (the prep tool's --max-seq-len, "
                    "make_dataset.py's --seq-len; data.seq_len must equal the rows' length), or raise "
                    "model.n_positions to 32"),
    "vocab_size": (["--data.train={d}/vocab100.h5"],
                   "nlptrain: error: data.train '{d}/vocab100.h5' has vocab_size = 100 (its root attribute) but the "
                   "model has vocab_size = 64 (command line)"),
    "memory plan": (["--data.train={d}/stream.h5", "--data.seq_len=16", "--run.memory_limit_gb=0.000001"],
                    "nlptrain: error: the memory plan does not fit: "),
    "comm.gpu": (["--data.train={d}/stream.h5", "--data.seq_len=16", "--comm.gpu=nccl"],
                 "nlptrain: error: comm.gpu = nccl needs run.backend = cuda"),
    "global batch": (["--data.train={d}/stream.h5", "--data.seq_len=16",
                      "--train.batch_size=1000"],
                     "nlptrain: error: data.train = '{d}/stream.h5' has 64 examples, fewer than one global batch of "
                     "2000 (2 ranks x train.batch_size = 1000)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_error_after_start_up_is_printed_once_and_removes_the_folder_it_created(case, data, tmp_path):
    extra, message = CASES[case]
    out = tmp_path / "new" / "run"  # two levels the run creates
    p = mpirun(TINY + [a.format(d=data) for a in extra] + [f"--output.dir={out}"])
    once(p, message.format(d=data))
    assert not (tmp_path / "new").exists()


def test_an_empty_folder_stays_empty_and_a_used_one_keeps_its_files(data, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    p = mpirun(TINY + [f"--data.train={data}/rows32.h5", f"--output.dir={empty}"])
    assert p.returncode != 0
    assert empty.is_dir() and list(empty.iterdir()) == []
    # a folder holding a finished run: a bad resume leaves it as it was (its lock file included)
    used = tmp_path / "used"
    nr.run(TINY + [f"--data.train={data}/stream.h5", "--data.seq_len=16", f"--output.dir={used}"])
    before = sorted(p.relative_to(used) for p in used.rglob("*"))
    assert any(p.name == "nlptrain.lock" for p in before)
    p = mpirun(TINY + [f"--data.train={data}/stream.h5", "--data.seq_len=32", "--train.resume=true",
                       f"--output.dir={used}"])
    once(p, "sequence length 32 exceeds model.n_positions = 16")
    assert sorted(p.relative_to(used) for p in used.rglob("*")) == before


def test_a_used_folder_refusal_and_a_held_lock_are_printed_once(data, tmp_path):
    out = tmp_path / "out"
    nr.run(TINY + [f"--data.train={data}/stream.h5", "--data.seq_len=16", f"--output.dir={out}"])
    p = mpirun(TINY + [f"--data.train={data}/stream.h5", "--data.seq_len=16", f"--output.dir={out}"])
    once(p, f"nlptrain: error: output.dir = '{out}' holds another training run")
    assert (out / "summary.json").exists()


def test_a_classifier_label_mismatch_is_printed_once(data, tmp_path):
    """A label outside model.num_labels: found while the data is checked, after start-up."""
    out = tmp_path / "o"
    p = mpirun(["--model.type=bert", "--model.num_hidden_layers=1", "--model.num_attention_heads=2",
                "--model.hidden_size=16", "--model.intermediate_size=32", f"--model.vocab_size={V}",
                "--model.max_position_embeddings=16", "--run.task=doc_cls", "--model.num_labels=2",
                "--run.threads=1", "--train.steps=2", "--train.batch_size=2", f"--data.train={data}/cls.h5",
                f"--output.dir={out}"])
    assert p.returncode != 0
    assert p.stderr.count("nlptrain: error") == 1, p.stderr
    assert (f"nlptrain: error: data.train = '{data}/cls.h5': file '{data}/cls.h5': labels[2] = 2 is out of range "
            f"[0, 2) of model.num_labels = 2 (command line): set model.num_labels to the number of classes") in p.stderr
    for banner in BANNERS:
        assert banner not in p.stderr, p.stderr
    assert not out.exists()


def test_a_bad_prompt_is_printed_once_before_the_output_starts(data, tmp_path):
    weights = tmp_path / "w" / "checkpoints" / "step_00000002.h5"
    nr.run(TINY + [f"--data.train={data}/stream.h5", "--data.seq_len=16", "--checkpoint.interval=2",
                   f"--output.dir={tmp_path / 'w'}"])
    gen = ["--run.mode=generate", f"--model.weights={weights}", "--run.threads=1", "--generate.tokenizer=byte",
           "--generate.max_new_tokens=2"]
    out = tmp_path / "gen"
    p = mpirun(gen + ["--generate.prompt=abc", f"--output.dir={out}"])  # 'a' = 97 >= vocab_size 64
    once(p, "nlptrain: error [rank 0 of 2]: generate.prompt: token id 97 (tokenizer byte) is outside the model's "
            "vocabulary (model.vocab_size = 64)")
    assert not out.exists()
    p = mpirun(gen + ["--generate.prompt=" + "\x01" * 20, f"--output.dir={out}"])
    once(p, "generate.prompt has 20 tokens; model.n_positions = 16 leaves no room to generate")
    assert not out.exists()
    p = mpirun(gen + ["--generate.prompt=\x01", f"--output.dir={out}"])  # a good prompt still generates
    assert p.returncode == 0, p.stderr
    assert (out / "generated.txt").exists()


def test_predict_for_a_language_model_is_a_configuration_error(data, tmp_path):
    p = mpirun(TINY + ["--run.mode=predict", f"--data.eval={data}/stream.h5", f"--output.dir={tmp_path / 'o'}"])
    assert p.returncode == 2
    once(p, "nlptrain: error: run.mode = predict (command line) writes the predictions of run.task = doc_cls, "
            "pair_cls, ner or qa, not run.task = clm (default): use run.mode = eval for its loss, run.mode = "
            "generate for text")
    assert not (tmp_path / "o").exists()
