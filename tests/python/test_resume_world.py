"""Resume at another world size (docs/running.md "Checkpoints and resume"): a checkpoint written by 2 ranks
resumes on 1 and on 4 ranks with the global batch kept (grad_accum adjusted), the data position carried
over in examples (same epoch, nothing repeated or skipped), and losses equal to the uninterrupted run's
up to the summation order; a global batch that cannot be kept stops with a message naming the keys, and
values given on the command line are used as given, with a warning."""
import json
import shutil

import h5py
import numpy as np
import pytest

import nlp_run as nr

# Dropout off: only the summation order differs between world sizes, so losses agree closely.
TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=1",
        "--model.embd_pdrop=0", "--model.attn_pdrop=0", "--model.resid_pdrop=0"]
STEPS = 10
# Measured: at most 5e-9 relative over steps 5-10 (1 and 4 ranks against 2); fp32 summation order.
TOL = 1e-6


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """An uninterrupted 2-rank run: 96 examples, global batch 16 = 2 ranks x batch 4 x accum 2 (set in
    the INI file, as a job would), 6 steps per epoch, so steps 5-10 cross into the second epoch."""
    d = tmp_path_factory.mktemp("world")
    rng = np.random.default_rng(7)
    base = np.tile(np.arange(64) * 7 % 64, 30)[: 16 * 96 + 1]
    toks = np.where(rng.random(base.shape) < 0.1, rng.integers(0, 64, size=base.shape), base)
    nr.write_stream(d / "train.h5", toks)
    ini = d / "run.ini"
    ini.write_text("[train]\nbatch_size = 4\ngrad_accum = 2\n")
    args = [ini] + TINY + [f"--data.train={d / 'train.h5'}", f"--train.steps={STEPS}", "--train.lr=3e-3",
                           "--train.warmup_steps=2", "--train.schedule=linear",
                           "--checkpoint.interval=4", "--checkpoint.keep=5"]
    out = d / "full"
    nr.run(args + [f"--output.dir={out}"], ranks=2)
    return d, args, out


def cut_at_step4(full_out, dest):
    """The folder as a job killed after the step-4 checkpoint left it."""
    shutil.copytree(full_out, dest)
    for f in (dest / "checkpoints").glob("step_*.h5"):
        if f.name != "step_00000004.h5":
            f.unlink()
    lines = (dest / "metrics.jsonl").read_text().splitlines()
    (dest / "metrics.jsonl").write_text(
        "".join(l + "\n" for l in lines if json.loads(l).get("step", 0) <= 4))
    (dest / "summary.json").unlink()


def losses(out):
    return {r["step"]: r["loss"] for r in nr.metrics(out)[0]}


@pytest.mark.parametrize("ranks,accum", [(1, 4), (4, 1)])
def test_resume_on_other_world_keeps_global_batch_and_data(full, ranks, accum):
    d, args, full_out = full
    out = d / f"resumed{ranks}"
    cut_at_step4(full_out, out)
    p = nr.run(args + [f"--output.dir={out}", "--train.resume=true"], ranks=ranks)
    log = p.stdout
    assert (f"global batch 16 kept: {ranks} rank{'s' if ranks > 1 else ''} x batch 4 x grad_accum {accum}, "
            f"was 2 ranks x batch 4 x accum 2 (adjusted: train.grad_accum 2 -> {accum})") in log, log
    assert "results differ from the uninterrupted 2-rank run in the last bits" in log
    assert "epoch 0 (the same example order, from train.seed); 64 of its examples were already seen" in log
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == ranks and summary["global_batch"] == 16
    assert summary["batch_size_per_rank"] == 4 and summary["grad_accum"] == accum
    rw = summary["resume_world"]
    assert rw["from_world_size"] == 2 and rw["world_size"] == ranks
    assert rw["from_global_batch"] == rw["global_batch"] == 16 and rw["global_batch_kept"] is True
    assert rw["adjusted"] == ["train.grad_accum"]
    assert rw["examples_seen_in_epoch"] == 64 and rw["examples_skipped"] == 0
    assert summary["warnings"] == []
    # The same examples make every step (a repeated or skipped example would change the loss by far
    # more than the summation order does); steps 7-10 are in the second epoch.
    lf, lr = losses(full_out), losses(out)
    assert sorted(lr) == list(range(1, STEPS + 1))
    for step in range(5, STEPS + 1):
        assert abs(lr[step] - lf[step]) <= TOL * abs(lf[step]), (step, lr[step], lf[step])
    # The checkpoints written after the resume record the new shape.
    with h5py.File(out / "checkpoints" / f"step_{STEPS:08d}.h5", "r") as f:
        assert int(f.attrs["nlptrain_world_size"]) == ranks
        assert int(f.attrs["nlptrain_batch_size"]) == 4
        assert int(f.attrs["nlptrain_grad_accum"]) == accum


def test_resume_world_global_batch_not_divisible(full):
    d, args, full_out = full
    out = d / "resumed3"
    cut_at_step4(full_out, out)
    before = (out / "metrics.jsonl").read_bytes()
    # 16 is not divisible by 3 ranks: stop before writing anything, naming the keys to set.
    p = nr.run(args + [f"--output.dir={out}", "--train.resume=true"], ranks=3, check=False)
    assert p.returncode != 0
    err = p.stderr
    assert "global batch 16, which cannot be kept on 3 ranks (16 is not divisible by 3)" in err, err
    assert "set train.batch_size and/or train.grad_accum" in err
    assert (out / "metrics.jsonl").read_bytes() == before
    assert not (out / "summary.json").exists()
    # Given on the command line: used as given, another global batch, with warnings. The data position
    # (64 examples into the epoch) is not a multiple of 3 x 2, so 2 examples are skipped, none repeated.
    p = nr.run(args + [f"--output.dir={out}", "--train.resume=true", "--train.batch_size=2",
                       "--train.grad_accum=3"], ranks=3)
    assert "warning: global batch changes from 16 to 18: 3 ranks x batch 2 x grad_accum 3" in p.stdout
    assert "warning: 2 example(s) of epoch 0 are skipped" in p.stdout
    summary = json.loads((out / "summary.json").read_text())
    rw = summary["resume_world"]
    assert rw["global_batch"] == 18 and rw["global_batch_kept"] is False and rw["adjusted"] == []
    assert rw["examples_skipped"] == 2
    assert summary["global_batch"] == 18 and summary["completed"] is True
    assert any("global batch changes" in w for w in summary["warnings"])
    assert sorted(losses(out)) == list(range(1, STEPS + 1))


def test_same_world_resume_reports_no_change(full):
    d, args, full_out = full
    out = d / "resumed2"
    cut_at_step4(full_out, out)
    p = nr.run(args + [f"--output.dir={out}", "--train.resume=true"], ranks=2)
    assert "kept:" not in p.stdout and "last bits" not in p.stdout
    assert json.loads((out / "summary.json").read_text())["resume_world"] is None
    assert losses(out) == losses(full_out)  # bitwise
