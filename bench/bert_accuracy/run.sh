#!/usr/bin/env bash
# BERT accuracy comparison: nlptrain (mpirun -np 2, 1 thread per rank) vs Hugging Face Trainer (1 process,
# torch.set_num_threads(2)) on the same HDF5 files. MLM pre-training, then 4 fine-tuning tasks, each side
# starting from its own MLM encoder. Raw outputs go to $RES; the summary tables to $RES/report_table.md
# and $RES/time_table.md (the analysis beside them, $RES.md, is written by hand).
#   bash bench/bert_accuracy/run.sh                 # everything (prep if missing, build if missing)
#   PARALLEL=1 bash bench/bert_accuracy/run.sh     # the two sides of each task at the same time (default: one after the other)
#   ONLY=hf bash bench/bert_accuracy/run.sh         # one side only (nlptrain|hf)
#   TASKS="doc_cls ner" bash bench/bert_accuracy/run.sh   # skip MLM (reuse), run these tasks
# Settings (environment): WORK (bench/bert_accuracy/work), RES (bench/results/bert-accuracy-DATE-HARDWARE-COMMIT),
#   NLPTRAIN_BIN (build-acc/nlptrain), HIDDEN LAYERS HEADS INTER (128 2 4 512), MLM_STEPS (60), MLM_LR (1e-3),
#   FT_STEPS (100), FT_LR (1e-3), SEED (1234), MLM_EVAL (0).
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-bench/bert_accuracy/work}
RES=${RES:-$(. bench/result_dir.sh && result_dir bert-accuracy)}
BIN=${NLPTRAIN_BIN:-build-acc/nlptrain}
PY=${PYTHON:-python3}
HIDDEN=${HIDDEN:-128}; LAYERS=${LAYERS:-2}; HEADS=${HEADS:-4}; INTER=${INTER:-512}; MAXPOS=${MAXPOS:-256}
MLM_STEPS=${MLM_STEPS:-60}; MLM_LR=${MLM_LR:-1e-3}; MLM_BATCH=64
FT_STEPS=${FT_STEPS:-100}; FT_LR=${FT_LR:-1e-3}; SEED=${SEED:-1234}
MLM_EVAL=${MLM_EVAL:-0}  # nlptrain's MLM eval interval (0: at the end only), for the learning curve
TASKS=${TASKS:-"mlm doc_cls pair_cls ner qa"}
ONLY=${ONLY:-both}
D=$WORK/data
mkdir -p "$RES" "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1

[ -f "$D/korquad_eval.h5" ] || bash bench/bert_accuracy/prep.sh "$WORK"
if [ ! -x "$BIN" ]; then
  cmake -S . -B build-acc -DNLPTRAIN_CUDA=OFF >/dev/null && cmake --build build-acc -j2 --target nlptrain
fi

# task -> ini, train file, eval file, global batch, warmup
ini()   { case $1 in mlm) echo mlm_pretrain;; doc_cls) echo doc_cls_nsmc;; pair_cls) echo pair_cls_kornli;; ner) echo ner_klue;; qa) echo qa_korquad;; esac; }
trainf(){ case $1 in mlm) echo mlm_train;; doc_cls) echo nsmc_train;; pair_cls) echo kornli_train;; ner) echo ner_train;; qa) echo korquad_train;; esac; }
evalf() { case $1 in mlm) echo mlm_eval;; doc_cls) echo nsmc_eval;; pair_cls) echo kornli_eval;; ner) echo ner_eval;; qa) echo korquad_eval;; esac; }
gbatch(){ case $1 in mlm) echo $MLM_BATCH;; qa) echo 16;; *) echo 32;; esac; }
steps() { [ "$1" = mlm ] && echo "$MLM_STEPS" || echo "$FT_STEPS"; }
lr()    { [ "$1" = mlm ] && echo "$MLM_LR" || echo "$FT_LR"; }
warm()  { echo $(( $(steps "$1") / 10 )); }

