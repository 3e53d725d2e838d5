"""Tests of bench/precision_compare.py, the rules of bench/precision_check.sh (bf16 against fp32 on the
CPU), on synthetic curves and metrics whose results are worked out by hand in the comments, and of the
script's refusal of bad settings (no runs: cheap).

  python3 -m pytest -q -rs tests/python/test_precision_check.py
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SOURCE = Path(os.environ.get("NLPTRAIN_SOURCE_DIR") or Path(__file__).resolve().parents[2])


def load():
    spec = importlib.util.spec_from_file_location("precision_compare", SOURCE / "bench" / "precision_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pc = load()


def curve(*losses):
    return {i + 1: v for i, v in enumerate(losses)}


def test_trailing_mean():
    assert pc.trailing_mean([1, 2, 3, 4, 5], 3) == [2, 3, 4]
    assert pc.trailing_mean([1, 2, 3], 1) == [1, 2, 3]
    assert pc.trailing_mean([1, 2], 3) == []
    with pytest.raises(ValueError):
        pc.trailing_mean([1], 0)


def test_curve_smoothing_passes_noise_that_steps_alone_would_fail():
    # per step: |10.2-10|/10 = 2%, 2%, 0.5%, 0.5%; window 2: fp32 means 10, 10, 10 (steps 2..4),
    # bf16 means 10.0, 9.925, 10.05 -> 0, 0.75%, 0.5%: max 0.75% at step 3, within 1%
    r = pc.curve_check(curve(10, 10, 10, 10), curve(10.2, 9.8, 10.05, 10.05), window=2, tol=0.01)
    assert r["ok"]
    assert r["max_rel"] == pytest.approx(0.0075, abs=1e-12)
    assert r["at_step"] == 3
    assert r["max_rel_raw"] == pytest.approx(0.02, abs=1e-12)
    assert r["at_step_raw"] == 1
    assert r["steps"] == 4


def test_curve_drift_fails():
    # bf16 means over 2 steps: 10.1, 10.1, 10.2 -> 1%, 1%, 2%: max 2% at step 4 > 1%
    r = pc.curve_check(curve(10, 10, 10, 10), curve(10.1, 10.1, 10.1, 10.3), window=2, tol=0.01)
    assert not r["ok"]
    assert r["max_rel"] == pytest.approx(0.02, abs=1e-12)
    assert r["at_step"] == 4


def test_curve_boundary_is_inclusive():
    # 8.0625 against 8: 0.0625 / 8 = 2^-7 exactly, both in binary floating point
    r = pc.curve_check(curve(8, 8), curve(8.0625, 8.0625), window=1, tol=2 ** -7)
    assert r["ok"] and r["max_rel"] == 2 ** -7
    assert not pc.curve_check(curve(8, 8), curve(8.0625, 8.0625), window=1, tol=2 ** -8)["ok"]


def test_curve_bad_input():
    with pytest.raises(ValueError, match="different steps"):
        pc.curve_check(curve(1, 2, 3), curve(1, 2), window=1)
    with pytest.raises(ValueError, match="fewer than the window"):
        pc.curve_check(curve(1, 2), curve(1, 2), window=3)


def test_metric_within_seed_spread():
    # spread 0.74 - 0.70 = 0.04 > floor 0.02: allowed 0.04; diffs +0.03, -0.01 -> pass
    r = pc.metric_check({1: 0.70, 2: 0.74}, {1: 0.73, 2: 0.73}, floor=0.02)
    assert r["ok"]
    assert r["spread"] == pytest.approx(0.04) and r["allowed"] == pytest.approx(0.04)
    assert r["diffs"][1] == pytest.approx(0.03) and r["diffs"][2] == pytest.approx(-0.01)
    assert r["max_diff"] == pytest.approx(0.03)
    # seed 1 at 0.75: diff 0.05 > 0.04 -> fail
    assert not pc.metric_check({1: 0.70, 2: 0.74}, {1: 0.75, 2: 0.73}, floor=0.02)["ok"]


def test_metric_floor_when_seeds_agree():
    # spread 0.005 < floor 0.02: allowed 0.02; diff 0.015 passes, 0.03 fails
    r = pc.metric_check({1: 0.700, 2: 0.705}, {1: 0.715, 2: 0.700}, floor=0.02)
    assert r["ok"] and r["allowed"] == 0.02
    assert not pc.metric_check({1: 0.700, 2: 0.705}, {1: 0.730, 2: 0.700}, floor=0.02)["ok"]
    with pytest.raises(ValueError, match="seeds differ"):
        pc.metric_check({1: 0.7}, {2: 0.7}, floor=0.02)


def test_metric_floor_by_task():
    assert pc.metric_floor("doc_cls", [0.7, 0.8], 0.02, 0.01) == 0.02
    # perplexity: 1% of the fp32 mean (100 + 102) / 2 = 101 -> 1.01
    assert pc.metric_floor("gpt2", [100.0, 102.0], 0.02, 0.01) == pytest.approx(1.01)


def write_run(raw, name, losses, eval_rec):
    d = raw / name
    d.mkdir(parents=True)
    lines = [{"step": i + 1, "loss": v, "lr": 1e-3} for i, v in enumerate(losses)]
    lines.append({"step": len(losses), "split": "eval", **eval_rec})
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def make_result(tmp_path, bf16_acc_seed1=0.715, bf16_ppl_seed2=101.5):
    raw = tmp_path / "raw"
    flat = [5.0] * 4
    write_run(raw, "gpt2_fp32_s1", flat, {"loss": 4.6, "perplexity": 100.0})
    write_run(raw, "gpt2_fp32_s2", flat, {"loss": 4.6, "perplexity": 100.4})
    write_run(raw, "gpt2_bf16_s1", [5.01] * 4, {"loss": 4.6, "perplexity": 100.2})
    write_run(raw, "gpt2_bf16_s2", flat, {"loss": 4.6, "perplexity": bf16_ppl_seed2})
    write_run(raw, "doc_cls_fp32_s1", [0.7] * 4, {"loss": 0.6, "accuracy": 0.70})
    write_run(raw, "doc_cls_fp32_s2", [0.7] * 4, {"loss": 0.6, "accuracy": 0.71})
    write_run(raw, "doc_cls_bf16_s1", [0.7] * 4, {"loss": 0.6, "accuracy": bf16_acc_seed1})
    write_run(raw, "doc_cls_bf16_s2", [0.7] * 4, {"loss": 0.6, "accuracy": 0.71})
    return tmp_path


def test_report_passes(tmp_path, capsys):
    # gpt2: seed 1's curves 5.01 against 5.0, 0.2% apart; perplexity floor 1% of the fp32 mean 100.2 = 1.002
    # > spread 0.4, diffs 0.2 and 0.6 pass; doc_cls: spread 0.01 < floor 0.02, diffs 0.015 and 0 pass
    res = make_result(tmp_path, bf16_acc_seed1=0.715, bf16_ppl_seed2=101.0)
    assert pc.main([str(res), "--window", "2"]) == 0
    text = (res / "results.md").read_text()
    assert "Overall: pass" in text and "| gpt2 | 1 | 4 | 0.200% (2) |" in text
    data = json.loads((res / "results.json").read_text())
    assert data["ok"] and data["tasks"]["gpt2"]["metric_check"]["allowed"] == pytest.approx(1.002)


def test_report_fails_on_metric(tmp_path):
    res = make_result(tmp_path, bf16_ppl_seed2=101.5)  # diff 1.1 > allowed 1.002
    assert pc.main([str(res), "--window", "2"]) == 1
    assert "Overall: FAIL" in (res / "results.md").read_text()


def test_report_fails_on_curve(tmp_path):
    res = make_result(tmp_path, bf16_ppl_seed2=101.0)
    assert pc.main([str(res), "--window", "2", "--curve-tol", "0.001"]) == 1  # 0.2% > 0.1%


def test_report_missing_runs(tmp_path, capsys):
    res = make_result(tmp_path)
    for f in (res / "raw" / "doc_cls_bf16_s2").iterdir():
        f.unlink()
    assert pc.main([str(res)]) == 2
    assert "doc_cls_bf16_s2/metrics.jsonl: missing" in capsys.readouterr().err
    assert not (res / "results.md").exists()


@pytest.mark.parametrize("env, message", [({"TASKS": "gpt3"}, "unknown task 'gpt3'"),
                                          ({"CPU_BF16": "fast"}, "CPU_BF16=fast"),
                                          ({"GPT2_STEPS": "10"}, "GPT2_STEPS=10: must be a number >= WINDOW")])
def test_script_refuses_bad_settings(tmp_path, env, message):
    res = tmp_path / "res"
    r = subprocess.run(["bash", str(SOURCE / "bench" / "precision_check.sh")], capture_output=True, text=True,
                       env={**os.environ, "RES": str(res), "WORK": str(tmp_path / "work"), **env}, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert not res.exists()
