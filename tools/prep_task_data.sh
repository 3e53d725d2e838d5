#!/usr/bin/env bash
# Preprocess the shared corpora for the BERT inputs/*.ini files into runs/data/.
#   bash tools/prep_task_data.sh [SHARED_DATA_DIR [TOKENIZER]]
# SHARED_DATA_DIR: default ../shared/data beside the checkout. TOKENIZER: the model's tokenizer, a Hugging
# Face model folder (tokenizer.json or vocab.txt), e.g. models/kcbert-base; default the kcbert-base
# vocabulary in SHARED_DATA_DIR/vocab/kcbert-base/vocab.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
D=${1:-../shared/data}
if [ -n "${2:-}" ]; then
  [ -e "$2" ] || { echo "prep_task_data: tokenizer not found: $2" >&2; exit 1; }
  TOK=(--tokenizer "$2")
else
  V=$D/vocab/kcbert-base/vocab.txt
  [ -f "$V" ] || { echo "prep_task_data: vocabulary not found: $V" >&2; exit 1; }
  TOK=(--vocab "$V")
fi
# PREP_LIMIT=N: only the first N examples of each input (a quick look, and the README walkthrough test)
LIM=(); [ -n "${PREP_LIMIT:-}" ] && LIM=(--limit "$PREP_LIMIT")
O=runs/data
mkdir -p "$O"
set -x
python3 tools/prep_mlm.py "${TOK[@]}" --tsv-column document --input "$D/nsmc/nsmc_from_raw_train.tsv" \
  --max-seq-len 128 --out "$O/mlm_train.h5" --split-eval 0.01 --eval-out "$O/mlm_eval.h5"  --quiet "${LIM[@]}"
python3 tools/prep_doc_cls.py "${TOK[@]}" --input "$D/nsmc/nsmc_from_raw_train.tsv" --max-seq-len 128 \
  --out "$O/nsmc_train.h5"  --quiet "${LIM[@]}"
python3 tools/prep_doc_cls.py "${TOK[@]}" --input "$D/nsmc/nsmc_from_raw_test.tsv" --max-seq-len 128 \
  --out "$O/nsmc_test.h5"  --quiet "${LIM[@]}"
# KorNLI ships only XNLI dev and test in Korean: train on test (5,010 pairs), evaluate on dev (2,490).
python3 tools/prep_pair_cls.py "${TOK[@]}" --input "$D/kornli/xnli.test.ko.tsv" --max-seq-len 128 \
  --out "$O/kornli_train.h5"  --quiet "${LIM[@]}"
python3 tools/prep_pair_cls.py "${TOK[@]}" --input "$D/kornli/xnli.dev.ko.tsv" --max-seq-len 128 \
  --out "$O/kornli_eval.h5"  --quiet "${LIM[@]}"
python3 tools/prep_ner.py "${TOK[@]}" --input "$D/klue-ner/klue-ner-v1.1_dev.tsv" --max-seq-len 128 \
  --out "$O/ner_train.h5" --split-eval 0.2 --eval-out "$O/ner_eval.h5"  --quiet "${LIM[@]}"
python3 tools/prep_qa.py "${TOK[@]}" --input "$D/korquad/KorQuAD_v1.0_dev.json" --max-seq-len 256 \
  --doc-stride 64 --out "$O/korquad_train.h5" --split-eval 0.2 --eval-out "$O/korquad_eval.h5"  --quiet "${LIM[@]}"
