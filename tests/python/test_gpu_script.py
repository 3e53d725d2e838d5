"""bench/gpu/run.sh, the one command of a GPU node's benchmark job, checked on a machine without a GPU.

A GPU node is held for minutes at a time, so an error in the script costs a whole run's
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
    for f in ("run.sh", "compare.py", "collect.py", "torch_bench.py", "ncu_busy.py"):
        shutil.copy(SOURCE_DIR / "bench" / "gpu" / f, gpu / f)
    for f in ("finetune_speed.sh", "finetune_speed_report.py", "results_archive.py", "bert_accuracy/hf_trainer.py"):
        (root / "bench" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCE_DIR / "bench" / f, root / "bench" / f)
    stage = gpu / "stage"
    (stage / "bin").mkdir(parents=True)
    os.symlink(binary(), stage / "bin" / "nlptrain")
    for t in ("test_ops_cuda", "test_ops_cuda_bf16", "test_gemm_cuda_bf16", "test_attention_cudnn_bf16"):
        tests = Path(binary()).parent / "tests" / t  # skips each test here, saying why
        if tests.exists():
            os.symlink(tests, stage / "bin" / t)
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


HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def ncu_csv(kernels) -> str:
    """Nsight Compute's --csv --page details output for [(kernel name, unit, value)], with the
    ==PROF== lines it writes before the table."""
    rows = ["==PROF== Connected to process 4242 (/stage/bin/nlptrain)", HEADER]
    for i, (name, unit, value) in enumerate(kernels):
        for metric, u, v in (("gpu__time_duration.sum", unit, value), ("sm__throughput.avg.pct", "%", "1.5")):
            rows.append(",".join(f'"{x}"' for x in (i, 4242, "nlptrain", "h", name, 1, 7, "(256, 1, 1)",
                                                   "(8, 1, 1)", 0, "9.0", "Command line profiler metrics",
                                                   metric, u, v)))
    rows.append("==PROF== Disconnected from process 4242")
    return "\n".join(rows) + "\n"


# two steps after a start-up kernel: layer norm, a GEMM, then AdamW (twice in step 2: a step may launch
# it more than once), and an evaluation's kernels after the last step (not a step)
STEPS_CSV = [("nlp::kern::init_k(float*)", "usecond", "5"),
             ("nlp::kern::(anonymous namespace)::ln_fwd_k(float*, int)", "usecond", "2.5"),
             ("sm90_xmma_gemm_bf16bf16_bf16f32", "msecond", "1.25"),
             ("nlp::kern::(anonymous namespace)::adamw_spans_k(float*)", "nsecond", "500"),
             ("nlp::kern::(anonymous namespace)::ln_fwd_k(float*, int)", "usecond", "2.5"),
             ("sm90_xmma_gemm_bf16bf16_bf16f32", "usecond", "1,250"),
             ("nlp::kern::(anonymous namespace)::adamw_spans_k(float*)", "nsecond", "250"),
             ("nlp::kern::(anonymous namespace)::adamw_spans_k(float*)", "nsecond", "250"),
             ("nlp::kern::(anonymous namespace)::ln_fwd_k(float*, int)", "usecond", "9")]


def test_ncu_busy_cuts_steps_at_adamw_and_sums_durations(tmp_path):
    csv_path, metrics = tmp_path / "busy.csv", tmp_path / "metrics.jsonl"
    csv_path.write_text(ncu_csv(STEPS_CSV))
    metrics.write_text('{"step": 1, "loss": 1.0, "step_time_s": 0.004}\n{"step": 2, "loss": 0.9, "step_time_s": 0.002}\n'
                       '{"step": 2, "split": "eval", "loss": 0.9}\n')
    script = SOURCE_DIR / "bench" / "gpu" / "ncu_busy.py"
    p = subprocess.run(["python3", str(script), "--csv", str(csv_path), "--metrics", str(metrics), "--skip", "1"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "9 kernels, 2 steps" in out, out
    # step 1: 5 + 2.5 + 1250 + 0.5 us = 1.258 ms of a 4 ms step; step 2: 2.5 + 1250 + 0.25 + 0.25 us
    assert re.search(r"^ +1 +4 +1\.258 +4\.000 +0\.31$", out, re.M), out
    assert re.search(r"^ +2 +4 +1\.253 +2\.000 +0\.63$", out, re.M), out
    assert "median over steps 2..2: 4 kernels, GPU busy 1.253 ms per step, busy/wall 0.63" in out, out
    assert re.search(r"sm90_xmma_gemm_bf16bf16_bf16f32 +99\.8% +1\.0 per step +1250\.0 us each", out), out
    assert re.search(r"^ +adamw_spans_k +0\.0% +2\.0 per step +0\.2 us each", out, re.M), out  # names, short
    # a log without the table (ncu refused the device, another format): FAIL with its first lines
    csv_path.write_text("==PROF== ERROR: Failed to initialize the profiler: LibraryNotLoaded\n")
    p = subprocess.run(["python3", str(script), "--csv", str(csv_path)], capture_output=True, text=True)
    assert p.returncode == 1 and "FAIL ncu busy" in p.stdout and "LibraryNotLoaded" in p.stdout, p.stdout


# a stand-in for Nsight Compute: writes STEPS_CSV to its --log-file, then runs the program it was given
FAKE_NCU = """#!/usr/bin/env python3
import os, sys
sys.path.insert(0, {here!r})
from test_gpu_script import STEPS_CSV, ncu_csv
args, log = sys.argv[1:], None
while args and args[0].startswith("--"):
    opt = args.pop(0)
    if opt != "--csv":  # every other option of run.sh's ncu line takes a value
        value = args.pop(0)
        if opt == "--log-file":
            log = value
