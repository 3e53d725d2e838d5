"""`nlptrain INI --check` says what it checked: the configuration resolved as the run resolves it (the
model's shape and label count from model.weights' attributes and classifier, the datasets' layout),
each value marked with its source (the INI, the command line, a preset or the default, the weights, the
data); every input file opened (headers and attributes only), a missing one or a wrong layout an error
(exit 1, printed once on 2 ranks); what it cannot check without running listed in one line. The weights
are an nlptrain checkpoint of a tiny BERT classifier (hidden 16, vocabulary 100, 3 labels), so that
every value --check reports differs from the default it would show without the weights."""
import subprocess

import numpy as np
import pytest

import nlp_run as nr

BERT = ["--model.type=bert", "--run.task=doc_cls", "--run.threads=1"]
SHAPE = ["--model.num_hidden_layers=1", "--model.num_attention_heads=2", "--model.hidden_size=16",
         "--model.intermediate_size=32", "--model.vocab_size=100", "--model.max_position_embeddings=32"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("check")
    rng = np.random.default_rng(0)
    nr.write_rows(d / "cls.h5", rng.integers(0, 100, (8, 16)), mask=np.ones((8, 16)), labels=np.arange(8) % 3)
    nr.write_rows(d / "long.h5", rng.integers(0, 100, (8, 64)), mask=np.ones((8, 64)), labels=np.arange(8) % 3)
    nr.run(BERT + SHAPE + ["--model.num_labels=3", "--train.steps=1", "--train.batch_size=2",
                           "--checkpoint.interval=1", f"--data.train={d / 'cls.h5'}", f"--output.dir={d / 'run'}"])
    return d, d / "run" / "checkpoints" / "step_00000001.h5"


def check(args, ranks=1):
    cmd = ["mpirun", "-np", str(ranks), nr.binary()] + [str(a) for a in args] + ["--check"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=nr.mpi_env())


def test_check_shows_the_values_the_run_takes_from_the_weights_and_the_data(files, tmp_path):
    d, weights = files
    p = check(BERT + [f"--model.weights={weights}", f"--data.train={d / 'cls.h5'}", "--train.lr=1e-4",
                      f"--output.dir={tmp_path / 'o'}"])
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for line in ("vocab_size = 100    # the weights '{w}'", "hidden_size = 16    # the weights '{w}'",
                 "num_hidden_layers = 1    # the weights '{w}'", "max_position_embeddings = 32    # the weights '{w}'",
                 "num_labels = 3    # from 'classifier.weight' of shape [3, 16] in weights file '{w}'",
                 "lr = 1e-04    # command line", "batch_size = 8    # default"):
        assert line.format(w=weights) + "\n" in out, out
    assert f"#   data.train = '{d / 'cls.h5'}': 8 rows of 16 tokens (data.seq_len = 0: the rows' length), " \
           f"labels [examples]\n" in out
    assert f"#   model.weights = '{weights}': model_type bert" in out
    assert "# not checked without running: the datasets' values (ids, masks, labels in range), the weights' " \
           "tensors" in out
    assert not (tmp_path / "o").exists()  # nothing written


def test_check_marks_ini_and_preset_values(files, tmp_path):
    d, _ = files
    ini = tmp_path / "job.ini"
    ini.write_text(f"[model]\ntype = bert\npreset = bert-base\n[run]\ntask = doc_cls\n[data]\ntrain = {d / 'cls.h5'}\n"
                   "[train]\nsteps = 7\n", encoding="utf-8")
    p = check([ini, "--model.vocab_size=100", "--model.max_position_embeddings=32", "--model.num_labels=3"])
    assert p.returncode == 0, p.stderr
    assert f"steps = 7    # config file '{ini}'" in p.stdout, p.stdout
    assert "hidden_size = 768    # model.preset = bert-base" in p.stdout, p.stdout
    assert "vocab_size = 100    # command line" in p.stdout


def test_check_fails_on_a_missing_weights_file_and_a_wrong_layout_once(files, tmp_path):
    d, _ = files
    missing = tmp_path / "w.h5"
    p = check(BERT + [f"--model.weights={missing}", f"--data.train={d / 'cls.h5'}"], ranks=2)
    assert p.returncode == 1
    assert p.stderr.count(f"nlptrain: error: model.weights = '{missing}' (command line): file not found") == 1, p.stderr
    assert p.stdout == ""
    # rows longer than the model's positions: found from the headers, naming the key to change
    p = check(BERT + SHAPE + ["--model.num_labels=3", f"--data.train={d / 'long.h5'}"], ranks=2)
    assert p.returncode == 1
    assert p.stderr.count("nlptrain: error") == 1, p.stderr
    assert (f"data.train = '{d / 'long.h5'}': sequence length 64 exceeds model.max_position_embeddings = 32 "
            f"(command line): make its rows at most 32 tokens long") in p.stderr
    for banner in ("MPI_ABORT", "ORTE_ERROR_LOG"):
        assert banner not in p.stderr
    # a dataset without the task's labels
    nr.write_rows(tmp_path / "nolabels.h5", np.zeros((4, 16), np.int32))
    p = check(BERT + SHAPE + ["--model.num_labels=3", f"--data.train={tmp_path / 'nolabels.h5'}"])
    assert p.returncode == 1 and "run.task = doc_cls needs 1-D 'labels' [examples]" in p.stderr, p.stderr
    # a configuration error is still exit code 2, before any file is opened
    p = check(BERT + ["--train.steps=many", f"--model.weights={missing}"])
    assert p.returncode == 2 and "train.steps" in p.stderr and "file not found" not in p.stderr
