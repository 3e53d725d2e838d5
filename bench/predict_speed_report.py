#!/usr/bin/env python3
"""The table of bench/predict_speed.sh: python3 bench/predict_speed_report.py RES WORK > RES/results.md

Per setting, medians over the rounds: the whole process's wall seconds, the prediction loop's
seconds (nlptrain: its 'predict |' log line; HF: around Trainer.predict), examples/s, the positions
computed and their padding fraction, accuracy and loss; and the prediction loop's time as a fraction
of HF's. Then the agreement of nlptrain's labels and probabilities (longest first and the file's
order) with HF's, example by example (the same weights: they should agree up to fp32 rounding).
"""
from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_archive as ra  # noqa: E402  (RES/raw on disk or in RES/raw.tar.xz)

LINE = re.compile(r"^predict \| .*\| padding ([0-9.]+)% of ([0-9]+) positions \| ([0-9.]+) s, ")


def nlptrain_run(raw: Path, name: str) -> dict:
    log = ra.read_text(raw / f"{name}.log")  # its standard output: the lines of log.txt
    m = next(LINE.match(line) for line in log.splitlines() if LINE.match(line))
    ev = [json.loads(line) for line in ra.read_text(raw / f"{name}.metrics.jsonl").splitlines()][-1]
    return dict(wall=float(ra.read_text(raw / f"{name}.time").split()[-1]), seconds=float(m.group(3)),
                positions=int(m.group(2)), padding=ev["padding_fraction"], accuracy=ev["accuracy"],
                loss=ev["loss"], examples=ev["tokens"])


def hf_run(raw: Path, name: str) -> dict:
    r = json.loads(ra.read_text(raw / f"{name}.json"))
    return dict(wall=float(ra.read_text(raw / f"{name}.time").split()[-1]), seconds=r["seconds"],
                positions=r["positions"], padding=1 - r["real_tokens"] / r["positions"],
                accuracy=r["accuracy"], loss=r["loss"], examples=r["examples"])


def main(res: str, work: str) -> None:
    raw, work = Path(res) / "raw", Path(work)
    settings = {"nlptrain, longest first (eval.sort_by_length = true)": ("nlptrain_sort_true", nlptrain_run),
                "nlptrain, the file's order (eval.sort_by_length = false)": ("nlptrain_sort_false", nlptrain_run),
                "HF Trainer.predict (eager, the file's order)": ("hf_eager", hf_run),
                "HF Trainer.predict (torch.compile)": ("hf_compile", hf_run)}
    rows = {}
    for label, (stem, read) in settings.items():
        runs = [read(raw, Path(p).name[:-len(".time")]) for p in ra.glob(str(raw / f"{stem}_*.time"))]
        if runs:
            rows[label] = {k: statistics.median(r[k] for r in runs) for k in runs[0]} | {"n": len(runs)}
    hf = rows.get("HF Trainer.predict (eager, the file's order)")
    print(f"# Prediction speed: nlptrain vs HF Trainer.predict ({(Path(res) / 'command.txt').read_text().strip()})\n")
    print((Path(res) / "environment.txt").read_text().strip().replace("\n", "; ") + "\n")
    print("| setting | runs | process s | predict s | examples/s | positions computed | padding | accuracy "
          "| loss | predict time / HF's |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for label, r in rows.items():
        ratio = f"{r['seconds'] / hf['seconds']:.2f}" if hf else "-"
        print(f"| {label} | {r['n']} | {r['wall']:.1f} | {r['seconds']:.1f} | {r['examples'] / r['seconds']:.0f} | "
              f"{r['positions']:.0f} | {r['padding']:.3f} | {r['accuracy']:.4f} | {r['loss']:.6f} | {ratio} |")
    hp = work / "hf_eager_preds.npz"
    if hp.exists():
        h = np.load(hp)
        print()
        print(f"- HF predicted class 1 for {int(h['labels'].sum())} of {len(h['labels'])} reviews")
        for srt in ("true", "false"):
            f = work / f"predictions_sort_{srt}.jsonl"
            if not f.exists():
                continue
            rows_n = [json.loads(line) for line in f.read_text().splitlines()]
            labels = np.array([r["label"] for r in rows_n])
            probs = np.array([r["probabilities"] for r in rows_n])
            print(f"- nlptrain (eval.sort_by_length = {srt}) against HF, example by example: labels equal for "
                  f"{int((labels == h['labels']).sum())} of {len(labels)}; largest probability difference "
                  f"{float(np.abs(probs - h['probs']).max()):.1e} (nlptrain writes 6 significant digits)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
