"""Stopping a run from outside, as a new user does: Ctrl-C typed at a terminal, and SIGINT and SIGTERM to a detached 2-rank job (what
`timeout`, `nohup`, a script's `cmd &` or a batch system sends; no terminal), under tools/nlprun and
under plain mpirun, and the stop file output.dir/STOP.

Open MPI's mpirun (4.1.4 measured) cannot forward SIGINT or SIGTERM: on either it sends SIGTERM to
every rank odls_base_sigkill_timeout seconds later (1 by default), SIGKILL as long after, and exits
with 1. tools/nlprun turns them into SIGUSR1, which mpirun forwards, so the run stops after the step
in progress with a checkpoint and exit code 75 however long the step. Under plain mpirun the ranks'
first report says what the kill delay leaves of the step in progress, and it must come true: a fast
step is checkpointed, a step longer than the delay is not, and then the report says so and names the
newest checkpoint. log.txt records the signal and what was done; the folder's lock is free after the
job; a resume continues from the checkpoint. Each test runs a tiny GPT-2 for a few seconds."""
import fcntl
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

import nlp_run as nr

TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=1"]
NLPRUN = str(nr.SOURCE_DIR / "tools" / "nlprun")
T = r"(?:\d+ ms|\d+(?:\.\d)? s)"  # a time as the reports write it: 4 ms, 1.5 s, 12 s


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    nr.pattern_stream(d / "train.h5", windows=96, seed=11)
    return d


def args(stream, out, steps=100000, extra=()):
    return TINY + [f"--data.train={stream / 'train.h5'}", f"--output.dir={out}", f"--train.steps={steps}",
                   "--train.batch_size=2", "--train.lr=3e-3", "--train.warmup_steps=2",
                   "--checkpoint.interval=0"] + list(extra)


def checkpoints(out):
    d = Path(out) / "checkpoints"
    return sorted(p.name for p in d.glob("step_*.h5")) if d.exists() else []


def steps_logged(out):
    f = Path(out) / "metrics.jsonl"
    if not f.exists():
        return 0
    return sum(1 for l in f.read_text().splitlines() if l.strip().endswith("}") and '"step"' in l)


def last_step(out):
    rows = [json.loads(l) for l in (Path(out) / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return rows[-1]["step"]


def detached(cmd, log, env=None):
    """cmd started as a shell script's `setsid cmd >log 2>&1 </dev/null &` starts it: a session of its
    own (no terminal), its output in a file, SIGINT and SIGQUIT ignored (what a non-interactive shell
    does to a command run with &)."""
    def child():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)
    f = open(log, "w")
    return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env or nr.mpi_env(), start_new_session=True, preexec_fn=child)


def finish(job, log, timeout=60):
    try:
        job.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        raise AssertionError(f"the job did not end after the signal\n{Path(log).read_text()[-3000:]}")
    return job.returncode, Path(log).read_text()


def lock_free(out, timeout=20):
    """No process holds the folder's lock (after mpirun exits its ranks may take a moment to end)."""
    def free():
        with open(Path(out) / "nlptrain.lock") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
    nr.wait_for(free, "the folder's lock to be released", timeout)


def send(job, sig):
    """SIGINT to the job's process group (kill -INT -- -PID, what a terminal or `timeout -s INT` in a
    group does), SIGTERM and SIGHUP to the launcher itself (kill PID, timeout, a batch system)."""
    if sig == signal.SIGINT:
        os.killpg(job.pid, sig)
    else:
        os.kill(job.pid, sig)


def resumes(stream, out, step):
    p = nr.run(args(stream, out, step + 2, ["--train.resume=true"]), ranks=2)
    assert f"resumed from '{Path(out) / 'checkpoints' / f'step_{step:08d}.h5'}' at step {step}" in p.stdout


