"""run.cuda_graph: each training micro-batch's forward and backward launch as one CUDA graph
wherever its calls repeat an earlier micro-batch's (backend/step_graph.h).

On the CPU the recording is emulated (NLPTRAIN_STEP_GRAPH_EMULATE=1: the calls are kept and made again
with each replay's seeds and loss scale), which checks the trainer's side of it here: which
micro-batches replay, the reduction after the backward, the log and summary.json, and that a replayed
run is bitwise the eager one (every step's loss and gradient norm), dropout on. The CUDA test runs the
real graphs against eager launches on a GPU and skips here.
"""
import numpy as np
import pytest

import nlp_run as nr
from test_packing import ROWS, SHORT
from test_padding import DROPOUT, MODEL, summary, task_data, write

FIXED = ROWS + ["--data.pack_fixed_examples=true", "--train.batch_size=4", "--train.seed=7", "--train.lr=1e-3"]


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv("NLPTRAIN_STEP_GRAPH_EMULATE", "1")


def run(task, data, out, extra, steps=5):
    return nr.run(MODEL + DROPOUT + [f"--run.task={task}", f"--data.train={data}", f"--output.dir={out}",
                                     f"--train.steps={steps}", *FIXED, *extra])


def curves(out):
    rows = nr.metrics(out)[0]
    return [(r["loss"], r["grad_norm"], r["examples"]) for r in rows]