timed() {  # timed NAME CMD... : wall time and load before/after into $RES/NAME.time
  local name=$1; shift
  local l0 t0 t1 rc=0
  l0=$(cut -d' ' -f1-3 /proc/loadavg); t0=$(date +%s.%N)
  "$@" > "$RES/$name.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  printf '{"name":"%s","wall_s":%.1f,"load_before":"%s","load_after":"%s","rc":%d,"date":"%s"}\n' \
    "$name" "$(echo "$t1 - $t0" | bc)" "$l0" "$(cut -d' ' -f1-3 /proc/loadavg)" "$rc" "$(date -Is)" | tee "$RES/$name.time"
  [ $rc -eq 0 ] || { echo "run.sh: $name failed (rc $rc), see $RES/$name.log" >&2; tail -20 "$RES/$name.log" >&2; }
  return $rc
}

run_nlptrain() {
  local t=$1 out=$WORK/nlptrain/$1
  local b=$(( $(gbatch "$t") / 2 ))
  local extra=() evint=0
  if [ "$t" = mlm ]; then
    evint=$MLM_EVAL
    extra=(--model.weights= --model.hidden_size=$HIDDEN --model.num_hidden_layers=$LAYERS
           --model.num_attention_heads=$HEADS --model.intermediate_size=$INTER --model.max_position_embeddings=$MAXPOS
           --eval.batches=0)
  else
    extra=(--model.weights=$WORK/nlptrain/mlm/best.h5)
  fi
  rm -rf "$out"
  timed "nlptrain_$t" mpirun -np 2 "$BIN" "inputs/$(ini "$t").ini" "${extra[@]}" \
    --data.train=$D/$(trainf "$t").h5 --data.eval=$D/$(evalf "$t").h5 --train.steps=$(steps "$t") \
    --train.batch_size=$b --train.lr=$(lr "$t") --train.warmup_steps=$(warm "$t") --train.weight_decay=0.01 \
    --train.seed=$SEED --eval.interval=$evint --checkpoint.interval=0 --run.threads=1 --run.log_interval=10 \
    --output.dir=$out
  mkdir -p "$RES/nlptrain_$t"
  cp "$out"/metrics.jsonl "$out"/summary.json "$out"/config.ini "$RES/nlptrain_$t/" 2>/dev/null || true
}

run_hf() {
  local t=$1 out=$WORK/hf/$1
  local extra=()
  [ "$t" = mlm ] || extra=(--init "$WORK/hf/mlm/model")
  rm -rf "$out"
  timed "hf_$t" "$PY" bench/bert_accuracy/hf_trainer.py --task "$t" "${extra[@]}" \
    --train $D/$(trainf "$t").h5 --eval $D/$(evalf "$t").h5 --out "$out" --steps $(steps "$t") \
    --batch $(gbatch "$t") --lr $(lr "$t") --warmup $(warm "$t") --weight-decay 0.01 --seed $SEED --threads 2 \
    --hidden $HIDDEN --layers $LAYERS --heads $HEADS --intermediate $INTER --max-pos $MAXPOS --log-steps 10
  mkdir -p "$RES/hf_$t"
  cp "$out"/result.json "$out"/log_history.jsonl "$RES/hf_$t/" 2>/dev/null || true
}

{ echo "date: $(date -Is)"; echo "host: $(uname -a)"; echo "nproc: $(nproc)"; uptime; git rev-parse HEAD;
  git status --short | head -30; "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)";
  echo "HIDDEN=$HIDDEN LAYERS=$LAYERS HEADS=$HEADS INTER=$INTER MAXPOS=$MAXPOS MLM_STEPS=$MLM_STEPS MLM_LR=$MLM_LR FT_STEPS=$FT_STEPS FT_LR=$FT_LR SEED=$SEED"; } \
  >> "$RES/environment.txt"

# PARALLEL=1: the two sides of each task run at the same time (they then share the 2 cores, and
# whatever else the machine runs, equally); PARALLEL=0 (default) runs them one after the other.
for t in $TASKS; do
  if [ "${PARALLEL:-0}" = 1 ]; then
    [ "$ONLY" = hf ] || run_nlptrain "$t" &
    [ "$ONLY" = nlptrain ] || run_hf "$t" &
    wait || true
  else
    [ "$ONLY" = hf ] || run_nlptrain "$t" || true
    [ "$ONLY" = nlptrain ] || run_hf "$t" || true
  fi
done
"$PY" bench/bert_accuracy/report.py "$RES" > "$RES/report_table.md"
"$PY" bench/bert_accuracy/rerun_table.py "$RES" > "$RES/time_table.md" 2>/dev/null || true
cat "$RES/report_table.md"
