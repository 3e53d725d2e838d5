"""A new user's first hour, end to end: one training run per output folder (a fresh run into a used
folder is refused with the ways on; output.overwrite moves the old run to previous/<run id>; resume
never crosses runs; checkpoint.keep counts every checkpoint in the folder), and stopping a run at any
moment with SIGINT (Ctrl-C) on 2 ranks under mpirun (and 1), during start-up, mid-step and twice, with the
exit code, the message and what is left on disk.

Under Open MPI's mpirun (4.1.4 measured here) a Ctrl-C reaches mpirun only (each rank runs in a
process group of its own); mpirun sends SIGTERM to every rank odls_base_sigkill_timeout seconds later
(1 by default), SIGKILL as long after that, and exits with 1 whatever the ranks return. The tests
below assert exactly that, and that within that second the run stops as nlptrain promises: at once
in start-up, with a checkpoint at the end of the step in progress otherwise. SIGUSR1 to mpirun is
forwarded to every rank and gives exit code 75; a SIGINT to nlptrain itself (one rank without
mpirun) gives 75, and a second one ends it at once (130)."""
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import h5py
import pytest

import nlp_run as nr

TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=1"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    nr.pattern_stream(d / "train.h5", windows=96, seed=11)
    return d


def args(stream, out, steps, extra=()):
    return TINY + [f"--data.train={stream / 'train.h5'}", f"--output.dir={out}", f"--train.steps={steps}",
                   "--train.batch_size=2", "--train.lr=3e-3", "--train.warmup_steps=2",
                   "--checkpoint.interval=5", "--checkpoint.keep=10"] + list(extra)


def ckpt(out, step):
    return Path(out) / "checkpoints" / f"step_{step:08d}.h5"


def checkpoints(out):
    return sorted(p.name for p in (Path(out) / "checkpoints").glob("step_*.h5"))


def run_id(out):
    return (Path(out) / "run_id").read_text().strip()


def records(out):
    return [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]


def ckpt_run_id(path):
    with h5py.File(path, "r") as f:
        v = f.attrs["nlptrain_run_id"]
        return v.decode() if isinstance(v, bytes) else str(v)


# ---- one run per folder ----------------------------------------------------------------------------

def test_a_fresh_run_into_a_used_folder_is_refused_naming_what_is_there_and_the_ways_on(stream, tmp_path):
    out = tmp_path / "out"
    nr.run(args(stream, out, 10))
    rid = run_id(out)
    before = (out / "metrics.jsonl").read_text()
    p = nr.run(args(stream, out, 4), ranks=2, check=False, timeout=120)
    assert p.returncode != 0
    msg = re.sub(r"\s+", " ", p.stderr)
    assert (f"output.dir = '{out}' holds another training run (run {rid}): 2 checkpoint(s) in {out}/checkpoints "
            f"(step_00000010.h5, step_00000005.h5) and metrics.jsonl with 10 record(s), the last of step 10. "
            f"A new run does not write into it. To continue that run: --train.resume=true; to start anew and "
            f"move its files to '{out}/previous/{rid}/': --output.overwrite=true; or choose another output.dir") in msg, msg
    # Refused before anything was written: the earlier run is as it was.
    assert (out / "metrics.jsonl").read_text() == before
    assert checkpoints(out) == ["step_00000005.h5", "step_00000010.h5"] and run_id(out) == rid