# ---- tools/nlprun: SIGINT, SIGTERM, SIGHUP stop with a checkpoint and exit code 75 ------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["INT", "TERM", "HUP"])
def test_a_signal_to_nlprun_stops_a_detached_run_with_a_checkpoint_and_75(stream, tmp_path, sig):
    out, log = tmp_path / "out", tmp_path / "job.log"
    # 1.5 s steps: longer than mpirun's kill delay (1 s), which nlprun keeps out of the way
    job = detached([NLPRUN, "-np", "2", "--bind-to", "none", nr.binary()]
                   + args(stream, out, extra=["--debug.step_sleep_ms=1500"]), log)
    nr.wait_for(lambda: steps_logged(out) >= 1, "a step")
    send(job, sig)
    rc, text = finish(job, log)
    assert rc == 75, f"{rc}\n{text[-3000:]}"
    assert re.search(rf"nlprun: {sig.name}: asking every rank to stop after the step in progress with a checkpoint "
                     r"\(SIGUSR1 to mpirun, pid \d+; exit code 75 follows\)", text), text[-3000:]
    m = re.search(r"stop signal received: checkpoint '(\S+)' written at step (\d+); exiting with code 75", text)
    assert m, text[-3000:]
    step = int(m.group(2))
    logtxt = (out / "log.txt").read_text()
    assert (f"signal: SIGUSR1 received: the run stops after step {step} with a checkpoint (exit code 75)"
            in logtxt), logtxt[-2000:]
    assert m.group(0) in logtxt
    assert checkpoints(out) == [f"step_{step:08d}.h5"] and last_step(out) == step
    lock_free(out, timeout=1)
    resumes(stream, out, step)


def test_nlprun_sends_the_stop_again_when_mpirun_dropped_it(stream, tmp_path):
    """mpirun drops a SIGUSR1 that comes before it has started the ranks (measured: a SIGTERM to nlprun
    1 s after its start, and the run trained on). Here the launcher ignores signals for its first
    second, as that mpirun did; nlprun's repeat reaches it."""
    out, log = tmp_path / "out", tmp_path / "job.log"
    slow = tmp_path / "slow_mpirun"
    slow.write_text('#!/usr/bin/env bash\ntrap "" USR1\nsleep 1\nexec mpirun "$@"\n')
    slow.chmod(0o755)
    env = nr.mpi_env()
    env.update(MPIRUN=str(slow), NLPRUN_RESIGNAL_S="1")
    job = detached([NLPRUN, "-np", "2", "--bind-to", "none", nr.binary()] + args(stream, out), log, env)
    time.sleep(0.5)  # nlprun has started its launcher, which does not listen yet
    send(job, signal.SIGTERM)
    rc, text = finish(job, log)
    assert rc == 75, f"{rc}\n{text[-3000:]}"
    assert "nlprun: SIGTERM: asking every rank to stop" in text
    assert re.search(r"stop signal received|during start-up: stopping before the first step", text), text[-3000:]
    lock_free(out)


def test_a_second_sigint_to_nlprun_ends_the_job_at_once(stream, tmp_path):
    out, log = tmp_path / "out", tmp_path / "job.log"
    job = detached([NLPRUN, "-np", "2", "--bind-to", "none", nr.binary()]
                   + args(stream, out, extra=["--debug.step_sleep_ms=5000"]), log)
    nr.wait_for(lambda: (out / "metrics.jsonl").exists(), "the steps to start")
    time.sleep(0.5)
    send(job, signal.SIGINT)
    time.sleep(0.3)
    t0 = time.time()
    send(job, signal.SIGINT)
    rc, text = finish(job, log)
    assert time.time() - t0 < 4.5, "the second SIGINT did not end the 5 s step early"
    assert rc == 130, f"{rc}\n{text[-3000:]}"
    assert ("nlprun: SIGINT again: ending the job now without a checkpoint (SIGTERM to mpirun; exit code 130); "
            "the newest complete checkpoint is the one to resume from") in text
    assert checkpoints(out) == [] and "stop signal received" not in (out / "log.txt").read_text()
    lock_free(out)


# ---- plain mpirun: the run is not lost, and the first report comes true -----------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_int_or_term_to_a_detached_mpirun_of_fast_steps_keeps_the_run(stream, tmp_path, sig):
    """A line to stdout every step (ms steps) once filled the pipe mpirun reads no more when it ends a
    job: the ranks hung in a write until the SIGKILL, with nothing in log.txt and no checkpoint."""
    out, log = tmp_path / "out", tmp_path / "job.log"
    job = detached(["mpirun", "-np", "2", "--bind-to", "none", nr.binary()] + args(stream, out), log)
    nr.wait_for(lambda: steps_logged(out) >= 200, "200 steps")
    send(job, sig)
    rc, text = finish(job, log)
    assert rc == 1, f"mpirun's exit code after SIGINT or SIGTERM is 1 (Open MPI 4.1): {rc}\n{text[-3000:]}"
    logtxt = (out / "log.txt").read_text()
    m = re.search(r"signal: SIGTERM received from mpirun \(pid \d+\), which ends the job: it kills the ranks 1 s from "
                  r"now \(odls_base_sigkill_timeout\) and exits with code 1; step (\d+) should end and its checkpoint "
                  rf"be written in {T} \(a step takes {T}, no checkpoint timed yet\): the run stops after step "
                  r"\1 with a checkpoint \(exit code 75\) if they end before the kill", logtxt)
    assert m, logtxt[-3000:]
    step = int(m.group(1))
    assert (f"stop signal received: checkpoint '{out / 'checkpoints' / f'step_{step:08d}.h5'}' written at step "
            f"{step}; exiting with code 75") in logtxt
    assert checkpoints(out) == [f"step_{step:08d}.h5"]
    lock_free(out)
    resumes(stream, out, step)


