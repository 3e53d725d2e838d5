"""bench/gpu/run.sh, the one command of a GPU node's benchmark job, checked on a machine without a GPU.

A GPU node is held for minutes at a time, so an error in the script costs a whole run's
checks. Here the script runs whole on a scratch copy (its own stage of small synthetic data, the
binary of this build, a run-on-device.sh that only executes its arguments). Every nlptrain command
that it sends to the GPU must fail for the one reason this machine gives, no CUDA device: that is
checked after the whole configuration is read and validated, so an option that nlptrain no longer
accepts, or a value that does not fit the model, fails here first. The CPU reference runs of the e2e
section must train.

The script's decisions (which fallback each test result switches on, which rung of the new bf16 step
is timed, the deadline) are checked against stand-ins: a gtest binary whose chosen tests fail, crash
(a signal), hang, or leave a sticky error that fails every later test of the process, and an nlptrain
that writes the files of a run whose chosen configurations fail their check or drift in loss.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from nlp_run import SOURCE_DIR, binary, write_stream

NO_DEVICE = re.compile(r"run\.backend=cuda: no usable CUDA device")
# PyTorch's and transformers' words for the same (a CUDA build of torch, or a CPU-only one)
TORCH_NO_DEVICE = re.compile(r"no NVIDIA driver|not compiled with CUDA|no CUDA GPUs|doesn't support bf16/gpu")


def build_has() -> dict:
    """What this nlptrain accepts, from its --help: model.type roberta and electra, train.zero's
    highest stage (and whether stage 3 runs on cuda), train.offload."""
    text = subprocess.run([binary(), "--help"], capture_output=True, text=True, timeout=60).stdout
    mtype = next(l for l in text.splitlines() if l.strip().startswith("model.type "))
    zero = next(l for l in text.splitlines() if l.strip().startswith("train.zero "))
    return {"roberta": "roberta" in mtype, "electra": "electra" in mtype,
            "zero": int(re.search(r"\(in \[0, (\d+)\]\)", zero).group(1)),
            # stage 3 refused with run.backend = cuda ("cpu backend only" in its help)
            "zero3_cuda": "3 = " in zero and "cpu backend only" not in zero,
            "offload": bool(re.search(r"^ +train\.offload ", text, re.M))}


def make_tree(root: Path) -> Path:
    """The parts of the repository that run.sh reads, and a stage like prepare.sh's; returns bench/gpu."""
    gpu = root / "bench" / "gpu"
    shutil.copytree(SOURCE_DIR / "bench" / "gpu" / "inputs", gpu / "inputs")
    for f in ("run.sh", "compare.py", "collect.py", "account.py", "torch_bench.py", "ncu_busy.py", "verified_ops.txt"):
        shutil.copy(SOURCE_DIR / "bench" / "gpu" / f, gpu / f)
    for f in ("finetune_speed.sh", "finetune_speed_report.py", "results_archive.py", "bert_accuracy/hf_trainer.py"):
        (root / "bench" / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(SOURCE_DIR / "bench" / f, root / "bench" / f)
    stage = gpu / "stage"
    (stage / "bin").mkdir(parents=True)
    os.symlink(binary(), stage / "bin" / "nlptrain")
    for t in ("test_ops_cuda", "test_cuda_bf16", "test_ops_cuda_bf16", "test_gemm_cuda_bf16",
              "test_attention_cudnn_bf16"):
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
    env = dict(os.environ, OUT=str(out), SECTIONS="info tests e2e finetune bench torch resume faults comm profile",
               NCU=str(fake_ncu), FT_PROFILE_INI=str(ft_ini),
               E2E_STEPS="3", COMM_STEPS="3", FT_STEPS="3", DEADLINE="600", TMPDIR=str(tmp_path),
               TORCH_RUNS="bert:compile:bf16 gpt2:eager:fp32",
               FT_SETTINGS="nlptrain-longest-group-bf16 nlptrain-packed-bf16 nlptrain-packed-cudnn-bf16 "
                           "nlptrain-packedrows-bf16 hf-longest-group-compile-bf16")
    p = subprocess.run(["bash", str(gpu / "run.sh")], capture_output=True, text=True, env=env, timeout=900)
    log = (out / "run.log").read_text()
    assert p.returncode == 0, f"run.sh exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert re.search(r"\] done$", log, re.M), log[-3000:]
    assert "SKIPPED" not in log, log

    work = Path(re.search(r"work (\S+)", log).group(1))
    # what this binary has of the encoders beside BERT and of the ZeRO stages (its --help): the runs of
    # the others must be refused and logged "not in this build", the rest must run
    has = build_has()
    encoders = [m for m in ("roberta", "electra") if has[m]]
    # e2e: the CPU references train; every GPU run stops at the device check, not before
    cpu = sorted(work.glob("e2e_*_cpu.log"))
    assert len(cpu) == 13, cpu
    for f in cpu:
        name = f.stem[len("e2e_"):]
        if name.split("_")[0] in ("roberta", "electra") and name.split("_")[0] not in encoders:
            assert re.search(rf"e2e {name}: not in this build: skipped \| nlptrain: error: .*model\.", log), log
            continue
        assert re.search(rf"e2e {name}: exit 0 \| step +3/3", log), f"{name}:\n{f.read_text()[-2000:]}"
    gpu_logs = [f for f in work.glob("e2e_*.log") if not f.stem.endswith("_cpu") and "compare" not in f.stem]
    assert len(gpu_logs) == 19, gpu_logs
    for f in [f for f in gpu_logs if f.stem.split("_")[1] in ("roberta", "electra")]:
        if f.stem.split("_")[1] not in encoders:
            assert f"e2e {f.stem[len('e2e_'):]}: not in this build: skipped" in log, log
            gpu_logs.remove(f)
    # comm: zero 0 and 1 and each stage this binary takes on 2 ranks (each CPU twin trains), the others
    # refused on cuda and not run on the CPU
    stages = {"zero2": has["zero"] >= 2, "zero3": has["zero"] >= 3 and has["zero3_cuda"], "zero1_offload": has["offload"],
              "zero2_offload": has["offload"] and has["zero"] >= 2,
              "zero3_offload": has["offload"] and has["zero"] >= 3 and has["zero3_cuda"]}
    for name, ok in dict(zero0=True, **stages).items():
        args = f"--train.zero={name[4]}" + (" --train.offload=optimizer" if name.endswith("offload") else "")
        if ok:
            gpu_logs.append(work / f"comm_cuda_{name}.log")
            assert f"comm 2 ranks cpu staged {args}: exit 0 | step " in log, \
                (work / f"comm_cpu_{name}.log").read_text()[-2000:]
        else:
            assert f"comm 2 ranks cuda staged {args}: not in this build: skipped" in log, log
            assert not (work / f"comm_cpu_{name}.log").exists()
    gpu_logs.append(work / "comm_cuda_zero1.log")
    # bench, profile, resume: nlptrain's own logs (stderr) beside the work folder's files
    # (bf16 only by default)
    gpu_logs += [f for f in work.glob("nlptrain_*.log")] + [f for f in work.glob("profile_*.log")]
    gpu_logs += [f for f in work.glob("resume_*.log") if "compare" not in f.stem]
    # the new bf16 step's ladder: every op test skipped here, so the fused head's rungs are skipped
    # and only the last rung is checked (the device check stops it: nothing of the new step is timed)
    gpu_logs += [work / "ladder_rung5_no_fused_head.log"]
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
    assert len(gpu_logs) == 15 + 2 * len(encoders) + 2 + sum(stages.values()) + 2 + 3 + 1 + 2 + 6 + 4 + 1 + 4, \
        gpu_logs
    assert "faults kill -9 of rank 0 at step 5 (2 ranks): exit" in log, log[-3000:]
    assert "ladder rung 1 all: skipped (the fused head failed its tests)" in log, log[-3000:]
    assert "ladder: no rung passed its check: the new bf16 step is not timed" in log, log[-3000:]
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
                                               "test_ops_cuda.log", "tests.log", "profile.txt",
                                               "finetune_results.md"}