def test_overwrite_moves_the_old_run_aside_and_resume_never_crosses_runs(stream, tmp_path):
    out = tmp_path / "out"
    nr.run(args(stream, out, 20))  # run A
    a = run_id(out)
    assert [r["step"] for r in records(out)] == list(range(1, 21))
    assert {r["run_id"] for r in records(out)} == {a}
    assert ckpt_run_id(ckpt(out, 20)) == a
    assert json.loads((out / "summary.json").read_text())["run_id"] == a

    p = nr.run(args(stream, out, 5, ["--output.overwrite=true"]), ranks=2)  # run B
    b = run_id(out)
    assert b != a
    moved = out / "previous" / a
    assert f"output.overwrite: the earlier run's files (run {a}) were moved to '{moved}'" in p.stdout
    assert f"run id {b} (a new run in '{out}')" in p.stdout
    assert sorted(x.name for x in moved.iterdir()) == ["checkpoints", "config.ini", "log.txt", "metrics.jsonl",
                                                       "run_id", "summary.json"]
    assert [r["step"] for r in records(moved)] == list(range(1, 21))  # A's, whole
    assert checkpoints(moved) == [f"step_{s:08d}.h5" for s in (5, 10, 15, 20)]
    assert checkpoints(out) == ["step_00000005.h5"] and ckpt_run_id(ckpt(out, 5)) == b
    assert (out / "nlptrain.lock").exists()

    # A checkpoint of run A put back into the folder by hand is not taken by B's resume.
    shutil.copy2(moved / "checkpoints" / "step_00000020.h5", ckpt(out, 20))
    p = nr.run(args(stream, out, 8, ["--train.resume=true"]), ranks=2)
    assert f"train.resume: not using '{ckpt(out, 20)}': it belongs to run {a}, not to run {b}" in p.stdout
    assert f"resumed from '{ckpt(out, 5)}' at step 5 (data position 5), run {b}" in p.stdout
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(1, 9))  # B's 1-5, then 6-8 continued from B's step 5
    assert {r["run_id"] for r in recs} == {b}
    assert json.loads((out / "summary.json").read_text())["run_id"] == b
    assert ckpt_run_id(ckpt(out, 8)) == b
    # Another fresh run may not mix with B either.
    refused = nr.run(args(stream, out, 3), check=False, timeout=120)
    assert refused.returncode != 0 and f"holds another training run (run {b})" in refused.stderr


def test_checkpoint_keep_counts_every_checkpoint_in_the_folder(stream, tmp_path):
    out = tmp_path / "out"
    nr.run(args(stream, out, 6, ["--checkpoint.interval=1", "--checkpoint.keep=2"]))
    assert checkpoints(out) == ["step_00000005.h5", "step_00000006.h5"]
    # A file of a higher step in the folder (put there by hand) counts too: after the next
    # checkpoint the folder holds checkpoint.keep files, the one just written among them.
    shutil.copy2(ckpt(out, 6), ckpt(out, 50))
    nr.run(args(stream, out, 7, ["--checkpoint.interval=1", "--checkpoint.keep=2", "--train.resume=true"]))
    assert len(checkpoints(out)) == 2 and ckpt(out, 7).exists()


# ---- stopping: SIGINT to the job's process group (a terminal's Ctrl-C), 2 ranks under mpirun -------


def start(cmd):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=nr.mpi_env(),
                            start_new_session=True)


def finish(job, timeout=60):
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        raise AssertionError(f"the job did not end after the signal\n{out[-3000:]}\n{err[-3000:]}")
    return job.returncode, out, err


def wait_unlocked(out, timeout=30):
    """Until no process holds the folder's lock: after mpirun exits, its ranks may take a moment to die."""
    def free():
        with open(Path(out) / "nlptrain.lock") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
    nr.wait_for(free, "the ranks to end", timeout)


def mpirun(run_args, sigkill_timeout=None, ranks=2):
    """2 ranks under mpirun; sigkill_timeout: Open MPI's odls_base_sigkill_timeout (default 1 s), the
    time between the Ctrl-C and the ranks' SIGTERM and between that and their SIGKILL."""
    env = nr.mpi_env()
    if sigkill_timeout is not None:
        env["OMPI_MCA_odls_base_sigkill_timeout"] = str(sigkill_timeout)
    return subprocess.Popen(["mpirun", "-np", str(ranks), nr.binary()] + run_args, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)


def no_half_written_files(out, temporaries_allowed=False):
    """Every checkpoint under its final name is complete. Temporary files (<name>.tmp.<pid>) are left
    only by a process killed with SIGKILL mid-write (mpirun's second Ctrl-C); the next run removes them."""
    d = Path(out) / "checkpoints"
    tmp = list(Path(out).rglob("*.tmp.*"))
    assert temporaries_allowed or not tmp, tmp
    for f in d.glob("step_*.h5") if d.exists() else []:
        with h5py.File(f, "r") as h:  # a complete file under every final name
            assert int(h.attrs["nlptrain_step"]) == int(f.stem.split("_")[1])