@pytest.mark.parametrize("kill_delay", [None, 2])
def test_ctrl_c_on_a_step_longer_than_the_kill_delay_says_no_checkpoint_and_names_the_newest(stream, tmp_path,
                                                                                             kill_delay):
    out, log = tmp_path / "out", tmp_path / "job.log"
    env = nr.mpi_env()
    if kill_delay:
        env["OMPI_MCA_odls_base_sigkill_timeout"] = str(kill_delay)
    d = kill_delay or 1
    # 4 s steps (6 s with a 2 s delay), a checkpoint after each: the Ctrl-C just after step 1 ends reaches
    # the ranks (as mpirun's SIGTERM) d s later, with about 3 s (4 s) of step 2 left, more than the d s to
    # the kill (2 s to spare for a loaded machine's late Ctrl-C).
    sleep_ms = 4000 if d == 1 else 6000
    job = detached(["mpirun", "-np", "2", "--bind-to", "none", nr.binary()]
                   + args(stream, out, extra=[f"--debug.step_sleep_ms={sleep_ms}", "--checkpoint.interval=1"]),
                   log, env)
    nr.wait_for(lambda: (out / "checkpoints" / "step_00000001.h5").exists(), "step 1's checkpoint")
    send(job, signal.SIGINT)
    rc, text = finish(job, log)
    assert rc == 1, f"{rc}\n{text[-3000:]}"
    logtxt = (out / "log.txt").read_text()
    newest = out / "checkpoints" / "step_00000001.h5"
    assert re.search(rf"signal: SIGTERM received from mpirun \(pid \d+\), which ends the job: it kills the ranks {d} s "
                     r"from now \(odls_base_sigkill_timeout\) and exits with code 1; step 2 needs about \d\.\d s more "
                     rf"\(a step takes \d\.\d s, a checkpoint {T}\), longer than that: the ranks will most likely be "
                     rf"killed before it ends, without a checkpoint of it; the newest checkpoint is '{re.escape(str(newest))}' "
                     r"\(step 1\)", logtxt), logtxt[-3000:]
    assert "stop signal received" not in logtxt  # and so it was
    assert checkpoints(out) == ["step_00000001.h5"]
    lock_free(out)


# ---- the stop file ------------------------------------------------------------------------------------

def test_the_stop_file_stops_every_rank_at_one_step_with_a_checkpoint_and_is_removed(stream, tmp_path):
    out, log = tmp_path / "out", tmp_path / "job.log"
    job = detached(["mpirun", "-np", "2", "--bind-to", "none", nr.binary()]
                   + args(stream, out, extra=["--debug.step_sleep_ms=50"]), log)
    nr.wait_for(lambda: steps_logged(out) >= 3, "three steps")
    (out / "STOP").touch()
    rc, text = finish(job, log)
    assert rc == 75, f"{rc}\n{text[-3000:]}"
    m = re.search(rf"stop file '{re.escape(str(out / 'STOP'))}' found by 2 of 2 rank\(s\) \(each looks in its own "
                  r"output.dir\) and removed: checkpoint '(\S+)' written at step (\d+); exiting with code 75", text)
    assert m, text[-3000:]
    step = int(m.group(2))
    assert m.group(0) in (out / "log.txt").read_text()
    assert not (out / "STOP").exists()
    assert checkpoints(out) == [f"step_{step:08d}.h5"] and last_step(out) == step
    lock_free(out, timeout=1)
    resumes(stream, out, step)


