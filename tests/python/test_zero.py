"""ZeRO-1 (train.zero = 1, README "Scaling out"): the gradient is reduce-scattered (after the backward,
or in buckets during it with comm.overlap), each rank runs AdamW on its 1/N shard of the parameters and
moments, and the parameters are all-gathered. Losses and
gradient norms (clipping by the global norm over the shards is active here) equal train.zero = 0 within
1e-6 over 50 steps on 2 and 4 ranks; summary.json and the log show the optimizer state per rank falling
by N. Checkpoints hold the full Hugging Face layout: a ZeRO checkpoint equals the one written without
ZeRO, resumes without ZeRO (and a plain checkpoint with ZeRO) onto the uninterrupted run, and resumes on
another world size."""
import json
import shutil

import h5py
import numpy as np
import pytest

import nlp_run as nr

TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=10",
        "--train.lr=3e-3", "--train.warmup_steps=5", "--train.schedule=cosine", "--train.clip=0.5"]
# Dropout off where world sizes are compared: its masks are drawn per rank.
NO_DROPOUT = ["--model.embd_pdrop=0", "--model.attn_pdrop=0", "--model.resid_pdrop=0"]
# fp32 summation order only (reduce-scatter or per-owner reduce against bucketed allreduce, norm over
# shards).
TOL = 1e-6


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("zero")
    # The batch shape in an INI file, as a job would set it: on resume at another world size it is
    # adjusted to keep the global batch (keys given on the command line would be used as given).
    (d / "run.ini").write_text("[train]\nbatch_size = 2\n")
    return [d / "run.ini", f"--data.train={nr.pattern_stream(d / 'train.h5', windows=256, seed=11)}"]


def train_log(out):
    rows = nr.metrics(out)[0]
    return {r["step"]: (r["loss"], r["grad_norm"]) for r in rows}


def assert_close(a, b, steps):
    assert sorted(a) == sorted(b) and len(a) == steps, (sorted(a), sorted(b))
    for s in a:
        for x, y, what in zip(a[s], b[s], ("loss", "grad_norm")):
            assert abs(x - y) <= TOL * abs(y), f"step {s} {what}: {x!r} vs {y!r} ({abs(x - y) / abs(y):.2e})"


# ZeRO-1 with comm.overlap: 0.01 MB buckets (2621 floats) go out during the backward, several per
# block, and some straddle the boundary between two ranks' ranges (each part reduced to its owner).
ZERO_RUNS = {"zero0": ["--train.zero=0"],
             "zero1": ["--train.zero=1", "--comm.overlap=false"],
             "zero1_overlap": ["--train.zero=1", "--comm.overlap=true", "--comm.bucket_mb=0.01"]}


@pytest.mark.parametrize("ranks", [2, 4])
def test_losses_equal_zero0_and_optimizer_memory_falls_by_n(data, ranks, tmp_path):
    outs = {}
    for name, keys in ZERO_RUNS.items():
        outs[name] = tmp_path / name
        nr.run(data + TINY + ["--train.steps=50", f"--output.dir={outs[name]}"] + keys, ranks=ranks,
               timeout=300)
    l0 = train_log(outs["zero0"])
    for name in ("zero1", "zero1_overlap"):
        assert_close(train_log(outs[name]), l0, 50)
    # clipping was active: the global norm over the shards is what the clip acted on
    assert max(v[1] for v in l0.values()) > 0.5

    s0 = json.loads((outs["zero0"] / "summary.json").read_text())
    full = s0["optimizer_state_bytes_per_rank"]
    assert s0["zero"] == 0 and s0["comm_overlap"] is True
    assert s0["memory_plan"]["optimizer_bytes"] == full
    for name in ("zero1", "zero1_overlap"):
        s1 = json.loads((outs[name] / "summary.json").read_text())
        assert s1["zero"] == 1
        assert full == s0["optimizer_state_bytes_total"] == s1["optimizer_state_bytes_total"]
        # 1/N of the arena, each range rounded up to 16 floats (64 bytes) for two moments
        assert full / ranks <= s1["optimizer_state_bytes_per_rank"] <= full / ranks + 2 * 16 * 4, (full, s1)
        assert s1["memory_plan"]["zero"] == 1 and s1["memory_plan"]["optimizer_shards"] == ranks
        assert s1["memory_plan"]["optimizer_bytes"] == s1["optimizer_state_bytes_per_rank"]
        assert s1["comm_overlap"] is (name == "zero1_overlap"), (name, s1["comm_overlap"])
        log = (outs[name] / "log.txt").read_text()
        assert f"train.zero = 1: shard [0, " in log and f"1/{ranks} of the" in log, log[:3000]
        mode = "ZeRO-1, overlapped" if name == "zero1_overlap" else "ZeRO-1)"
        assert f"(gradients: mpi, {mode}" in log, log[:3000]


