#!/usr/bin/env python3
"""Checks of a GPU run (bench/gpu/run.sh): prints PASS or FAIL lines, exits 1 on any FAIL.

  compare.py losses REF/metrics.jsonl TEST/metrics.jsonl --within 20:1e-4 --within 100:1e-3
      per-step training losses of TEST against REF: for each N:TOL, the largest relative difference
      over steps 1..N must be <= TOL (both runs must have reached step N)
  compare.py resume STRAIGHT_DIR RESUMED_DIR --step 20
      a run that stopped and resumed against one that never stopped: the losses of every step that
      both logged are bitwise equal (17 significant digits in metrics.jsonl) and every dataset of
      checkpoints/step_<step>.h5 is bitwise equal (needs h5py)
  compare.py steps NAME=RUN_DIR ... --skip 20
      no check, a measurement: each run's median step time (metrics.jsonl's step_time_s, logged every
      step) over the steps after the first SKIP (recordings, cuDNN graph builds and other first-step
      costs left out), and each run's ratio to the first NAME's; prints INFO lines
  compare.py tests TESTS_DIR PATTERN...
      for each PATTERN, a PASS or FAIL line: did every test of a gtest filter PATTERN ("A.*:*B*", optionally "-NEG:..."; the tests that
      the binaries list, TESTS_DIR/*.list, and any a log shows) pass? run.sh's test processes:
      TESTS_DIR/NAME.log (gtest's output) and NAME.rc (the exit status; 124/137: timed out). A test
      passed when a sound process printed its "[       OK ]" line; a process is sound when its exit
      status is 0 or 1 and it printed gtest's "[  PASSED  ]" summary: a crash (signal, abort), a
      timeout or a missing summary fails every test of that process. A test that no process ran, or
      that was skipped, did not pass. Exit 0: all passed; 1: some did not; 2: no test matches
      (one PATTERN: none of that name; several: the worst of them)
"""
from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import re
import statistics
import sys

from ncu_busy import wall_times  # beside this script


def train_losses(path: str) -> dict[int, float]:
    out: dict[int, float] = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if "split" not in r:
                out[int(r["step"])] = float(r["loss"])  # a resumed run appends: the last value wins
    return out


def cmd_losses(a) -> int:
    ref, test = train_losses(a.ref), train_losses(a.test)
    bad = 0
    for spec in a.within:
        n, tol = spec.split(":")
        n, tol = int(n), float(tol)
        steps = range(1, n + 1)
        missing = [s for s in steps if s not in ref or s not in test]
        if missing:
            print(f"FAIL losses 1..{n}: steps missing (first {missing[0]}) in {a.ref if missing[0] not in ref else a.test}")
            bad += 1
            continue
        worst, at = max((abs(test[s] - ref[s]) / abs(ref[s]), s) for s in steps)
        ok = worst <= tol
        bad += not ok
        print(f"{'PASS' if ok else 'FAIL'} losses 1..{n}: max relative difference {worst:.3e} at step {at} "
              f"(tolerance {tol:g}); step {n}: ref {ref[n]:.6f} test {test[n]:.6f}")
    return 1 if bad else 0


def cmd_resume(a) -> int:
    s, r = train_losses(os.path.join(a.straight, "metrics.jsonl")), train_losses(os.path.join(a.resumed, "metrics.jsonl"))
    common = sorted(set(s) & set(r))
    bad = 0
    if len(common) < a.step or max(common, default=0) < a.step:
        print(f"FAIL resume: losses logged by both runs: {len(common)} steps (need 1..{a.step})")
        return 1
    diff = [k for k in common if s[k] != r[k]]
    ok = not diff
    bad += not ok
    print(f"{'PASS' if ok else 'FAIL'} resume losses: {len(common)} steps, {len(diff)} differ"
          + (f" (first at step {diff[0]}: {s[diff[0]]!r} vs {r[diff[0]]!r})" if diff else " (bitwise equal)"))
    try:
        import h5py
        import numpy as np
    except ImportError:
        print("FAIL resume checkpoint: h5py not available")
        return 1
    name = f"checkpoints/step_{a.step:08d}.h5"
    fs, fr = os.path.join(a.straight, name), os.path.join(a.resumed, name)
    if not (os.path.exists(fs) and os.path.exists(fr)):
        print(f"FAIL resume checkpoint: {name} missing ({glob.glob(os.path.join(a.straight, 'checkpoints/*'))}, "
              f"{glob.glob(os.path.join(a.resumed, 'checkpoints/*'))})")
        return 1
    n = ndiff = 0
    with h5py.File(fs, "r") as hs, h5py.File(fr, "r") as hr:
        names: list[str] = []
        hs.visit(lambda k: names.append(k) if isinstance(hs[k], h5py.Dataset) else None)
        for k in names:
            n += 1
            if k not in hr or not np.array_equal(np.asarray(hs[k]), np.asarray(hr[k])):
                ndiff += 1
                if ndiff <= 3:
                    print(f"  differs: {k}")
    ok = n > 0 and ndiff == 0
    bad += not ok
    print(f"{'PASS' if ok else 'FAIL'} resume checkpoint {name}: {n} datasets, {ndiff} differ")
    return 1 if bad else 0