def test_a_stop_file_seen_by_one_rank_only_stops_them_all(stream, tmp_path):
    """Each rank looks in its own output.dir: with node-local scratch folders (the jobscripts), a stop
    file on one node is enough. Here rank 1 is given a folder of its own."""
    out, other, log = tmp_path / "out", tmp_path / "rank1", tmp_path / "job.log"
    other.mkdir()
    a = args(stream, out, extra=["--debug.step_sleep_ms=50"])
    b = args(stream, other, extra=["--debug.step_sleep_ms=50"])
    job = detached(["mpirun", "--bind-to", "none", "-np", "1", nr.binary()] + a + [":", "-np", "1", nr.binary()] + b, log)
    nr.wait_for(lambda: steps_logged(out) >= 3, "three steps")
    (other / "STOP").touch()
    rc, text = finish(job, log)
    assert rc == 75, f"{rc}\n{text[-3000:]}"
    m = re.search(rf"stop file '{re.escape(str(out / 'STOP'))}' found by 1 of 2 rank\(s\) \(each looks in its own "
                  r"output.dir\) and removed: checkpoint '\S+' written at step (\d+)", text)
    assert m, text[-3000:]
    assert not (other / "STOP").exists()
    assert checkpoints(out) == [f"step_{int(m.group(1)):08d}.h5"]


def test_a_stop_file_there_at_start_up_stops_before_the_first_step(stream, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "STOP").touch()
    p = nr.run(args(stream, out, 10), check=False)
    assert p.returncode == 75, p.stderr[-2000:]
    assert (f"stop file '{out / 'STOP'}' found by 1 of 1 rank(s) (each looks in its own output.dir) and removed during "
            "start-up: stopping before step 1, no checkpoint written; exiting with code 75 (run again to train)") in p.stdout
    assert not (out / "STOP").exists() and checkpoints(out) == []
    p = nr.run(args(stream, out, 3))  # and the next run trains
    assert "done: 3 steps" in p.stdout


# ---- in a terminal: Ctrl-C typed at the terminal ------------------------------------------------------

def in_terminal(cmd, env=None):
    """cmd as a shell in a terminal starts it: the session leader and foreground process group of a
    new pseudo-terminal, stdin, stdout and stderr on it. Returns (job, master fd, output collected so far)."""
    import pty
    import termios
    import threading
    master, slave = pty.openpty()

    def child():
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    job = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env or nr.mpi_env(),
                           preexec_fn=child, close_fds=True)
    os.close(slave)
    out = []

    def drain():  # a terminal shows everything: nothing waits on a full pty
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                return
            if not b:
                return
            out.append(b.decode(errors="replace"))
    threading.Thread(target=drain, daemon=True).start()
    return job, master, out


@pytest.mark.parametrize("launcher", ["nlprun", "mpirun"])
def test_ctrl_c_typed_at_a_terminal(stream, tmp_path, launcher):
    """The terminal's Ctrl-C goes to its foreground process group: tools/nlprun only (mpirun runs in a
    group of its own), which stops the run with a checkpoint after a step longer than mpirun's kill
    delay; plain mpirun takes it and kills the ranks, whose report says so."""
    out = tmp_path / "out"
    cmd = [NLPRUN if launcher == "nlprun" else "mpirun", "-np", "2", "--bind-to", "none", nr.binary()]
    job, master, shown = in_terminal(cmd + args(stream, out, extra=["--debug.step_sleep_ms=4000",
                                                                    "--checkpoint.interval=1"]))
    try:
        nr.wait_for(lambda: (out / "checkpoints" / "step_00000001.h5").exists(), "step 1's checkpoint")
        os.write(master, b"\x03")  # Ctrl-C
        job.wait(timeout=60)
    finally:
        if job.poll() is None:
            job.kill()
        time.sleep(0.2)
        os.close(master)
    text = "".join(shown)
    logtxt = (out / "log.txt").read_text()
    if launcher == "nlprun":
        assert job.returncode == 75, f"{job.returncode}\n{text[-3000:]}"
        assert "nlprun: SIGINT: asking every rank to stop after the step in progress with a checkpoint" in text
        assert re.search(r"stop signal received: checkpoint '\S+step_00000002.h5' written at step 2; exiting with "
                         r"code 75", logtxt), logtxt[-2000:]
        assert checkpoints(out) == ["step_00000001.h5", "step_00000002.h5"]
    else:
        assert job.returncode == 1, f"{job.returncode}\n{text[-3000:]}"
        assert re.search(r"signal: SIGTERM received from mpirun \(pid \d+\), which ends the job: it kills the ranks 1 s "
                         r"from now .*; step 2 needs about \d\.\d s more .*: the ranks will most likely be killed before "
                         r"it ends, without a checkpoint of it; the newest checkpoint is '\S+step_00000001.h5' \(step 1\)",
                         logtxt), logtxt[-2000:]
        assert checkpoints(out) == ["step_00000001.h5"]
    lock_free(out)