def test_ctrl_c_during_start_up_under_mpirun(stream, tmp_path):
    out = tmp_path / "out"
    job = mpirun(args(stream, out, 50, ["--debug.startup_sleep_ms=20000"]))
    nr.wait_for(lambda: (out / "run_id").exists(), "the run to start")
    os.killpg(job.pid, signal.SIGINT)
    t0 = time.time()
    rc, stdout, stderr = finish(job)
    assert time.time() - t0 < 10, "start-up was not cut short"
    assert rc == 1, f"mpirun's exit code after a Ctrl-C is 1 (Open MPI 4.1): {rc}\n{stderr[-3000:]}"
    assert re.search(r"nlptrain: SIGTERM received from mpirun \(pid \d+\) during start-up: stopping before the first "
                     r"step, no checkpoint written \(exit code 75\)", stderr), stderr[-3000:]
    assert checkpoints(out) == [] if (out / "checkpoints").exists() else True
    assert not (out / "metrics.jsonl").exists() or records(out) == []
    assert "done:" not in stdout
    no_half_written_files(out)
    # Nothing of a run was left: a fresh run may use the folder.
    nr.run(args(stream, out, 2))


@pytest.mark.parametrize("ranks", [1, 2])
def test_ctrl_c_mid_step_under_mpirun_checkpoints_that_step_and_resumes(stream, tmp_path, ranks):
    out = tmp_path / "out"
    # 3 s instead of 1 between SIGTERM and SIGKILL: room for the step's end and the checkpoint on a
    # loaded machine (the 300 ms step and the write take well under 1 s when the machine is idle)
    job = mpirun(args(stream, out, 1000, ["--debug.step_sleep_ms=300", "--checkpoint.interval=0"]), sigkill_timeout=3,
                 ranks=ranks)
    nr.wait_for(lambda: (out / "metrics.jsonl").exists() and len(records(out)) >= 2, "two steps")
    os.killpg(job.pid, signal.SIGINT)
    rc, stdout, stderr = finish(job)
    assert rc == 1, f"mpirun's exit code after a Ctrl-C is 1 (Open MPI 4.1): {rc}\n{stderr[-3000:]}"
    m = re.search(r"SIGTERM received from mpirun \(pid \d+\), which ends the job: it kills the ranks 3 s from now "
                  r"\(odls_base_sigkill_timeout\) and exits with code 1; .*: the run stops after step (\d+) with a "
                  r"checkpoint \(exit code 75\) if they end before the kill; a second SIGINT or SIGTERM stops it at "
                  r"once without one", stderr)
    assert m, stderr[-3000:]
    step = int(m.group(1))
    log = (out / "log.txt").read_text()  # mpirun shows no more of the ranks' output: log.txt has it
    assert (f"stop signal received: checkpoint '{ckpt(out, step)}' written at step {step}; exiting with code 75"
            in log), log[-2000:]
    assert "done:" not in log and "done:" not in stdout
    assert checkpoints(out) == [f"step_{step:08d}.h5"]
    assert ckpt_run_id(ckpt(out, step)) == run_id(out)
    assert records(out)[-1]["step"] == step
    no_half_written_files(out)
    p = nr.run(args(stream, out, step + 2, ["--train.resume=true", "--checkpoint.interval=0"]), ranks=ranks)
    assert f"resumed from '{ckpt(out, step)}' at step {step}" in p.stdout
    assert [r["step"] for r in records(out)] == list(range(1, step + 3))


def test_ctrl_c_twice_under_mpirun_ends_the_job_with_nothing_half_written(stream, tmp_path):
    out = tmp_path / "out"
    job = mpirun(args(stream, out, 1000, ["--checkpoint.interval=1", "--checkpoint.keep=3"]))
    nr.wait_for(lambda: (out / "metrics.jsonl").exists() and len(records(out)) >= 3, "three steps")
    os.killpg(job.pid, signal.SIGINT)
    time.sleep(0.2)
    os.killpg(job.pid, signal.SIGINT)
    rc, stdout, stderr = finish(job)
    assert rc not in (0, 75), rc
    log = (out / "log.txt").read_text()
    assert "done:" not in log and "done:" not in stdout
    wait_unlocked(out)
    no_half_written_files(out, temporaries_allowed=True)
    tmp = sorted(str(p) for p in Path(out).rglob("*.tmp.*"))
    # What is there resumes, and a temporary file of a killed write is removed, with a word.
    newest = max(int(c.split("_")[1].split(".")[0]) for c in checkpoints(out))
    p = nr.run(args(stream, out, newest + 1, ["--train.resume=true", "--checkpoint.interval=0"]))
    assert f"resumed from '{ckpt(out, newest)}'" in p.stdout
    if tmp:
        assert (f"output.dir: removed {len(tmp)} temporary file(s) of an unfinished write by a run that was killed: "
                in p.stdout), p.stdout[:3000]
    no_half_written_files(out)


