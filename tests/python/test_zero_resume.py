"""Checkpoints independent of the ZeRO stage and the world size (README "Scaling out"): a checkpoint
holds the full Hugging Face layout (weights, AdamW moments) at every stage, so a run saved at
(stage, ranks) resumes at another (stage, ranks) with the same global batch onto the uninterrupted
run (to fp32 summation order), and bitwise at the same (stage, ranks); tools/hf_export.py exports a
ZeRO-2 checkpoint as it does a ZeRO-0 one (the same tensors, equal to summation order)."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nlp_run as nr
from test_zero import checkpoint, cut_at

TINY = ["--model.n_layer=3", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=10",
        "--train.lr=3e-3", "--train.warmup_steps=5", "--train.schedule=cosine", "--train.clip=0.5",
        "--model.embd_pdrop=0", "--model.attn_pdrop=0", "--model.resid_pdrop=0", "--train.steps=20",
        "--checkpoint.interval=10", "--checkpoint.keep=5", "--comm.bucket_mb=0.01"]
# the global batch: 4 sequences a step (an INI value, so that a resume at another world size adjusts it)
GLOBAL = 4


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("zres")
    inis = {}
    for ranks in (1, 2, 4):
        inis[ranks] = d / f"run{ranks}.ini"
        inis[ranks].write_text(f"[train]\nbatch_size = {GLOBAL // ranks}\n")
    return inis, f"--data.train={nr.pattern_stream(d / 'train.h5', windows=256, seed=21)}"


def log(out):
    return {r["step"]: r["loss"] for r in nr.metrics(out)[0]}


def straight(data, tmp_path, stage, ranks):
    inis, train = data
    out = tmp_path / f"straight_{stage}_{ranks}"
    nr.run([inis[ranks], train] + TINY + [f"--train.zero={stage}", f"--output.dir={out}"], ranks=ranks, timeout=300)
    return out


@pytest.mark.parametrize("written,resumed", [((0, 1), (1, 2)), ((1, 2), (2, 4)), ((2, 4), (0, 1)),
                                             ((2, 4), (2, 4))])
def test_resume_at_another_stage_and_world_size(data, tmp_path, written, resumed):
    inis, train = data
    src = straight(data, tmp_path, *written)
    out = tmp_path / "resumed"
    cut_at(src, out, 10)
    stage, ranks = resumed
    # the INI of the writer: on resume the batch shape is adjusted to keep the global batch
    nr.run([inis[written[1]], train] + TINY + [f"--train.zero={stage}", "--train.resume=true", f"--output.dir={out}"],
           ranks=ranks, timeout=300)
    got, ref = log(out), log(src)
    assert sorted(got) == list(range(1, 21))
    for s in range(11, 21):
        if written == resumed:
            assert got[s] == ref[s], (s, got[s], ref[s])  # bitwise at the same (stage, ranks)
        else:
            assert abs(got[s] - ref[s]) <= 1e-5 * abs(ref[s]), (s, got[s], ref[s])
    a, b = checkpoint(out, 20), checkpoint(src, 20)
    assert sorted(a) == sorted(b)
    for k in a:
        if "key.bias" in k or "c_attn.bias" in k:  # zero gradient in exact arithmetic: rounding noise
            continue
        x, y = np.asarray(a[k], np.float64), np.asarray(b[k], np.float64)
        err = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30)
        assert err <= (0 if written == resumed else 1e-3), (k, err)


def test_hf_export_of_a_zero2_checkpoint_equals_zero0s(data, tmp_path):
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file
    export = Path(__file__).resolve().parents[2] / "tools" / "hf_export.py"
    got = {}
    for stage in (0, 2):
        src = straight(data, tmp_path, stage, 2)
        dest = tmp_path / f"hf{stage}"
        subprocess.run([sys.executable, str(export), str(src / "checkpoints" / "step_00000020.h5"), str(dest),
                        "--no-tokenizer"], check=True, capture_output=True, text=True, timeout=300)
        got[stage] = load_file(str(dest / "model.safetensors"))
    assert sorted(got[0]) == sorted(got[2]) and len(got[0]) > 10
    for k in got[0]:
        x, y = got[0][k].astype(np.float64), got[2][k].astype(np.float64)
        assert x.shape == y.shape, k
        if "c_attn.bias" in k:
            continue
        assert np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30) <= 1e-4, k


def test_damaged_newest_checkpoint_at_stage2_falls_back_bitwise(data, tmp_path):
    """The tensor-by-tensor verification on resume: a truncated newest checkpoint of a ZeRO-2 run is
    reported and moved aside, the run continues from the previous one onto the straight run bitwise."""
    inis, train = data
    keys = ["--train.zero=2", "--checkpoint.interval=5"]
    src = tmp_path / "straight"
    nr.run([inis[2], train] + TINY + keys + [f"--output.dir={src}"], ranks=2, timeout=300)
    out = tmp_path / "resumed"
    cut_at(src, out, 15)
    for s in (5, 10):  # cut_at keeps only step 15: the older ones back
        (out / "checkpoints" / f"step_{s:08d}.h5").write_bytes((src / "checkpoints" / f"step_{s:08d}.h5").read_bytes())
    newest = out / "checkpoints" / "step_00000015.h5"
    raw = newest.read_bytes()
    newest.write_bytes(raw[: len(raw) // 2])
    p = nr.run([inis[2], train] + TINY + keys + ["--train.resume=true", f"--output.dir={out}"], ranks=2, timeout=300)
    assert f"warning: checkpoint '{newest}' is damaged" in p.stdout, p.stdout[-3000:]
    assert "step_00000010.h5" in p.stdout and (out / "checkpoints" / "step_00000015.h5.damaged").exists()
    got, ref = log(out), log(src)
    assert sorted(got) == list(range(1, 21)) and all(got[s] == ref[s] for s in got)
    a, b = checkpoint(out, 20), checkpoint(src, 20)
    assert all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a) and sorted(a) == sorted(b)
