#!/usr/bin/env python3
"""Plot nlptrain training curves from one or more runs' metrics.jsonl into one PNG.

    python3 tools/plot_run.py RUN_DIR [RUN_DIR ...] --out curves.png

Panels (one figure, runs overlaid, each run one colour, labelled by its directory name):
  loss            training loss per step (solid) and evaluation loss (markers, dashed)
  eval metrics    every other evaluation field (perplexity, accuracy, f1, exact_match, ...);
                  perplexity on a log scale; left out when no run has evaluations
  learning rate   lr per step
  throughput      tokens/s per step
For comparing seeds, precisions or node counts: give each run's output.dir. A resumed run's
repeated steps are counted once (the last record of a step wins). --smooth N draws the training
loss as a running mean over N steps (the raw curve faint behind it).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_metrics import MetricsError, load  # noqa: E402

TOOL = "plot_run"
EVAL_SKIP = {"loss", "tokens", "padding_fraction"}


def run_label(run_dir: Path, used: set) -> str:
    p = Path(run_dir).resolve()
    if p.is_file():
        p = p.parent
    label = p.name or str(p)
    # Runs that share a folder name (seed1/out, seed2/out): add parents until unique.
    q = p
    while label in used and q.parent != q:
        q = q.parent
        label = f"{q.name}/{label}"
    used.add(label)
    return label


def running_mean(ys, n):
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= n:
            acc -= ys[i - n]
        out.append(acc / min(i + 1, n))
    return out


def make_figure(runs, smooth=0, title=None):
    """runs: [(label, {split: {step: {name: value}}})] -> matplotlib Figure. Axes titles name the
    panels: 'loss', 'eval: <metric>' (one per eval metric), 'learning rate', 'throughput'."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eval_metrics = []
    for _, d in runs:
        for vals in d.get("eval", {}).values():
            for k in vals:
                if k not in EVAL_SKIP and k not in eval_metrics:
                    eval_metrics.append(k)
    panels = ["loss"] + [f"eval: {m}" for m in eval_metrics] + ["learning rate", "throughput"]
    ncols = 2
    nrows = (len(panels) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(11, 3.6 * nrows), squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(panels):]:
        ax.remove()
    ax_of = dict(zip(panels, axes))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    for i, (label, d) in enumerate(runs):
        c = colors[i % len(colors)]
        train = d.get("train", {})
        ev = d.get("eval", {})
        steps = [s for s, v in train.items() if "loss" in v]
        loss = [train[s]["loss"] for s in steps]
        ax = ax_of["loss"]
        if steps:
            if smooth > 1:
                ax.plot(steps, loss, color=c, alpha=0.25, linewidth=0.8)
                ax.plot(steps, running_mean(loss, smooth), color=c, label=f"{label} train")
            else:
                ax.plot(steps, loss, color=c, label=f"{label} train", linewidth=1.0)
        es = [s for s, v in ev.items() if "loss" in v]
        if es:
            ax.plot(es, [ev[s]["loss"] for s in es], "o--", color=c, markersize=4,
                    label=f"{label} eval")
        for m in eval_metrics:
            ms = [s for s, v in ev.items() if m in v]
            if ms:
                ax_of[f"eval: {m}"].plot(ms, [ev[s][m] for s in ms], "o-", color=c, markersize=4,
                                         label=label)
        for key, panel in (("lr", "learning rate"), ("tokens_per_s", "throughput")):
            ks = [s for s, v in train.items() if key in v]
            if ks:
                ax_of[panel].plot(ks, [train[s][key] for s in ks], color=c, label=label, linewidth=1.0)

    ylabels = {"loss": "loss", "learning rate": "lr", "throughput": "tokens/s"}
    for name, ax in ax_of.items():
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabels.get(name, name.split(": ", 1)[-1]))
        ax.grid(True, alpha=0.3)
        if name == "eval: perplexity":
            ax.set_yscale("log")
        if name == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center",
                    color="grey")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="plot_run.py", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                    help="nlptrain output.dir holding metrics.jsonl (or a .jsonl path); several overlay")
    ap.add_argument("--out", required=True, type=Path, help="PNG file to write")
    ap.add_argument("--smooth", type=int, default=0, metavar="N",
                    help="running mean of the training loss over N steps (0 = raw)")
    ap.add_argument("--title", help="figure title")
    ap.add_argument("--dpi", type=int, default=100)
    args = ap.parse_args(argv)
    if args.out.suffix.lower() != ".png":
        print(f"{TOOL}: error: --out '{args.out}' must end in .png", file=sys.stderr)
        return 1
    try:
        used: set = set()
        runs = [(run_label(Path(r), used), load(r)) for r in args.run_dirs]
    except MetricsError as e:
        print(f"{TOOL}: error: {e}", file=sys.stderr)
        return 1
    fig = make_figure(runs, smooth=args.smooth, title=args.title)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp.png")
    fig.savefig(tmp, dpi=args.dpi)
    os.replace(tmp, args.out)
    print(f"{TOOL}: wrote '{args.out}' ({', '.join(l for l, _ in runs)})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
