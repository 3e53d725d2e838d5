"""bench/predict_speed.sh stays runnable: a smoke run (64 NSMC test reviews, 3 training steps) writes
results.md with a row per setting and the agreement of nlptrain's labels with HF's. A benchmark's
numbers are not asserted (speed is measured in bench/, not in tests); what is asserted is that both
sides predicted every review and, on the same weights, gave the same labels."""
import os
import re
import subprocess

import pytest

import nlp_run as nr

DATA = nr.shared_data()


def test_predict_speed_smoke(tmp_path):
    for need in (DATA / "nsmc" / "nsmc_from_raw_test.tsv", DATA / "nsmc" / "nsmc_from_raw_train.tsv",
                 DATA / "vocab" / "kcbert-base" / "vocab.txt"):
        if not need.exists():
            pytest.skip(f"shared data absent: {need} (NLPTRAIN_SHARED_DATA)")
    env = dict(os.environ, N="64", TRAIN_STEPS="3", WORK=str(tmp_path / "work"), RES=str(tmp_path / "res"),
               SHARED=str(DATA), NLPTRAIN_BIN=nr.binary(), OMP_NUM_THREADS="1")
    p = subprocess.run(["bash", str(nr.SOURCE_DIR / "bench" / "predict_speed.sh")], env=env, capture_output=True,
                       text=True, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    md = (tmp_path / "res" / "results.md").read_text()
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| (nlptrain, [^|]*|HF [^|]*) \| 1 \|(.*)$", md, re.M)}
    assert len(rows) == 3, md  # two nlptrain orders and HF eager (HF_COMPILE not set)
    for label, rest in rows.items():
        cells = [c.strip() for c in rest.split("|")]
        assert float(cells[1]) > 0, (label, md)  # the prediction loop's seconds
    agree = re.findall(r"labels equal for (\d+) of (\d+)", md)
    assert agree == [("64", "64"), ("64", "64")], md
