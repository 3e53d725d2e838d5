"""bench/finetune_speed_seeds.py: the accuracy over the seeds of several benchmark folders, on two made-up
folders whose figures are worked out by hand here: per-seed metrics on each side, means and sample
standard deviations, HF's range, the per-seed differences with the standard error of their mean, the
evaluation set's standard error; a seed run again in a later folder replaces the earlier run; other
settings and failed runs are left out; a folder with two step counts is refused."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nlp_run import SOURCE_DIR

SCRIPT = SOURCE_DIR / "bench" / "finetune_speed_seeds.py"


def folder(path, steps, runs):
    path.mkdir()
    cmd = "\n".join(f"MODEL=electra TASKS=doc_cls STEPS={s} bash bench/finetune_speed.sh" for s in steps)
    rows = [dict(task="doc_cls", model_type="electra", setting=st, seed=seed, rc=rc, metric=m,
                 eval={"examples": 400}) for st, seed, m, rc in runs]
    (path / "results.json").write_text(json.dumps({"command": cmd, "runs": rows}))
    return str(path)


def run(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


def test_seed_table(tmp_path):
    a = folder(tmp_path / "a", [200], [("nlptrain-longest-group", 1, 0.70, 0), ("hf-longest-group", 1, 0.74, 0),
                                       ("nlptrain-longest-group", 2, 0.90, 0), ("hf-longest-group", 2, 0.76, 0),
                                       ("hf-longest-group-bf16", 1, 0.10, 0),  # another setting: left out
                                       ("nlptrain-longest-group", 3, 0.50, 1), ("hf-longest-group", 3, 0.5, 0)])
    b = folder(tmp_path / "b", [200], [("nlptrain-longest-group", 2, 0.72, 0),  # seed 2 again: replaces 0.90
                                       ("nlptrain-longest-group", 4, 0.74, 0), ("hf-longest-group", 4, 0.72, 0)])
    p = run(a, b)
    assert p.returncode == 0, p.stderr
    rows = [l for l in p.stdout.splitlines() if l.startswith("| electra")]
    assert len(rows) == 1, p.stdout
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[0] == "electra, doc_cls, 200"
    assert cells[1] == "3 (1, 2, 4)"  # seed 3: nlptrain failed there
    assert cells[2] == "70.0 / 72.0 / 74.0" and cells[3] == "72.00 (2.00)"
    assert cells[4] == "74.0 / 76.0 / 72.0" and cells[5] == "74.00 (2.00)"
    assert cells[6] == "yes"  # 72.0 is HF's lowest: inside, at the edge
    # differences -4, -4, +2: mean -2, sd sqrt(12) = 3.464, SE 2.000
    assert cells[7] == "-4.0 / -4.0 / +2.0" and cells[8] == "-2.00 (2.00)"
    # pooled p = 0.73 over 400 examples: 100 sqrt(0.73 * 0.27 / 400) = 2.22
    assert cells[9] == "2.22 (400 examples)"


def test_two_step_counts_refused(tmp_path):
    a = folder(tmp_path / "a", [200, 1000], [("nlptrain-longest-group", 1, 0.7, 0), ("hf-longest-group", 1, 0.7, 0)])
    p = run(a)
    assert p.returncode != 0 and "STEPS ['1000', '200']" in p.stderr, p.stderr
