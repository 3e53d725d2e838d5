#!/usr/bin/env python3
"""Wall-time table of one run.sh results folder: rerun_table.py RES_DIR (markdown on stdout)."""
import json, os, sys
R = sys.argv[1]
print("| task | wall nlptrain (s) | wall HF (s) | HF / nlptrain | train s/step nlptrain | train s/step HF | 1-min load before (nl / HF) |")
print("|---|---|---|---|---|---|---|")
for t in ["mlm", "doc_cls", "pair_cls", "ner", "qa"]:
    try:
        nt = json.load(open(f"{R}/nlptrain_{t}.time")); ht = json.load(open(f"{R}/hf_{t}.time"))
    except OSError:
        print(f"| {t} | (not run) | | | | | |"); continue
    ns = json.load(open(f"{R}/nlptrain_{t}/summary.json"))["step_time_s"]
    hr = json.load(open(f"{R}/hf_{t}/result.json")); hs = hr["train_s"] / hr["steps"]
    print(f"| {t} | {nt['wall_s']} | {ht['wall_s']} | {ht['wall_s']/nt['wall_s']:.2f} | {ns:.3f} | {hs:.3f} | "
          f"{nt['load_before'].split()[0]} / {ht['load_before'].split()[0]} |")
