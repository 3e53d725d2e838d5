#!/usr/bin/env bash
# Prediction speed: nlptrain run.mode = predict (eval.sort_by_length on, the default, and off) against
# Hugging Face Trainer.predict, on NSMC's test reviews (kcbert-base WordPiece, T = 128), with the same
# weights on both sides, one run at a time on this machine.
#
#   bash bench/predict_speed.sh                  # all 50,000 reviews, one round (about 8 minutes on 2 cores)
#   N=2000 ROUNDS=1 bash bench/predict_speed.sh  # a smoke run
#
# The weights: a 4-layer, 256-wide BERT doc_cls (kcbert vocabulary; HIDDEN/LAYERS/HEADS/INTER set
# it) trained by nlptrain for TRAIN_STEPS (200) steps of 32 on the first 8,000 reviews of NSMC's train
# split (lr 3e-4; speed does not depend on what it learned, but a model that predicts both classes
# makes the label agreement check mean something: the report counts them), exported with
# tools/hf_export.py for the HF side.
# Each round runs, in turn: nlptrain longest first, nlptrain in the file's order, HF Trainer.predict
# (the file's order, batches padded to their longest row: what Trainer does with
# DataCollatorWithPadding; bench/hf_predict.py). Every side: batch BATCH (32), THREADS (2) threads,
# fp32. Times: the whole process (/usr/bin/time) and the prediction loop alone (nlptrain's log line;
# hf_predict.py's seconds around Trainer.predict).
# Environment (defaults): N (all), ROUNDS (1), TRAIN_STEPS (200), BATCH (32), THREADS (2), WORK (bench/predict_speed_work),
# RES (bench/results/predict-speed-DATE-HARDWARE-COMMIT, bench/result_dir.sh), NLPTRAIN_BIN (build/nlptrain), PYTHON (python3),
# SHARED (../shared/data), HF_COMPILE (set: HF also with torch_compile=True).
# Output in RES: command.txt, environment.txt, raw/ (logs, nlptrain's metrics.jsonl, HF's result.json)
# and results.md (the table and the agreement of nlptrain's labels with HF's).
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-}
ROUNDS=${ROUNDS:-1}
TRAIN_STEPS=${TRAIN_STEPS:-200}
BATCH=${BATCH:-32}
THREADS=${THREADS:-2}
HIDDEN=${HIDDEN:-256}
LAYERS=${LAYERS:-4}
HEADS=${HEADS:-4}
INTER=${INTER:-1024}
WORK=${WORK:-bench/predict_speed_work}
NLPTRAIN_BIN=${NLPTRAIN_BIN:-build/nlptrain}
PYTHON=${PYTHON:-python3}
SHARED=${SHARED:-../shared/data}
commit=$(git rev-parse --short HEAD)$(git status --porcelain --untracked-files=no | grep -q . && echo -dirty || true)
RES=${RES:-$(. bench/result_dir.sh && result_dir predict-speed)}
SRC="$SHARED/nsmc/nsmc_from_raw_test.tsv"
VOCAB="$SHARED/vocab/kcbert-base/vocab.txt"
for f in "$SRC" "$VOCAB" "$NLPTRAIN_BIN"; do
  [[ -e $f ]] || { echo "predict_speed: missing $f" >&2; exit 2; }
done
mkdir -p "$WORK" "$RES/raw"
echo "N=$N ROUNDS=$ROUNDS TRAIN_STEPS=$TRAIN_STEPS BATCH=$BATCH THREADS=$THREADS HIDDEN=$HIDDEN LAYERS=$LAYERS HEADS=$HEADS INTER=$INTER bash bench/predict_speed.sh" \
  > "$RES/command.txt"
{ echo "commit $commit"; date -u; lscpu | grep -E "Model name|^CPU\(s\)"; "$PYTHON" -c \
  "import torch, transformers; print('torch', torch.__version__, '| transformers', transformers.__version__)"; } \
  > "$RES/environment.txt"

train="$WORK/nsmc_train_8000.h5"
[[ -f $train ]] || { head -n 8001 "$SHARED/nsmc/nsmc_from_raw_train.tsv" > "$WORK/train.tsv" && "$PYTHON" \
  tools/prep_doc_cls.py --vocab "$VOCAB" --input "$WORK/train.tsv" --max-seq-len 128 --quiet --out "$train"; }
data="$WORK/nsmc_test${N:+_$N}.h5"
[[ -f $data ]] || "$PYTHON" tools/prep_doc_cls.py --vocab "$VOCAB" --input "$SRC" --max-seq-len 128 --quiet \
  ${N:+--limit "$N"} --out "$data"

model=(--run.task=doc_cls --model.type=bert --model.vocab_size=30000 --model.hidden_size="$HIDDEN"
       --model.num_hidden_layers="$LAYERS" --model.num_attention_heads="$HEADS"
       --model.intermediate_size="$INTER" --model.max_position_embeddings=128 --model.num_labels=2
       --run.threads="$THREADS" --train.batch_size="$BATCH")
rm -rf "$WORK/train" "$WORK/hf_model"
OMP_NUM_THREADS=$THREADS "$NLPTRAIN_BIN" "${model[@]}" --data.train="$train" --train.steps=$TRAIN_STEPS \
  --train.lr=3e-4 --train.warmup_steps=$((TRAIN_STEPS / 10)) --checkpoint.interval=$TRAIN_STEPS --output.dir="$WORK/train" > "$RES/raw/train.log" 2>&1
ckpt="$WORK/train/checkpoints/step_$(printf %08d "$TRAIN_STEPS").h5"
"$PYTHON" tools/hf_export.py "$ckpt" "$WORK/hf_model" --no-tokenizer > "$RES/raw/export.log" 2>&1

timed() {  # name, command...: the whole process's wall seconds into raw/<name>.time
  local name=$1; shift
  /usr/bin/time -f "%e" -o "$RES/raw/$name.time" "$@" > "$RES/raw/$name.log" 2>&1 \
    || { echo "predict_speed: $name failed (raw/$name.log)" >&2; tail -5 "$RES/raw/$name.log" >&2; exit 1; }
  echo "$name: $(cat "$RES/raw/$name.time") s"
}
for r in $(seq 1 "$ROUNDS"); do
  for sort in true false; do
    out="$WORK/nlptrain_sort_${sort}_$r"
    rm -rf "$out"
    OMP_NUM_THREADS=$THREADS timed "nlptrain_sort_${sort}_$r" "$NLPTRAIN_BIN" "${model[@]}" --run.mode=predict \
      --model.weights="$ckpt" --data.eval="$data" --eval.sort_by_length=$sort --output.dir="$out"
    cp "$out/metrics.jsonl" "$RES/raw/nlptrain_sort_${sort}_$r.metrics.jsonl"
    [[ $r == 1 ]] && cp "$out/predictions.jsonl" "$WORK/predictions_sort_$sort.jsonl"
  done
  hf_modes=(eager)
  [[ -n ${HF_COMPILE:-} ]] && hf_modes+=(compile)
  for m in "${hf_modes[@]}"; do
    OMP_NUM_THREADS=$THREADS timed "hf_${m}_$r" "$PYTHON" bench/hf_predict.py --model "$WORK/hf_model" \
      --data "$data" --batch "$BATCH" --threads "$THREADS" --out "$RES/raw/hf_${m}_$r.json" \
      --preds "$WORK/hf_${m}_preds.npz" $([[ $m == compile ]] && echo --compile)
  done
done
"$PYTHON" bench/predict_speed_report.py "$RES" "$WORK" | tee "$RES/results.md"
