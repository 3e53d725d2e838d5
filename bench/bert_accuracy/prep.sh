#!/usr/bin/env bash
# Reduced-size preprocessing for the BERT accuracy comparison (same HDF5 files for both sides).
#   bash bench/bert_accuracy/prep.sh [WORK_DIR] [SHARED_DATA_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${1:-bench/bert_accuracy/work}
D=${2:-/work/shared/data}
V=$D/vocab/kcbert-base/vocab.txt
O=$W/data
mkdir -p "$O"
MLM_DOCS=${MLM_DOCS:-20000}
set -x
python3 tools/prep_mlm.py --vocab "$V" --tsv-column document --input "$D/nsmc/nsmc_from_raw_train.tsv" \
  --limit "$MLM_DOCS" --max-seq-len 64 --out "$O/mlm_train.h5" --split-eval 0.02 --eval-out "$O/mlm_eval.h5"
# doc_cls: the first 8000 reviews of the NSMC train file (the MLM text is the first MLM_DOCS reviews of the
# same file, unlabelled, as in tools/prep_task_data.sh) and the first 2000 of the NSMC test file.
python3 tools/prep_doc_cls.py --vocab "$V" --input "$D/nsmc/nsmc_from_raw_train.tsv" --limit 8000 --max-seq-len 64 \
  --out "$O/nsmc_train.h5"
python3 tools/prep_doc_cls.py --vocab "$V" --input "$D/nsmc/nsmc_from_raw_test.tsv" --limit 2000 --max-seq-len 64 \
  --out "$O/nsmc_eval.h5"
python3 tools/prep_pair_cls.py --vocab "$V" --input "$D/kornli/xnli.test.ko.tsv" --max-seq-len 64 \
  --out "$O/kornli_train.h5"
python3 tools/prep_pair_cls.py --vocab "$V" --input "$D/kornli/xnli.dev.ko.tsv" --max-seq-len 64 \
  --out "$O/kornli_eval.h5"
python3 tools/prep_ner.py --vocab "$V" --input "$D/klue-ner/klue-ner-v1.1_dev.tsv" --max-seq-len 96 \
  --out "$O/ner_train.h5" --split-eval 0.2 --eval-out "$O/ner_eval.h5"
python3 tools/prep_qa.py --vocab "$V" --input "$D/korquad/KorQuAD_v1.0_dev.json" --max-seq-len 192 \
  --doc-stride 64 --out "$O/korquad_train.h5" --split-eval 0.2 --eval-out "$O/korquad_eval.h5"
