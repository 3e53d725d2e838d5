"""Multi-rank tests of the gradient communication (comm.*): the overlapped, bucketed allreduce gives
the losses of the single blocking allreduce (2 and 4 ranks, gradient accumulation, buckets small
enough that every block is its own bucket), the staged communicator equals plain MPI on the CPU
backend, summary.json reports the exposed communication, and the GPU runs (1 rank, and 2 ranks
sharing one GPU through the staged communicator) when a CUDA device is present (skipped, saying why,
without one)."""
import json
import subprocess

import numpy as np
import pytest

import nlp_run as nr

TINY = ["--model.n_layer=3", "--model.n_head=2", "--model.n_embd=32", "--model.vocab_size=64",
        "--model.n_positions=16", "--data.seq_len=16", "--run.threads=1", "--run.log_interval=10",
        "--train.lr=3e-3", "--train.warmup_steps=5", "--train.clip=1.0"]


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    return nr.pattern_stream(tmp_path_factory.mktemp("data") / "train.h5", windows=128, seed=11, mult=5)


def losses(out):
    return np.array([r["loss"] for r in nr.metrics(out)[0]])


def run(stream, out, ranks, steps, extra):
    batch = 8 // (ranks * 2)  # global batch 8 = ranks x batch x accum 2
    p = nr.run(TINY + [f"--data.train={stream}", f"--output.dir={out}", f"--train.steps={steps}",
                       f"--train.batch_size={batch}", "--train.grad_accum=2"] + list(extra), ranks=ranks)
    (out / "stdout.txt").write_text(p.stdout)
    return losses(out)


@pytest.mark.parametrize("ranks", [2, 4])
def test_overlapped_buckets_equal_one_allreduce(stream, tmp_path, ranks):
    steps = 50
    ref = run(stream, tmp_path / "blocking", ranks, steps, ["--comm.overlap=false"])
    # 0.01 MiB = 2621 floats: the ~12.7k-float blocks are one bucket each, started during the backward
    ovl = run(stream, tmp_path / "overlap", ranks, steps, ["--comm.overlap=true", "--comm.bucket_mb=0.01"])
    one = run(stream, tmp_path / "one_bucket", ranks, steps, ["--comm.overlap=true", "--comm.bucket_mb=100"])
    assert len(ref) == len(ovl) == len(one) == steps
    assert ref[-1] < ref[0] - 0.5, "the run must learn, else equal losses prove little"
    assert np.max(np.abs(ovl - ref)) < 1e-6, (ref, ovl)
    assert np.max(np.abs(one - ref)) < 1e-6, (ref, one)
    assert "(gradients: mpi, overlapped)" in (tmp_path / "overlap" / "stdout.txt").read_text()
    assert "(gradients: mpi)" in (tmp_path / "blocking" / "stdout.txt").read_text()
    for d in ("blocking", "overlap"):
        s = json.loads((tmp_path / d / "summary.json").read_text())
        assert s["world_size"] == ranks
        assert 0 <= s["comm_s"] <= s["step_time_s"], s


@pytest.mark.parametrize("ranks", [2, 4])
def test_staged_equals_mpi_on_cpu(stream, tmp_path, ranks):
    steps = 20
    mpi = run(stream, tmp_path / "mpi", ranks, steps, ["--comm.overlap=false"])
    staged = run(stream, tmp_path / "staged", ranks, steps, ["--comm.gpu=staged", "--comm.overlap=false"])
    staged_ovl = run(stream, tmp_path / "staged_ovl", ranks, steps,
                     ["--comm.gpu=staged", "--comm.bucket_mb=0.01"])
    # ZeRO-1's overlapped reduce-scatter buckets (with grad_accum 2: only the last micro-batch's
    # backward starts buckets) through MPI with block recomputation, and through the staged copies
    zero_ovl = run(stream, tmp_path / "zero_ovl", ranks, steps,
                   ["--train.zero=1", "--comm.bucket_mb=0.01", "--train.recompute=block"])
    staged_zero = run(stream, tmp_path / "staged_zero", ranks, steps,
                      ["--comm.gpu=staged", "--train.zero=1", "--comm.bucket_mb=0.01"])
    if ranks == 2:  # a + b: the same sum whatever the chunking
        assert np.array_equal(staged, mpi), (mpi, staged)
    for name, got in (("staged", staged), ("staged_ovl", staged_ovl), ("zero_ovl", zero_ovl),
                      ("staged_zero", staged_zero)):
        assert len(got) == steps and np.max(np.abs(got - mpi)) < 1e-6, (name, mpi, got)


def test_nccl_on_cpu_backend_is_an_error(stream, tmp_path):
    p = nr.run(TINY + [f"--data.train={stream}", f"--output.dir={tmp_path}", "--train.steps=1",
                       "--comm.gpu=nccl"], ranks=2, check=False)
    assert p.returncode != 0
    assert "comm.gpu = nccl needs run.backend = cuda" in p.stderr


@pytest.mark.parametrize("ranks", [1, 2])
def test_cuda_staged_ranks_sharing_one_gpu(stream, tmp_path, ranks):
    """1 rank, and 2 ranks on one GPU through the staged communicator (NCCL refuses a shared GPU):
    the same losses as the CPU backend with the same global batch (fp32, native attention)."""
    nr.cuda_device_or_skip("the GPU communicator runs are")
    common = ["--train.precision=fp32", "--model.attention=native", "--comm.bucket_mb=0.01"]
    cpu = run(stream, tmp_path / "cpu", 2, 10, common)
    gpu = run(stream, tmp_path / "gpu", ranks, 10,
              common + ["--run.backend=cuda", "--comm.gpu=staged"])
    assert np.max(np.abs(gpu - cpu)) < 1e-4, (cpu, gpu)


@pytest.mark.parametrize("zero", [0, 1])
def test_stuck_rank_ends_every_rank_after_the_timeout(stream, tmp_path, zero):
    """A rank that never joins the gradient sum (NLPTRAIN_TEST_STALL_RANK makes rank 1 stop as a hung
    rank would): the others give up after comm.timeout_s with a message, and every rank ends. Also for
    ZeRO-1's overlapped reduce-scatter buckets."""
    env = nr.mpi_env()
    env["NLPTRAIN_TEST_STALL_RANK"] = "1"
    cmd = ["mpirun", "-np", "2", nr.binary()] + TINY + [
        f"--data.train={stream}", f"--output.dir={tmp_path}", "--train.steps=3", "--comm.timeout_s=3",
        "--comm.bucket_mb=0.01", f"--train.zero={zero}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0
    assert "not complete after comm.timeout_s = 3 s" in p.stderr, p.stderr[-3000:]
    assert "rank 0 of 2" in p.stderr


@pytest.mark.parametrize("bad", ["0", "-1", "5000", "abc"])
def test_bad_bucket_mb_is_rejected(stream, tmp_path, bad):
    p = nr.run(TINY + [f"--data.train={stream}", f"--output.dir={tmp_path}", "--train.steps=1",
                       f"--comm.bucket_mb={bad}"], ranks=1, check=False)
    assert p.returncode != 0
    assert "comm.bucket_mb" in p.stderr and bad in p.stderr, p.stderr[-2000:]


def test_bad_comm_gpu_is_rejected(stream, tmp_path):
    p = nr.run(TINY + [f"--data.train={stream}", f"--output.dir={tmp_path}", "--train.steps=1",
                       "--comm.gpu=gloo"], ranks=1, check=False)
    assert p.returncode != 0
    assert "comm.gpu" in p.stderr and "gloo" in p.stderr, p.stderr[-2000:]
