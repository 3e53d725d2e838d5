#!/usr/bin/env python3
"""Collects a GPU run's benchmarks (bench/gpu/run.sh's work folder) into results.json and prints a
summary table (and the checks' PASS/FAIL lines) on stdout.

  collect.py --work /tmp/gpurun.XXXX --commit-file stage/commit.txt --out results.json

results.json: {"device", "date", "commit", "records": [...]}, one record per benchmark and side:
device (as nvidia-smi names it), system (nlptrain, torch-eager, torch-compile), model, precision,
batch, seq, step_time_s (median of the timed steps), timed_steps, tokens_per_s, seqs_per_s, mfu,
peak_mem_gb, commit. Timed steps: nlptrain's metrics.jsonl after the first WARMUP (5) steps; the
PyTorch peer's after its warm-up. MFU = tokens/s x FLOPs per token / the device's dense bf16 peak
(PEAK_BF16_TFLOPS, by device name; the same peak for every precision, so fp32 rows show how far fp32
is from the tensor-core peak). FLOPs per token (both sides, the same formula as nlptrain's
summary.json): 6 x (parameters outside the embedding tables; GPT-2's tied wte counts, it is the LM
head) + 12 x layers x T x width. peak_mem_gb: the device's used memory sampled by nvidia-smi every
100 ms (CUDA context included, the same measure for both sides); the PyTorch rows also carry
torch_max_allocated_gb.
nlptrain's records also carry gpu_paths (summary.json's "gpu_paths": fused and fallback GEMM
epilogue calls per kind, staged ops, fp32<->bf16 casts over the timed steps; null where the run
has none, e.g. on the cpu backend). The new bf16 step's records (nlptrain_gpt2_124m_bf16_new_bN)
carry the ladder's rung that was timed (rung, rung_index, rung_env, rung_args: run.sh's
ladder/chosen.json), and results.json's "ladder" lists every rung's check (pass, fail or skipped,
and why). results.json's "checks": every verdict of the e2e and comm sections in the order they
were made (run.sh's checks.jsonl: section, check, verdict pass / fail / not_in_build, detail).
"""
from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import statistics
import sys

WARMUP = 5
# Dense bf16 tensor-core peak (TFLOP/s, without sparsity) by device name.
PEAK_BF16_TFLOPS = [("H100 80GB HBM3", 989.0), ("H100 SXM", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0),
                    ("H200", 989.0), ("A100", 312.0)]
GPT2 = dict(L=12, C=768, V=50257, P=1024)
BERT = dict(L=12, C=768, V=30000, P=512, TT=2, FF=3072)


def peak_tflops(device: str) -> float | None:
    for key, v in PEAK_BF16_TFLOPS:
        if key in device:
            return v
    return None


def flops_per_token(model: str, T: int, num_labels: int = 2) -> float:
    if model == "gpt2":
        L, C, V = GPT2["L"], GPT2["C"], GPT2["V"]
        dense = V * C + L * (12 * C * C + 13 * C) + 2 * C  # params without wpe (wte is the LM head)
    else:
        L, C, FF = BERT["L"], BERT["C"], BERT["FF"]
        dense = L * (4 * C * C + 2 * C * FF + 9 * C + FF) + 2 * C + C * C + C + C * num_labels + num_labels
    return 6.0 * dense + 12.0 * L * T * C


def read_mem(work: str, name: str) -> float | None:
    try:
        return float(open(os.path.join(work, "mem", name)).read().strip()) / 1024.0  # MiB -> GiB
    except (OSError, ValueError):
        return None


def nlptrain_records(work: str, device: str, commit: str):
    out = []
    for d in sorted(glob.glob(os.path.join(work, "bench", "nlptrain_*"))):
        name = os.path.basename(d)
        m = re.match(r"nlptrain_(gpt2_124m|bert_base_doc_cls)_(\w+)$", name)
        if not m:
            continue
        model = "gpt2" if m.group(1).startswith("gpt2") else "bert"
        prec = m.group(2)
        try:
            steps = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
        except OSError:
            continue
        steps = [r for r in steps if "split" not in r]
        timed = [r["step_time_s"] for r in steps if r["step"] > WARMUP]
        if not timed:
            continue
        summ = {}
        try:
            summ = json.load(open(os.path.join(d, "summary.json")))
        except (OSError, ValueError):
            pass
        B = summ.get("batch_size_per_rank", 16 if model == "gpt2" else 32)
        T = summ.get("seq_len", 1024 if model == "gpt2" else 128)
        med = statistics.median(timed)
        rec = dict(system="nlptrain", model=model, precision=prec, batch=B, seq=T, step_time_s=med,
                   timed_steps=len(timed), tokens_per_s=B * T / med, seqs_per_s=B / med,
                   peak_mem_gb=read_mem(work, name), losses=[r["loss"] for r in steps],
                   gpu_paths=summ.get("gpu_paths"), device=device, commit=commit)
        if re.search(r"_new_b\d+$", name):
            rung = chosen_rung(work)
            rec.update(rung=rung.get("rung"), rung_index=rung.get("index"), rung_env=rung.get("env"),
                       rung_args=rung.get("args"))
        out.append(rec)
    return out


def ladder(work: str) -> list[dict]:
    """Every rung of the new step's ladder, in order (run.sh's ladder/ladder.jsonl)."""
    try:
        return [json.loads(l) for l in open(os.path.join(work, "ladder", "ladder.jsonl")) if l.strip()]
    except (OSError, ValueError):
        return []


