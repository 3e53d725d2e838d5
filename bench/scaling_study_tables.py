#!/usr/bin/env python3
"""One Markdown page over the variants of bench/scaling_study.sh: the allreduce fit, and per variant and
rank count the measured parallel efficiency beside the alpha-beta model's.

  python3 bench/scaling_study_tables.py --fit FIT_JSON [--fit ...] --out study.md REPORT_DIR[=FIT_NAME] ...

Each REPORT_DIR is a tools/scaling_report --comm-fit output folder (its fit_model.csv is read, and
each run's summary.json through the path in it); its name is the variant, e.g.
strong-overlap_true-zero_0; FIT_NAME (optional) names the fit its report used. Numbers are copied, not
recomputed (scaling_report computes them).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import comm_fit as cf  # noqa: E402


def f3(v, digits=3):
    if v in (None, ""):
        return "-"
    return f"{float(v):.{digits}f}"


def ms(v, digits=1):
    if v in (None, ""):
        return "-"
    return f"{float(v) * 1e3:.{digits}f}"


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fit_section(doc):
    rows = []
    for f in doc["fits"] + ([doc["joint"]] if doc.get("joint") else []):
        where = (f"{f['world_size']} ({f['nodes']}x{f['ranks_per_node']})" if "world_size" in f
                 else "/".join(map(str, f.get("world_sizes", []))))
        ib = f["inv_beta_s_per_B"]
        rows.append([f["label"], where, f"{f['alpha_s'] * 1e6:.3g}",
                     f"{1 / ib / 1e9:.3g}" if ib > 0 else f"(1/beta = {ib:.3g} s/B)",
                     f"{f['rms_rel_err']:.2f} / {f['max_rel_err']:.2f}",
                     "yes" if f["valid"] else "**NO**: " + "; ".join(f["problems"])])
    lines = [f"`{doc.get('call', 'MPI_Allreduce')}`: model {doc['model']}, least squares on the "
             f"microbenchmark's {doc['statistic']} ({doc['weighting']} residuals).", "",
             md_table(["fit", "ranks (placement)", "alpha (us)", "beta (GB/s)",
                       "relative error rms / max", "valid"], rows)]
    # measured vs fitted at a few sizes
    picks = (4, 4096, 1 << 20, 16 << 20, 256 << 20)
    prow = []
    for f in doc["fits"]:
        pts = {int(p["bytes"]): p for p in f.get("points", [])}
        cells = []
        for b in picks:
            p = pts.get(b)
            cells.append("-" if p is None else f"{p['measured_s'] * 1e3:.3g} / {p['model_s'] * 1e3:.3g}")
        prow.append([f["label"]] + cells)
    if prow:
        lines += ["", "Measured / fitted allreduce time (ms) at some sizes:", "",
                  md_table(["fit", "4 B", "4 KiB", "1 MiB", "16 MiB", "256 MiB"], prow)]
    return lines


def optimizer_mb(summary):
    """Optimizer state per rank in MB, from the summary if it says (None otherwise)."""
    for k in ("optimizer_state_bytes_per_rank", "optimizer_bytes_per_rank"):
        v = summary.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return v / 1e6
    mp = summary.get("memory_plan")
    if isinstance(mp, dict) and isinstance(mp.get("optimizer_bytes"), (int, float)):
        return mp["optimizer_bytes"] / 1e6
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", required=True, action="append",
                    help="comm_fit JSON (repeat for several collectives)")
    ap.add_argument("--out", required=True)
    ap.add_argument("reports", nargs="+")
    a = ap.parse_args(argv)
    parts = ["# Scaling study: measured vs modelled parallel efficiency", ""]
    for path in a.fit:
        doc = cf.load_fit(path)
        parts += [f"## Fit: {doc.get('collective', 'allreduce')}"
                  + (" (non-blocking)" if doc.get("nonblocking") else " (blocking)"), "",
                  *fit_section(doc), ""]
    parts += [
             "## Measured vs modelled, every variant", "",
             "Efficiency is relative to the variant's 1-rank run (strong: T_1/(p T_p); weak: per-rank "
             "throughput ratio). Model (tools/scaling_report --comm-fit): t_c(p) from the 1-rank run, "
             "communication c from the fit of the run's placement, of the variant's collective (see "
             "'fit' below); 'no overlap' = t_c/(t_c + c); "
             "'overlap f' with the run's own hidden fraction f = 1 - exposed/c (overlapped runs); "
             "'f, shared cores' also lets p ranks share the host's cores (p/cores times slower compute "
             "when p > cores). Exposed comm: summary comm_s_min_step (the last rank's wait per step); "
             "compute ratio: the run's compute + data per step over t_c(p).", ""]
    header = ["variant", "fit", "ranks", "nodes x ranks", "step (ms)", "exposed comm (ms)",
              "comm model (ms)", "f", "compute ratio", "optimizer MB/rank",
              "**efficiency measured**", "model: no overlap", "model: overlap f",
              "model: f, shared cores"]
    rows = []
    for spec in a.reports:
        rd, _, fit_name = spec.partition("=")
        rd = Path(rd)
        csv_path = rd / "fit_model.csv"
        if not csv_path.is_file():
            print(f"scaling_study_tables: {csv_path} missing (run scaling_report with --comm-fit)",
                  file=sys.stderr)
            return 1
        with open(csv_path, newline="") as fh:
            for r in csv.DictReader(fh):
                try:
                    summary = json.loads(Path(r["path"]).read_text())
                except (OSError, ValueError):
                    summary = {}
                opt = optimizer_mb(summary)
                fit_note = "" if r["fit_valid"] == "true" else " (invalid fit)"
                rows.append([rd.name, fit_name or "-", r["world_size"], f"{r['nodes']}x{r['ranks_per_node']}",
                             ms(r["step_time_s"]),
                             "-" if r["world_size"] == "1" else ms(r["comm_s_min_step"] or r["comm_s"]),
                             ms(r["allreduce_model_s"]) + fit_note, f3(r["overlap_fraction"], 2),
                             f3(r["compute_ratio"], 2), "-" if opt is None else f"{opt:.1f}",
                             f"**{f3(r['efficiency_measured'])}**", f3(r["efficiency_model_no_overlap"]),
                             f3(r["efficiency_model"]), f3(r["efficiency_model_cores"])])
    parts.append(md_table(header, rows))
    parts.append("")
    text = "\n".join(parts)
    cf.write_atomic(a.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
