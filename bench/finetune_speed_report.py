#!/usr/bin/env python3
"""Tables of bench/finetune_speed.sh: RES/results.md and RES/results.json from RES/raw (on disk, or in
RES/raw.tar.xz once archived: bench/results_archive.py).

  python3 bench/finetune_speed_report.py RES

Per run (raw/<task>_<setting>_s<seed>.time, .log and folder):
  train_s   nlptrain: the sum of step_time_s over every training step of metrics.jsonl (log_interval 1),
            i.e. from the first step's start to the last step's end, without start-up, data loading
            and the final evaluation; HF: the wall time of trainer.train() (hf_trainer.py's train_s:
            includes the Trainer's dataloader/optimizer set-up, and LengthGroupedSampler's length scan)
  wall_s    the whole process (start-up, data, training, evaluation), from raw/*.time
  real tok/s   the sum of attention_mask over the trained batches / train_s (both sides the same way;
            nlptrain: sum over steps of real_tokens_per_s * step_time_s)
  mean len  computed positions per row (batch length), pad % = 1 - real / computed positions
  metric    on the held-out file: accuracy (doc_cls, pair_cls), entity F1 (ner), KorQuAD EM / F1 (qa)
  vs HF fastest  train_s / the smallest train_s of the HF settings of the same task and seed
  model     the family (bert, roberta, electra: finetune_speed.sh MODEL) and the parameter count of each
            side (nlptrain: summary.json parameters; HF: result.json parameters), per task; a count that
            differs between the sides is flagged in results.md
  step ms (after 20)  the median step time after the first 20 steps (steady state: torch.compile's
            compilations are mostly in the first steps; HF: between the ends of consecutive training_step
            calls, nlptrain: step_time_s); vs HF fastest step: the same ratio on it
"""
from __future__ import annotations

import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_archive as ra  # noqa: E402

SETTINGS = ["nlptrain-max_length", "hf-max_length", "nlptrain-longest", "hf-longest", "nlptrain-longest-group",
            "nlptrain-packed", "nlptrain-packedrows", "hf-longest-group", "hf-longest-group-compile",
            "nlptrain-longest-group-bf16", "nlptrain-packed-bf16", "nlptrain-packedrows-bf16", "nlptrain-packedrowsfixed",
            "nlptrain-packedrowsfixed-bf16", "nlptrain-packedrowsgraph-bf16", "hf-longest-group-bf16",
            "nlptrain-longest-groupshuffled-bf16", "hf-longest-groupshuffled-bf16", "nlptrain-packed-cudnn-bf16",
            "hf-longest-group-compile-bf16"]
TASKS = ["doc_cls", "pair_cls", "ner", "qa"]
CUDNN_BUILDS = re.compile(r"cuDNN attention: (\d+) graph\(s\) built, (\d+) declined, ([0-9.]+) s of host time")


def read_json(path):
    try:
        with ra.open_text(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path):
    try:
        with ra.open_text(path) as f:
            return f.read()
    except OSError:
        return ""


