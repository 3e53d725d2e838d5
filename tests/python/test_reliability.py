"""End-to-end tests of the reliability features (docs/running.md "Checkpoints and resume"): a damaged newest
checkpoint makes resume fall back to the previous intact one (warning in log.txt and summary.json),
all damaged is an error listing what was tried, a damaged best.h5 as model.weights is a checksum
error, one run per output.dir (flock; a dead holder is no obstacle), metrics.jsonl holds each step
once after a resume, a stop signal taken off the computing threads, and train.nonfinite = stop | skip
with debug.inject_nonfinite_step."""
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import nlp_run as nr

TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=1"]
DROPOUT = ["--model.embd_pdrop=0.1", "--model.attn_pdrop=0.1", "--model.resid_pdrop=0.1"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    nr.pattern_stream(d / "train.h5", windows=96, seed=11)
    nr.pattern_stream(d / "eval.h5", windows=8, seed=12)  # the same pattern, other noise
    return d


def args(stream, out, steps, extra=()):
    return TINY + DROPOUT + [f"--data.train={stream / 'train.h5'}", f"--output.dir={out}",
                             f"--train.steps={steps}", "--train.batch_size=2", "--train.lr=3e-3",
                             "--train.warmup_steps=2", "--train.clip=1.0", "--checkpoint.interval=2",
                             "--checkpoint.keep=5"] + list(extra)


HANG_INPUT = nr.SOURCE_DIR / "tests" / "fuzz" / "corpus" / "h5file" / "regress-hang-vlen-string-attr-corrupt-global-heap"


def ckpt(out, step):
    return Path(out) / "checkpoints" / f"step_{step:08d}.h5"


def train_records(out):
    return [(r["step"], r["loss"]) for r in nr.metrics(out)[0]]


def summary(out):
    return json.loads((Path(out) / "summary.json").read_text())


def assert_same_weights(a, b):
    wa, wb = nr.read_weights(a), nr.read_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert np.array_equal(wa[k], wb[k]), k


def flip_data_byte(path, dataset):
    """Flips one bit inside a dataset's stored data (found with h5py), as a bad block would."""
    with h5py.File(path, "r") as f:
        offset = f[dataset].id.get_offset()
        assert offset is not None, f"{dataset} has no contiguous storage"
    with open(path, "r+b") as fh:
        fh.seek(offset + 6)
        b = fh.read(1)
        fh.seek(offset + 6)
        fh.write(bytes([b[0] ^ 0x08]))


def damage(path, how):
    if how == "truncate":
        os.truncate(path, os.path.getsize(path) // 3)
        return "cannot open"
    if how == "flip":
        flip_data_byte(path, "transformer.h.1.mlp.c_fc.weight")
        return "fails its checksum"
    if how == "delete":
        with h5py.File(path, "a") as f:
            del f["optimizer/exp_avg/transformer.wte.weight"]
        return "optimizer/exp_avg/transformer.wte.weight"
    if how == "global_heap":
        # The seed as a decimal string (load_checkpoint accepts one), in a global heap collection that
        # libhdf5 1.10 loops on forever (nr.damage_global_heap): reported, not a hang.
        with h5py.File(path, "a") as f:
            seed = int(f.attrs["nlptrain_seed"]) & (2**64 - 1)
            del f.attrs["nlptrain_seed"]
            f.attrs["nlptrain_seed"] = str(seed)
        nr.damage_global_heap(path)
        return "damaged global heap collection"
    if how == "fuzz_hang_input":
        # Replaced by the fuzzing input that hung libhdf5 (a weights file with a damaged global heap).
        shutil.copy(HANG_INPUT, path)
        return "is not an nlptrain checkpoint"
    raise ValueError(how)


@pytest.fixture(scope="module")
def full(stream, tmp_path_factory):
    """The uninterrupted 8-step run every resumed run must reproduce bit for bit."""
    out = tmp_path_factory.mktemp("full") / "out"
    nr.run(args(stream, out, 8), ranks=2)
    return out


def crashed_run(stream, out, kill_at=7):
    """A run killed (SIGKILL on rank 0) after step `kill_at`'s metrics: checkpoints 2, 4, 6."""
    t0 = time.time()
    p = nr.run(args(stream, out, 8, [f"--debug.kill_at_step={kill_at}"]), ranks=2, timeout=120, check=False)
    assert p.returncode != 0, p.stdout
    assert time.time() - t0 < 30, "the surviving rank kept the job alive"  # dead rank ends the job
    assert [s for s, _ in train_records(out)] == list(range(1, kill_at + 1))
    assert sorted(x.name for x in (Path(out) / "checkpoints").glob("*.h5")) == \
        [f"step_{s:08d}.h5" for s in (2, 4, 6)]


def test_kill9_resume_bitwise_with_each_step_once(stream, full, tmp_path):
    out = tmp_path / "out"
    crashed_run(stream, out)
    p = nr.run(args(stream, out, 8, ["--train.resume=true"]), ranks=2)
    assert "resumed from" in p.stdout and "step_00000006.h5" in p.stdout
    assert "removed 1 metrics.jsonl line(s) after step 6" in p.stdout
    # Each step exactly once, with the uninterrupted run's losses (17 significant digits).
    assert train_records(out) == train_records(full)
    assert_same_weights(ckpt(out, 8), ckpt(full, 8))
    s = summary(out)
    assert s["resumed_step"] == 6 and s["metrics_dropped"] == 1
    assert s["damaged_checkpoints"] == [] and s["warnings"] == []


@pytest.mark.parametrize("how", ["truncate", "flip", "delete", "global_heap", "fuzz_hang_input"])
def test_damaged_newest_checkpoint_falls_back_to_previous(stream, full, tmp_path, how):
    out = tmp_path / "out"
    crashed_run(stream, out)
    newest = ckpt(out, 6)
    reason = damage(newest, how)
    p = nr.run(args(stream, out, 8, ["--train.resume=true"]), ranks=2)
    log = (out / "log.txt").read_text()
    for text in (p.stdout, log):
        assert f"warning: checkpoint '{newest}' is damaged" in text, text
        assert reason in text
        assert f"resuming from the older checkpoint '{ckpt(out, 4)}' (step 4)" in text
    s = summary(out)
    assert s["resumed_from"] == str(ckpt(out, 4)) and s["resumed_step"] == 4
    assert [d["file"] for d in s["damaged_checkpoints"]] == [str(newest)]
    assert reason in s["damaged_checkpoints"][0]["reason"]
    assert any("is damaged" in w for w in s["warnings"])
    assert Path(str(newest) + ".damaged").exists()  # moved aside, not counted or chosen again
    # The run continued from step 4 exactly as the uninterrupted one, each step recorded once.
    assert train_records(out) == train_records(full)
    assert_same_weights(ckpt(out, 8), ckpt(full, 8))


def test_all_checkpoints_damaged_is_an_error_listing_them(stream, tmp_path):
    out = tmp_path / "out"
    crashed_run(stream, out)
    reasons = {6: damage(ckpt(out, 6), "truncate"), 4: damage(ckpt(out, 4), "flip"),
               2: damage(ckpt(out, 2), "delete")}
    p = nr.run(args(stream, out, 8, ["--train.resume=true"]), ranks=2, timeout=120, check=False)
    assert p.returncode != 0
    assert "none of the 3 checkpoint(s)" in p.stderr and "is intact" in p.stderr, p.stderr
    for step, reason in reasons.items():
        assert str(ckpt(out, step)) in p.stderr
        assert reason in p.stderr
    # Newest first, and nothing renamed or overwritten.
    assert p.stderr.index(str(ckpt(out, 6))) < p.stderr.index(str(ckpt(out, 4))) < \
        p.stderr.index(str(ckpt(out, 2)))
    assert all(ckpt(out, s).exists() for s in (2, 4, 6))


def test_damaged_best_h5_as_model_weights_is_a_checksum_error(stream, tmp_path):
    first = tmp_path / "first"
    nr.run(args(stream, first, 2, [f"--data.eval={stream / 'eval.h5'}", "--eval.interval=1"]))
    best = first / "best.h5"
    assert best.exists()
    # Intact, it is accepted as the weights of a later run.
    nr.run(args(stream, tmp_path / "ok", 1, [f"--model.weights={best}"]))
    flip_data_byte(best, "transformer.wpe.weight")
    p = nr.run(args(stream, tmp_path / "second", 1, [f"--model.weights={best}"]), ranks=2,
               timeout=120, check=False)
    assert p.returncode != 0
    assert str(best) in p.stderr and "transformer.wpe.weight" in p.stderr, p.stderr
    assert "fails its checksum" in p.stderr


@contextlib.contextmanager
def running_job(out, run_args, lines):
    """A 2-rank mpirun run in a session of its own, yielded as (Popen, rank 0's pid) once its
    metrics.jsonl has `lines` lines; the whole session is SIGKILLed on the way out if still running."""
    job = subprocess.Popen(["mpirun", "-np", "2", nr.binary()] + run_args, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=nr.mpi_env(), start_new_session=True)
    try:
        metrics = out / "metrics.jsonl"
        nr.wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= lines, what="the run's steps")
        yield job, int((out / "nlptrain.lock").read_text().split("pid=")[1].split()[0])
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)


