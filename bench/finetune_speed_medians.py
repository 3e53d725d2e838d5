#!/usr/bin/env python3
"""Median over several fine-tuning benchmark runs (bench/finetune_speed.sh result folders) of nlptrain's
fastest setting against HF Trainer's fastest, per task: the figure docs/performance.md quotes.

  python3 bench/finetune_speed_medians.py bench/results/finetune-speed-20261126-*/

Within one folder, each (task, seed) is one comparison: the smallest nlptrain train_s of any setting
divided by the smallest HF train_s of any setting, both from the same run of the script (the same
machine state). A (task, seed) without both sides, or with a failed run, is skipped and listed.
"""
import json
import os
import statistics
import sys


def comparisons(folder):
    with open(os.path.join(folder, "results.json")) as f:
        runs = json.load(f)["runs"]
    best = {}  # (task, seed) -> {"nlptrain": s, "hf": s}
    for r in runs:
        if r.get("rc") not in (0, None) or not r.get("train_s"):
            continue
        side = "nlptrain" if r["setting"].startswith("nlptrain") else "hf"
        key = (r["task"], r["seed"])
        cur = best.setdefault(key, {})
        cur[side] = min(cur.get(side, float("inf")), float(r["train_s"]))
    return best


def main(folders):
    per_task, skipped = {}, []
    for folder in folders:
        if not os.path.exists(os.path.join(folder, "results.json")):
            continue
        for (task, seed), sides in sorted(comparisons(folder).items()):
            if "nlptrain" not in sides or "hf" not in sides:
                skipped.append(f"{os.path.basename(os.path.normpath(folder))} {task} seed {seed}")
                continue
            ratio = sides["nlptrain"] / sides["hf"]
            per_task.setdefault(task, []).append((ratio, os.path.basename(os.path.normpath(folder)), seed))
    print("| task | runs | median | min | max | above 0.67 |")
    print("|---|---:|---:|---:|---:|---:|")
    for task in ("doc_cls", "pair_cls", "ner", "qa"):
        rs = [r for r, _, _ in per_task.get(task, [])]
        if not rs:
            continue
        print(f"| {task} | {len(rs)} | {statistics.median(rs):.2f} | {min(rs):.2f} | {max(rs):.2f} | "
              f"{sum(r > 0.67 for r in rs)} |")
    print()
    for task, rows in per_task.items():
        print(task + ": " + ", ".join(f"{r:.2f} ({f} s{s})" for r, f, s in rows))
    if skipped:
        print("\nskipped (one side missing): " + "; ".join(skipped))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