# ---- the script's decisions, against stand-ins for the GPU binaries

# A stand-in for a gtest binary (its name: the binary's): --gtest_list_tests and --gtest_filter as
# gtest reads them; PLAN's "tests" maps "BINARY:PATTERN" to what that test does: fail, crash (SIGSEGV
# while it runs), hang, or sticky (it fails, and so does every later test of the process, as after a
# sticky CUDA error). The others pass.
FAKE_GTEST = """#!/usr/bin/env python3
import fnmatch, json, os, signal, sys, time
BIN, TESTS = {bin!r}, {tests!r}
plan = json.load(open(os.environ["FAKE_GPU_PLAN"])).get("tests", {{}})
def match(n, pat):
    pos, _, neg = pat.partition("-")
    return (any(fnmatch.fnmatchcase(n, p) for p in (pos or "*").split(":") if p)
            and not any(fnmatch.fnmatchcase(n, p) for p in neg.split(":") if p))
flt = "*"
for a in sys.argv[1:]:
    if a.startswith("--gtest_filter="):
        flt = a.split("=", 1)[1]
tests = [t for t in TESTS if match(t, flt)]
if "--gtest_list_tests" in sys.argv:
    suite = None
    for t in tests:
        s, n = t.split(".")
        if s != suite:
            print(s + ".")
            suite = s
        print("  " + n)
    sys.exit(0)
print(f"[==========] Running {{len(tests)}} tests", flush=True)
failed, sticky = [], False
for t in tests:
    what = next((v for k, v in plan.items() if k.split(":", 1)[0] == BIN and match(t, k.split(":", 1)[1])), "pass")
    print(f"[ RUN      ] {{t}}", flush=True)
    if what == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    if what == "hang":
        time.sleep(3600)
    if what == "sticky":
        sticky = True
    if sticky or what == "fail":
        print(f"[  FAILED  ] {{t}} (1 ms)")
        failed.append(t)
    else:
        print(f"[       OK ] {{t}} (1 ms)")
print(f"[==========] {{len(tests)}} tests ran. (9 ms total)")
print(f"[  PASSED  ] {{len(tests) - len(failed)}} tests.")
if failed:
    print(f"[  FAILED  ] {{len(failed)}} tests, listed below:")
    for t in failed:
        print(f"[  FAILED  ] {{t}}")
sys.exit(1 if failed else 0)
"""