def test_second_run_on_same_output_dir_is_refused_and_dead_lock_is_no_obstacle(stream, tmp_path):
    out = tmp_path / "out"
    metrics = out / "metrics.jsonl"
    with running_job(out, args(stream, out, 100000, ["--checkpoint.interval=50"]), 3) as (first, pid):
        assert "nlptrain" in Path(f"/proc/{pid}/cmdline").read_text()  # rank 0 of the first run
        second = nr.run(args(stream, out, 4), ranks=2, timeout=60, check=False)
        assert second.returncode != 0
        assert f"host {socket.gethostname()}, pid {pid}" in second.stderr, second.stderr
        assert "in use by another nlptrain run" in second.stderr and str(out) in second.stderr
        # The refused run wrote nothing: the first run's metrics were not truncated.
        n_before = metrics.read_text().count("\n")
        time.sleep(0.3)
        assert metrics.read_text().count("\n") >= n_before >= 3
        nr.wait_for(lambda: any((out / "checkpoints").glob("step_*.h5")), what="the first run's checkpoint")
        # A dead holder (kill -9 of the whole job) leaves a stale lock file but no lock.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        nr.wait_for(lambda: not Path(f"/proc/{pid}").exists() or
                 Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=30, what="rank 0 to die")
    assert f"pid={pid}" in (out / "nlptrain.lock").read_text()
    # Resume from the killed run's newest checkpoint and run two more steps.
    newest = max(int(c.stem.split("_")[1]) for c in (out / "checkpoints").glob("step_*.h5"))
    assert newest >= 50 and newest % 50 == 0
    third = nr.run(args(stream, out, newest + 2, ["--train.resume=true", "--checkpoint.interval=50"]),
                   ranks=2)
    assert f"resumed from '{ckpt(out, newest)}'" in third.stdout
    steps = [s for s, _ in train_records(out)]
    assert steps == list(range(1, newest + 3))  # each step once, although the killed run went further


