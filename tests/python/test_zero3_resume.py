"""ZeRO-3 checkpoints (train.zero = 3): rank 0 writes each weight tensor as gathered from the parameter
shards that hold its parts (no rank holds the whole parameters to write), and a resume puts each rank's
part of every tensor into its shard. A run saved at (stage, ranks) resumes at stage 3 and a stage-3 run at
another (stage, ranks) with the same global batch onto the uninterrupted run (to fp32 summation order),
bitwise at the same (stage, ranks); a stage-3 run killed after a step or mid-checkpoint, and a truncated
newest checkpoint, fall back as at the other stages; tools/hf_export.py exports a ZeRO-3 checkpoint as it
does a ZeRO-0 one."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import nlp_run as nr
from test_zero import checkpoint, cut_at
from test_zero_resume import TINY, log, straight
from test_zero_resume import data  # noqa: F401  (the module's fixture)


# With test_zero_resume.py's pairs, every pair of (stage, ranks) in {(0, 1), (1, 2), (2, 4), (3, 4), (3, 2)}
# (issue 53) is resumed one way or the other: (0,1)-(1,2), (1,2)-(2,4), (2,4)-(0,1) there; (3,4)-(3,2),
# (2,4)-(3,4), (3,2)-(0,1), (0,1)-(3,4), (3,4)-(1,2), (1,2)-(3,2), (3,2)-(2,4) here.
@pytest.mark.parametrize("written,resumed", [((3, 4), (3, 2)), ((2, 4), (3, 4)), ((3, 2), (0, 1)),
                                             ((3, 2), (3, 2)), ((0, 1), (3, 4)), ((3, 4), (1, 2)),
                                             ((1, 2), (3, 2)), ((3, 2), (2, 4))])
def test_zero3_resume_at_another_stage_and_world_size(data, tmp_path, written, resumed):  # noqa: F811
    inis, train = data
    src = straight(data, tmp_path, *written)
    out = tmp_path / "resumed"
    cut_at(src, out, 10)
    stage, ranks = resumed
    nr.run([inis[written[1]], train] + TINY + [f"--train.zero={stage}", "--train.resume=true", f"--output.dir={out}"],
           ranks=ranks, timeout=300)
    got, ref = log(out), log(src)
    assert sorted(got) == list(range(1, 21))
    for s in range(11, 21):
        if written == resumed:
            assert got[s] == ref[s], (s, got[s], ref[s])
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


def test_zero3_checkpoint_holds_the_full_weights(data, tmp_path):  # noqa: F811
    """The weights a stage-3 checkpoint holds on 4 ranks are those of stage 2 (bitwise: the same update)."""
    a = checkpoint(straight(data, tmp_path, 3, 4), 20)
    b = checkpoint(straight(data, tmp_path, 2, 4), 20)
    assert sorted(a) == sorted(b) and len(a) > 20
    for k in a:
        assert np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes(), k


def test_hf_export_of_a_zero3_checkpoint_equals_zero0s(data, tmp_path):  # noqa: F811
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file
    export = Path(__file__).resolve().parents[2] / "tools" / "hf_export.py"
    got = {}
    for stage in (0, 3):
        src = straight(data, tmp_path, stage, 2)
        dest = tmp_path / f"hf{stage}"
        subprocess.run([sys.executable, str(export), str(src / "checkpoints" / "step_00000020.h5"), str(dest),
                        "--no-tokenizer"], check=True, capture_output=True, text=True, timeout=300)
        got[stage] = load_file(str(dest / "model.safetensors"))
    assert sorted(got[0]) == sorted(got[3]) and len(got[0]) > 10
    for k in got[0]:
        x, y = got[0][k].astype(np.float64), got[3][k].astype(np.float64)
        assert x.shape == y.shape, k
        if "c_attn.bias" in k:
            continue
        assert np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30) <= 1e-4, k


def test_zero3_killed_and_damaged_checkpoint_fall_back_bitwise(data, tmp_path):  # noqa: F811
    """A stage-3 run killed (SIGKILL on rank 0 after step 17) resumes from its step-15 checkpoint; with that
    newest checkpoint truncated (a write cut short), it is reported, moved aside, and the run continues from
    step 10; both end bitwise on the straight run."""
    inis, train = data
    keys = ["--train.zero=3", "--checkpoint.interval=5"]
    src = tmp_path / "straight"
    nr.run([inis[2], train] + TINY + keys + [f"--output.dir={src}"], ranks=2, timeout=300)
    ref = log(src)
    for damaged in (False, True):
        out = tmp_path / f"killed_{damaged}"
        p = nr.run([inis[2], train] + TINY + keys + ["--debug.kill_at_step=17", f"--output.dir={out}"], ranks=2,
                   timeout=300, check=False)
        assert p.returncode != 0
        newest = out / "checkpoints" / "step_00000015.h5"
        assert newest.exists()
        if damaged:
            raw = newest.read_bytes()
            newest.write_bytes(raw[: len(raw) // 2])
        p = nr.run([inis[2], train] + TINY + keys + ["--train.resume=true", f"--output.dir={out}"], ranks=2,
                   timeout=300)
        if damaged:
            assert f"warning: checkpoint '{newest}' is damaged" in p.stdout, p.stdout[-3000:]
            assert "step_00000010.h5" in p.stdout and (out / "checkpoints" / "step_00000015.h5.damaged").exists()
        else:
            assert "step_00000015.h5" in p.stdout and "resumed from" in p.stdout
        got = log(out)
        assert sorted(got) == list(range(1, 21)) and all(got[s] == ref[s] for s in got)
        a, b = checkpoint(out, 20), checkpoint(src, 20)
        assert sorted(a) == sorted(b)
        assert all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)


def test_zero3_killed_mid_checkpoint_falls_back_bitwise(data, tmp_path):  # noqa: F811
    """kill -9 mid-checkpoint at stage 3 (debug.kill_in_checkpoint: rank 0 SIGKILLs itself with the
    step-15 checkpoint's weights written, gathered from the shards, and its moments not, while the other
    rank waits in the gather): the job ends (no hang), no step-15 checkpoint exists, only the unfinished
    write's temporary file; the resume removes it, starts from step 10 and ends bitwise on the straight
    run."""
    inis, train = data
    keys = ["--train.zero=3", "--checkpoint.interval=5"]
    src = tmp_path / "straight"
    nr.run([inis[2], train] + TINY + keys + [f"--output.dir={src}"], ranks=2, timeout=300)
    out = tmp_path / "killed"
    p = nr.run([inis[2], train] + TINY + keys + ["--debug.kill_in_checkpoint=15", f"--output.dir={out}"], ranks=2,
               timeout=120, check=False)
    assert p.returncode != 0
    ckpt = out / "checkpoints"
    assert not (ckpt / "step_00000015.h5").exists() and (ckpt / "step_00000010.h5").exists()
    tmp = list(ckpt.glob("step_00000015.h5.tmp*"))
    assert len(tmp) == 1, sorted(ckpt.iterdir())
    p = nr.run([inis[2], train] + TINY + keys + ["--train.resume=true", f"--output.dir={out}"], ranks=2, timeout=300)
    assert "step_00000010.h5' at step 10" in p.stdout and "temporary file(s) of an unfinished write" in p.stdout, \
        p.stdout[-3000:]
    assert not tmp[0].exists()
    got, ref = log(out), log(src)
    assert sorted(got) == list(range(1, 21)) and all(got[s] == ref[s] for s in got)
    a, b = checkpoint(out, 20), checkpoint(src, 20)
    assert sorted(a) == sorted(b)
    assert all(np.asarray(a[k]).tobytes() == np.asarray(b[k]).tobytes() for k in a)
