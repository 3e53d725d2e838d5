#!/usr/bin/env python3
"""Fit the alpha-beta ring-allreduce model to allreduce microbenchmark output.

Reads the JSON files written by bench/allreduce_bench (one per launch: world size, nodes, ranks per
node, and the time of MPI_Allreduce per message size; or of another gradient path of the benchmark,
--nonblocking / --collective reduce_scatter_allgather, all files of one fit measuring the same one)
and fits

    T(p, S) = 2(p-1)·alpha + 2(p-1)/p·S/beta

(alpha: latency per ring step in seconds, beta: bandwidth in bytes/s, p ranks, S bytes; the model of
tools/scaling_model.py) by linear least squares in (alpha, 1/beta):

  * one fit per input file (its p, nodes and ranks per node), and
  * one joint fit over all files (all p together), when there are at least two different p or one file.

Least squares minimises relative residuals by default (each point weighted by 1/T: every size counts
the same whatever its time, which is what a fit over 4 B .. 256 MB needs; --weighting absolute gives
the plain sum of squared seconds, dominated by the largest messages). Open MPI picks different
allreduce algorithms for small and large messages, so one (alpha, beta) over the whole range is a
compromise: the per-size residuals are written next to the fit, and --min-bytes / --max-bytes restrict
the sizes used.

A fit whose alpha is negative or whose beta is not positive (or not finite) is physically meaningless;
it is still written, with "valid": false and the reasons in "problems", and a warning is printed.
Nothing is clamped or dropped silently.

Output (--out, default stdout): JSON
  {"tool": "comm_fit", "model": ..., "statistic": "median_s", "weighting": "relative",
   "call": the benchmarked call, "collective": "allreduce" | "reduce_scatter_allgather",
   "nonblocking": bool,
   "fits": [{"label", "source", "world_size", "nodes", "ranks_per_node", "alpha_s", "beta_Bps",
             "valid", "problems", "n_points", "rms_rel_err", "max_rel_err",
             "points": [{"bytes", "measured_s", "model_s", "rel_err"}]}, ...],
   "joint": {... the same, "world_sizes": [...]} or null}

Example
  tools/comm_fit.py --out fit.json ar_2x1.json ar_2x2.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also when loaded by path (tests, bench/)
from hf_layout import ToolError, atomic_file  # noqa: E402

PROG = "comm_fit"
MODEL = "T(p, S) = 2(p-1)*alpha + 2(p-1)/p*S/beta"
STATISTICS = ("median_s", "min_s", "mean_s")


class FitError(Exception):
    pass


def read_json(path):
    """A JSON file, or FitError naming the file and what is wrong."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError) as e:
        raise FitError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise FitError(f"{path}: invalid JSON: {e}") from None


def load_bench(path):
    """One allreduce_bench JSON file, checked."""
    d = read_json(path)
    if not isinstance(d, dict) or not isinstance(d.get("results"), list):
        raise FitError(f"{path}: not allreduce_bench output (no 'results' list)")
    for k in ("world_size", "nodes", "ranks_per_node"):
        v = d.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise FitError(f"{path}: '{k}' must be a positive integer, found {json.dumps(v)}")
    if d.get("correct") is False:
        raise FitError(f"{path}: the benchmark reported wrong sums (correct: false); its times are not used")
    rows = []
    for i, r in enumerate(d["results"]):
        if not isinstance(r, dict):
            raise FitError(f"{path}: results[{i}] is not an object")
        for k in ("bytes",) + STATISTICS:
            v = r.get(k)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise FitError(f"{path}: results[{i}].{k} must be a positive number, found {json.dumps(v)}")
        rows.append(r)
    if not rows:
        raise FitError(f"{path}: no results")
    d["source"] = str(path)
    return d