def thread_signal_masks(pid):
    """{tid: SigBlk} of every thread of a process."""
    masks = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        m = re.search(r"^SigBlk:\s*([0-9a-f]+)", (t / "status").read_text(), re.M)
        masks[int(t.name)] = int(m.group(1), 16)
    return masks


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM], ids=["SIGUSR1", "SIGTERM"])
def test_stop_signal_is_taken_off_the_computing_threads(stream, tmp_path, sig):
    """Every thread of a rank blocks SIGUSR1 and SIGTERM but the one that takes them (sigwait):
    oneDNN's sgemm points the stack pointer into the heap, so a handler run on a computing thread
    wrote its frame into the heap (src/train/signals.h). A signal to one rank stops both ranks at
    the same step boundary with a checkpoint and exit code 75."""
    out = tmp_path / "out"
    run_args = [a for a in args(stream, out, 100000, ["--checkpoint.interval=0"])
                if not a.startswith("--run.threads")] + ["--run.threads=2"]  # an OpenMP worker too
    with running_job(out, run_args, 20) as (job, pid):
        masks = thread_signal_masks(pid)
        both = (1 << (signal.SIGUSR1 - 1)) | (1 << (signal.SIGTERM - 1))
        assert masks[pid] & both == both, f"the main thread takes stop signals: {masks}"
        takers = [t for t, m in masks.items() if m & both != both]
        assert len(takers) <= 1, f"threads that take stop signals: {takers} of {masks}"
        assert len(masks) >= 3, masks  # main, the OpenMP worker, the signal thread at least
        os.kill(pid, sig)
        stdout, stderr = job.communicate(timeout=60)
    assert job.returncode == 75, f"exit {job.returncode}\n{stdout[-2000:]}\n{stderr[-2000:]}"
    m = re.search(r"stop signal received: checkpoint '(\S+)' written at step (\d+)", stdout)
    assert m, stdout[-2000:]
    step = int(m.group(2))
    assert Path(m.group(1)) == ckpt(out, step) and ckpt(out, step).exists()
    assert train_records(out)[-1][0] == step


def test_a_crashing_rank_says_where_and_the_job_ends(stream, tmp_path):
    """A rank that dies of SIGSEGV prints nlptrain's report (src/core/crash_report.h: rank, host,
    pid, signal, backtrace), installed before MPI_Init so Open MPI leaves the signal to it, dies of it,
    and mpirun ends the other rank: no hang, no exit code 75."""
    out = tmp_path / "out"
    with running_job(out, args(stream, out, 100000, ["--checkpoint.interval=0"]), 5) as (job, pid):
        os.kill(pid, signal.SIGSEGV)
        stdout, stderr = job.communicate(timeout=60)
    both = stdout + stderr
    assert job.returncode not in (0, 75), f"exit {job.returncode}\n{both[-3000:]}"
    head = f"nlptrain: rank 0 (host {socket.gethostname()}, pid {pid}): fatal signal SIGSEGV (sent by pid {os.getpid()})"
    assert head in both, both[-3000:]
    frames = re.findall(r"nlptrain: rank 0:   #\d+ +0x[0-9a-f]+: (\S+)", both)
    assert len(frames) >= 3 and any(f.startswith("nlptrain+0x") for f in frames), both[-3000:]
    assert "*** Process received signal ***" not in both, "Open MPI's handler ran, not nlptrain's:\n" + both[-3000:]