# A stand-in for nlptrain on the GPU: writes a run's log.txt (step lines, the done: line),
# metrics.jsonl and summary.json (gpu_paths) like nlptrain, and notes its switches (its arguments and
# the NLPTRAIN_CUDA_* environment) in PLAN's journal. PLAN's "nlptrain" rules, the first whose "env"
# and "args" all match: fail (exit 1 with a sync_check error after a step), crash (SIGSEGV after a
# step), drift (losses 5% off) or reject (exit 1 at once with the rule's "message", as nlptrain
# refuses a key or value it does not have).
FAKE_NLPTRAIN = """#!/usr/bin/env python3
import json, os, sys, time
plan = json.load(open(os.environ["FAKE_GPU_PLAN"]))
argv = sys.argv[1:]
if argv[:1] == ["--version"]:
    print("nlptrain (stand-in)")
    sys.exit(0)
opts = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
env = {{k: v for k, v in os.environ.items() if k.startswith("NLPTRAIN_CUDA")}}
with open(plan["journal"], "a") as j:
    j.write(json.dumps({{"args": argv, "env": env}}) + "\\n")
do = "ok"
for rule in plan.get("nlptrain", []):
    if (all(os.environ.get(k) == v for k, v in rule.get("env", {{}}).items())
            and all(a in argv for a in rule.get("args", []))):
        do, message = rule["do"], rule.get("message")
        break
if do == "reject":  # the configuration refused before the run, as a binary without a key or value
    print("nlptrain: error: " + message, file=sys.stderr)
    sys.exit(1)
ini_steps = [l.split("=")[1] for l in open(argv[0]) if l.replace(" ", "").startswith("steps=")]
steps = int(opts.get("train.steps", ini_steps[0] if ini_steps else 30))
B = int(opts.get("train.batch_size", 16))
out = opts["output.dir"]
os.makedirs(out, exist_ok=True)
time.sleep(0.2)  # (long enough for the memory sampler's first line)
with open(os.path.join(out, "log.txt"), "w") as log, open(os.path.join(out, "metrics.jsonl"), "w") as m:
    for s in range(1, steps + 1):
        loss = (11.0 - 0.01 * s) * (1.05 if do == "drift" else 1.0)
        m.write(json.dumps({{"step": s, "loss": loss, "step_time_s": 0.01 * B / 16}}) + "\\n")
        log.write(f"step {{s:6d}}/{{steps}} | loss {{loss:.4f}}\\n")
        if do == "crash":
            os.kill(os.getpid(), 11)
        if do == "fail":
            print("nlptrain: error: run.sync_check: matmul_forward (bf16, bias): an illegal memory access", file=sys.stderr)
            sys.exit(1)
    log.write(f"done: {{steps}} steps in 1.0s, {{B * 1024 * 100}} tokens/s on average\\n")
    log.write("  paths: epilogues fused bias 48 gelu_aux 12 | staged ops 0 | casts 0 0\\n")
paths = {{"gemm_fused": {{"bias": 48, "gelu_aux": 12, "dgelu": 12, "bgrad": 0}},
          "gemm_fallback": {{"bias": 0, "gelu_aux": 0, "dgelu": 0, "bgrad": 24}}, "staged_ops": 0,
          "casts": {{"fp32_to_bf16": 0, "bf16_to_fp32": 0}}}}
summary = {{"batch_size_per_rank": B, "seq_len": 1024, "gpu_paths": paths}}
if "bert" in os.path.basename(argv[0]):  # (BERT's runs: a summary.json without the counts, as an older binary's)
    del summary["gpu_paths"]
json.dump(summary, open(os.path.join(out, "summary.json"), "w"))
"""

# test_cuda_bf16's suites (one binary for the three bf16 test files), two tests each
BF16_SUITES = ["CudaBf16Kernels", "CudaBf16Backend", "GemmBf16Reference", "GemmBf16Plain", "GemmBf16EpilogueBias",
               "GemmBf16EpilogueGeluAux", "GemmBf16EpilogueDgelu", "GemmBf16EpilogueBgrad", "GemmBf16Backward",
               "CudaBackendBf16Views", "GemmEpiloguesEnv", "CudnnBf16", "CudnnBf16Sizes"]


def ops_cuda_tests() -> list[str]:
    """test_ops_cuda's tests, from its source, in its order, and one more in the middle: a test added
    after the last GPU run (not in bench/gpu/verified_ops.txt)."""
    src = (SOURCE_DIR / "tests" / "unit" / "test_ops_cuda.cpp").read_text()
    tests = [f"{a}.{b}" for a, b in re.findall(r"^TEST(?:_F|_P)?\((\w+), *(\w+)\)", src, re.M)]
    return tests[:5] + ["CudaOps.AddedSinceTheLastGpuRun"] + tests[5:]


def fake_tree(root: Path, plan: dict) -> tuple[Path, dict]:
    """make_tree's tree with the stand-ins in the stage; returns bench/gpu and the environment."""
    gpu = make_tree(root / "repo")
    bindir = gpu / "stage" / "bin"
    for f in bindir.iterdir():
        if f.name != "run-on-device.sh":
            f.unlink()
    for name, tests in (("test_ops_cuda", ops_cuda_tests()),
                        ("test_cuda_bf16", [f"{s}.{t}" for s in BF16_SUITES for t in ("First", "Second")])):
        (bindir / name).write_text(FAKE_GTEST.format(bin=name, tests=tests))
        (bindir / name).chmod(0o755)
    (bindir / "nlptrain").write_text(FAKE_NLPTRAIN.format())
    (bindir / "nlptrain").chmod(0o755)
    tools = root / "tools"
    tools.mkdir()
    smi = tools / "nvidia-smi"  # the memory sampler's: 1234 MiB used, every 100 ms
    smi.write_text("#!/bin/bash\nwhile :; do echo 1234; sleep 0.1; done\n")
    smi.chmod(0o755)
    plan = dict(plan, journal=str(root / "journal.jsonl"))
    (root / "plan.json").write_text(__import__("json").dumps(plan))
    env = dict(os.environ, OUT=str(root / "out"), TMPDIR=str(root), FAKE_GPU_PLAN=str(root / "plan.json"),
               SECTIONS="tests bench account", TEST_TIMEOUT="10", PATH=f"{tools}:{os.environ['PATH']}")
    return gpu, env


