"""bench/gpu/run.sh, the one command of a GPU session, checked on a machine without a GPU.

A task is lent a GPU for 15 minutes at most, and rarely, so an error in the script costs a session's
checks. Here the script runs whole on a scratch copy (its own stage of small synthetic data, the
binary of this build, a run-on-device.sh that only executes its arguments). Every nlptrain command
that it sends to the GPU must fail for the one reason this machine gives, no CUDA device: that is
checked after the whole configuration is read and validated, so an option that nlptrain no longer
accepts, or a value that does not fit the model, fails here first. The CPU reference runs of the e2e
section must train.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from nlp_run import SOURCE_DIR, binary, write_stream

NO_DEVICE = re.compile(r"run\.backend=cuda: no usable CUDA device")
# PyTorch's and transformers' words for the same (a CUDA build of torch, or a CPU-only one)
TORCH_NO_DEVICE = re.compile(r"no NVIDIA driver|not compiled with CUDA|no CUDA GPUs|doesn't support bf16/gpu")


def make_tree(root: Path) -> Path:
    """The parts of the repository that run.sh reads, and a stage like prepare.sh's; returns bench/gpu."""
    gpu = root / "bench" / "gpu"
    shutil.copytree(SOURCE_DIR / "bench" / "gpu" / "inputs", gpu / "inputs")
    for f in ("run.sh", "compare.py", "collect.py", "torch_bench.py"):
        shutil.copy(SOURCE_DIR / "bench" / "gpu" / f, gpu / f)
    for f in ("finetune_speed.sh", "finetune_speed_report.py", "bert_accuracy/hf_trainer.py"):
        (root / "bench" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCE_DIR / "bench" / f, root / "bench" / f)
    stage = gpu / "stage"
    (stage / "bin").mkdir(parents=True)
    os.symlink(binary(), stage / "bin" / "nlptrain")
    tests = Path(binary()).parent / "tests" / "test_ops_cuda"  # skips each test here, saying why
    if tests.exists():
        os.symlink(tests, stage / "bin" / "test_ops_cuda")
    launcher = stage / "bin" / "run-on-device.sh"
    launcher.write_text('#!/bin/bash\nif [[ $1 == --check ]]; then exit 0; fi\nexec "$@"\n')
    launcher.chmod(0o755)
    (stage / "commit.txt").write_text("test\n")
    rng = np.random.default_rng(0)
    data = stage / "data"
    data.mkdir()
    write_stream(data / "gpt2_train.h5", rng.integers(0, 50257, size=20000))
    doc_cls(data / "nsmc_train.h5", 256, rng)
    (data / "ft" / "doc_cls").mkdir(parents=True)
    doc_cls(data / "ft" / "doc_cls" / "train.h5", 256, rng)
    doc_cls(data / "ft" / "doc_cls" / "eval.h5", 32, rng)
    # the key finetune_speed.sh compares before it reuses the data (as prepare.sh writes it)
    (data / "ft" / "doc_cls" / "key").write_text("nsmc train --limit 8000 test --limit 500 T128\n")
    return gpu


def doc_cls(path: Path, n: int, rng) -> None:
    """n NSMC-like rows at T = 128 (kcbert-base's ids: [CLS] 2, [SEP] 3, padding 0), 5-60 tokens."""
    import h5py

    T = 128
    ids = np.zeros((n, T), np.int32)
    mask = np.zeros((n, T), np.int32)
    for r in range(n):
        L = int(rng.integers(5, 61))
        ids[r, :L] = rng.integers(5, 30000, size=L)
        ids[r, 0], ids[r, L - 1] = 2, 3
        mask[r, :L] = 1
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=ids)
        f.create_dataset("attention_mask", data=mask)
        f.create_dataset("token_type_ids", data=np.zeros_like(ids))
        f.create_dataset("labels", data=rng.integers(0, 2, size=n).astype(np.int32))
        f.attrs.update(task="doc_cls", vocab_size=30000, pad_id=0, cls_id=2, sep_id=3, num_labels=2,
                       max_seq_len=T, num_examples=n)


def test_gpu_script_runs_whole_without_a_gpu(tmp_path):
    gpu = make_tree(tmp_path / "repo")
    out = tmp_path / "out"
    env = dict(os.environ, OUT=str(out), SECTIONS="info tests e2e finetune bench torch resume profile",
               E2E_STEPS="3", FT_STEPS="3", DEADLINE="600", TMPDIR=str(tmp_path),
               TORCH_RUNS="bert:compile:bf16 gpt2:eager:fp32",
               FT_SETTINGS="nlptrain-longest-group-bf16 nlptrain-packed-bf16 nlptrain-packed-cudnn-bf16 "
                           "hf-longest-group-compile-bf16")
    p = subprocess.run(["bash", str(gpu / "run.sh")], capture_output=True, text=True, env=env, timeout=900)
    log = (out / "run.log").read_text()
    assert p.returncode == 0, f"run.sh exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert re.search(r"\] done$", log, re.M), log[-3000:]
    assert "SKIPPED" not in log, log

    work = Path(re.search(r"work (\S+)", log).group(1))
    # e2e: the CPU references train; every GPU run stops at the device check, not before
    cpu = sorted(work.glob("e2e_*_cpu.log"))
    assert len(cpu) == 5, cpu
    for f in cpu:
        name = f.stem[len("e2e_"):]
        assert re.search(rf"e2e {name}: exit 0 \| step +3/3", log), f"{name}:\n{f.read_text()[-2000:]}"
    gpu_logs = [f for f in work.glob("e2e_*.log") if not f.stem.endswith("_cpu") and "compare" not in f.stem]
    assert len(gpu_logs) == 8, gpu_logs
    # bench, profile, resume: nlptrain's own logs (stderr) beside the work folder's files
    gpu_logs += [f for f in work.glob("nlptrain_*.log")] + [f for f in work.glob("profile_*.log")]
    gpu_logs += [f for f in work.glob("resume_*.log") if "compare" not in f.stem]
    # finetune: the nlptrain settings' logs
    gpu_logs += [f for f in (work / "finetune" / "raw").glob("doc_cls_nlptrain-*.log")]
    assert len(gpu_logs) == 8 + 4 + 2 + 6 + 3, gpu_logs
    for f in gpu_logs:
        text = f.read_text()
        assert NO_DEVICE.search(text), f"{f.name}: failed before the device check:\n{text[-2000:]}"
    # the PyTorch side: the arguments are taken (no usage message), the device is what stops it
    torch_logs = sorted(work.glob("torch_*.log")) + sorted((work / "finetune" / "raw").glob("doc_cls_hf-*.log"))
    assert len(torch_logs) == 3, torch_logs
    for f in torch_logs:
        text = f.read_text()
        assert "usage:" not in text and TORCH_NO_DEVICE.search(text), f"{f.name}:\n{text[-2000:]}"
    assert (out / "finetune_results.md").exists()
    assert {p.name for p in out.iterdir()} <= {"results.json", "summary.txt", "run.log", "gpu-run.tar.gz",
                                               "test_ops_cuda.log", "profile.txt", "finetune_results.md"}