def nonfinite_args(stream, out, steps, extra):
    return args(stream, out, steps, ["--checkpoint.interval=1", "--checkpoint.keep=10"] + list(extra))


def test_nonfinite_skip_drops_the_update_and_continues(stream, tmp_path):
    out = tmp_path / "out"
    p = nr.run(nonfinite_args(stream, out, 6, ["--train.nonfinite=skip", "--debug.inject_nonfinite_step=3"]),
               ranks=2)
    assert re.search(r"step +3/6 \|.*\| non-finite: update skipped \(1 in a row, 1 skipped in total\)",
                     p.stdout), p.stdout
    assert "1 step(s) skipped for a non-finite gradient" in p.stdout
    rows = nr.metrics(out)[0]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[2].get("skipped") is True and rows[2]["grad_norm"] is None  # NaN -> null
    assert all("skipped" not in r for i, r in enumerate(rows) if i != 2)
    assert all(r["nonfinite_skipped"] == 1 for r in rows[2:]) and "nonfinite_skipped" not in rows[1]
    assert summary(out)["nonfinite_skipped"] == 1 and summary(out)["completed"] is True
    # The skipped step changed nothing: weights and AdamW moments of step 3 are those of step 2.
    assert_same_weights(ckpt(out, 3), ckpt(out, 2))
    w = nr.read_weights(ckpt(out, 6))
    assert all(np.isfinite(v).all() for v in w.values())
    with h5py.File(ckpt(out, 6), "r") as f:
        assert f.attrs["nlptrain_optimizer_steps"] == 5 and f.attrs["nlptrain_nonfinite_skipped"] == 1


def test_nonfinite_skip_count_survives_resume(stream, tmp_path):
    out = tmp_path / "out"
    extra = ["--train.nonfinite=skip", "--debug.inject_nonfinite_step=2"]
    nr.run(nonfinite_args(stream, out, 4, extra), ranks=1)
    (ckpt(out, 4)).unlink()
    nr.run(nonfinite_args(stream, out, 4, extra + ["--train.resume=true"]), ranks=1)
    assert summary(out)["nonfinite_skipped"] == 1
    assert [r["step"] for r in nr.metrics(out)[0]] == [1, 2, 3, 4]


def test_nonfinite_skip_stops_after_max_consecutive(stream, tmp_path):
    # Non-consecutive skips never reach the limit ...
    ok = tmp_path / "ok"
    nr.run(nonfinite_args(stream, ok, 6, ["--train.nonfinite=skip", "--train.nonfinite_max=2",
                                          "--debug.inject_nonfinite_step=2,4"]), ranks=1)
    assert summary(ok)["nonfinite_skipped"] == 2
    # ... consecutive ones stop the run at the limit, with a message.
    out = tmp_path / "out"
    p = nr.run(nonfinite_args(stream, out, 8, ["--train.nonfinite=skip", "--train.nonfinite_max=3",
                                               "--debug.inject_nonfinite_step=2,3,4,5"]),
               ranks=2, timeout=120, check=False)
    assert p.returncode != 0
    assert "step 4: 3 consecutive steps had a non-finite loss or gradient norm" in p.stderr, p.stderr
    assert "train.nonfinite_max = 3" in p.stderr
    assert [r["step"] for r in nr.metrics(out)[0]] == [1, 2, 3, 4]


def test_nonfinite_stop_names_step_loss_and_norm(stream, tmp_path):
    out = tmp_path / "out"
    p = nr.run(args(stream, out, 5, ["--debug.inject_nonfinite_step=3"]), ranks=2, timeout=120, check=False)
    assert p.returncode != 0
    msg = [l for l in p.stderr.splitlines() if "not finite" in l]
    assert msg, p.stderr
    assert "step 3: loss or gradient norm is not finite (loss " in msg[0]
    loss = float(msg[0].split("(loss ")[1].split(",")[0])
    assert np.isfinite(loss) and 3.0 < loss < 5.0  # the real loss: only the gradient was poisoned
    assert "grad norm nan" in msg[0] and "train.nonfinite = skip" in msg[0]
    assert [r["step"] for r in nr.metrics(out)[0]] == [1, 2]
