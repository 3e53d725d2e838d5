#!/usr/bin/env python3
"""Side-by-side Markdown table from the raw outputs of run.sh: report.py RES_DIR > RES_DIR.md"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import results_archive as ra  # noqa: E402  (RES_DIR's raw files on disk or in RES_DIR/raw.tar.xz)

RES = sys.argv[1]
ENV = os.environ
METRICS = {"mlm": ["accuracy", "perplexity", "loss"], "doc_cls": ["accuracy"], "pair_cls": ["accuracy"],
           "ner": ["f1", "precision", "recall"], "qa": ["exact_match", "f1", "korquad_exact_match", "korquad_f1"]}
DATA = {"mlm": "NSMC text (packed), mlm_eval", "doc_cls": "NSMC", "pair_cls": "KorNLI (XNLI ko dev)",
        "ner": "KLUE NER (20% split)", "qa": "KorQuAD 1.0 (20% of articles)"}


def load(path):
    try:
        return json.loads(ra.read_text(path))
    except (OSError, ValueError):
        return None


def nl_eval(t):
    p = os.path.join(RES, f"nlptrain_{t}", "metrics.jsonl")
    last = None
    if ra.is_file(p):
        for line in ra.open_text(p):
            r = json.loads(line)
            if r.get("split") == "eval":
                last = r
    return last


def nl_cfg(t):
    p = os.path.join(RES, f"nlptrain_{t}", "config.ini")
    cfg, sec = {}, ""
    if ra.is_file(p):
        for line in ra.open_text(p):
            line = line.split("#")[0].strip()
            if line.startswith("["):
                sec = line.strip("[]")
            elif "=" in line:
                k, v = line.split("=", 1)
                cfg[f"{sec}.{k.strip()}"] = v.strip()
    return cfg


def fmt(x, k):
    if x is None:
        return "n/a"
    if k in ("accuracy", "f1", "precision", "recall") and x <= 1.0 and k != "f1" or (k == "f1" and x <= 1.0):
        return f"{100 * x:.2f}"
    return f"{x:.2f}"


rows = []
print("| task | metric | nlptrain | HF Trainer | diff (nl - HF) | wall nlptrain (s) | wall HF (s) | load 1-min (nl / HF) | steps | global batch | seq len | train loss last 10% (nl / HF) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for t in ["mlm", "doc_cls", "pair_cls", "ner", "qa"]:
    ne = nl_eval(t)
    hr = load(os.path.join(RES, f"hf_{t}", "result.json"))
    he = hr["eval"] if hr else None
    nt = load(os.path.join(RES, f"nlptrain_{t}.time"))
    ht = load(os.path.join(RES, f"hf_{t}.time"))
    if ne is None and he is None:
        continue
    cfg = nl_cfg(t)
    steps = hr["steps"] if hr else cfg.get("train.steps", "?")
    gb = hr["global_batch"] if hr else "?"
    # train loss over the last 10% of steps
    nll = None
    p = os.path.join(RES, f"nlptrain_{t}", "metrics.jsonl")
    if ra.is_file(p):
        tr = [json.loads(l) for l in ra.open_text(p)]
        tr = [r for r in tr if "loss" in r and r.get("split") is None]
        if tr:
            k = max(1, len(tr) // 10)
            nll = sum(r["loss"] for r in tr[-k:]) / k
    hll = None
    p = os.path.join(RES, f"hf_{t}", "log_history.jsonl")
    if ra.is_file(p):
        tr = [json.loads(l) for l in ra.open_text(p)]
        tr = [r for r in tr if "loss" in r]
        if tr:
            k = max(1, len(tr) // 10)
            hll = sum(float(r["loss"]) for r in tr[-k:]) / k
    seq = {"mlm": 64, "doc_cls": 64, "pair_cls": 64, "ner": 96, "qa": 192}[t]
    for i, m in enumerate(METRICS[t]):
        a = ne.get(m) if ne else None
        b = he.get(m) if he else None
        pct = m in ("accuracy", "precision", "recall") or (m == "f1" and t == "ner")
        fa = f"{100 * a:.2f}" if (a is not None and pct) else (f"{a:.3f}" if a is not None else "n/a")
        fb = f"{100 * b:.2f}" if (b is not None and pct) else (f"{b:.3f}" if b is not None else "n/a")
        d = ""
        if a is not None and b is not None:
            d = f"{100 * (a - b):+.2f}" if pct else f"{a - b:+.3f}"
        first = i == 0
        print(f"| {t if first else ''} | {m}{' (%)' if pct else ''} | {fa} | {fb} | {d} | "
              f"{nt['wall_s'] if (nt and first) else ''} | {ht['wall_s'] if (ht and first) else ''} | "
              f"{(nt['load_before'].split()[0] + ' / ' + ht['load_before'].split()[0]) if (nt and ht and first) else ''} | "
              f"{steps if first else ''} | {gb if first else ''} | {seq if first else ''} | "
              f"{(f'{nll:.3f} / {hll:.3f}' if (nll is not None and hll is not None) else '') if first else ''} |")
