#!/usr/bin/env python3
"""The per-op account of run.profile, from one or more runs' summary.json ("profile" section).

  account.py verified=RUN_A/summary.json bf16_weights=RUN_B/summary.json

For each run: the rates it measured (device-to-device copy bandwidth, GEMM rate), then per op family
the floor (bytes / bandwidth or FLOPs / GEMM rate, whichever binds, from the shapes), the measured
time and their ratio, per step; then the step the floors predict (their sum) beside the measured step
(summary.json's step_time_s, the mean of the timed steps) and the ops' measured sum. A family whose
measured time is more than 25% above its floor is marked: that is where the step loses time against
what its bytes and FLOPs need. With two or more runs, each family's measured time is also given as a
ratio to the first run's.

Exits 1 (with a FAIL line) when a summary is missing or holds no profile.
"""
from __future__ import annotations

import json
import sys


def load(path: str) -> dict | None:
    try:
        with open(path) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return None
    return s if isinstance(s.get("profile"), dict) else None


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def report(name: str, s: dict, first: dict | None) -> list[str]:
    p = s["profile"]
    out = [f"INFO account {name}: {p.get('rates', '')}"]
    step_s = s.get("step_time_s")
    step_ms = 1e3 * step_s if step_s else p.get("measured_step_ms")
    pred = p.get("predicted_step_ms") or 0.0
    out.append(f"  {'family':<26} {'floor ms':>9} {'ms':>9} {'ratio':>7}  {'vs first':>8}")
    base = {f["family"]: f.get("ms") for f in first["profile"]["families"]} if first else {}
    for f in p.get("families", []):
        ms, fl = f.get("ms"), f.get("floor_ms") or 0.0
        ratio = ms / fl if (ms is not None and fl > 0) else None
        b = base.get(f["family"])
        vs = ms / b if (first and ms is not None and b) else None
        mark = "  > floor + 25%" if ratio is not None and ratio > 1.25 else ""
        out.append(f"  {f['family']:<26} {fl:9.3f} {fmt(ms):>9} {fmt(ratio, '.2f'):>7}  {fmt(vs, '.2f'):>8}{mark}")
    ops = p.get("measured_ops_ms")
    line = f"  predicted step (sum of floors) {pred:.3f} ms | measured step {fmt(step_ms)} ms"
    if step_ms and pred > 0:
        line += f" ({step_ms / pred:.2f}x the prediction)"
    line += f" | measured ops {fmt(ops)} ms"
    out.append(line)
    return out


def main(argv: list[str]) -> int:
    runs = []
    for a in argv:
        name, _, path = a.partition("=")
        if not path:
            name, path = a, a
        runs.append((name, path))
    if not runs:
        print(__doc__)
        return 2
    rc, first = 0, None
    for name, path in runs:
        s = load(path)
        if s is None:
            print(f"FAIL account {name}: no summary.json with a \"profile\" section at {path}")
            rc = 1
            continue
        print("\n".join(report(name, s, first)))
        if first is None:
            first = s
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
