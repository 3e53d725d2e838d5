"""bench/finetune_speed.sh MODEL=roberta | electra: both sides train the same family and shape.

A tiny run (1 layer x 32, 40 KorNLI pairs, 2 steps, one nlptrain and one HF setting) of each family,
then what the benchmark's comparison rests on: both runs completed, nlptrain's model.type and HF's
class are the family's, the two parameter counts are equal (the report says "(equal)"), RoBERTa's data
has every token type 0 (a pair's second sentence too) and its position table MAXPOS + pad id + 1 rows
on both sides, ELECTRA's embedding_size is the one asked for on both sides. A bad MODEL stops the script
before it runs anything. Needs the shared corpora (skips without them) and transformers.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from nlp_run import SOURCE_DIR, binary, mpi_env, shared_data

SCRIPT = SOURCE_DIR / "bench" / "finetune_speed.sh"


def run_script(tmp_path: Path, model: str, **extra) -> subprocess.CompletedProcess:
    env = mpi_env(threads=1)
    env.update(MODEL=model, TASKS="pair_cls", LIMIT="40", EVAL_N="40", STEPS="2", WARMUP="1", BATCH="8",
               THREADS="1", HIDDEN="32", LAYERS="1", HEADS="2", INTER="64", MAXPOS="64", MAXLEN="32",
               QA_MAXLEN="32", SETTINGS="nlptrain-longest-group hf-longest-group", RES=str(tmp_path / "res"),
               WORK=str(tmp_path / "work"), NLPTRAIN_BIN=binary(), SHARED=str(shared_data()), **extra)
    return subprocess.run(["bash", str(SCRIPT)], cwd=SOURCE_DIR, env=env, capture_output=True, text=True,
                          timeout=600)


def test_unknown_model_family_stops_before_any_run(tmp_path):
    p = run_script(tmp_path, "albert")
    assert p.returncode == 2, p.stdout[-2000:] + p.stderr[-2000:]
    assert "MODEL=albert (expected bert, roberta or electra)" in p.stderr
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("model", ["roberta", "electra"])
def test_both_sides_train_the_same_family(tmp_path, model):
    if not (shared_data() / "kornli" / "xnli.test.ko.tsv").is_file():
        pytest.skip(f"no shared KorNLI under {shared_data()}")
    pytest.importorskip("transformers")
    extra = {"EMBED": "16"} if model == "electra" else {}  # E != H: embeddings_project on both sides
    p = run_script(tmp_path, model, **extra)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    raw = tmp_path / "res" / "raw"
    for name in ("pair_cls_nlptrain-longest-group_s1234", "pair_cls_hf-longest-group_s1234"):
        assert json.loads((raw / f"{name}.time").read_text())["rc"] == 0, (raw / f"{name}.log").read_text()[-3000:]
    summ = json.loads((raw / "pair_cls_nlptrain-longest-group_s1234" / "summary.json").read_text())
    hf = json.loads((raw / "pair_cls_hf-longest-group_s1234" / "result.json").read_text())
    assert summ["completed"] and summ["model_type"] == model
    assert hf["model_type"] == model
    assert hf["model_class"] == {"roberta": "RobertaForSequenceClassification",
                                 "electra": "ElectraForSequenceClassification"}[model]
    assert summ["parameters"] == hf["parameters"] > 0
    ini = (raw / "pair_cls_nlptrain-longest-group_s1234" / "config.ini").read_text()
    report = (tmp_path / "res" / "results.md").read_text()
    assert f"- pair_cls: {model}: nlptrain {summ['parameters']}, HF {hf['parameters']} (equal)" in report
    assert f"({model} from scratch)" in report.splitlines()[0]
    assert f"MODEL={model} " in (tmp_path / "res" / "command.txt").read_text()
    if model == "roberta":
        data = tmp_path / "work" / "data" / "pair_cls-single"
        with h5py.File(data / "train.h5", "r") as f:
            pad = int(f.attrs["pad_id"])
            tt = f["token_type_ids"][()]
            am = f["attention_mask"][()]
        assert am.sum() > 0 and not np.any(tt), "roberta's pairs must carry token type 0 only"
        assert hf["type_vocab_size"] == 1 and "type_vocab_size = 1" in ini
        assert hf["max_position_embeddings"] == 64 + pad + 1
        assert f"max_position_embeddings = {64 + pad + 1}" in ini
    else:
        with h5py.File(tmp_path / "work" / "data" / "pair_cls" / "train.h5", "r") as f:
            assert np.any(f["token_type_ids"][()]), "electra's pairs keep BERT's two token types"
        assert hf["type_vocab_size"] == 2 and "embedding_size = 16" in ini
        assert hf["max_position_embeddings"] == 64