def run_fake(tmp_path: Path, plan: dict, **env_extra):
    """run.sh against the stand-ins; returns (run.log, results.json, the journal's runs, seconds)."""
    import json
    gpu, env = fake_tree(tmp_path, plan)
    env.update(env_extra)
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(gpu / "run.sh")], capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - t0
    log = (tmp_path / "out" / "run.log").read_text()
    assert p.returncode == 0, f"run.sh exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    journal = tmp_path / "journal.jsonl"
    runs = [json.loads(l) for l in journal.read_text().splitlines()] if journal.exists() else []
    return log, results, runs, took


def timed_new(results) -> list[dict]:
    return [r for r in results["records"] if re.search(r"_new_b\d+$", r["precision"])]


def test_each_fallback_comes_from_its_own_tests(tmp_path):
    plan = {"tests": {
        # a verified test fails (a clean failure: exit 1, with gtest's summary)
        "test_ops_cuda:CudaOps.FusedResidualLayerNorm*": "fail",
        # never-run tests: one crashes, one leaves a sticky error (every later test of its process fails)
        "test_ops_cuda:CudaOps.SegmentCrossEntropy*": "crash",
        "test_ops_cuda:CudaOps.LmHeadBf16DlogitsMatchFp32Dlogits": "sticky",
        "test_ops_cuda:CudaOps.AddedSinceTheLastGpuRun": "sticky",
        # the head's one-pass softmax fails (its own fallback only: the bf16 wte copy's test passes)
        "test_ops_cuda:CudaOps.LmHeadOnlineSoftmaxMatchesTwoPassAndReference": "fail",
        # one epilogue kind fails
        "test_cuda_bf16:GemmBf16EpilogueDgelu.Second": "fail"}}
    log, results, runs, _ = run_fake(tmp_path, plan)
    # the verified tests in one process: every test of the binary but those never run on a GPU (the
    # one added since the last GPU run too), each of those in its own
    verified = {l.strip() for l in (SOURCE_DIR / "bench" / "gpu" / "verified_ops.txt").read_text().splitlines()
                if l.strip() and not l.startswith("#")}
    n_never = sum(t not in verified for t in ops_cuda_tests())
    assert re.search(rf"tests: test_ops_cuda lists \d+ tests, {n_never} of them never run on a GPU \(a process each\): "
                     r"CudaOps.AddedSinceTheLastGpuRun CudaOps.LmHeadCrossEntropyMatchesCpu", log), log
    n_verified = len(ops_cuda_tests()) - n_never
    assert f"tests test_ops_cuda: exit 1 | [  PASSED  ] {n_verified - 1} tests." in log, log
    assert "tests test_ops_cuda--CudaOps.AddedSinceTheLastGpuRun: exit 1 | [  PASSED  ] 0 tests." in log, log
    assert re.search(r"tests test_ops_cuda--CudaOps.SegmentCrossEntropyForwardBackward: FAILED: crashed \(signal 11 SIGSEGV\)",
                     log), log
    assert "NLPTRAIN_CUDA_FUSED_LN=0 for the rest of the run" in log, log
    assert "NLPTRAIN_CUDA_SEGMENT_CE=rows for the rest of the run" in log, log
    assert "NLPTRAIN_CUDA_HEAD_DLOGITS=fp32 for the rest of the run" in log, log
    assert "NLPTRAIN_CUDA_HEAD_SOFTMAX=twopass for the rest of the run" in log, log
    assert "NLPTRAIN_CUDA_HEAD_WTE=fp32" not in log, log
    # the sticky error stayed in its own process: the other never-run tests and the verified ones passed
    assert "PASS tests CudaOps.LmHeadCrossEntropyMatchesCpu:*FusedHead*: 2 of 2 passed" in log, log
    assert "PASS tests CudaOps.Bf16OperandCastsRoundAsTheHost: 1 of 1 passed" in log, log
    for switch in ("NLPTRAIN_CUDA_BF16_CAST", "NLPTRAIN_CUDA_BF16_ACTS=staged", "NLPTRAIN_CUDA_GEMM_EPILOGUES=none",
                   "fused LM head did not pass", "bf16 weight copy did not pass"):
        assert switch not in log, (switch, log)
    assert "epilogue kinds that passed their tests: bias gelu_aux bgrad" in log, log
    # every nlptrain run after the tests carries the fallbacks; the first rung is all less dgelu, and
    # passes; the timed runs are its switches at B = 16, 24, 32, without sync_check
    assert runs, log
    for r in runs:
        assert r["env"].get("NLPTRAIN_CUDA_FUSED_LN") == "0" and r["env"].get("NLPTRAIN_CUDA_SEGMENT_CE") == "rows", r
        assert r["env"].get("NLPTRAIN_CUDA_HEAD_DLOGITS") == "fp32" and "NLPTRAIN_CUDA_BF16_ACTS" not in r["env"], r
        assert r["env"].get("NLPTRAIN_CUDA_HEAD_SOFTMAX") == "twopass", r
    checks = [r for r in runs if "--run.sync_check=true" in r["args"] and "--run.bf16_activations=true" in r["args"]]
    assert len(checks) == 1 and checks[0]["env"]["NLPTRAIN_CUDA_GEMM_EPILOGUES"] == "bias,gelu_aux,bgrad", checks
    assert "--model.fused_head=on" in checks[0]["args"] and "--run.bf16_weights=true" in checks[0]["args"]
    assert re.search(r"ladder rung 1 all \(NLPTRAIN_CUDA_GEMM_EPILOGUES=bias,gelu_aux,bgrad .*\): PASS \| PASS losses "
                     r"1\.\.6: .* \| peak 1234 MiB", log), log
    timed = [r for r in runs if "--run.bf16_activations=true" in r["args"] and "--run.sync_check=true" not in r["args"]
             and "--run.profile=true" not in r["args"]]
    assert sorted(int(a.split("=")[1]) for r in timed for a in r["args"] if a.startswith("--train.batch_size")) == [16, 24, 32]
    for r in timed:
        assert r["env"]["NLPTRAIN_CUDA_GEMM_EPILOGUES"] == "bias,gelu_aux,bgrad" and "--model.fused_head=on" in r["args"]
    # results.json: the rung in every record of the new step, with its env and switches; gpu_paths in
    # each nlptrain record
    new = timed_new(results)
    assert sorted(r["batch"] for r in new) == [16, 24, 32], results
    for r in new:
        assert r["rung"] == "all" and r["rung_index"] == 1, r
        assert r["rung_env"] == {"NLPTRAIN_CUDA_GEMM_EPILOGUES": "bias,gelu_aux,bgrad"}, r
        assert "--model.pad_vocab=128" in r["rung_args"], r
    for r in results["records"]:
        if r["model"] == "gpt2":
            assert r["gpu_paths"]["gemm_fused"]["bias"] == 48 and r["gpu_paths"]["gemm_fallback"]["bgrad"] == 24, r
        else:
            assert r["gpu_paths"] is None, r  # its summary.json has none
    assert [(l["rung"], l["check"]) for l in results["ladder"]] == [("all", "pass")], results["ladder"]
    assert results["ladder"][0]["peak_mem_mib"] == 1234.0
    # the account profiles the rung that passed
    acct = [r for r in runs if "--run.profile=true" in r["args"] and "--run.bf16_activations=true" in r["args"]]
    assert len(acct) == 1 and acct[0]["env"]["NLPTRAIN_CUDA_GEMM_EPILOGUES"] == "bias,gelu_aux,bgrad", acct
    assert "account new bf16 step (rung all:" in log, log
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert "new step timed at rung 1 all (NLPTRAIN_CUDA_GEMM_EPILOGUES=bias,gelu_aux,bgrad" in summary, summary
    # what comes back: the verified tests' log, and every other test process's log in one file
    assert {p.name for p in (tmp_path / "out").iterdir()} <= {"results.json", "summary.txt", "run.log", "gpu-run.tar.gz",
                                                              "test_ops_cuda.log", "tests.log", "profile.txt"}
    tests_log = (tmp_path / "out" / "tests.log").read_text()
    assert "==== test_cuda_bf16--GemmBf16EpilogueDgelu (exit 1)" in tests_log, tests_log[:2000]