open(log, "w").write(ncu_csv(STEPS_CSV))
os.execvp(args[0], args)
"""


def test_compare_steps_gives_the_median_after_the_skipped_steps(tmp_path):
    # the A/B's measurement: step times of two runs, the first SKIP steps slow (recording, builds)
    import json
    for name, times in {"a": [9.0, 9.0, 0.010, 0.012, 0.011], "b": [7.0, 7.0, 0.006, 0.004, 0.005, 0.003]}.items():
        (tmp_path / name).mkdir()
        with open(tmp_path / name / "metrics.jsonl", "w") as f:
            for i, t in enumerate(times, 1):
                f.write(json.dumps({"step": i, "loss": 1.0, "step_time_s": t}) + "\n")
            f.write(json.dumps({"step": len(times), "split": "eval", "loss": 1.0}) + "\n")
    p = subprocess.run(["python3", str(SOURCE_DIR / "bench" / "gpu" / "compare.py"), "steps",
                        f"a={tmp_path / 'a'}", f"b={tmp_path / 'b'}", f"c={tmp_path / 'none'}", "--skip", "2"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    # a: median of 10, 12, 11 ms; b: median of 6, 4, 5, 3 ms = 4.5 ms, 0.409x a's
    assert lines[0].startswith("INFO steps a: median step 11.000 ms over steps 3..5 (3 steps;"), lines
    assert lines[0].endswith("1.000x the first run's"), lines
    assert lines[1].startswith("INFO steps b: median step 4.500 ms over steps 3..6 (4 steps; fastest 3.000,"), lines
    assert lines[1].endswith("0.409x the first run's"), lines
    assert lines[2].startswith("INFO steps c: no "), lines


def synthetic_profile(head_ms, blocks_ms, step_s):
    # floors worked out by hand: the head's GEMMs 2 ms, the blocks' 4 ms, the casts 1 ms (7 ms a step)
    fam = [{"family": "gemm (lm head)", "bytes": 0, "flops": 2e12, "floor_ms": 2.0, "ms": head_ms, "ratio": None,
            "calls": 3},
           {"family": "gemm (blocks)", "bytes": 0, "flops": 4e12, "floor_ms": 4.0, "ms": blocks_ms, "ratio": None,
            "calls": 48},
           {"family": "cast (bf16 operands)", "bytes": 1e9, "flops": 0, "floor_ms": 1.0, "ms": None, "ratio": None,
            "calls": 49}]
    return {"step_time_s": step_s,
            "profile": {"steps": 5, "rates": "copy ...: 1000.0 GB/s; GEMM: 1000.0 TFLOP/s",
                        "predicted_step_ms": 7.0, "measured_ops_ms": head_ms + blocks_ms, "families": fam,
                        "ops": []}}


def test_account_prints_families_floors_and_the_predicted_step(tmp_path):
    import json
    (tmp_path / "a.json").write_text(json.dumps(synthetic_profile(8.0, 4.8, 0.014)))
    (tmp_path / "b.json").write_text(json.dumps(synthetic_profile(2.4, 4.8, 0.0075)))
    (tmp_path / "none.json").write_text(json.dumps({"step_time_s": 0.01, "profile": None}))
    p = subprocess.run(["python3", str(SOURCE_DIR / "bench" / "gpu" / "account.py"), f"verified={tmp_path / 'a.json'}",
                        f"copy={tmp_path / 'b.json'}", f"none={tmp_path / 'none.json'}"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr  # the run without a profile
    out = p.stdout
    assert out.startswith("INFO account verified: copy ...: 1000.0 GB/s"), out
    # the head: 8 ms against a floor of 2 (4x, marked); the blocks 4.8 against 4 (1.2x, within 25%)
    assert re.search(r"^  gemm \(lm head\) +2\.000 +8\.000 +4\.00 +- +> floor \+ 25%$", out, re.M), out
    assert re.search(r"^  gemm \(blocks\) +4\.000 +4\.800 +1\.20 +-$", out, re.M), out
    assert re.search(r"^  cast \(bf16 operands\) +1\.000 +- +- +-$", out, re.M), out
    assert "predicted step (sum of floors) 7.000 ms | measured step 14.000 ms (2.00x the prediction) | " \
           "measured ops 12.800 ms" in out, out
    # the second run against the first: the head 0.30x, within 25% of its floor (2.4 / 2 = 1.2)
    assert re.search(r"^  gemm \(lm head\) +2\.000 +2\.400 +1\.20 +0\.30$", out, re.M), out
    assert "measured step 7.500 ms (1.07x the prediction)" in out, out
    assert "FAIL account none: no summary.json with a \"profile\" section" in out, out


def test_gpu_script_runs_whole_without_a_gpu(tmp_path):
    gpu = make_tree(tmp_path / "repo")
    out = tmp_path / "out"
    fake_ncu = tmp_path / "ncu"
    fake_ncu.write_text(FAKE_NCU.format(here=str(Path(__file__).parent)))
    fake_ncu.chmod(0o755)
    # the finetune runs stop at the device check before they write the config.ini that the finetune
    # section's profile, A/B and ncu runs take: a cuda INI of the small BERT in its place
    ft_ini = tmp_path / "ft_config.ini"
    ft_ini.write_text((gpu / "inputs" / "bert_small.ini").read_text().replace("[run]", "[run]\nbackend = cuda")
                      .replace("stage/data/", str(gpu / "stage" / "data") + "/"))
    env = dict(os.environ, OUT=str(out), SECTIONS="info tests e2e finetune bench torch resume faults profile",
               NCU=str(fake_ncu), FT_PROFILE_INI=str(ft_ini),
               E2E_STEPS="3", FT_STEPS="3", DEADLINE="600", TMPDIR=str(tmp_path),
               TORCH_RUNS="bert:compile:bf16 gpt2:eager:fp32",
               FT_SETTINGS="nlptrain-longest-group-bf16 nlptrain-packed-bf16 nlptrain-packed-cudnn-bf16 "
                           "nlptrain-packedrows-bf16 hf-longest-group-compile-bf16")
    p = subprocess.run(["bash", str(gpu / "run.sh")], capture_output=True, text=True, env=env, timeout=900)
    log = (out / "run.log").read_text()
    assert p.returncode == 0, f"run.sh exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert re.search(r"\] done$", log, re.M), log[-3000:]
    assert "SKIPPED" not in log, log

    work = Path(re.search(r"work (\S+)", log).group(1))
    # e2e: the CPU references train; every GPU run stops at the device check, not before
    cpu = sorted(work.glob("e2e_*_cpu.log"))
    assert len(cpu) == 9, cpu
    for f in cpu:
        name = f.stem[len("e2e_"):]
        assert re.search(rf"e2e {name}: exit 0 \| step +3/3", log), f"{name}:\n{f.read_text()[-2000:]}"
    gpu_logs = [f for f in work.glob("e2e_*.log") if not f.stem.endswith("_cpu") and "compare" not in f.stem]
    assert len(gpu_logs) == 15, gpu_logs
    # bench, profile, resume: nlptrain's own logs (stderr) beside the work folder's files
    # (bf16 only by default)
    gpu_logs += [f for f in work.glob("nlptrain_*.log")] + [f for f in work.glob("profile_*.log")]
    gpu_logs += [f for f in work.glob("resume_*.log") if "compare" not in f.stem]
    # the fused LM head's GPT-2 124M run (after the benchmarks)
    gpu_logs += [work / "fused_head_gpt2_124m_bf16.log"]
    # the new bf16 step's check under run.sync_check (its timed runs at three batches are nlptrain_*)
    gpu_logs += [work / "new_gpt2_124m_bf16_check.log"]
    # the two faults (a rank killed with two ranks on the GPU; a batch beyond its memory)
    gpu_logs += [work / "faults_kill.log", work / "faults_too_big.log"]
    # finetune: the nlptrain settings' logs
    gpu_logs += [f for f in (work / "finetune" / "raw").glob("doc_cls_nlptrain-*.log")]
    # the finetune step's profile and its run under ncu (here the stand-in, whose CSV is read into the
    # log and profile.txt)
    gpu_logs += [work / "ncu_busy.log"]
    # run.cuda_graph's A/B: eager and graphs, two rounds
    gpu_logs += sorted(work.glob("graph_ab_*.log"))
    assert work / "profile_finetune.log" in gpu_logs  # with the two models' profiles, above
    assert len(gpu_logs) == 15 + (2 + 3) + 3 + 1 + 1 + 2 + 6 + 4 + 1 + 4, gpu_logs
    assert "faults kill -9 of rank 0 at step 5 (2 ranks): exit" in log, log[-3000:]
    assert "fused head: op tests exit" in log, log[-3000:]
    assert "ncu busy: 9 kernels, 2 steps" in log, log[-3000:]
    # the A/B's steady-step line for each of its four runs (here each says it has no metrics)
    for run in ("eager_1", "graphs_1", "eager_2", "graphs_2"):
        assert f"graph A/B: INFO steps {run}:" in log, log[-3000:]
    assert "ncu busy: 9 kernels, 2 steps" in (out / "profile.txt").read_text()
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
                                               "test_ops_cuda.log", "test_ops_cuda_bf16.log", "profile.txt",
                                               "finetune_results.md"}