def ring_time(p, nbytes, alpha, beta):
    """The model: 0 for p = 1."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2.0 * (p - 1) / p * nbytes / beta


def lstsq2(xs, ys, ws):
    """Weighted least squares y ~ c1*x1 + c2*x2 (xs: list of (x1, x2)); returns (c1, c2).
    The 2x2 normal equations, solved directly (no numpy needed)."""
    a11 = a12 = a22 = b1 = b2 = 0.0
    for (x1, x2), y, w in zip(xs, ys, ws):
        w2 = w * w
        a11 += w2 * x1 * x1
        a12 += w2 * x1 * x2
        a22 += w2 * x2 * x2
        b1 += w2 * x1 * y
        b2 += w2 * x2 * y
    det = a11 * a22 - a12 * a12
    # Relative test: the two regressors must not be proportional (e.g. all points at one size).
    if not abs(det) > 1e-12 * a11 * a22:
        raise FitError("the fit is underdetermined: need at least two different message sizes")
    return (b1 * a22 - b2 * a12) / det, (a11 * b2 - a12 * b1) / det


def fit_points(points, weighting):
    """points: [(p, bytes, seconds)] with p >= 2. Returns (alpha, beta, inv_beta)."""
    if len(points) < 2:
        raise FitError(f"the fit needs at least two sizes, got {len(points)}")
    xs = [(2.0 * (p - 1), 2.0 * (p - 1) / p * s) for p, s, _ in points]
    ys = [t for _, _, t in points]
    ws = [1.0 / t if weighting == "relative" else 1.0 for t in ys]
    alpha, inv_beta = lstsq2(xs, ys, ws)
    beta = 1.0 / inv_beta if inv_beta != 0 else math.inf
    return alpha, beta, inv_beta


def describe(points, alpha, inv_beta):
    out, errs = [], []
    for p, s, t in points:
        m = 2 * (p - 1) * alpha + 2.0 * (p - 1) / p * s * inv_beta
        e = (m - t) / t
        errs.append(e)
        out.append({"world_size": p, "bytes": s, "measured_s": t, "model_s": m, "rel_err": e})
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    return out, rms, max(abs(e) for e in errs)


def problems_of(alpha, beta, inv_beta):
    probs = []
    if not math.isfinite(alpha):
        probs.append("alpha is not finite")
    elif alpha < 0:
        probs.append(f"alpha is negative ({alpha:.3e} s): the latency term cannot be fitted by this "
                     "model over these sizes (try --min-bytes/--max-bytes, or more repetitions)")
    if not (inv_beta > 0) or not math.isfinite(beta):
        probs.append(f"beta is not a positive finite bandwidth (1/beta = {inv_beta:.3e} s/B): the "
                     "times do not grow with the message size as the model needs")
    return probs


def make_fit(points, weighting, **info):
    alpha, beta, inv_beta = fit_points(points, weighting)
    pts, rms, mx = describe(points, alpha, inv_beta)
    probs = problems_of(alpha, beta, inv_beta)
    d = dict(info)
    d.update(alpha_s=alpha, beta_Bps=beta if math.isfinite(beta) else None, inv_beta_s_per_B=inv_beta,
             valid=not probs, problems=probs, n_points=len(points), rms_rel_err=rms, max_rel_err=mx,
             points=pts)
    return d


def fit_files(benches, statistic="median_s", weighting="relative", min_bytes=0, max_bytes=math.inf):
    kinds = {(b.get("collective", "allreduce"), bool(b.get("nonblocking", False))) for b in benches}
    if len(kinds) > 1:
        raise FitError("the files measure different collectives ("
                       + ", ".join(f"{c}{' non-blocking' if nb else ''}" for c, nb in sorted(kinds))
                       + "): fit each one separately")
    (collective, nonblocking), = kinds
    fits, joint_pts = [], []
    for b in benches:
        p = b["world_size"]
        if p < 2:
            raise FitError(f"{b['source']}: world_size 1: an allreduce over one rank moves nothing; "
                           "run the benchmark on 2 or more ranks")
        pts = [(p, float(r["bytes"]), float(r[statistic])) for r in b["results"]
               if min_bytes <= r["bytes"] <= max_bytes]
        if len(pts) < 2:
            raise FitError(f"{b['source']}: fewer than two sizes between {min_bytes} and {max_bytes} bytes")
        label = b.get("label") or f"{b['nodes']}x{b['ranks_per_node']}"
        fits.append(make_fit(pts, weighting, label=label, source=b["source"], world_size=p,
                             nodes=b["nodes"], ranks_per_node=b["ranks_per_node"],
                             mpi_library=b.get("mpi_library")))
        joint_pts += pts
    joint = None
    if len({b["world_size"] for b in benches}) >= 2 or len(benches) == 1:
        joint = make_fit(joint_pts, weighting, label="joint",
                         world_sizes=sorted({b["world_size"] for b in benches}),
                         sources=[b["source"] for b in benches])
        # the per-point list of the joint fit repeats the per-file ones: keep it short
        joint.pop("points")
    return {"tool": PROG, "model": MODEL, "statistic": statistic, "weighting": weighting,
            "call": benches[0].get("call", "MPI_Allreduce"), "collective": collective,
            "nonblocking": nonblocking,
            "min_bytes": min_bytes, "max_bytes": None if math.isinf(max_bytes) else max_bytes,
            "fits": fits, "joint": joint}


def load_fit(path):
    """A comm_fit JSON file (for tools/scaling_report), checked."""
    d = read_json(path)
    if not isinstance(d, dict) or d.get("tool") != PROG or not isinstance(d.get("fits"), list):
        raise FitError(f"{path}: not a {PROG} file (expected 'tool': '{PROG}' and a 'fits' list)")
    entries = list(d["fits"]) + ([d["joint"]] if d.get("joint") else [])
    if not entries:
        raise FitError(f"{path}: no fits")
    for f in entries:
        a, ib = f.get("alpha_s"), f.get("inv_beta_s_per_B")
        for k, v in (("alpha_s", a), ("inv_beta_s_per_B", ib)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise FitError(f"{path}: fit '{f.get('label')}': '{k}' must be a finite number, found {json.dumps(v)}")
    return d


def select_fit(fitdoc, world_size, nodes, ranks_per_node):
    """The fit for a run: same (p, nodes, ranks per node), else same p, else the joint one.
    Returns (fit, how) or (None, reason)."""
    fits = fitdoc["fits"]
    for f in fits:
        if (f.get("world_size"), f.get("nodes"), f.get("ranks_per_node")) == (world_size, nodes, ranks_per_node):
            return f, "same ranks and placement"
    for f in fits:
        if f.get("world_size") == world_size:
            return f, f"same ranks, other placement ({f.get('nodes')}x{f.get('ranks_per_node')})"
    if fitdoc.get("joint"):
        return fitdoc["joint"], "joint fit"
    return None, "no fit for this world size and no joint fit"


def fmt_fit(f):
    a, ib = f["alpha_s"], f["inv_beta_s_per_B"]
    bw = f"{1.0 / ib / 1e9:.3g} GB/s" if ib > 0 else f"1/beta = {ib:.3e} s/B"
    return f"alpha = {a * 1e6:.3g} us, beta = {bw}"


def text_summary(doc):
    lines = [f"model {doc['model']}, fitted to {doc['statistic']} ({doc['weighting']} residuals) "
             f"of {doc.get('call', 'MPI_Allreduce')}"]
    for f in doc["fits"] + ([doc["joint"]] if doc["joint"] else []):
        where = (f"p={f['world_size']} ({f['nodes']}x{f['ranks_per_node']})" if "world_size" in f
                 else f"p in {f['world_sizes']}")
        flag = "" if f["valid"] else "  INVALID: " + "; ".join(f["problems"])
        lines.append(f"  {f['label']:>8}  {where}: {fmt_fit(f)}; {f['n_points']} sizes, relative error "
                     f"rms {f['rms_rel_err']:.2f}, max {f['max_rel_err']:.2f}{flag}")
    return "\n".join(lines)


def write_atomic(path, text):
    """`text` into `path`, never half-written (hf_layout.atomic_file: temp file, fsync, rename)."""
    with atomic_file(Path(path), "the fit") as tmp:
        tmp.write_text(text, encoding="utf-8")


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="BENCH_JSON", help="allreduce_bench --out files")
    p.add_argument("--out", metavar="FILE", help="write the fit here (default: stdout)")
    p.add_argument("--statistic", choices=STATISTICS, default="median_s",
                   help="which per-size time to fit (default median_s)")
    p.add_argument("--weighting", choices=("relative", "absolute"), default="relative",
                   help="least-squares residuals (default relative: (model - T)/T)")
    p.add_argument("--min-bytes", type=float, default=0, help="smallest message size used (default all)")
    p.add_argument("--max-bytes", type=float, default=math.inf, help="largest message size used (default all)")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        doc = fit_files([load_bench(f) for f in a.files], a.statistic, a.weighting, a.min_bytes,
                        a.max_bytes)
    except FitError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(doc, indent=1) + "\n"
    if a.out:
        try:
            write_atomic(a.out, text)
        except ToolError as e:
            print(f"{PROG}: error: {e}", file=sys.stderr)
            return 1
        print(f"{PROG}: wrote {a.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    print(text_summary(doc), file=sys.stderr)
    for f in doc["fits"] + ([doc["joint"]] if doc["joint"] else []):
        if not f["valid"]:
            print(f"{PROG}: warning: fit '{f['label']}' is not physically meaningful: "
                  + "; ".join(f["problems"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