def test_crashes_and_hangs_fail_and_the_ladder_falls_through(tmp_path):
    plan = {"tests": {"test_cuda_bf16:CudnnBf16.*": "hang",  # cut at TEST_TIMEOUT
                      "test_cuda_bf16:GemmBf16EpilogueBias.First": "crash"},
            "nlptrain": [
                # rung 1 (all but bias, staged since cuDNN's bf16 tests hung) crashes in its check;
                # rung 3 (epilogues none, fused head) drifts
                {"env": {"NLPTRAIN_CUDA_GEMM_EPILOGUES": "gelu_aux,dgelu,bgrad"}, "args": ["--run.sync_check=true"],
                 "do": "crash"},
                {"env": {"NLPTRAIN_CUDA_GEMM_EPILOGUES": "none"}, "args": ["--run.sync_check=true",
                                                                         "--model.fused_head=on"], "do": "drift"}]}
    log, results, runs, _ = run_fake(tmp_path, plan)
    assert "tests test_cuda_bf16--CudnnBf16: FAILED: timed out after 10 s" in log, log
    assert "tests test_cuda_bf16--GemmBf16EpilogueBias: FAILED: crashed (signal 11 SIGSEGV)" in log, log
    assert "cuDNN bf16-I/O attention: NLPTRAIN_CUDA_BF16_ACTS=staged for the rest of the run" in log, log
    assert "the bias epilogue did not pass its tests: NLPTRAIN_CUDA_GEMM_EPILOGUES=none" in log, log
    # CudnnBf16Sizes ran in its own process: only CudnnBf16 failed
    assert re.search(r"FAIL tests CudnnBf16\.\*:CudnnBf16Sizes\.\*: 2 of 4 passed; not: CudnnBf16.First \(began in "
                     r"process test_cuda_bf16--CudnnBf16, which failed: timed out", log), log
    assert "ladder rung 1 all (NLPTRAIN_CUDA_GEMM_EPILOGUES=gelu_aux,dgelu,bgrad NLPTRAIN_CUDA_BF16_ACTS=staged" in log, log
    assert re.search(r"ladder rung 1 all .*: FAIL \| crashed \(signal 11\)", log), log
    assert "ladder rung 2 bias: skipped (the bias epilogue failed its tests)" in log, log
    assert re.search(r"ladder rung 3 none .*: FAIL \| losses: FAIL losses 1\.\.6", log), log
    assert "ladder rung 4 staged: skipped (the switches of rung 3 none)" in log, log
    assert re.search(r"ladder rung 5 no_fused_head .*: PASS", log), log
    assert [(l["rung"], l["check"]) for l in results["ladder"]] == [
        ("all", "fail"), ("bias", "skipped"), ("none", "fail"), ("staged", "skipped"), ("no_fused_head", "pass")]
    new = timed_new(results)
    assert len(new) == 3 and all(r["rung"] == "no_fused_head" and r["rung_index"] == 5 for r in new), new
    assert all("--model.fused_head=off" in r["rung_args"] and
               r["rung_env"] == {"NLPTRAIN_CUDA_GEMM_EPILOGUES": "none", "NLPTRAIN_CUDA_BF16_ACTS": "staged"} for r in new)
    # nothing of a failed rung was timed or accounted: every new-step run outside the checks is rung 5's
    for r in runs:
        if "--run.bf16_activations=true" in r["args"] and "--run.sync_check=true" not in r["args"]:
            assert "--model.fused_head=off" in r["args"], r


