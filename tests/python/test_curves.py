"""tools/tensorboard_export.py (read back with TensorBoard's own EventAccumulator) and
tools/plot_run.py (a valid PNG with the expected panels), on hand-written metrics.jsonl files with
resumed steps and a cut-off last line, and on a real nlptrain run."""
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nlp_run as nr

TOOLS = nr.SOURCE_DIR / "tools"
sys.path.insert(0, str(TOOLS))


def tool(name, *args, check=True, **kw):
    p = subprocess.run([sys.executable, str(TOOLS / name)] + [str(a) for a in args],
                       capture_output=True, text=True, timeout=300, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def train_rec(step, seed=0.0):
    return {"step": step, "loss": 5.0 / step + seed, "lr": 1e-3 * step / 20, "grad_norm": 0.5 + step / 100,
            "tokens_per_s": 1000.0 + 7 * step, "step_time_s": 0.25 - step / 1000}


def eval_rec(step, seed=0.0):
    return {"step": step, "split": "eval", "loss": 4.0 / step + seed, "perplexity": float(np.exp(4.0 / step + seed)),
            "accuracy": 0.5 + step / 100}


def expected_of(recs):
    """{tag: {step: value}} of the records, the later record of a step winning (what a resumed
    run's metrics.jsonl must export to)."""
    out = {}
    for r in recs:
        if "step" not in r:
            continue
        split = r.get("split", "train")
        for k, v in r.items():
            # numbers only: strings ("run_id") and bools are no scalars (tools/run_metrics.py)
            if k not in ("step", "split") and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(f"{split}/{k}", {})[r["step"]] = v
    return out


def read_events(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    # A tag whose points were all purged (a restarted run) stays listed with no points: left out.
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return {tag: pts for tag, pts in got.items() if pts}


def assert_events_equal(got, expected):
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for tag, by_step in expected.items():
        steps = [s for s, _ in got[tag]]
        assert steps == sorted(by_step), (tag, steps)  # every step once, in order
        np.testing.assert_array_equal(np.float32([v for _, v in got[tag]]),
                                      np.float32([by_step[s] for s in sorted(by_step)]), err_msg=tag)


def lines(recs):
    return "".join(json.dumps(r) + "\n" for r in recs)


@pytest.fixture
def resumed_run(tmp_path):
    """Steps 1-12 with evals at 4 and 8, then a resume from step 8 (steps 9-12 again with other
    values, eval at 12), an eval-mode record without a step, and a line cut off mid-write."""
    d = tmp_path / "seed1"
    d.mkdir()
    first = [r for s in range(1, 13) for r in ([train_rec(s)] + ([eval_rec(s)] if s % 4 == 0 else []))]
    second = [r for s in range(9, 15) for r in ([train_rec(s, 0.01)] + ([eval_rec(s, 0.01)] if s % 4 == 0 else []))]
    tail = [{"split": "eval", "loss": 1.0, "tokens": 100}]
    (d / "metrics.jsonl").write_text(lines(first + second + tail) + '{"step": 15, "loss": 0.3')
    return d, first + second + tail


def test_export_reads_back_through_tensorboard(resumed_run):
    d, recs = resumed_run
    p = tool("tensorboard_export.py", d)
    expected = expected_of(recs)
    assert expected["train/loss"][10] == train_rec(10, 0.01)["loss"]  # the resumed value
    got = read_events(d / "tensorboard")
    assert_events_equal(got, expected)
    assert "eval/perplexity" in got and "train/tokens_per_s" in got and "eval/accuracy" in got
    # Running it again replaces the events instead of duplicating them.
    tool("tensorboard_export.py", d)
    assert_events_equal(read_events(d / "tensorboard"), expected)
    assert len(list((d / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_follow_tails_a_growing_file_with_a_resume(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    logdir = tmp_path / "tb"
    proc = subprocess.Popen([sys.executable, str(TOOLS / "tensorboard_export.py"), d, "--follow",
                             "--interval", "0.1", "--logdir", logdir],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait for the tool to be ready (the writer opened).
        seen = []
        while not any("following" in l for l in seen):
            line = proc.stderr.readline()
            assert line, f"tensorboard_export --follow ended early: {seen}"
            seen.append(line)
        assert any("waiting for" in l for l in seen), seen
        m = d / "metrics.jsonl"

        def wait_for(expected):
            deadline = time.monotonic() + 60
            while True:
                got = read_events(logdir)
                try:
                    assert_events_equal(got, expected)
                    return
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)

        phase1 = [train_rec(s) for s in range(1, 7)] + [eval_rec(6)]
        text = lines(phase1)
        cut = text.rindex('"grad_norm"')  # step 6's line arrives in two pieces
        with open(m, "w") as f:
            f.write(text[:cut])
            f.flush()
            wait_for(expected_of(phase1[:5]))  # the half line is not exported
            f.write(text[cut:])
        wait_for(expected_of(phase1))
        # The job is requeued and resumes from its step-4 checkpoint: steps 5.. come again.
        phase2 = [train_rec(s, 0.02) for s in range(5, 10)] + [eval_rec(8, 0.02)]
        with open(m, "a") as f:
            f.write(lines(phase2))
        wait_for(expected_of(phase1[:4] + phase2))
        # A fresh run (no resume) in the same output.dir truncates metrics.jsonl and starts over:
        # only its points remain. Its last line has no newline yet when the exporter is stopped.
        phase3 = [train_rec(s, 0.05) for s in range(1, 4)] + [eval_rec(3, 0.05)]
        m.write_text(lines(phase3[:-1]))
        wait_for(expected_of(phase3[:-1]))
        with open(m, "a") as f:
            f.write(json.dumps(phase3[-1]))
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0, proc.stderr.read()
    assert_events_equal(read_events(logdir), expected_of(phase3))


def test_export_errors(tmp_path):
    p = tool("tensorboard_export.py", tmp_path / "nope", check=False)
    assert p.returncode == 1 and "nope" in p.stderr and "not found" in p.stderr
    (tmp_path / "empty").mkdir()
    p = tool("tensorboard_export.py", tmp_path / "empty", check=False)
    assert p.returncode == 1 and "metrics.jsonl" in p.stderr and "not found" in p.stderr
    (tmp_path / "empty" / "metrics.jsonl").write_text('{"split": "eval", "loss": 1.0}\n')
    p = tool("tensorboard_export.py", tmp_path / "empty", check=False)
    assert p.returncode == 1 and "no training or evaluation records" in p.stderr
    (tmp_path / "empty" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\nnot json\n{"step": 2}\n')
    p = tool("tensorboard_export.py", tmp_path / "empty", check=False)
    assert p.returncode == 1 and "metrics.jsonl:2" in p.stderr
    for t in ("tensorboard_export.py", "plot_run.py"):
        h = tool(t, "--help")
        assert "RUN_DIR" in h.stdout and "metrics.jsonl" in h.stdout


def test_plot_overlays_runs(resumed_run, tmp_path):
    import matplotlib.image as mpimg
    import plot_run
    from run_metrics import load
    d1, _ = resumed_run
    d2 = tmp_path / "seed2"
    d2.mkdir()
    (d2 / "metrics.jsonl").write_text(lines([train_rec(s, 0.2) for s in range(1, 15)] + [eval_rec(14, 0.2)]))
    out = tmp_path / "plots" / "curves.png"
    p = tool("plot_run.py", d1, d2, "--out", out, "--smooth", "3")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10000
    img = mpimg.imread(out)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500
    assert np.std(img[..., :3]) > 0.01  # not blank
    fig = plot_run.make_figure([("seed1", load(d1)), ("seed2", load(d2))])
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["loss", "eval: perplexity", "eval: accuracy", "learning rate", "throughput"]
    ax = {ax.get_title(): ax for ax in fig.axes}
    assert ax["loss"].get_legend_handles_labels()[1] == ["seed1 train", "seed1 eval", "seed2 train", "seed2 eval"]
    assert ax["throughput"].get_legend_handles_labels()[1] == ["seed1", "seed2"]
    # The plotted training loss of seed1 is the deduplicated, resumed curve.
    x, y = ax["loss"].lines[0].get_data()
    assert list(x) == list(range(1, 15)) and y[9] == train_rec(10, 0.01)["loss"]
    p = tool("plot_run.py", d1, tmp_path / "missing", "--out", out, check=False)
    assert p.returncode == 1 and "missing" in p.stderr


def test_real_run_exports_every_scalar(tmp_path):
    """A short real training run with evaluations: TensorBoard sees every value metrics.jsonl has."""
    rng = np.random.default_rng(3)
    toks = rng.integers(0, 64, size=16 * 40 + 1)
    nr.write_stream(tmp_path / "train.h5", toks[:16 * 30 + 1])
    nr.write_stream(tmp_path / "eval.h5", toks[16 * 30:])
    out = tmp_path / "run"
    nr.run(["--model.n_layer=1", "--model.n_head=2", "--model.n_embd=16", "--model.vocab_size=64",
            "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--train.batch_size=2",
            "--train.steps=6", "--eval.interval=3", f"--data.train={tmp_path / 'train.h5'}",
            f"--data.eval={tmp_path / 'eval.h5'}", f"--output.dir={out}"])
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if l]
    expected = expected_of(recs)
    assert len(expected["train/loss"]) == 6 and sorted(expected["eval/loss"]) == [3, 6]
    tool("tensorboard_export.py", out)
    assert_events_equal(read_events(out / "tensorboard"), expected)
    tool("plot_run.py", out, "--out", tmp_path / "real.png")
    assert (tmp_path / "real.png").stat().st_size > 10000
