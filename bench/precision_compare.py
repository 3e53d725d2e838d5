#!/usr/bin/env python3
"""bf16 against fp32: the two rules of bench/precision_check.sh, and its results.md.

Rules (each task, each seed paired with the fp32 run of the same seed: same initialisation, same data
order, so that the difference is the precision's alone):

1. Loss curves. Each curve is smoothed by a trailing mean over WINDOW steps (steps WINDOW..N); at every
   such step r = |mean_bf16 - mean_fp32| / mean_fp32. The largest r over steps and seeds must be at most
   CURVE_TOL (0.01). The unsmoothed per-step maximum is reported beside it, not judged.
2. Final eval metric (perplexity for GPT-2, accuracy for doc_cls). The fp32 seed spread is
   max(fp32) - min(fp32) over the seeds; allowed = max(spread, FLOOR); every seed must have
   |bf16 - fp32| <= allowed. FLOOR is absolute for accuracy (default 0.02: about one binomial standard
   error of an accuracy near 0.7 on 500 examples) and relative to the fp32 mean for perplexity (default
   0.01), so that two seeds that happen to agree closely do not make the rule stricter than the eval
   set can resolve.

  python3 bench/precision_compare.py RESULT_DIR [--window 20] [--curve-tol 0.01] [--acc-floor 0.02]
                                                [--ppl-floor-rel 0.01]
reads RESULT_DIR/raw/TASK_PRECISION_sSEED/metrics.jsonl (TASK gpt2 or doc_cls, PRECISION fp32 or bf16;
on disk or in RESULT_DIR/raw.tar.xz, bench/results_archive.py),
writes RESULT_DIR/results.md and results.json, prints the table; exit status 1 when a rule fails, 2 when
runs are missing or unreadable.
"""
import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import results_archive as ra  # noqa: E402

METRIC = {"gpt2": "perplexity", "doc_cls": "accuracy"}


