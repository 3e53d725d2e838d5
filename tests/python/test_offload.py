"""train.offload = optimizer (README "Scaling out"): each rank's fp32 master weights and AdamW moments
(its shard with train.zero = 1) live in host memory and a host AdamW updates them (train/host_adamw.h).
On the CPU backend the host AdamW is bitwise the backend's, so an offloaded run equals the same run
without offload bit for bit: losses, gradient norms, and the checkpoint's weights and moments, over
20 steps with grad_accum and active clipping, on 1 and 2 ranks, with and without ZeRO-1, and with the
bf16 weight copy (which the copy back into the arena refreshes). A checkpoint resumes with and without
offload onto the uninterrupted run, bitwise. summary.json and the memory plan name the host part."""
import json

import numpy as np
import pytest

import nlp_run as nr
from test_zero import checkpoint, cut_at

TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=10",
        "--train.lr=3e-3", "--train.warmup_steps=5", "--train.schedule=cosine", "--train.clip=0.5",
        "--train.batch_size=2", "--train.grad_accum=2", "--train.steps=20", "--checkpoint.interval=10",
        "--checkpoint.keep=5"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("offload")
    return [f"--data.train={nr.pattern_stream(d / 'train.h5', windows=256, seed=13)}"]


def log_rows(out):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in nr.metrics(out)[0]]


def assert_same_checkpoint(a, b):
    assert sorted(a) == sorted(b)
    assert len([k for k in a if k.startswith("optimizer/exp_avg")]) > 10
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.shape == y.shape and x.dtype == y.dtype, k
        assert x.tobytes() == y.tobytes(), k


CASES = {"1rank": (1, []), "2ranks": (2, []), "2ranks_zero1": (2, ["--train.zero=1", "--comm.bucket_mb=0.01"]),
         "2ranks_zero1_bf16": (2, ["--train.zero=1", "--train.precision=bf16", "--run.cpu_bf16=emulate",
                                   "--run.bf16_weights=true"])}


@pytest.mark.parametrize("case", sorted(CASES))
def test_offload_equals_no_offload_bitwise(data, case, tmp_path):
    ranks, keys = CASES[case]
    outs = {}
    for off in ("none", "optimizer"):
        outs[off] = tmp_path / off
        nr.run(data + TINY + keys + [f"--train.offload={off}", f"--output.dir={outs[off]}"], ranks=ranks,
               timeout=300)
    a, b = log_rows(outs["none"]), log_rows(outs["optimizer"])
    assert [r[0] for r in a] == list(range(1, 21))
    assert a == b  # bitwise: the records hold the doubles exactly
    assert max(r[2] for r in a) > 0.5  # clipping acted
    for step in (10, 20):
        assert_same_checkpoint(checkpoint(outs["none"], step), checkpoint(outs["optimizer"], step))

    s0 = json.loads((outs["none"] / "summary.json").read_text())
    s1 = json.loads((outs["optimizer"] / "summary.json").read_text())
    assert s0["offload"] == "none" and s0["optimizer_host_bytes_per_rank"] == 0
    assert s1["offload"] == "optimizer"
    # master weights, m, v and the gradient copy of this rank's range: twice the moments' bytes
    assert s1["optimizer_host_bytes_per_rank"] == 2 * s1["optimizer_state_bytes_per_rank"] > 0
    plan0, plan1 = s0["memory_plan"], s1["memory_plan"]
    assert plan1["optimizer_bytes"] == 0 and plan0["offload_host_bytes"] == 0
    # the plan's host part is the largest shard's (rank 0's): what summary.json reports for rank 0
    assert plan1["offload_host_bytes"] == s1["optimizer_host_bytes_per_rank"]
    assert plan1["offload_host_bytes"] == 2 * plan0["optimizer_bytes"]
    log = (outs["optimizer"] / "log.txt").read_text()
    assert "train.offload = optimizer: the fp32 master weights" in log, log[:3000]
    assert "offloaded to the host (train.offload = optimizer" in log, log[:3000]


def test_checkpoints_resume_with_and_without_offload_bitwise(data, tmp_path):
    keys = ["--train.zero=1"]
    straight = tmp_path / "straight"
    nr.run(data + TINY + keys + ["--train.offload=optimizer", f"--output.dir={straight}"], ranks=2, timeout=300)
    ref = log_rows(straight)
    for written, resumed in (("optimizer", "optimizer"), ("optimizer", "none"), ("none", "optimizer")):
        src = straight
        if written == "none":
            src = tmp_path / "plain"
            nr.run(data + TINY + keys + ["--train.offload=none", f"--output.dir={src}"], ranks=2, timeout=300)
        out = tmp_path / f"{written}_to_{resumed}"
        cut_at(src, out, 10)
        nr.run(data + TINY + keys + [f"--train.offload={resumed}", "--train.resume=true", f"--output.dir={out}"],
               ranks=2, timeout=300)
        assert log_rows(out) == ref, (written, resumed)
        assert_same_checkpoint(checkpoint(out, 20), checkpoint(straight, 20))