def read_jsonl(path):
    out = []
    try:
        with ra.open_text(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def metric_text(task, ev):
    if not ev:
        return "-"
    if task in ("doc_cls", "pair_cls"):
        return f"acc {100 * ev['accuracy']:.2f}" if "accuracy" in ev else "-"
    if task == "ner":
        return f"F1 {100 * ev['f1']:.2f}" if "f1" in ev else "-"
    if "korquad_f1" in ev:
        return f"EM {ev['korquad_exact_match']:.2f} / F1 {ev['korquad_f1']:.2f}"
    return "-"


def metric_value(task, ev):
    if not ev:
        return None
    key = {"doc_cls": "accuracy", "pair_cls": "accuracy", "ner": "f1", "qa": "korquad_f1"}[task]
    return ev.get(key)


def nlptrain_run(d, r):
    lines = read_jsonl(os.path.join(d, "metrics.jsonl"))
    train = [x for x in lines if "split" not in x and "step_time_s" in x]
    evals = [x for x in lines if x.get("split") == "eval"]
    summ = read_json(os.path.join(d, "summary.json")) or {}
    r["summary"] = summ
    r["parameters"] = summ.get("parameters")
    m = re.search(r"^\[model\][^\[]*?^type\s*=\s*(\S+)", read_text(os.path.join(d, "config.ini")), re.M | re.S)
    r["model_type"] = m.group(1) if m else None
    if train:
        steps = {x["step"]: x for x in train}  # one line per step (log_interval 1)
        train = [steps[k] for k in sorted(steps)]
        r["train_steps_logged"] = len(train)
        r["train_s"] = sum(x["step_time_s"] for x in train)
        # per step: tokens = (tokens/s) * (s/step), an integer up to the logged precision
        r["real_tokens"] = sum(round(x.get("real_tokens_per_s", 0) * x["step_time_s"]) for x in train)
        r["computed_tokens"] = sum(round(x.get("tokens_per_s", 0) * x["step_time_s"]) for x in train)
        r["train_loss_last"] = train[-1].get("loss")
        if any("examples" in x for x in train):  # packed runs log each step's examples
            r["examples_seen"] = sum(x.get("examples", 0) for x in train)
        if len(train) > 21:
            r["median_step_s_after_20"] = statistics.median(x["step_time_s"] for x in train[21:])
    if evals:
        ev = {k: v for k, v in evals[-1].items() if k not in ("step", "split")}
        r["eval"] = ev
    r["completed"] = bool(summ.get("completed"))
    r["own_real_tokens_per_s"] = summ.get("real_tokens_per_s")  # nlptrain's own figure (steps 2.., see summary)
    r["own_step_time_s"] = summ.get("step_time_s")
    r["batch_rows"] = summ.get("global_batch")
    # cuda with cuDNN's attention: the graphs built (the stderr line at exit, attention_cudnn.cpp), host
    # time spent inside the steps that first met each length and variant
    m = CUDNN_BUILDS.search(read_text(d + ".log"))
    if m:
        r["cudnn_graphs_built"], r["cudnn_graphs_declined"] = int(m.group(1)), int(m.group(2))
        r["cudnn_build_s"] = float(m.group(3))


def hf_run(d, r):
    res = read_json(os.path.join(d, "result.json"))
    if not res:
        return
    r["result"] = res
    r["parameters"] = res.get("parameters")
    r["model_type"] = res.get("model_type", "bert")  # hf_trainer.py before --model-type: BERT only
    r["train_s"] = res.get("train_s")
    r["eval_s"] = res.get("eval_s")
    r["real_tokens"] = res.get("real_tokens")
    r["computed_tokens"] = res.get("computed_tokens")
    r["eval"] = res.get("eval")
    r["train_loss_mean"] = res.get("train_loss")
    r["median_step_s_after_20"] = res.get("median_step_s_after_20")
    r["completed"] = True
    r["batch_rows"] = res.get("global_batch")


def collect(res_dir):
    runs = []
    for tf in sorted(ra.glob(os.path.join(res_dir, "raw", "*.time"))):
        name = os.path.basename(tf)[:-5]
        if name.startswith("prep_"):
            continue
        tm = read_json(tf) or {}
        try:
            head, seed = name.rsplit("_s", 1)
            task = next(t for t in TASKS if head.startswith(t + "_"))
            setting = head[len(task) + 1:]
        except (ValueError, StopIteration):
            continue
        side = setting.split("-", 1)[0]
        r = {"name": name, "task": task, "setting": setting, "side": side, "seed": int(seed),
             "padding": "max_length" if setting.endswith("max_length") else "longest",
             "group_by_length": "-group" in setting, "packing": "-packed" in setting, "bf16": setting.endswith("-bf16"), "torch_compile": "-compile" in setting, "wall_s": tm.get("wall_s"), "rc": tm.get("rc"),
             "loadavg_before": tm.get("loadavg_before"), "loadavg_after": tm.get("loadavg_after"),
             "start": tm.get("start"), "completed": False}
        d = os.path.join(res_dir, "raw", name)
        (nlptrain_run if side == "nlptrain" else hf_run)(d, r)
        if r.get("train_s"):
            r["real_tokens_per_s"] = (r.get("real_tokens") or 0) / r["train_s"]
            r["computed_tokens_per_s"] = (r.get("computed_tokens") or 0) / r["train_s"]
        if r.get("computed_tokens"):
            r["padding_fraction"] = 1 - r["real_tokens"] / r["computed_tokens"]
            rows = None
            if side == "hf":
                rows = (r.get("result") or {}).get("trained_rows")
            elif r.get("batch_rows") and r.get("train_steps_logged"):
                rows = r["batch_rows"] * r["train_steps_logged"]
            if rows:
                r["mean_batch_len"] = r["computed_tokens"] / rows
        if r.get("wall_s") is not None and r.get("train_s") is not None:
            r["other_s"] = r["wall_s"] - r["train_s"]  # start-up, data, evaluation
        r["metric"] = metric_value(task, r.get("eval"))
        runs.append(r)
    order = {s: i for i, s in enumerate(SETTINGS)}
    runs.sort(key=lambda r: (r["seed"], TASKS.index(r["task"]), order.get(r["setting"], 99)))
    # vs HF's fastest setting of the same task and seed
    for r in runs:
        hf = [x["train_s"] for x in runs if x["side"] == "hf" and x["task"] == r["task"] and x["seed"] == r["seed"]
              and x.get("train_s") and x.get("completed")]
        if hf and r.get("train_s"):
            r["hf_fastest_train_s"] = min(hf)
            r["vs_hf_fastest"] = r["train_s"] / min(hf)
        hf_step = [x["median_step_s_after_20"] for x in runs if x["side"] == "hf" and x["task"] == r["task"]
                   and x["seed"] == r["seed"] and x.get("median_step_s_after_20")]
        if hf_step and r.get("median_step_s_after_20"):
            r["step_vs_hf_fastest"] = r["median_step_s_after_20"] / min(hf_step)
    return runs


def parameter_counts(runs):
    """task -> 'family: nlptrain N, HF M (equal | DIFFER)' from the runs that report their counts."""
    out = {}
    for t in TASKS:
        rs = [r for r in runs if r["task"] == t and r.get("parameters")]
        if not rs:
            continue
        fam = sorted({r.get("model_type") or "?" for r in rs})
        side = {k: sorted({r["parameters"] for r in rs if r["side"] == k}) for k in ("nlptrain", "hf")}
        text = ", ".join(f"{'HF' if k == 'hf' else k} {' / '.join(str(v) for v in vs)}" for k, vs in side.items() if vs)
        same = len(side["nlptrain"]) == 1 and side["nlptrain"] == side["hf"]
        out[t] = f"{' / '.join(fam)}: {text}" + (" (equal)" if same else
                                                 " (DIFFER)" if side["nlptrain"] and side["hf"] else "")
    return out


def seed_spread_lines(runs, seeds):
    """Per task: each nlptrain setting's metric per seed and mean against the seed spread (min..max over
    the seeds) of HF's fastest setting (the smallest mean train s among the HF settings run with every
    seed), and the mean time ratio to HF's fastest of each seed."""
    out = ["## Metric against HF's seed spread", "",
           "HF fastest: the HF setting with the smallest mean train s among those run with every seed; its "
           "spread: its lowest to highest metric over the seeds. inside: nlptrain's mean metric is within it.", "",
           "| task | nlptrain setup | metric per seed | mean | HF fastest | its metric per seed | inside? | "
           "vs HF fastest per seed | mean |", "|---|---|---|---:|---|---|---|---|---:|"]
    for t in TASKS:
        rs = [r for r in runs if r["task"] == t and r.get("train_s") and r.get("metric") is not None]
        full = {}
        for s in SETTINGS:
            mine = {r["seed"]: r for r in rs if r["setting"] == s}
            if set(mine) >= set(seeds):
                full[s] = mine
        hf = [s for s in full if s.startswith("hf-")]
        if not hf:
            continue
        best = min(hf, key=lambda s: statistics.mean(full[s][k]["train_s"] for k in seeds))
        pct = 1 if t == "qa" else 100  # korquad_f1 is a percentage already
        hm = [full[best][k]["metric"] for k in seeds]
        lo, hi = min(hm), max(hm)
        for s in (x for x in full if x.startswith("nlptrain-")):
            m = [full[s][k]["metric"] for k in seeds]
            mean = statistics.mean(m)
            where = "yes" if lo <= mean <= hi else f"no ({pct * (mean - (lo if mean < lo else hi)):+.2f})"
            ratios = [full[s][k].get("vs_hf_fastest") for k in seeds]
            out.append("| {} | {} | {} | {:.2f} | {} | {} | {} | {} | {} |".format(
                t, s, " / ".join(f"{pct * x:.2f}" for x in m), pct * mean, best,
                " / ".join(f"{pct * x:.2f}" for x in hm), where,
                " / ".join(f(x, "{:.2f}") for x in ratios),
                f(statistics.mean(ratios), "{:.2f}") if all(x is not None for x in ratios) else "-"))
    out.append("")
    return out


def f(x, fmt="{:.1f}"):
    return "-" if x is None else fmt.format(x)


def load_text(r):
    a = (r.get("loadavg_before") or "").split()[:1]
    b = (r.get("loadavg_after") or "").split()[:1]
    return f"{a[0] if a else '?'} → {b[0] if b else '?'}"


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    res = argv[1]
    runs = collect(res)
    cmd = read_text(os.path.join(res, "command.txt")).strip() or "?"
    env = read_text(os.path.join(res, "environment.txt"))
    prep = {}
    for p in sorted(ra.glob(os.path.join(res, "raw", "prep_*.log"))):
        t = os.path.basename(p)[5:-4]
        prep[t] = [l.strip() for l in ra.open_text(p) if "wrote" in l]
    families = sorted({r["model_type"] for r in runs if r.get("model_type")})
    title = "# Fine-tuning speed: nlptrain vs Hugging Face Trainer" + (
        f" ({', '.join(families)} from scratch)" if families else "")
    out = [title, "", "Command (repository root):", "", "```sh", cmd,
           "```", "", "Environment:", "", "```", env.rstrip(), "```", "",
           "Data (tools/prep_*.py):", ""]
    for t, ls in prep.items():
        for l in ls:
            out.append(f"- {t}: {l}")
    counts = parameter_counts(runs)
    if counts:
        out += ["", "Model and parameters (each side's own count of the from-scratch model):", ""]
        for t, c in counts.items():
            out.append(f"- {t}: {c}")
    out += ["", "train s: nlptrain = sum of its per-step times (steps 1..N, no start-up or evaluation); HF = "
            "trainer.train() wall time. real tok/s = sum of attention_mask over the trained batches / train s. "
            "vs HF fastest = train s / the smallest HF train s of that task and seed (< 1: faster); step ms: the "
            "median step after the first 20 (steady state), and its ratio to HF's fastest. wall s: the whole "
            "process, evaluation included. len: computed positions per row (packed: per example, rows holding several); pad: share of computed positions "
            "that are padding. load: 1-minute loadavg before → after the run. One run at a time.", ""]
    seeds = sorted({r["seed"] for r in runs})
    for seed in seeds:
        for t in TASKS:
            rs = [r for r in runs if r["task"] == t and r["seed"] == seed]
            if not rs:
                continue
            out += [f"## {t} (seed {seed})", "",
                    "| setup | train s | vs HF fastest | step ms (after 20) | vs HF fastest step | real tok/s | len "
                    "| pad % | metric | wall s | load | rc |",
                    "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|"]
            for r in rs:
                step = r.get("median_step_s_after_20")
                out.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                    r["setting"], f(r.get("train_s")), f(r.get("vs_hf_fastest"), "{:.2f}x"),
                    f(None if step is None else 1000 * step, "{:.0f}"), f(r.get("step_vs_hf_fastest"), "{:.2f}x"),
                    f(r.get("real_tokens_per_s"), "{:.0f}"), f(r.get("mean_batch_len")),
                    f(None if r.get("padding_fraction") is None else 100 * r["padding_fraction"]),
                    metric_text(t, r.get("eval")), f(r.get("wall_s")), load_text(r),
                    r.get("rc") if r.get("completed") or r.get("rc") else f"{r.get('rc')} (incomplete)"))
            out.append("")
            built = [r for r in rs if r.get("cudnn_build_s") is not None]
            if built:
                out += ["cuDNN attention graphs (host time inside nlptrain's train s, paid at the first step of each "
                        "new batch length and variant): " + "; ".join(
                            f"{r['setting']} {r['cudnn_graphs_built']} built ({r['cudnn_graphs_declined']} declined) "
                            f"in {r['cudnn_build_s']:.1f} s" for r in built), ""]
    if len(seeds) > 1:
        out += ["## Mean over seeds", "", "| task | setup | seeds | train s | vs HF fastest | real tok/s | metric |",
                "|---|---|---:|---:|---:|---:|---:|"]
        for t in TASKS:
            for s in SETTINGS:
                rs = [r for r in runs if r["task"] == t and r["setting"] == s and r.get("train_s")]
                if not rs:
                    continue
                m = [r["metric"] for r in rs if r.get("metric") is not None]
                out.append("| {} | {} | {} | {} | {} | {} | {} |".format(
                    t, s, len(rs), f(statistics.mean(r["train_s"] for r in rs)),
                    f(statistics.mean(r["vs_hf_fastest"] for r in rs if "vs_hf_fastest" in r), "{:.2f}x")
                    if any("vs_hf_fastest" in r for r in rs) else "-",
                    f(statistics.mean(r["real_tokens_per_s"] for r in rs), "{:.0f}"),
                    f(statistics.mean(m), "{:.4f}") if m else "-"))
        out.append("")
    if len(seeds) > 1:
        out += seed_spread_lines(runs, seeds)
    md = "\n".join(out) + "\n"
    with open(os.path.join(res, "results.md"), "w") as fh:
        fh.write(md)
    with open(os.path.join(res, "results.json"), "w") as fh:
        json.dump({"command": cmd, "environment": env, "data": prep, "runs": runs}, fh, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