def chosen_rung(work: str) -> dict:
    """The rung that passed its check and was timed (run.sh's ladder/chosen.json); {} if none."""
    try:
        return json.loads(open(os.path.join(work, "ladder", "chosen.json")).readline())
    except (OSError, ValueError):
        return {}


def checks(work: str) -> list[dict]:
    """The e2e and comm sections' verdicts, in order (run.sh's checks.jsonl)."""
    try:
        return [json.loads(l) for l in open(os.path.join(work, "checks.jsonl")) if l.strip()]
    except (OSError, ValueError):
        return []


def paths_line(p: dict) -> str:
    """gpu_paths in one line: fused/fallback per epilogue kind, staged ops, casts."""
    fused, fb = p.get("gemm_fused") or {}, p.get("gemm_fallback") or {}
    kinds = " ".join(f"{k} {fused.get(k, 0)}/{fb.get(k, 0)}" for k in ("bias", "gelu_aux", "dgelu", "bgrad"))
    casts = p.get("casts") or {}
    return (f"epilogues fused/fallback: {kinds} | staged ops {p.get('staged_ops')} | casts fp32->bf16 "
            f"{casts.get('fp32_to_bf16')}, bf16->fp32 {casts.get('bf16_to_fp32')}")


def torch_records(work: str, device: str, commit: str):
    out = []
    for f in sorted(glob.glob(os.path.join(work, "torch_*.log"))):
        name = os.path.basename(f)[:-4]
        res = None
        for line in open(f, errors="replace"):
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
        if res is None:
            continue
        rec = dict(system=res["system"], model=res["model"], precision=res["precision"], batch=res["batch"],
                   seq=res["seq"], step_time_s=res["step_time_s"], timed_steps=res["timed_steps"],
                   tokens_per_s=res["tokens_per_s"], seqs_per_s=res["seqs_per_s"],
                   peak_mem_gb=read_mem(work, name), torch_max_allocated_gb=res.get("peak_mem_gb"),
                   losses=res.get("losses"), torch=res.get("torch"), transformers=res.get("transformers"),
                   device=device, commit=commit)
        out.append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", required=True)
    ap.add_argument("--commit-file", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    W = a.work
    device = open(os.path.join(W, "device_name")).read().strip() if os.path.exists(os.path.join(W, "device_name")) else "unknown"
    commit = open(a.commit_file).read().split()[0] if os.path.exists(a.commit_file) else "unknown"
    recs = nlptrain_records(W, device, commit) + torch_records(W, device, commit)
    peak = peak_tflops(device)
    for r in recs:
        fpt = flops_per_token(r["model"], r["seq"])
        r["flops_per_token"] = fpt
        r["mfu"] = r["tokens_per_s"] * fpt / (peak * 1e12) if peak else None
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open(a.out, "w") as f:
        json.dump({"device": device, "date": date, "commit": commit, "peak_bf16_tflops": peak, "records": recs,
                   "ladder": ladder(W), "checks": checks(W)}, f, indent=1)

    print(f"device {device} | commit {commit} | {date} | MFU against {peak} TFLOP/s dense bf16")
    for log in ["run.log"]:
        p = os.path.join(W, log)
        if os.path.exists(p):
            for line in open(p):
                if any(k in line for k in ("PASS", "FAIL", "tests:", "SKIPPED", "exit 1", "exit 2", "exit 124", "exit 134", "exit 139")):
                    print(line.rstrip())
    print(f"{'model':5} {'precision':12} {'system':14} {'B':>3} {'T':>5} {'ms/step':>9} {'tokens/s':>10} {'seq/s':>8} {'MFU':>6} {'peak GiB':>8} rung")
    key = lambda r: (r["model"], r["precision"], r["system"])
    for r in sorted(recs, key=key):
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        mem = f"{r['peak_mem_gb']:.1f}" if r["peak_mem_gb"] is not None else "-"
        print(f"{r['model']:5} {r['precision']:12} {r['system']:14} {r['batch']:>3} {r['seq']:>5} {1e3 * r['step_time_s']:>9.1f} "
              f"{r['tokens_per_s']:>10.0f} {r['seqs_per_s']:>8.1f} {mfu:>6} {mem:>8} {r.get('rung') or '-'}")
    for r in ladder(W):
        print(f"ladder rung {r.get('index')} {r.get('rung')}: {r.get('check')} | {r.get('why')}")
    for c in checks(W):
        print(f"check ({c.get('section')}) {c.get('check')}: {c.get('verdict')}")
    rung = chosen_rung(W)
    if ladder(W):
        print(f"new step timed at rung {rung['index']} {rung['rung']} ({' '.join(f'{k}={v}' for k, v in rung['env'].items())} "
              f"{' '.join(rung['args'])})" if rung else "new step: no rung passed its check: not timed")
    for r in sorted(recs, key=key):
        if r.get("gpu_paths"):
            print(f"paths {r['model']} {r['precision']} B={r['batch']}: {paths_line(r['gpu_paths'])}")
    # nlptrain against the peers, per model and precision (the new step's records against the peer's
    # bf16, each batch)
    by = {key(r): r for r in recs}
    for r in sorted(recs, key=key):
        if r["system"] != "nlptrain":
            continue
        base = re.sub(r"_new_b\d+$", "", r["precision"])
        label = r["precision"] + (f" (rung {r['rung']})" if r.get("rung") else "")
        for peer in ("torch-eager", "torch-compile"):
            p = by.get((r["model"], base, peer))
            if p:
                print(f"ratio {r['model']} {label}: nlptrain / {peer} = {r['tokens_per_s'] / p['tokens_per_s']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