def cmd_steps(a) -> int:
    first = None
    for spec in a.runs:
        name, _, d = spec.partition("=")
        path = os.path.join(d, "metrics.jsonl")
        if not os.path.exists(path):
            print(f"INFO steps {name}: no {path}")
            continue
        t = wall_times(path)  # step -> step_time_s, as ncu_busy.py reads it
        after = sorted(v for k, v in t.items() if k > a.skip)
        if not after:
            print(f"INFO steps {name}: no step after {a.skip} logged ({len(t)} in all)")
            continue
        n = len(after)
        med = statistics.median(after)
        first = first if first is not None else med
        print(f"INFO steps {name}: median step {1e3 * med:.3f} ms over steps {a.skip + 1}..{max(t)} ({n} steps; "
              f"fastest {1e3 * after[0]:.3f}, slowest {1e3 * after[-1]:.3f}); {med / first:.3f}x the first run's")
    return 0


def gtest_match(name: str, pattern: str) -> bool:
    """gtest's --gtest_filter: positive patterns, then optionally '-' and negative ones, ':'-separated."""
    pos, _, neg = pattern.partition("-")
    inc = any(fnmatch.fnmatchcase(name, p) for p in (pos or "*").split(":") if p)
    return inc and not any(fnmatch.fnmatchcase(name, p) for p in neg.split(":") if p)


RESULT = re.compile(r"^\[ *(RUN|OK|FAILED|SKIPPED) *\] ([A-Za-z_][\w/]*\.[\w/]+)(?: |$)")


def read_process(log: str) -> dict:
    """One test process: its exit status, soundness, and each test's last word (RUN if it began and
    never finished: the test that crashed or hung)."""
    rc_path = log[:-len(".log")] + ".rc"
    try:
        rc = int(open(rc_path).read().strip())
    except (OSError, ValueError):
        rc = None
    text = open(log, errors="replace").read()
    tests: dict[str, str] = {}
    for line in text.splitlines():
        m = RESULT.match(line)
        if m and not line.rstrip().endswith("listed below:"):
            tests[m.group(2)] = m.group(1)
    summary = any(line.startswith("[  PASSED  ]") for line in text.splitlines())
    if rc is None:
        why = "no exit status"
    elif rc in (124, 137):
        why = "timed out"
    elif rc > 128:
        why = f"crashed (signal {rc - 128})"
    elif rc > 1:
        why = f"exit {rc}"
    elif not summary:
        why = f"exit {rc} without gtest's summary"
    else:
        why = ""
    return {"name": os.path.basename(log)[:-len(".log")], "sound": not why, "why": why, "tests": tests}


def cmd_tests(a) -> int:
    procs = [read_process(f) for f in sorted(glob.glob(os.path.join(a.dir, "*.log")))]
    listed: set[str] = set()
    for f in glob.glob(os.path.join(a.dir, "*.list")):
        listed.update(l.strip() for l in open(f) if l.strip())
    known = listed | {t for p in procs for t in p["tests"]}
    return max(tests_verdict(pattern, known, procs) for pattern in a.patterns)


def tests_verdict(pattern: str, known: set[str], procs: list[dict]) -> int:
    names = sorted(n for n in known if gtest_match(n, pattern))
    if not names:
        print(f"FAIL tests {pattern}: no test of this name (in {len(procs)} processes' logs)")
        return 2
    bad = []
    for n in names:
        seen = [(p, p["tests"][n]) for p in procs if n in p["tests"]]
        if any(p["sound"] and w == "OK" for p, w in seen):
            continue
        if not seen:
            bad.append(f"{n} (not run)")
            continue
        p, w = seen[-1]
        if w == "FAILED":
            bad.append(f"{n} (failed, {p['name']})")
        elif w == "SKIPPED":
            bad.append(f"{n} (skipped, {p['name']})")
        elif w == "OK":
            bad.append(f"{n} (passed, but its process {p['name']} failed: {p['why']})")
        else:
            bad.append(f"{n} (began in process {p['name']}, which {('failed: ' + p['why']) if p['why'] else 'never finished it'})")
    if bad:
        more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
        print(f"FAIL tests {pattern}: {len(names) - len(bad)} of {len(names)} passed; not: {', '.join(bad[:5])}{more}")
        return 1
    print(f"PASS tests {pattern}: {len(names)} of {len(names)} passed")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("losses")
    p.add_argument("ref")
    p.add_argument("test")
    p.add_argument("--within", action="append", required=True, metavar="N:TOL")
    p = sub.add_parser("resume")
    p.add_argument("straight")
    p.add_argument("resumed")
    p.add_argument("--step", type=int, required=True)
    p = sub.add_parser("steps")
    p.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    p.add_argument("--skip", type=int, default=20)
    p = sub.add_parser("tests")
    p.add_argument("dir")
    p.add_argument("patterns", nargs="+", metavar="PATTERN")
    a = ap.parse_args()
    try:
        return {"losses": cmd_losses, "resume": cmd_resume, "steps": cmd_steps, "tests": cmd_tests}[a.cmd](a)
    except (OSError, ValueError, KeyError) as e:
        print(f"FAIL {a.cmd}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
