#!/usr/bin/env python3
"""Tables of a bench/zero_stages.sh results folder (markdown on stdout, which the script saves as
results.md): step time per (ranks, configuration) as the median over rounds [min-max], the paired
ratio against z1 of the same round and, for the offload configurations, against the same stage
without offload; then the bytes each rank sent per step (bench/mpi_bytes.c's counts) against the
parameter bytes.

    python3 bench/zero_stages_report.py bench/results/zero-stages-...
"""
import glob
import json
import os
import re
import statistics
import sys

ORDER = ["z1", "z2", "z3", "z1off", "z2off", "z3off"]


def med(xs):
    """'median [min-max]' of a list, or '-'."""
    if not xs:
        return "-"
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}-{max(xs):.3f}]"


def load(res):
    """{(ranks, config, round): run} for every raw/r{R}_{C}_{K} folder."""
    runs = {}
    for d in glob.glob(os.path.join(res, "raw", "r*_*_*")):
        m = re.fullmatch(r"r(\d+)_(z\d(?:off)?)_(\d+)", os.path.basename(d))
        if not m:
            continue
        run = {"exit": open(os.path.join(d, "exit_code")).read().strip(), "dir": d}
        if os.path.exists(os.path.join(d, "summary.json")):
            run["summary"] = json.load(open(os.path.join(d, "summary.json")))
        out = open(os.path.join(d, "stdout.txt"), errors="replace").read()
        steps = re.search(r"^done: (\d+) steps", out, re.M)
        run["steps"] = int(steps.group(1)) if steps else None
        run["bytes"] = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(d, "mpi_bytes.rank*.json")))]
        runs[int(m.group(1)), m.group(2), int(m.group(3))] = run
    return runs


def ok(run):
    return run and run["exit"] == "0" and "summary" in run and run["summary"].get("completed")


def main():
    res = sys.argv[1]
    runs = load(res)
    env = open(os.path.join(res, "environment.txt")).read() if os.path.exists(os.path.join(res, "environment.txt")) else ""
    ranks = sorted({r for r, _, _ in runs})
    configs = [c for c in ORDER if any(c == k[1] for k in runs)]
    rounds = sorted({k for _, _, k in runs})
    print(f"# ZeRO stages and offload on CPU ranks: {os.path.basename(os.path.normpath(res))}\n")
    print("```\n" + env.strip() + "\n```\n")
    print("Written by `bench/zero_stages_report.py` from `raw/` (one folder per run: stdout, summary.json, "
          "mpi_bytes.rank*.json, exit code). step_time_s is nlptrain's summary.json figure (mean over the "
          "timed steps of a run); each cell is the median over rounds [min-max]; a ratio is taken per round "
          "against the run next to it in the same round, then its median [min-max] quoted.\n")
    cores = re.search(r"cores: (\d+)", env)
    for r in ranks:
        if cores and r > int(cores.group(1)):
            print(f"**{r} ranks on {cores.group(1)} cores oversubscribe the CPU**: ranks wait for a core, so "
                  "communication and compute of different ranks do not overlap as they would on their own cores.\n")
    print("## Step time\n")
    print("| ranks | config | runs ok | step_time_s | vs z1 (paired) | vs same stage, no offload | comm_s | "
          "peak RSS rank 0 (MiB) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ranks:
        for c in configs:
            rs = [runs.get((r, c, k)) for k in rounds]
            good = [x for x in rs if ok(x)]
            st = [x["summary"]["step_time_s"] for x in good]
            vs1, vsoff = [], []
            for k in rounds:
                a, b = runs.get((r, c, k)), runs.get((r, "z1", k))
                if ok(a) and ok(b) and c != "z1":
                    vs1.append(a["summary"]["step_time_s"] / b["summary"]["step_time_s"])
                if c.endswith("off"):
                    b = runs.get((r, c[:-3], k))
                    if ok(a) and ok(b):
                        vsoff.append(a["summary"]["step_time_s"] / b["summary"]["step_time_s"])
            comm = [x["summary"]["comm_s"] for x in good]
            rss = [x["summary"]["peak_rss_bytes"] / 2**20 for x in good]
            fails = [f"{os.path.basename(x['dir'])} exit {x['exit']}" for x in rs if x and not ok(x)]
            print(f"| {r} | {c} | {len(good)}/{len([x for x in rs if x])}{' (' + ', '.join(fails) + ')' if fails else ''} "
                  f"| {med(st)} | {med(vs1) if c != 'z1' else '1'} | {med(vsoff) if c.endswith('off') else ''} "
                  f"| {med(comm)} | {statistics.median(rss):.0f} |" if good else
                  f"| {r} | {c} | 0/{len([x for x in rs if x])} ({', '.join(fails)}) | - | - | - | - | - |")
    print("\n## Bytes on the wire per step and rank\n")
    print("Counted at the MPI interface by bench/mpi_bytes.c (LD_PRELOAD): for every collective the elements "
          "nlptrain handed to MPI, and what each rank sends of them under a ring algorithm (reduce-scatter "
          "and all-gather: the other ranks' parts; allreduce: 2(P-1)/P of the buffer). Per step = the run's "
          "count / its steps (every step, the untimed first included, issues the same collectives). "
          "`x params` = sent bytes / the fp32 parameter bytes; `x params (P-1)/P` divides by (P-1)/P too, "
          "the ZeRO papers' convention, in which data parallelism and stages 1-2 move 2x the parameter bytes "
          "and stage 3 3x. Mean over ranks of the first complete round.\n")
    print("| ranks | config | parameters | reduce-scatter MB | all-gather MB | allreduce MB | sent MB/step | "
          "x params | x params (P-1)/P |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in ranks:
        for c in configs:
            run = next((runs[r, c, k] for k in rounds if ok(runs.get((r, c, k))) and runs[r, c, k]["bytes"]
                        and runs[r, c, k]["steps"]), None)
            if not run:
                print(f"| {r} | {c} | - | - | - | - | - | - | - |")
                continue
            n = run["steps"]
            P = run["bytes"][0]["world"]
            per = {k: statistics.mean(b[k]["bytes_sent"] for b in run["bytes"]) / n
                   for k in ("reduce_scatter", "allgather", "allreduce")}
            total = sum(per.values())
            pbytes = 4 * run["summary"]["parameters"]
            print(f"| {r} | {c} | {run['summary']['parameters']} | {per['reduce_scatter'] / 1e6:.2f} | "
                  f"{per['allgather'] / 1e6:.2f} | {per['allreduce'] / 1e6:.4f} | {total / 1e6:.2f} | "
                  f"{total / pbytes:.3f} | {total / pbytes / ((P - 1) / P):.3f} |")


if __name__ == "__main__":
    main()