def test_no_rung_passing_times_nothing(tmp_path):
    # (with the e2e and comm sections: each encoder and ZeRO stage a verdict of its own, the ones this
    # build refuses "not in this build", below)
    plan = {"nlptrain": [{"args": ["--run.sync_check=true", "--run.bf16_activations=true"], "do": "fail"},
                         {"args": ["--train.zero=3"], "do": "reject",
                          "message": "command line: train.zero = '3': must be in [0, 2]"},
                         {"args": ["--train.zero=2", "--train.offload=optimizer", "--run.backend=cpu"], "do": "drift"},
                         {"args": ["inputs/missing_small.ini"], "do": "reject",
                          "message": "config file 'inputs/missing_small.ini', line 9: model.type = 'mistral': must be "
                                     "one of: gpt2, bert, roberta, electra"}]}
    log, results, runs, _ = run_fake(tmp_path, plan, SECTIONS="tests e2e bench account comm", E2E_STEPS="100",
                                     E2E_ENCODERS="roberta_small electra_small missing_small")
    assert len(re.findall(r"ladder rung \d \w+ .*: FAIL \| exit 1: nlptrain: error: run.sync_check: matmul_forward", log)) == 5, log
    assert "ladder: no rung passed its check: the new bf16 step is not timed" in log, log
    assert "account: no rung of the new bf16 step passed its check: the new step is not accounted" in log, log
    assert [l["check"] for l in results["ladder"]] == ["fail"] * 5, results["ladder"]
    assert timed_new(results) == []
    assert not [r for r in runs if "--run.bf16_activations=true" in r["args"] and "--run.sync_check=true" not in r["args"]
                and not any(a.startswith("--output.dir=") and "/e2e/" in a for a in r["args"])]  # (e2e's CPU runs)
    assert "new step: no rung passed its check: not timed" in (tmp_path / "out" / "summary.txt").read_text()
    # the verified benchmarks were timed
    assert {r["precision"] for r in results["records"]} == {"bf16"}, results["records"]
    assert_encoders_and_stages(log, results, runs)