def checkpoint(out, step):
    with h5py.File(out / "checkpoints" / f"step_{step:08d}.h5", "r") as f:
        got = {}
        f.visititems(lambda n, o: got.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return got


def cut_at(out, dest, step):
    """The folder as a job stopped after the checkpoint at `step` left it."""
    shutil.copytree(out, dest)
    for f in (dest / "checkpoints").glob("step_*.h5"):
        if f.name != f"step_{step:08d}.h5":
            f.unlink()
    lines = (dest / "metrics.jsonl").read_text().splitlines()
    (dest / "metrics.jsonl").write_text("".join(l + "\n" for l in lines if json.loads(l).get("step", 0) <= step))
    (dest / "summary.json").unlink()


def test_checkpoints_are_full_and_resume_across_zero_and_world_size(data, tmp_path):
    common = data + TINY + NO_DROPOUT + ["--train.steps=20", "--checkpoint.interval=10",
                     "--checkpoint.keep=5"]
    runs = {}
    for z in (0, 1):
        runs[z] = tmp_path / f"full{z}"
        nr.run(common + [f"--train.zero={z}", f"--output.dir={runs[z]}"], ranks=2, timeout=300)

    # gathered on write: the ZeRO checkpoint has every tensor and moment, equal to the plain one's
    c0, c1 = checkpoint(runs[0], 10), checkpoint(runs[1], 10)
    assert sorted(c0) == sorted(c1)
    moments = [k for k in c0 if k.startswith("optimizer/exp_avg")]
    assert len(moments) > 10
    for k in c0:
        a, b = np.asarray(c0[k]), np.asarray(c1[k])
        assert a.shape == b.shape and a.dtype == b.dtype, k
        if a.dtype.kind == "f":
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7, err_msg=k)

    # sharded on read: each checkpoint resumes with the other setting onto the uninterrupted run
    for written, resumed in ((1, 0), (0, 1)):
        out = tmp_path / f"written{written}_resumed{resumed}"
        cut_at(runs[written], out, 10)
        nr.run(common + [f"--train.zero={resumed}", "--train.resume=true", f"--output.dir={out}"],
               ranks=2, timeout=300)
        assert_close(train_log(out), train_log(runs[resumed]), 20)

    # another world size: 2 ranks x batch 2 resumed on 4 ranks keeps the global batch (batch 1)
    out = tmp_path / "world4"
    cut_at(runs[1], out, 10)
    nr.run(common + ["--train.zero=1", "--train.resume=true", f"--output.dir={out}"], ranks=4, timeout=300)
    got, ref = train_log(out), train_log(runs[1])
    assert sorted(got) == list(range(1, 21))
    for s in range(11, 21):  # the same batches, summed in another order: close, not bitwise
        assert abs(got[s][0] - ref[s][0]) <= 1e-5 * abs(ref[s][0]), (s, got[s], ref[s])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["zero"] == 1 and summary["resume_world"] is not None


def test_nonfinite_skip_is_decided_alike_on_every_shard(data, tmp_path):
    """A NaN injected into the gradient lands in rank 0's shard only; the global norm over the shards is
    NaN on every rank, so every rank skips the update: the run equals train.zero = 0 step for step."""
    logs = {}
    for z in (0, 1):
        out = tmp_path / f"zero{z}"
        nr.run(data + TINY + ["--train.steps=6", f"--train.zero={z}", "--train.nonfinite=skip",
                              "--debug.inject_nonfinite_step=3", f"--output.dir={out}"], ranks=2, timeout=120)
        rows = nr.metrics(out)[0]
        assert [r.get("skipped", False) for r in rows] == [False, False, True, False, False, False], rows
        logs[z] = [r["loss"] for r in rows]
    assert logs[0] == logs[1], logs