@pytest.mark.parametrize("ranks", [1, 2])
def test_sigusr1_to_mpirun_stops_with_a_checkpoint_and_exit_code_75(stream, tmp_path, ranks):
    out = tmp_path / "out"
    job = mpirun(args(stream, out, 1000, ["--debug.step_sleep_ms=100", "--checkpoint.interval=0"]), ranks=ranks)
    nr.wait_for(lambda: (out / "metrics.jsonl").exists() and len(records(out)) >= 2, "two steps")
    os.kill(job.pid, signal.SIGUSR1)  # Open MPI forwards SIGUSR1 to every rank
    rc, stdout, stderr = finish(job)
    assert rc == 75, f"{rc}\n{stderr[-3000:]}"
    m = re.search(r"stop signal received: checkpoint '(\S+)' written at step (\d+)", stdout)
    assert m and Path(m.group(1)) == ckpt(out, int(m.group(2))), stdout[-2000:]
    assert "done:" not in stdout


# ---- stopping nlptrain itself (one rank, no mpirun): the first SIGINT checkpoints, a second exits -----

def test_sigint_to_nlptrain_checkpoints_and_exits_75_and_a_second_exits_at_once(stream, tmp_path):
    out = tmp_path / "once"
    job = start([nr.binary()] + args(stream, out, 1000, ["--debug.step_sleep_ms=300", "--checkpoint.interval=0"]))
    nr.wait_for(lambda: (out / "metrics.jsonl").exists() and len(records(out)) >= 1, "a step")
    os.killpg(job.pid, signal.SIGINT)
    rc, stdout, stderr = finish(job)
    m = re.search(r"nlptrain: SIGINT received: the run stops after step (\d+) with a checkpoint \(exit code 75\)", stderr)
    assert rc == 75 and m, f"{rc}\n{stderr[-2000:]}"
    step = int(m.group(1))
    assert f"stop signal received: checkpoint '{ckpt(out, step)}' written at step {step}" in stdout
    assert "done:" not in stdout and checkpoints(out) == [f"step_{step:08d}.h5"]

    out = tmp_path / "twice"
    job = start([nr.binary()] + args(stream, out, 1000, ["--debug.step_sleep_ms=1000", "--checkpoint.interval=0"]))
    nr.wait_for(lambda: (out / "metrics.jsonl").exists() and len(records(out)) >= 1, "a step")
    os.killpg(job.pid, signal.SIGINT)
    time.sleep(0.2)  # within the 1 s step: the first is pending at the step's end
    os.killpg(job.pid, signal.SIGINT)
    rc, stdout, stderr = finish(job)
    assert rc == 130, f"{rc}\n{stderr[-2000:]}"
    assert re.search(r"SIGINT received: the run stops after step \d+ with a checkpoint", stderr), stderr
    assert ("nlptrain: SIGINT received again: exiting now without a checkpoint (exit code 130); the newest "
            "complete checkpoint is the one to resume from") in stderr
    assert "done:" not in stdout and "stop signal received" not in stdout
    assert checkpoints(out) == [] if (out / "checkpoints").exists() else True
    no_half_written_files(out)


def test_a_repeated_sigusr1_is_no_second_signal(stream, tmp_path):
    """The jobscripts re-send SIGUSR1 every NLP_RESIGNAL_S seconds until the ranks have stopped: a long
    step still ends in its checkpoint and exit code 75."""
    out = tmp_path / "out"
    job = start([nr.binary()] + args(stream, out, 1000, ["--debug.step_sleep_ms=1000", "--checkpoint.interval=0"]))
    nr.wait_for(lambda: (out / "metrics.jsonl").exists() and len(records(out)) >= 1, "a step")
    os.kill(job.pid, signal.SIGUSR1)
    time.sleep(0.3)
    os.kill(job.pid, signal.SIGUSR1)
    rc, stdout, stderr = finish(job)
    assert rc == 75, f"{rc}\n{stderr[-2000:]}"
    m = re.search(r"stop signal received: checkpoint '(\S+)' written at step (\d+)", stdout)
    assert m and Path(m.group(1)).exists(), stdout[-2000:]
    assert "received again" not in stderr