def assert_encoders_and_stages(log, results, runs):
    """test_no_rung_passing_times_nothing's e2e and comm sections: the encoders beside BERT and the
    ZeRO stages beyond 0 and 1, each its own verdict; zero 3 refused by the binary, and an encoder
    whose INI the binary refuses (missing_small: inputs/missing_small.ini, an unknown model.type),
    each "not in this build" and skipped without failing the others."""
    checks = {(c["section"], c["check"]): c for c in results["checks"]}
    # the encoders: fp32 and bf16 (cuDNN), cuda against cpu, a pass each
    for m in ("roberta_small", "electra_small"):
        for be in ("cpu", "cuda"):
            assert re.search(rf"e2e {m}_{be}: exit 0 \| step +100/100", log), log
            assert re.search(rf"e2e {m}_bf16_{be}: exit 0 \| step +100/100", log), log
        for label in (f"{m} cuda vs cpu", f"{m} bf16 cuda (cuDNN) vs cpu"):
            assert re.search(rf"^{re.escape(label)}: PASS losses 1\.\.100", log, re.M), (label, log)
            assert checks[("e2e", label)]["verdict"] == "pass", checks
        ini = [r for r in runs if r["args"][0].endswith(f"inputs/{m}.ini")]
        assert len(ini) == 4 and sum("--train.precision=bf16" in r["args"] for r in ini) == 2, ini
        assert all("--model.attention=auto" in r["args"] for r in ini if "--train.precision=bf16" in r["args"])
    assert re.search(r"e2e missing_small_cpu: not in this build: skipped \| nlptrain: error: .*model\.type = 'mistral'", log), log
    assert re.search(r"e2e missing_small_cuda: not in this build: skipped", log), log
    for label in ("missing_small cuda vs cpu", "missing_small bf16 cuda (cuDNN) vs cpu"):
        assert f"{label}: not in this build (missing_small_" in log, log
        assert checks[("e2e", label)]["verdict"] == "not_in_build", checks
    # the BERT checks beside them still pass
    assert checks[("e2e", "bert_small cuda vs cpu")]["verdict"] == "pass", checks
    # comm: zero 0 and 1 as before; zero 2 and offload with zero 1: cuda and cpu runs, two passes each
    comm = [r for r in runs if "--comm.gpu=staged" in r["args"] and "--debug.kill_at_step=5" not in r["args"]]
    for name, args in (("zero2", ["--train.zero=2"]), ("zero1_offload", ["--train.zero=1", "--train.offload=optimizer"]),
                       ("zero2_offload", ["--train.zero=2", "--train.offload=optimizer"])):
        for be in ("cuda", "cpu"):
            assert any(f"--run.backend={be}" in r["args"] and all(a in r["args"] for a in args) for r in comm), (name, be)
            assert re.search(rf"comm 2 ranks {be} staged {re.escape(' '.join(args))}: exit 0 \| step +20/20", log), log
        assert checks[("comm", f"comm {name} vs zero 0, cuda")]["verdict"] == "pass", checks
    assert checks[("comm", "comm zero2 cpu vs cuda")]["verdict"] == "pass", checks
    assert checks[("comm", "comm zero1_offload cpu vs cuda")]["verdict"] == "pass", checks
    # the CPU twin that drifts fails its own check, and only that one
    assert re.search(r"^comm zero2_offload cpu vs cuda: FAIL losses 1\.\.20", log, re.M), log
    assert checks[("comm", "comm zero2_offload cpu vs cuda")]["verdict"] == "fail", checks
    # zero 3 (alone and with offload): refused on cuda, logged, its CPU twin not run, both of its checks
    # "not in this build"
    for name, args in (("zero3", "--train.zero=3"), ("zero3_offload", "--train.zero=3 --train.offload=optimizer")):
        assert f"comm 2 ranks cuda staged {args}: not in this build: skipped | nlptrain: error: command line: " \
               "train.zero = '3': must be in [0, 2]" in log, log
        for label in (f"comm {name} cpu vs cuda", f"comm {name} vs zero 0, cuda"):
            assert checks[("comm", label)]["verdict"] == "not_in_build", checks
    assert not [r for r in comm if "--train.zero=3" in r["args"] and "--run.backend=cpu" in r["args"]], comm
    assert checks[("comm", "comm cpu vs cuda")]["verdict"] == "pass" and \
        checks[("comm", "comm zero 0 vs 1")]["verdict"] == "pass", checks


def test_the_run_ends_by_its_deadline(tmp_path):
    # a verified test hangs: its process is cut at the deadline (less FINISH_S), its tests count as
    # failed, the sections after it are skipped, and the results are packed by DEADLINE
    plan = {"tests": {"test_ops_cuda:CudaOps.MatmulForwardBackward": "hang", "test_cuda_bf16:GemmBf16Plain.*": "hang"}}
    log, results, runs, took = run_fake(tmp_path, plan, DEADLINE="26", FINISH_S="6", TEST_TIMEOUT="30")
    assert took <= 26 + 1, (took, log)  # (+1: bash's start and exit)
    assert re.search(r"^\[run.sh \d+s\] estimate \(seconds\)", log, re.M), log
    assert re.search(r"^\[run.sh \d+s\]   total +\d+  of DEADLINE 26 s", log, re.M), log
    assert re.search(r"tests test_ops_cuda: FAILED: timed out after \d+ s", log), log
    assert "NLPTRAIN_CUDA_FUSED_LN=0 for the rest of the run" in log, log  # (a verified test it did not finish)
    assert "SKIPPED (deadline)" in log, log
    assert timed_new(results) == [] and results["ladder"] == []


