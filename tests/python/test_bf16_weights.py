"""run.bf16_weights (a persistent bf16 copy of the weights that the GEMMs read, written by AdamW and
refreshed after loading, resume and the ZeRO all-gather) and run.profile's account, end to end on the
CPU backend with train.precision = bf16:
 - a GPT-2 run with the copy gives bitwise the losses and checkpoints (weights and AdamW moments) of
   the same run without it: the copy is the rounding the per-call casts make, at every step;
 - a run resumed from a checkpoint with the copy on continues bitwise onto the uninterrupted run
   without it (the copy is refreshed from the loaded weights);
 - with train.zero = 1 on 2 ranks (each rank's AdamW writes its shard's copy, the all-gather's part is
   refreshed) likewise bitwise against the same run without the copy;
 - the memory plan counts the copy (2 bytes a parameter);
 - run.profile writes the account into the log and summary.json, which bench/gpu/account.py reads."""
import json
import shutil
import subprocess

import h5py
import numpy as np
import pytest

import nlp_run as nr

TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=1",
        "--train.lr=3e-3", "--train.warmup_steps=2", "--train.clip=0.5", "--train.batch_size=2",
        "--train.precision=bf16", "--run.cpu_bf16=emulate"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16w")
    return [f"--data.train={nr.pattern_stream(d / 'train.h5', windows=128, seed=5)}"]


def losses(out):
    return [(r["step"], r["loss"], r["grad_norm"]) for r in nr.metrics(out)[0]]


def checkpoint(out, step):
    with h5py.File(out / "checkpoints" / f"step_{step:08d}.h5", "r") as f:
        got = {}
        f.visititems(lambda n, o: got.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
        return got


def assert_bitwise(a, b):
    assert sorted(a) == sorted(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.dtype.kind == "f":
            assert x.shape == y.shape and x.tobytes() == y.tobytes(), k
        else:
            assert np.array_equal(x, y), k


def test_copy_on_equals_off_bitwise_and_resumes(data, tmp_path):
    common = data + TINY + ["--train.steps=12", "--checkpoint.interval=6", "--checkpoint.keep=5"]
    outs = {}
    for on in (False, True):
        outs[on] = tmp_path / f"on{int(on)}"
        p = nr.run(common + [f"--output.dir={outs[on]}", f"--run.bf16_weights={str(on).lower()}"])
        log = (outs[on] / "log.txt").read_text()
        assert ("weights: persistent bf16 copy (run.bf16_weights)" in log) == on, log[:3000]
    assert losses(outs[True]) == losses(outs[False])
    assert len(losses(outs[True])) == 12
    for step in (6, 12):
        assert_bitwise(checkpoint(outs[True], step), checkpoint(outs[False], step))
    # the memory plan counts the copy: 2 bytes a parameter
    s_on = json.loads((outs[True] / "summary.json").read_text())["memory_plan"]
    s_off = json.loads((outs[False] / "summary.json").read_text())["memory_plan"]
    assert s_off["bf16_weights_bytes"] == 0
    assert s_on["bf16_weights_bytes"] == s_on["weights_bytes"] - s_off["weights_bytes"] > 0
    assert s_on["bf16_weights_bytes"] * 2 == s_off["weights_bytes"]

    # resume at step 6 with the copy on: the loaded weights' copy, then bitwise onto the run without it
    cut = tmp_path / "cut"
    shutil.copytree(outs[True], cut)
    (cut / "checkpoints" / "step_00000012.h5").unlink()
    (cut / "summary.json").unlink()
    lines = (cut / "metrics.jsonl").read_text().splitlines()
    (cut / "metrics.jsonl").write_text("".join(l + "\n" for l in lines if json.loads(l).get("step", 0) <= 6))
    nr.run(common + [f"--output.dir={cut}", "--run.bf16_weights=true", "--train.resume=true"])
    assert "resumed from" in (cut / "log.txt").read_text()
    assert_bitwise(checkpoint(cut, 12), checkpoint(outs[False], 12))
    assert losses(cut) == losses(outs[False])


def test_zero_two_ranks_copy_on_equals_off_bitwise(data, tmp_path):
    common = data + TINY + ["--train.steps=8", "--checkpoint.interval=8", "--train.zero=1",
                            "--comm.overlap=false", "--model.embd_pdrop=0", "--model.attn_pdrop=0",
                            "--model.resid_pdrop=0"]
    outs = {}
    for on in (False, True):
        outs[on] = tmp_path / f"z{int(on)}"
        nr.run(common + [f"--output.dir={outs[on]}", f"--run.bf16_weights={str(on).lower()}"], ranks=2,
               timeout=300)
    assert losses(outs[True]) == losses(outs[False])
    assert_bitwise(checkpoint(outs[True], 8), checkpoint(outs[False], 8))


def test_profile_account_in_log_and_summary(data, tmp_path):
    out = tmp_path / "prof"
    nr.run(data + TINY + ["--train.steps=4", f"--output.dir={out}", "--run.profile=true",
                          "--run.bf16_weights=true"])
    log = (out / "log.txt").read_text()
    assert "profile account (run.profile), per step over 3 step(s)" in log, log[-4000:]
    assert "predicted step (sum of floors)" in log
    s = json.loads((out / "summary.json").read_text())
    p = s["profile"]
    assert p["steps"] == 3 and p["bandwidth_bytes_per_s"] > 0 and p["gemm_flops_per_s"] > 0
    fams = {f["family"]: f for f in p["families"]}
    for fam in ("gemm (lm head)", "gemm (blocks)", "cast (bf16 operands)", "cross-entropy", "layernorm",
                "attention", "optimizer", "memset"):
        assert fam in fams, sorted(fams)
    # the LM head's forward GEMM per step: 2 * (B*T) * V * C FLOPs (tied wte: M = 32, V = 64, C = 32)
    ops = {o["label"]: o for o in p["ops"]}
    assert ops["gemm lm head (forward)"]["flops"] == 2 * 32 * 64 * 32
    assert ops["gemm lm head (forward)"]["calls"] == 1
    # with the copy, the head's forward casts only its activation: 32 x 32 elements, 4 + 2 bytes each
    assert ops["cast: gemm lm head (forward)"]["bytes"] == 32 * 32 * 6
    assert p["predicted_step_ms"] > 0 and p["measured_ops_ms"] > 0
    assert fams["cast (bf16 operands)"]["ms"] > 0  # the CPU times the casts apart from their GEMMs
    r = subprocess.run(["python3", str(nr.SOURCE_DIR / "bench" / "gpu" / "account.py"), f"cpu={out / 'summary.json'}"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "gemm (lm head)" in r.stdout and "predicted step" in r.stdout, r.stdout + r.stderr
