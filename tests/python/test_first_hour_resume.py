"""Resuming a finished or extended run, as a new user does it: a no-op resume (`--train.resume=true` on a
finished run with the same train.steps) leaves the run's results as they were and says so; a resume with
a larger train.steps says that the lr schedule is stretched, with both schedules' lr at the resume step,
and train.schedule_steps extends a run without stretching its schedule. The lr values are checked
against the schedule's formula written out here (linear warmup (step+1)/warmup, then cosine decay to
lr * min_lr_ratio at the schedule's end), not against the program's own output."""
import json
import math
import re
from pathlib import Path

import pytest

import nlp_run as nr

LR, WARMUP = 3e-3, 2
TINY = ["--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=1",
        "--train.batch_size=2", f"--train.lr={LR}", f"--train.warmup_steps={WARMUP}", "--train.schedule=cosine",
        "--checkpoint.interval=5"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    return nr.pattern_stream(tmp_path_factory.mktemp("data") / "train.h5", windows=96, seed=5)


def args(stream, out, steps, extra=()):
    return TINY + [f"--data.train={stream}", f"--output.dir={out}", f"--train.steps={steps}"] + list(extra)


def cosine_lr(step, length, lr=LR, warmup=WARMUP, min_ratio=0.0):
    """lr of the 0-based step on a cosine schedule of `length` steps."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(max((step - warmup) / (length - warmup), 0.0), 1.0)
    return lr * min_ratio + (lr - lr * min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def lrs(out):
    return {r["step"]: r["lr"] for r in map(json.loads, (Path(out) / "metrics.jsonl").read_text().splitlines())
            if r.get("split") is None and "lr" in r}


def test_a_no_op_resume_leaves_the_finished_runs_results(stream, tmp_path):
    out = tmp_path / "out"
    nr.run(args(stream, out, 10))
    kept = {name: (out / name).read_bytes() for name in ("summary.json", "config.ini", "metrics.jsonl")}
    summary = json.loads(kept["summary.json"])
    assert summary["timed_steps"] > 0 and summary["tokens_per_s"] > 0
    for ranks in (1, 2):
        p = nr.run(args(stream, out, 10, ["--train.resume=true"]), ranks=ranks)
        line = ("nothing to do: already at step 10 of train.steps = 10; summary.json and config.ini are left as the "
                "run that reached it wrote them")
        assert line in p.stdout
        assert line in (out / "log.txt").read_text()
        for name, before in kept.items():
            assert (out / name).read_bytes() == before, name
        assert sorted(p.name for p in (out / "checkpoints").glob("step_*.h5")) == ["step_00000005.h5",
                                                                                  "step_00000010.h5"]


def test_a_larger_train_steps_on_resume_says_the_schedule_is_stretched(stream, tmp_path):
    out = tmp_path / "out"
    nr.run(args(stream, out, 10))
    p = nr.run(args(stream, out, 20, ["--train.resume=true"]))
    now, was = cosine_lr(10, 20), cosine_lr(10, 10)
    m = re.search(r"train\.resume: the lr schedule now ends at step 20 \(train\.steps = 20, command line\), not at "
                  r"step 10 as in the run that wrote the checkpoint: the cosine schedule is stretched; lr at step 11 "
                  r"is (\S+) on this schedule, (\S+) on the checkpoint's \(to keep that one: "
                  r"train\.schedule_steps = 10\)", p.stdout)
    assert m, p.stdout
    assert float(m[1]) == pytest.approx(now, rel=1e-3) and float(m[2]) == pytest.approx(was, abs=1e-9)
    assert m[0] in (out / "log.txt").read_text()
    got = lrs(out)
    for step in range(11, 21):  # the stretched schedule from step 11 on (metrics' step = steps done)
        assert got[step] == pytest.approx(cosine_lr(step - 1, 20), rel=1e-5, abs=1e-9), step
    # the same resume without a larger train.steps says nothing of the schedule
    out2 = tmp_path / "same"
    nr.run(args(stream, out2, 5, ["--train.schedule_steps=10"]))
    p = nr.run(args(stream, out2, 10, ["--train.resume=true"]))
    assert "the lr schedule now ends" not in p.stdout


def test_schedule_steps_extends_a_run_without_stretching_it(stream, tmp_path):
    out, ref = tmp_path / "out", tmp_path / "ref"
    nr.run(args(stream, out, 10))
    p = nr.run(args(stream, out, 16, ["--train.resume=true", "--train.schedule_steps=10", "--train.min_lr_ratio=0.1"]))
    assert "the lr schedule now ends" not in p.stdout
    got = lrs(out)
    for step in range(1, 11):
        assert got[step] == pytest.approx(cosine_lr(step - 1, 10), rel=1e-5, abs=1e-9), step
    for step in range(11, 17):  # past its end the schedule stays at lr * min_lr_ratio
        assert got[step] == pytest.approx(0.1 * LR, rel=1e-5), step
    # a run of 16 steps with a schedule of 10 follows the same schedule from the start
    nr.run(args(stream, ref, 16, ["--train.schedule_steps=10", "--train.min_lr_ratio=0.1"]))
    for step, value in lrs(ref).items():
        assert value == pytest.approx(cosine_lr(step - 1, 10, min_ratio=0.1), rel=1e-5), step


def test_schedule_steps_is_validated(stream, tmp_path):
    p = nr.run(args(stream, tmp_path / "o", 10, ["--train.schedule_steps=2"]), check=False)
    assert p.returncode == 2
    assert ("train.schedule_steps = 2 (command line) must exceed train.warmup_steps = 2 (command line): the cosine "
            "decay would never start") in p.stderr
    p = nr.run(args(stream, tmp_path / "o", 10, ["--train.schedule_steps=-1"]), check=False)
    assert p.returncode == 2 and "train.schedule_steps" in p.stderr
    assert not (tmp_path / "o").exists()