def test_compare_tests_counts_crashes_timeouts_and_missing_summaries_as_failures(tmp_path):
    # gtest's output of four processes: A crashed after X passed, while Y ran; B exited 0 but printed no
    # summary; C ended normally (Z failed, W skipped, U passed); D timed out. V is listed, never run.
    ok = "[       OK ] {} (1 ms)"
    logs = {"A": (139, ["[ RUN      ] S.X", ok.format("S.X"), "[ RUN      ] S.Y"]),
            "B": (0, ["[ RUN      ] T.B", ok.format("T.B")]),
            "C": (1, ["[ RUN      ] S.Z", "[  FAILED  ] S.Z (2 ms)", "[ RUN      ] S.W", "[  SKIPPED ] S.W (0 ms)",
                      "[ RUN      ] U.U", ok.format("U.U"), "[  PASSED  ] 1 test.",
                      "[  FAILED  ] 1 test, listed below:", "[  FAILED  ] S.Z"]),
            "D": (124, ["[ RUN      ] T.D", ok.format("T.D"), "[  PASSED  ] 1 test."])}
    for name, (rc, lines) in logs.items():
        (tmp_path / f"{name}.log").write_text("\n".join(lines) + "\n")
        (tmp_path / f"{name}.rc").write_text(f"{rc}\n")
    (tmp_path / "bin.list").write_text("S.X\nS.Y\nS.Z\nS.W\nS.V\nT.B\nT.D\nU.U\n")
    script = str(SOURCE_DIR / "bench" / "gpu" / "compare.py")

    def verdict(*patterns):
        p = subprocess.run(["python3", script, "tests", str(tmp_path), *patterns], capture_output=True, text=True,
                           timeout=60)
        return p.returncode, p.stdout

    assert verdict("U.*") == (0, "PASS tests U.*: 1 of 1 passed\n")
    rc, out = verdict("S.*")
    assert rc == 1, out
    for why in ("S.X (passed, but its process A failed: crashed (signal 11))", "S.Y (began in process A, which failed: crashed",
                "S.Z (failed, C)", "S.W (skipped, C)", "S.V (not run)"):
        assert why in out, (why, out)
    assert out.startswith("FAIL tests S.*: 0 of 5 passed; not: "), out
    rc, out = verdict("T.B", "T.D", "Q.*")
    assert rc == 2, out  # the worst of the three: Q has no test
    assert "FAIL tests T.B: 0 of 1 passed; not: T.B (passed, but its process B failed: exit 0 without gtest's summary)" in out
    assert "FAIL tests T.D: 0 of 1 passed; not: T.D (passed, but its process D failed: timed out)" in out
    assert "FAIL tests Q.*: no test of this name" in out
    # a negative filter: the verified part of S
    assert verdict("S.*:U.*-S.*")[0] == 0


def test_collect_names_the_rung_carries_gpu_paths_and_rates_the_new_step_against_the_peer(tmp_path):
    import json
    w = tmp_path / "work"
    paths = {"gemm_fused": {"bias": 36, "gelu_aux": 12, "dgelu": 12, "bgrad": 12},
             "gemm_fallback": {"bias": 1, "gelu_aux": 0, "dgelu": 0, "bgrad": 0}, "staged_ops": 3,
             "casts": {"fp32_to_bf16": 5, "bf16_to_fp32": 7}}
    # the verified run (no counts in its summary.json) and the new step at B = 24: 40 ms a step after
    # the 5 warm-up steps (24 x 1024 / 0.04 = 614400 tokens/s)
    for name, B, summ in (("nlptrain_gpt2_124m_bf16", 16, {}), ("nlptrain_gpt2_124m_bf16_new_b24", 24, {"gpu_paths": paths})):
        d = w / "bench" / name
        d.mkdir(parents=True)
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 10.0, "step_time_s": 9.0 if s <= 5 else 0.04})
                                                 + "\n" for s in range(1, 11)))
        (d / "summary.json").write_text(json.dumps(dict(summ, batch_size_per_rank=B, seq_len=1024)))
    (w / "ladder").mkdir()
    chosen = {"rung": "bias", "index": 2, "check": "pass", "why": "PASS losses", "peak_mem_mib": 30000.0,
              "env": {"NLPTRAIN_CUDA_GEMM_EPILOGUES": "bias"}, "args": ["--run.bf16_activations=true"]}
    (w / "ladder" / "ladder.jsonl").write_text(json.dumps(dict(chosen, rung="all", index=1, check="fail", why="exit 1"))
                                               + "\n" + json.dumps(chosen) + "\n")
    (w / "ladder" / "chosen.json").write_text(json.dumps(chosen) + "\n")
    # the peer: 307200 tokens/s
    (w / "torch_gpt2_compile_bf16.log").write_text("RESULT " + json.dumps(
        {"system": "torch-compile", "model": "gpt2", "precision": "bf16", "batch": 16, "seq": 1024, "step_time_s": 0.05333,
         "timed_steps": 15, "tokens_per_s": 307200.0, "seqs_per_s": 300.0}) + "\n")
    (w / "device_name").write_text("NVIDIA H200\n")
    out = tmp_path / "results.json"
    p = subprocess.run(["python3", str(SOURCE_DIR / "bench" / "gpu" / "collect.py"), "--work", str(w), "--commit-file",
                        str(tmp_path / "none"), "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    res = json.loads(out.read_text())
    recs = {r["precision"]: r for r in res["records"] if r["system"] == "nlptrain"}
    assert recs["bf16"]["gpu_paths"] is None and "rung" not in recs["bf16"]
    new = recs["bf16_new_b24"]
    assert new["gpu_paths"] == paths and new["rung"] == "bias" and new["rung_index"] == 2, new
    assert new["rung_env"] == {"NLPTRAIN_CUDA_GEMM_EPILOGUES": "bias"} and new["rung_args"] == ["--run.bf16_activations=true"]
    assert abs(new["tokens_per_s"] - 614400) < 1e-6, new
    assert [(l["rung"], l["check"]) for l in res["ladder"]] == [("all", "fail"), ("bias", "pass")]
    assert "ratio gpt2 bf16_new_b24 (rung bias): nlptrain / torch-compile = 2.000" in p.stdout, p.stdout
    assert "new step timed at rung 2 bias (NLPTRAIN_CUDA_GEMM_EPILOGUES=bias --run.bf16_activations=true)" in p.stdout
    assert ("paths gpt2 bf16_new_b24 B=24: epilogues fused/fallback: bias 36/1 gelu_aux 12/0 dgelu 12/0 bgrad 12/0 | "
            "staged ops 3 | casts fp32->bf16 5, bf16->fp32 7") in p.stdout, p.stdout