def read_metrics(path):
    """metrics.jsonl -> (train losses by step, last eval record). Train lines carry 'loss' and no 'split'."""
    losses, evals = {}, []
    with ra.open_text(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            if rec.get("split") == "eval":
                evals.append(rec)
            elif "loss" in rec and "step" in rec:
                losses[int(rec["step"])] = float(rec["loss"])
    if not losses:
        raise ValueError(f"{path}: no training losses")
    return losses, (evals[-1] if evals else None)


def trailing_mean(values, window):
    """Means of values[i-window+1 .. i] for i = window-1 .. len-1 (empty when len < window)."""
    if window < 1:
        raise ValueError("window must be >= 1")
    out, s = [], 0.0
    for i, v in enumerate(values):
        s += v
        if i >= window:
            s -= values[i - window]
        if i >= window - 1:
            out.append(s / window)
    return out


def curve_check(fp32, bf16, window=20, tol=0.01):
    """fp32, bf16: {step: loss}. Both must cover the same steps 1..N (N >= window).
    Returns {max_rel, at_step, max_rel_raw, at_step_raw, steps, ok}."""
    if sorted(fp32) != sorted(bf16):
        raise ValueError(f"the curves cover different steps ({len(fp32)} fp32, {len(bf16)} bf16)")
    steps = sorted(fp32)
    if len(steps) < window:
        raise ValueError(f"{len(steps)} steps, fewer than the window ({window})")
    a = [fp32[s] for s in steps]
    b = [bf16[s] for s in steps]
    raw = [abs(y - x) / x for x, y in zip(a, b)]
    ia = max(range(len(raw)), key=raw.__getitem__)
    sa, sb = trailing_mean(a, window), trailing_mean(b, window)
    rel = [abs(y - x) / x for x, y in zip(sa, sb)]
    i = max(range(len(rel)), key=rel.__getitem__)
    return {"max_rel": rel[i], "at_step": steps[i + window - 1], "max_rel_raw": raw[ia],
            "at_step_raw": steps[ia], "steps": len(steps), "ok": rel[i] <= tol}


def metric_check(fp32_by_seed, bf16_by_seed, floor):
    """{seed: metric} each, the same seeds (at least one). allowed = max(fp32 spread, floor);
    every seed's |bf16 - fp32| <= allowed. Returns {spread, floor, allowed, diffs, max_diff, ok}."""
    if sorted(fp32_by_seed) != sorted(bf16_by_seed) or not fp32_by_seed:
        raise ValueError(f"seeds differ: fp32 {sorted(fp32_by_seed)}, bf16 {sorted(bf16_by_seed)}")
    vals = list(fp32_by_seed.values())
    spread = max(vals) - min(vals)
    allowed = max(spread, floor)
    diffs = {s: bf16_by_seed[s] - fp32_by_seed[s] for s in sorted(fp32_by_seed)}
    max_diff = max(abs(d) for d in diffs.values())
    return {"spread": spread, "floor": floor, "allowed": allowed, "diffs": diffs, "max_diff": max_diff,
            "ok": max_diff <= allowed}


def metric_floor(task, fp32_values, acc_floor, ppl_floor_rel):
    if METRIC[task] == "accuracy":
        return acc_floor
    return ppl_floor_rel * sum(fp32_values) / len(fp32_values)


def collect(raw_dir):
    """raw/TASK_PRECISION_sSEED/metrics.jsonl -> {task: {precision: {seed: (losses, eval)}}}."""
    runs = {}
    pat = re.compile(r"^(gpt2|doc_cls)_(fp32|bf16)_s(\d+)$")
    for d in ra.iterdir(raw_dir):
        m = pat.match(d.name)
        if not m or not ra.is_dir(d):
            continue
        f = d / "metrics.jsonl"
        if not ra.is_file(f):
            raise ValueError(f"{f}: missing (did that run fail? see {d}.log)")
        runs.setdefault(m.group(1), {}).setdefault(m.group(2), {})[int(m.group(3))] = read_metrics(f)
    if not runs:
        raise ValueError(f"{raw_dir}: no runs named TASK_PRECISION_sSEED")
    return runs


def compare(runs, window, curve_tol, acc_floor, ppl_floor_rel):
    out = {}
    for task, by_prec in runs.items():
        if set(by_prec) != {"fp32", "bf16"}:
            raise ValueError(f"{task}: needs fp32 and bf16 runs, has {sorted(by_prec)}")
        fp32, bf16 = by_prec["fp32"], by_prec["bf16"]
        if sorted(fp32) != sorted(bf16):
            raise ValueError(f"{task}: seeds differ: fp32 {sorted(fp32)}, bf16 {sorted(bf16)}")
        curves = {s: curve_check(fp32[s][0], bf16[s][0], window, curve_tol) for s in sorted(fp32)}
        name = METRIC[task]
        met = {}
        for prec, by_seed in by_prec.items():
            for s, (_, ev) in by_seed.items():
                if ev is None or name not in ev:
                    raise ValueError(f"{task} {prec} seed {s}: no eval {name} in metrics.jsonl")
                met.setdefault(prec, {})[s] = float(ev[name])
        floor = metric_floor(task, list(met["fp32"].values()), acc_floor, ppl_floor_rel)
        mc = metric_check(met["fp32"], met["bf16"], floor)
        final = {p: {s: by_prec[p][s][0][max(by_prec[p][s][0])] for s in by_prec[p]} for p in by_prec}
        out[task] = {"metric": name, "curves": curves, "metric_check": mc, "metrics": met,
                     "final_loss": final,
                     "ok": all(c["ok"] for c in curves.values()) and mc["ok"]}
    return out


def fmt(x, metric):
    return f"{x:.4f}" if metric == "accuracy" else f"{x:.3f}"


def report(res, window, curve_tol, acc_floor, ppl_floor_rel):
    lines = ["# bf16 against fp32 on the CPU", "",
             f"Rule 1, loss curves: trailing mean over {window} steps, |bf16 - fp32| / fp32 at most "
             f"{curve_tol:g} at every step, each seed against the fp32 run of the same seed.",
             f"Rule 2, final eval metric: |bf16 - fp32| per seed at most max(fp32 seed spread, floor); "
             f"floor {acc_floor:g} accuracy, {ppl_floor_rel:g} x the fp32 mean perplexity.", ""]
    lines += ["| task | seed | steps | max smoothed rel. diff (step) | max per-step rel. diff (step) | "
              "final loss fp32 / bf16 | curve rule |",
              "|---|---|---|---|---|---|---|"]
    for task, r in res.items():
        for s, c in r["curves"].items():
            lines.append(f"| {task} | {s} | {c['steps']} | {100 * c['max_rel']:.3f}% ({c['at_step']}) | "
                         f"{100 * c['max_rel_raw']:.3f}% ({c['at_step_raw']}) | "
                         f"{r['final_loss']['fp32'][s]:.4f} / {r['final_loss']['bf16'][s]:.4f} | "
                         f"{'pass' if c['ok'] else 'FAIL'} |")
    lines += ["", "| task | metric | seed | fp32 | bf16 | bf16 - fp32 | fp32 spread | floor | allowed | "
              "metric rule |", "|---|---|---|---|---|---|---|---|---|---|"]
    for task, r in res.items():
        m, mc = r["metric"], r["metric_check"]
        for s in sorted(r["metrics"]["fp32"]):
            lines.append(f"| {task} | {m} | {s} | {fmt(r['metrics']['fp32'][s], m)} | "
                         f"{fmt(r['metrics']['bf16'][s], m)} | {mc['diffs'][s]:+.4f} | {fmt(mc['spread'], m)} | "
                         f"{fmt(mc['floor'], m)} | {fmt(mc['allowed'], m)} | {'pass' if mc['ok'] else 'FAIL'} |")
    ok = all(r["ok"] for r in res.values())
    lines += ["", f"Overall: {'pass' if ok else 'FAIL'}", ""]
    return "\n".join(lines), ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("result_dir")
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--curve-tol", type=float, default=0.01)
    ap.add_argument("--acc-floor", type=float, default=0.02)
    ap.add_argument("--ppl-floor-rel", type=float, default=0.01)
    a = ap.parse_args(argv)
    try:
        res = compare(collect(Path(a.result_dir) / "raw"), a.window, a.curve_tol, a.acc_floor, a.ppl_floor_rel)
    except (OSError, ValueError) as e:
        print(f"precision_compare: {e}", file=sys.stderr)
        return 2
    text, ok = report(res, a.window, a.curve_tol, a.acc_floor, a.ppl_floor_rel)
    Path(a.result_dir, "results.md").write_text(text)
    Path(a.result_dir, "results.json").write_text(json.dumps(
        {"window": a.window, "curve_tol": a.curve_tol, "acc_floor": a.acc_floor,
         "ppl_floor_rel": a.ppl_floor_rel, "ok": ok,
         "tasks": json.loads(json.dumps(res, default=str))}, indent=1, sort_keys=True) + "\n")
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
