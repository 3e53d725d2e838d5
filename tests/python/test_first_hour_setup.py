"""A new user's first commands on a fresh clone: the documented data preparation with its default
vocabulary (`bash tools/prep_task_data.sh`, no tokenizer argument: the route of inputs/mlm_pretrain.ini
for users with no pretrained model), and the folders the README downloads into (models/, datasets/)
kept out of git. The preparation test is skipped, saying so, without ../shared/data."""
import os
import subprocess
from pathlib import Path

import h5py
import pytest

import nlp_run as nr

DATA = nr.shared_data()
CORPORA = ["vocab/kcbert-base/vocab.txt", "nsmc/nsmc_from_raw_train.tsv", "nsmc/nsmc_from_raw_test.tsv",
           "kornli/xnli.test.ko.tsv", "kornli/xnli.dev.ko.tsv", "klue-ner/klue-ner-v1.1_dev.tsv",
           "korquad/KorQuAD_v1.0_dev.json"]
OUTPUTS = ["mlm_train.h5", "mlm_eval.h5", "nsmc_train.h5", "nsmc_test.h5", "kornli_train.h5", "kornli_eval.h5",
           "ner_train.h5", "ner_eval.h5", "korquad_train.h5", "korquad_eval.h5"]


def test_prep_task_data_without_a_tokenizer_uses_the_default_vocabulary(tmp_path):
    missing = [c for c in CORPORA if not (DATA / c).exists()]
    if missing:
        pytest.skip(f"shared data not found ({DATA / missing[0]}): prep_task_data.sh test skipped")
    # A scratch checkout: the script works from the folder above tools/ and writes runs/data there.
    (tmp_path / "tools").symlink_to(nr.SOURCE_DIR / "tools")
    env = dict(os.environ, PREP_LIMIT="200")
    p = subprocess.run(["bash", "tools/prep_task_data.sh", str(DATA)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"stdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    assert "--vocab" in p.stderr and str(DATA / CORPORA[0]) in p.stderr  # set -x shows what was passed
    vocab_size = sum(1 for _ in open(DATA / CORPORA[0], encoding="utf-8"))
    for name in OUTPUTS:
        path = tmp_path / "runs" / "data" / name
        assert path.exists(), name
        with h5py.File(path, "r") as f:
            ids = f["input_ids"][()]
            assert ids.shape[0] > 0 and ids.shape[1] in (128, 256), (name, ids.shape)
            assert 0 <= ids.min() and ids.max() < vocab_size, name


def test_prep_task_data_names_a_missing_default_vocabulary(tmp_path):
    (tmp_path / "tools").symlink_to(nr.SOURCE_DIR / "tools")
    p = subprocess.run(["bash", "tools/prep_task_data.sh", str(tmp_path / "nodata")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert f"prep_task_data: vocabulary not found: {tmp_path / 'nodata'}/vocab/kcbert-base/vocab.txt" in p.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("path", ["models/kcbert-base/config.json", "models/gpt2/model.safetensors",
                                  "datasets/wikitext/wikitext-2-raw-v1/test-00000-of-00001.parquet"])
def test_hub_download_folders_are_ignored_by_git(path):
    if not (nr.SOURCE_DIR / ".git").exists():
        pytest.skip(f"{nr.SOURCE_DIR} is not a git checkout: .gitignore test skipped")
    p = subprocess.run(["git", "-C", str(nr.SOURCE_DIR), "check-ignore", "--no-index", "-q", path])
    assert p.returncode == 0, f"{path} is not ignored by .gitignore"


def test_the_sources_are_not_ignored_by_git():
    if not (nr.SOURCE_DIR / ".git").exists():
        pytest.skip(f"{nr.SOURCE_DIR} is not a git checkout: .gitignore test skipped")
    for path in ["src/model/gpt2.cpp", "tools/hf_import.py", "tests/python/nlp_run.py"]:
        p = subprocess.run(["git", "-C", str(nr.SOURCE_DIR), "check-ignore", "--no-index", "-q", path])
        assert p.returncode == 1, f"{path} is ignored by .gitignore"
