#!/usr/bin/env python3
"""How much of each training step the GPU is busy, from Nsight Compute's kernel durations.

  ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv --page details \\
      --log-file busy.csv  nlptrain run.ini --train.steps=8 ...
  ncu_busy.py --csv busy.csv --metrics RUN/metrics.jsonl --skip 2

Under ncu every kernel runs alone and is timed from its start to its end on the GPU, so the sum of the
durations is the step's GPU work without the time the GPU waits for the host to launch the next
kernel. The kernels are cut into steps at the optimizer's kernel (AdamW, the last launch of a step).
METRICS is a run of the same configuration without ncu (the same seed, so step k has the same batch):
its step_time_s per step is the wall time. busy / wall well under 1 means the step waits on the host's
launches (what CUDA graphs would remove); near 1, on the kernels themselves.

Prints one line per step, the medians over the steps after --skip, and the kernels that take the most
GPU time in those steps. Exits 1 when the CSV holds no kernel durations (then prints its first lines,
so that a format this parser does not know can be seen).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import sys

METRIC = "gpu__time_duration.sum"
TO_NS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
         "second": 1e9}
OPTIMIZER = re.compile(r"adamw", re.IGNORECASE)


def kernel_durations(path: str) -> list[tuple[str, float]]:
    """[(kernel name, duration ns)] in launch order, from ncu's --csv --page details output."""
    with open(path, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    # ncu prefixes its own lines with ==PROF== (and may echo warnings): the table starts at its header
    start = next((i for i, l in enumerate(lines) if '"Kernel Name"' in l and '"Metric Value"' in l), None)
    if start is None:
        return []
    rows = csv.DictReader(lines[start:])
    out: list[tuple[int, str, float]] = []
    for r in rows:
        if r.get("Metric Name") != METRIC:
            continue
        unit = (r.get("Metric Unit") or "ns").strip()
        if unit not in TO_NS:
            raise SystemExit(f"ncu_busy.py: unknown unit {unit!r} of {METRIC} in {path}")
        value = float((r.get("Metric Value") or "nan").replace(",", ""))
        try:
            order = int(r.get("ID") or len(out))
        except ValueError:
            order = len(out)
        out.append((order, r.get("Kernel Name") or "?", value * TO_NS[unit]))
    out.sort(key=lambda t: t[0])
    return [(name, ns) for _, name, ns in out]


def split_steps(kernels: list[tuple[str, float]]) -> list[list[tuple[str, float]]]:
    """Steps of kernels, each ending with its run of optimizer kernels; what follows the last (an
    evaluation, the end of the run) is not a step."""
    steps, cur = [], []
    for i, (name, ns) in enumerate(kernels):
        cur.append((name, ns))
        opt = bool(OPTIMIZER.search(name))
        nxt_opt = i + 1 < len(kernels) and bool(OPTIMIZER.search(kernels[i + 1][0]))
        if opt and not nxt_opt:
            steps.append(cur)
            cur = []
    return steps


def wall_times(path: str) -> dict[int, float]:
    out: dict[int, float] = {}
    if not os.path.exists(path):
        print(f"ncu busy: no wall times ({path} is missing)")
        return out
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "split" not in r and "step_time_s" in r:
                out[int(r["step"])] = float(r["step_time_s"])
    return out


def short(name: str) -> str:
    """A kernel's name without its argument list and namespaces."""
    base = name.replace("(anonymous namespace)::", "").split("(", 1)[0]
    return base.rsplit("::", 1)[-1][:60] or name[:60]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--csv", required=True, help="ncu's --csv --page details output (its --log-file)")
    p.add_argument("--metrics", help="metrics.jsonl of the same configuration run without ncu")
    p.add_argument("--skip", type=int, default=2, help="steps left out of the medians (start-up: graphs, caches)")
    p.add_argument("--top", type=int, default=12, help="kernels listed by GPU time")
    a = p.parse_args(argv)

    kernels = kernel_durations(a.csv)
    if not kernels:
        print(f"FAIL ncu busy: no {METRIC} rows in {a.csv}; its first lines:")
        try:
            with open(a.csv, errors="replace") as f:
                for _ in range(8):
                    line = f.readline()
                    if not line:
                        break
                    print("  " + line.rstrip()[:200])
        except OSError as e:
            print(f"  ({e})")
        return 1
    steps = split_steps(kernels)
    wall = wall_times(a.metrics) if a.metrics else {}
    print(f"ncu busy: {len(kernels)} kernels, {len(steps)} steps (cut at the AdamW kernel)")
    print(f"  {'step':>4} {'kernels':>7} {'GPU busy ms':>11} {'wall ms':>8} {'busy/wall':>9}")
    busy, shares, counts = [], [], []
    for k, st in enumerate(steps, start=1):
        b = sum(ns for _, ns in st) / 1e6
        w = wall.get(k)
        share = b / (w * 1e3) if w else None
        print(f"  {k:>4} {len(st):>7} {b:>11.3f} {w * 1e3 if w else float('nan'):>8.3f} "
              f"{share if share is not None else float('nan'):>9.2f}")
        if k > a.skip:
            busy.append(b)
            counts.append(len(st))
            if share is not None:
                shares.append(share)
    if busy:
        line = (f"  median over steps {a.skip + 1}..{len(steps)}: {statistics.median(counts):.0f} kernels, "
                f"GPU busy {statistics.median(busy):.3f} ms per step")
        if shares:
            line += f", busy/wall {statistics.median(shares):.2f}"
        print(line)
        per: dict[str, list[float]] = {}
        for st in steps[a.skip:]:
            for name, ns in st:
                per.setdefault(short(name), []).append(ns)
        total = sum(sum(v) for v in per.values())
        print(f"  kernels by GPU time over those steps ({min(a.top, len(per))} of {len(per)}):")
        for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))[: a.top]:
            print(f"    {name:<60} {100 * sum(v) / total:5.1f}% {len(v) / len(busy):6.1f} per step "
                  f"{sum(v) / len(v) / 1e3:8.1f} us each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