@pytest.mark.parametrize("task,accum,ranks", [("doc_cls", 2, 1), ("qa", 1, 1), ("pair_cls", 1, 2), ("ner", 1, 1)])
def test_replayed_micro_batches_train_bitwise_as_eager(task, accum, ranks, emulate, tmp_path, report):
    _, cols, attrs = task_data(task, np.random.default_rng(150 + len(task)), n=240, **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    extra = [f"--train.grad_accum={accum}", "--comm.overlap=true"]
    args = lambda out, more: MODEL + DROPOUT + [  # noqa: E731
        f"--run.task={task}", f"--data.train={data}", f"--output.dir={out}", "--train.steps=5", *FIXED, *extra, *more]
    nr.run(args(tmp_path / "eager", []), ranks=ranks)
    p = nr.run(args(tmp_path / "graph", ["--run.cuda_graph=true"]), ranks=ranks)
    assert "run.cuda_graph: each training micro-batch launches as one recording (emulated on the cpu)" in p.stdout
    if ranks > 1:
        assert "the gradient sums run after the backward (comm.overlap does not apply)" in p.stdout
    a, b = curves(tmp_path / "graph"), curves(tmp_path / "eager")
    assert len(a) == 5 and a == b, (a, b)  # every step's loss and gradient norm, bitwise
    g = summary(tmp_path / "graph")["cuda_graph"]
    n = 5 * accum
    # the first micro-batch of the shape eagerly, the second recorded, every later one replayed
    assert g.pop("check_us") > 0, g
    assert g == {"replayed": n - 2, "recorded": 1, "eager": 1, "failed_recordings": 0,
                 "dropped_recordings": 0, "eager_reasons": {"the first micro-batch of its shape": 1}}, g
    assert "us on the host" in p.stdout
    assert summary(tmp_path / "eager")["cuda_graph"] is None
    report(f"{task} packed rows with fixed examples, {ranks} rank(s) x accum {accum}, 5 steps: "
           f"{g['replayed']} of {n} micro-batches replayed, losses and gradient norms bitwise the eager run's")


@pytest.mark.parametrize("name,extra,ranks", [
    ("recompute", ["--train.recompute=block"], 1),
    ("eval", ["--eval.interval=2", "--eval.batches=2"], 1),
    ("zero", ["--train.zero=1", "--train.clip=0.01"], 2),
    ("checkpoint", ["--checkpoint.interval=2"], 1)])
def test_replays_with_recompute_evaluation_zero_and_checkpoints(name, extra, ranks, emulate, tmp_path):
    # what runs between micro-batches (evaluation, checkpoints, ZeRO's sharded update and gather,
    # clipping) passes through; block recompute is part of the recorded backward
    _, cols, attrs = task_data("doc_cls", np.random.default_rng(155), n=240, **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    if name == "eval":
        extra = extra + [f"--data.eval={data}"]
    for g in ("false", "true"):
        nr.run(MODEL + DROPOUT + ["--run.task=doc_cls", f"--data.train={data}", f"--output.dir={tmp_path / g}",
                                  "--train.steps=6", *FIXED, *extra, f"--run.cuda_graph={g}"], ranks=ranks)
    assert curves(tmp_path / "true") == curves(tmp_path / "false")
    assert summary(tmp_path / "true")["cuda_graph"]["replayed"] == 4


def test_shapes_that_vary_run_eagerly(emulate, tmp_path):
    # without fixed examples the heads' example count changes with each micro-batch
    _, cols, attrs = task_data("doc_cls", np.random.default_rng(160), n=240, **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    base = MODEL + DROPOUT + ["--run.task=doc_cls", f"--data.train={data}", "--train.steps=4", *ROWS,
                              "--train.batch_size=4", "--train.seed=7"]
    nr.run(base + [f"--output.dir={tmp_path / 'eager'}"])
    p = nr.run(base + [f"--output.dir={tmp_path / 'graph'}", "--run.cuda_graph=true"])
    assert curves(tmp_path / "graph") == curves(tmp_path / "eager")
    g = summary(tmp_path / "graph")["cuda_graph"]
    # steps whose example counts happen to repeat an earlier one's may replay; the others launch eagerly
    assert g["replayed"] + g["recorded"] + g["eager"] == 4, g
    assert g["eager_reasons"]["the first micro-batch of its shape"] >= 2, g
    assert (f"{g['replayed']} replayed a recording, {g['recorded']} were recorded, {g['eager']} ran eagerly "
            "(the first micro-batch of its shape: ") in p.stdout, p.stdout


def test_gpt2_windows_replay(emulate, tmp_path):
    # clm: every window has the file's length, so every micro-batch has one shape
    path = tmp_path / "s.h5"
    nr.pattern_stream(path, windows=64, seed=3)
    base = ["--model.type=gpt2", "--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
            "--model.n_positions=32", "--data.seq_len=16", "--run.task=clm", f"--data.train={path}",
            "--train.batch_size=4", "--train.steps=4", "--train.seed=3", "--run.threads=1"]
    nr.run(base + [f"--output.dir={tmp_path / 'eager'}"])
    nr.run(base + [f"--output.dir={tmp_path / 'graph'}", "--run.cuda_graph=true"])
    a = [(r["loss"], r["grad_norm"]) for r in nr.metrics(tmp_path / "graph")[0]]
    assert a == [(r["loss"], r["grad_norm"]) for r in nr.metrics(tmp_path / "eager")[0]]
    assert summary(tmp_path / "graph")["cuda_graph"]["replayed"] == 2


def test_config_errors(tmp_path):
    _, cols, attrs = task_data("doc_cls", np.random.default_rng(161), n=40, **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    base = MODEL + ["--run.task=doc_cls", f"--data.train={data}", f"--output.dir={tmp_path / 'o'}", "--train.steps=1"]
    p = nr.run(base + ["--run.cuda_graph=true"], check=False)
    assert p.returncode != 0
    assert "run.cuda_graph = true (command line) needs run.backend = cuda (now cpu, default)" in p.stdout + p.stderr
    p = nr.run(base + ["--run.cuda_graph=true", "--run.backend=cuda", "--run.profile=true"], check=False)
    assert p.returncode != 0
    assert ("run.cuda_graph = true (command line) cannot be combined with run.profile = true (command line)"
            in p.stdout + p.stderr)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_graphs_train_bitwise_as_eager_launches(precision, tmp_path, report):
    nr.cuda_device_or_skip("run.cuda_graph's CUDA graphs are")
    _, cols, attrs = task_data("doc_cls", np.random.default_rng(170), n=240, **SHORT)
    data = write(tmp_path / "d.h5", cols, attrs)
    extra = ["--run.backend=cuda", f"--train.precision={precision}", "--train.grad_accum=2"]
    run("doc_cls", data, tmp_path / "eager", extra)
    run("doc_cls", data, tmp_path / "graph", extra + ["--run.cuda_graph=true"])
    a, b = curves(tmp_path / "graph"), curves(tmp_path / "eager")
    g = summary(tmp_path / "graph")["cuda_graph"]
    report(f"cuda {precision}, doc_cls packed with fixed examples, 5 steps x accum 2: {g}; losses equal: {a == b}")
    # 10 micro-batches: the first eagerly, the second recorded; the step's end (the gradient norm's
    # reduction) may grow the backend's workspace once, which drops the recording (recorded again)
    assert g["replayed"] >= 6 and g["failed_recordings"] == 0 and g["dropped_recordings"] <= 1, g
    assert a == b, (a, b)
