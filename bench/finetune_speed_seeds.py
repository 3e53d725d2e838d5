#!/usr/bin/env python3
"""Accuracy of nlptrain against HF Trainer over the seeds of several fine-tuning benchmark folders
(bench/finetune_speed.sh results), per family, task and step count: the comparison docs/performance.md
quotes for RoBERTa and ELECTRA.

  python3 bench/finetune_speed_seeds.py bench/results/finetune-speed-20261207-xeon-*-electra*/ ...
  python3 bench/finetune_speed_seeds.py --nlptrain nlptrain-longest-group --hf hf-longest-group DIR...

For each (family, task, steps) with both settings run on a seed: the metric per seed on each side, each
side's mean and sample standard deviation over the seeds, HF's range (lowest to highest: "inside" when
nlptrain's mean is in it), the per-seed differences (nlptrain - HF; the two programs draw different
initial weights and orders from the same seed, so a seed pairs the runs by name only) with their mean
and its standard error (their standard deviation / sqrt(seeds)), and the evaluation set's own standard
error on one run's accuracy, sqrt(p (1 - p) / examples) at the pooled mean p. A seed run twice in the
folders given (a rerun) counts once, from the folder given last. Steps come from each folder's
command (STEPS=); a folder whose commands give several is refused.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys


def folder_runs(folder):
    with open(os.path.join(folder, "results.json")) as f:
        d = json.load(f)
    steps = set(re.findall(r"\bSTEPS=(\d+)", d.get("command", "")))
    if len(steps) != 1:
        sys.exit(f"finetune_speed_seeds: {folder}: its commands give STEPS {sorted(steps) or 'none'}, expected one")
    return int(steps.pop()), d["runs"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="+")
    p.add_argument("--nlptrain", default="nlptrain-longest-group", help="nlptrain's setting (default %(default)s)")
    p.add_argument("--hf", default="hf-longest-group", help="HF's setting (default %(default)s)")
    a = p.parse_args(argv)
    table = {}  # (family, task, steps) -> side -> seed -> (metric, examples)
    for folder in a.folders:
        steps, runs = folder_runs(folder)
        for r in runs:
            side = {a.nlptrain: "nlptrain", a.hf: "hf"}.get(r.get("setting"))
            if side is None or r.get("rc") not in (0, None) or r.get("metric") is None:
                continue
            n = (r.get("eval") or {}).get("examples")
            key = (r.get("model_type", "bert"), r["task"], steps)
            table.setdefault(key, {}).setdefault(side, {})[r["seed"]] = (100.0 * float(r["metric"]), n)
    print(f"| family, task, steps | seeds | nlptrain per seed | mean (sd) | HF per seed | mean (sd) | inside HF's range? "
          f"| differences per seed | mean difference (SE) | eval SE of one run |")
    print("|---|---:|---|---|---|---|---|---|---|---:|")
    for (fam, task, steps), sides in sorted(table.items()):
        seeds = sorted(set(sides.get("nlptrain", {})) & set(sides.get("hf", {})))
        if not seeds:
            continue
        ours = [sides["nlptrain"][s][0] for s in seeds]
        theirs = [sides["hf"][s][0] for s in seeds]
        diffs = [o - t for o, t in zip(ours, theirs)]
        sd = lambda v: statistics.stdev(v) if len(v) > 1 else float("nan")
        mo, mt, md = statistics.mean(ours), statistics.mean(theirs), statistics.mean(diffs)
        lo, hi = min(theirs), max(theirs)
        inside = "yes" if lo <= mo <= hi else f"no ({mo - lo:+.1f})" if mo < lo else f"no ({mo - hi:+.1f})"
        n = sides["hf"][seeds[0]][1] or 500
        pm = (mo + mt) / 200.0
        eval_se = 100.0 * math.sqrt(pm * (1 - pm) / n)
        f = lambda v: " / ".join(f"{x:.1f}" for x in v)
        print(f"| {fam}, {task}, {steps} | {len(seeds)} ({', '.join(map(str, seeds))}) | {f(ours)} | {mo:.2f} ({sd(ours):.2f}) "
              f"| {f(theirs)} | {mt:.2f} ({sd(theirs):.2f}) | {inside} | {' / '.join(f'{x:+.1f}' for x in diffs)} "
              f"| {md:+.2f} ({sd(diffs) / math.sqrt(len(diffs)):.2f}) | {eval_se:.2f} ({n} examples) |")


if __name__ == "__main__":
    main()
