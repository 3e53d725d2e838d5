"""CPU threads from the CPUs a rank was given: under Open MPI's default binding (one
core per rank for up to 2 ranks), under --bind-to none and under taskset, the thread count and the
warning are as the README says."""
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

import nlp_run as nr

RUN = ["--train.steps=1", "--model.n_layer=1", "--model.n_embd=32", "--model.n_head=2", "--model.vocab_size=64",
       "--model.n_positions=16", "--data.seq_len=16"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs at least 2 CPUs in this process's affinity mask (binding is then moot)")
    p = tmp_path_factory.mktemp("aff") / "stream.h5"
    with h5py.File(p, "w") as f:
        f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, 64, 2000).astype(np.int32))
    return p


def launch(prefix, data, out, *extra):
    env = nr.mpi_env(threads=None)
    env.pop("OMP_NUM_THREADS", None)
    cmd = prefix + [nr.binary()] + RUN + [f"--data.train={data}", f"--output.dir={out}", *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_default_mpirun_binding_gets_one_thread_and_a_warning(data, tmp_path):
    log = launch(["mpirun", "-np", "1"], data, tmp_path / "o")
    assert "1 thread(s) per rank on 1 CPU(s)" in log, log
    assert "warning: this rank is bound to 1 CPU" in log and "--bind-to none" in log, log


def test_bind_to_none_uses_the_node(data, tmp_path):
    n = len(os.sched_getaffinity(0))
    log = launch(["mpirun", "-np", "1", "--bind-to", "none"], data, tmp_path / "o")
    assert f"{n} thread(s) per rank on {n} CPU(s)" in log, log
    assert "warning: this rank is bound" not in log, log


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset (util-linux) not installed")
def test_taskset_mask_and_requested_threads_above_it(data, tmp_path):
    log = launch(["taskset", "-c", "0"], data, tmp_path / "a")
    assert "1 thread(s) per rank on 1 CPU(s) (0)" in log and "warning: this rank is bound to 1 CPU" in log, log
    log = launch(["taskset", "-c", "0"], data, tmp_path / "b", "--run.threads=2")
    assert "2 thread(s) per rank on 1 CPU(s) (0)" in log, log
    assert "warning: run.threads = 2 but this rank may run on 1 CPU(s) (affinity mask 0" in log, log
