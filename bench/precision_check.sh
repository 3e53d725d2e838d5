#!/usr/bin/env bash
# bf16 against fp32 on the CPU: GPT-2 (causal LM on WikiText-2) and BERT doc_cls (NSMC), trained from
# scratch in fp32 and in bf16 with the same seeds, then judged by bench/precision_compare.py:
#   1. loss curves: trailing mean over WINDOW steps, |bf16 - fp32| / fp32 <= 1% at every step, per seed;
#   2. final eval metric (GPT-2 perplexity, doc_cls accuracy): |bf16 - fp32| per seed at most
#      max(fp32 seed spread, floor).
# bf16 is train.precision = bf16 with run.cpu_bf16 = CPU_BF16 (emulate: operands rounded to bf16 and
# multiplied in fp32, the reference the GPU is compared with; native: oneDNN bf16 where the CPU has it).
# Only losses and metrics are compared: the machine may be shared, nothing here is a timing.
#
#   bash bench/precision_check.sh            # default: 22 minutes on 2 cores shared with other jobs (load 4)
#   SEEDS="1 2 3" GPT2_STEPS=300 bash bench/precision_check.sh
#
# Environment (defaults in brackets):
#   TASKS ["gpt2 doc_cls"]  SEEDS ["1 2"]  CPU_BF16 [emulate]  THREADS [2]  WINDOW [20]
#   BF16_ARGS [""]  more options of the bf16 runs, e.g. "--run.bf16_activations=true" (activations
#                   and their gradients stored in bf16 too)
#   GPT2_STEPS [100] GPT2_BATCH [4] GPT2_SEQ [128] GPT2_LAYERS [4] GPT2_EMBD [256] GPT2_HEADS [4] GPT2_LR [6e-4]
#   CLS_STEPS [200] CLS_BATCH [32] CLS_SEQ [128] CLS_LAYERS [4] CLS_HIDDEN [256] CLS_HEADS [4] CLS_LR [3e-4]
#   CLS_TRAIN_N [8000] CLS_EVAL_N [500]   NSMC examples for training / evaluation
#   ACC_FLOOR [0.02] PPL_FLOOR_REL [0.01]  CURVE_TOL [0.01]   the rules' floors and tolerance
#   NLPTRAIN_BIN [build/nlptrain]  PYTHON [python3]  SHARED [../shared/data or /work/shared/data]
#   RES [bench/results/precision-check-DATE-HARDWARE-COMMIT]  WORK [runs/precision_check]
# Writes RES/command.txt, environment.txt, raw/ (each run's log, metrics.jsonl, summary.json,
# config.ini), results.md and results.json. Exit status: 0 when every rule passes, 1 when one fails,
# 2 on bad settings or a failed run.
set -euo pipefail
cd "$(dirname "$0")/.."

TASKS=${TASKS:-"gpt2 doc_cls"}
SEEDS=${SEEDS:-"1 2"}
CPU_BF16=${CPU_BF16:-emulate}
BF16_ARGS=${BF16_ARGS:-}
THREADS=${THREADS:-2}
WINDOW=${WINDOW:-20}
GPT2_STEPS=${GPT2_STEPS:-100}; GPT2_BATCH=${GPT2_BATCH:-4}; GPT2_SEQ=${GPT2_SEQ:-128}
GPT2_LAYERS=${GPT2_LAYERS:-4}; GPT2_EMBD=${GPT2_EMBD:-256}; GPT2_HEADS=${GPT2_HEADS:-4}; GPT2_LR=${GPT2_LR:-6e-4}
CLS_STEPS=${CLS_STEPS:-200}; CLS_BATCH=${CLS_BATCH:-32}; CLS_SEQ=${CLS_SEQ:-128}
CLS_LAYERS=${CLS_LAYERS:-4}; CLS_HIDDEN=${CLS_HIDDEN:-256}; CLS_HEADS=${CLS_HEADS:-4}; CLS_LR=${CLS_LR:-3e-4}
CLS_TRAIN_N=${CLS_TRAIN_N:-8000}; CLS_EVAL_N=${CLS_EVAL_N:-500}
ACC_FLOOR=${ACC_FLOOR:-0.02}; PPL_FLOOR_REL=${PPL_FLOOR_REL:-0.01}; CURVE_TOL=${CURVE_TOL:-0.01}
BIN=${NLPTRAIN_BIN:-build/nlptrain}
PY=${PYTHON:-python3}
if [ -z "${SHARED:-}" ]; then
  if [ -d ../shared/data ]; then SHARED=$(cd ../shared/data && pwd); else SHARED=/work/shared/data; fi
fi
RES=${RES:-$(. bench/result_dir.sh && result_dir precision-check)}
WORK=${WORK:-runs/precision_check}

die() { echo "precision_check: $*" >&2; exit 2; }
for t in $TASKS; do case $t in gpt2|doc_cls) ;; *) die "unknown task '$t' (gpt2, doc_cls)";; esac; done
case $CPU_BF16 in emulate|native|auto) ;; *) die "CPU_BF16=$CPU_BF16 (emulate, native or auto)";; esac
for v in GPT2_STEPS CLS_STEPS WINDOW; do
  [ "${!v}" -ge "$WINDOW" ] 2>/dev/null || die "$v=${!v}: must be a number >= WINDOW ($WINDOW)"
done
[ -n "$SEEDS" ] || die "SEEDS is empty"
[ -x "$BIN" ] || die "$BIN not found (cmake --build build -j2 --target nlptrain)"
[ -d "$SHARED/wikitext2" ] && [ -d "$SHARED/nsmc" ] || die "SHARED=$SHARED: no wikitext2/ or nsmc/ there"

mkdir -p "$RES/raw" "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMP_NUM_THREADS=$THREADS

CMD="TASKS=\"$TASKS\" SEEDS=\"$SEEDS\" CPU_BF16=$CPU_BF16 BF16_ARGS=\"$BF16_ARGS\" THREADS=$THREADS WINDOW=$WINDOW"
CMD+=" GPT2_STEPS=$GPT2_STEPS GPT2_BATCH=$GPT2_BATCH GPT2_SEQ=$GPT2_SEQ GPT2_LAYERS=$GPT2_LAYERS GPT2_EMBD=$GPT2_EMBD"
CMD+=" GPT2_HEADS=$GPT2_HEADS GPT2_LR=$GPT2_LR CLS_STEPS=$CLS_STEPS CLS_BATCH=$CLS_BATCH CLS_SEQ=$CLS_SEQ"
CMD+=" CLS_LAYERS=$CLS_LAYERS CLS_HIDDEN=$CLS_HIDDEN CLS_HEADS=$CLS_HEADS CLS_LR=$CLS_LR CLS_TRAIN_N=$CLS_TRAIN_N"
CMD+=" CLS_EVAL_N=$CLS_EVAL_N ACC_FLOOR=$ACC_FLOOR PPL_FLOOR_REL=$PPL_FLOOR_REL CURVE_TOL=$CURVE_TOL"
CMD+=" NLPTRAIN_BIN=$BIN PYTHON=$PY SHARED=$SHARED RES=$RES WORK=$WORK bash bench/precision_check.sh"
echo "$CMD" > "$RES/command.txt"
echo "precision_check: $CMD"

{ echo "date: $(date -Is)"; echo "host: $(uname -a)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "nproc: $(nproc)"; echo "loadavg at start: $(cat /proc/loadavg)"
  echo "native bf16 (lscpu flags): $(lscpu | grep -o 'avx512_bf16\|amx_bf16' | sort -u | tr '\n' ' ')"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo '?')"; git status --short 2>/dev/null | head -30 | sed 's/^/  /'
  echo "nlptrain: $("$BIN" --version 2>&1 | head -1)"
  "$PY" -c "import sys, numpy, h5py; print('python', sys.version.split()[0], '| numpy', numpy.__version__, '| h5py', h5py.__version__)"
} > "$RES/environment.txt" 2>&1 || true  # a record only
cat "$RES/environment.txt"

# ---- data --------------------------------------------------------------------------------------------
D=$WORK/data
mkdir -p "$D"
if [[ " $TASKS " == *" gpt2 "* ]] && [ ! -f "$D/gpt2_eval.h5" ]; then
  # WikiText-2's raw test split, its last 10% held out for the perplexity
  "$PY" tools/make_dataset.py --tokenizer gpt2 --vocab-dir "$SHARED/vocab/gpt2" --out "$D/gpt2_train.h5" \
    --val-fraction 0.1 --val-out "$D/gpt2_eval.h5" "$SHARED/wikitext2/wiki.test.raw" > "$RES/raw/prep_gpt2.log" 2>&1 ||
    { cat "$RES/raw/prep_gpt2.log" >&2; die "GPT-2 data failed"; }
fi
KEY="nsmc $CLS_TRAIN_N $CLS_EVAL_N T$CLS_SEQ"
if [[ " $TASKS " == *" doc_cls "* ]] && [ "$(cat "$D/doc_cls.key" 2>/dev/null)" != "$KEY" ]; then
  rm -f "$D/doc_cls_train.h5" "$D/doc_cls_eval.h5" "$D/doc_cls.key"
  { "$PY" tools/prep_doc_cls.py --vocab "$SHARED/vocab/kcbert-base/vocab.txt" --input "$SHARED/nsmc/nsmc_from_raw_train.tsv" \
      --limit "$CLS_TRAIN_N" --max-seq-len "$CLS_SEQ" --out "$D/doc_cls_train.h5" &&
    "$PY" tools/prep_doc_cls.py --vocab "$SHARED/vocab/kcbert-base/vocab.txt" --input "$SHARED/nsmc/nsmc_from_raw_test.tsv" \
      --limit "$CLS_EVAL_N" --max-seq-len "$CLS_SEQ" --out "$D/doc_cls_eval.h5"; } > "$RES/raw/prep_doc_cls.log" 2>&1 ||
    { cat "$RES/raw/prep_doc_cls.log" >&2; die "NSMC data failed"; }
  echo "$KEY" > "$D/doc_cls.key"
fi
h5attr() { "$PY" -c "import h5py,sys; print(int(h5py.File(sys.argv[1],'r').attrs[sys.argv[2]]))" "$1" "$2"; }

# ---- runs --------------------------------------------------------------------------------------------
run() {  # run TASK PRECISION SEED
  local t=$1 p=$2 seed=$3 name=$1_$2_s$3 out=$WORK/runs/$1_$2_s$3 args=()
  if [ "$t" = gpt2 ]; then
    args=(--run.task=clm --model.type=gpt2 --model.n_layer="$GPT2_LAYERS" --model.n_head="$GPT2_HEADS"
          --model.n_embd="$GPT2_EMBD" --model.vocab_size=50257 --model.n_positions="$GPT2_SEQ"
          --model.embd_pdrop=0.0 --model.attn_pdrop=0.0 --model.resid_pdrop=0.0
          --data.train="$D/gpt2_train.h5" --data.eval="$D/gpt2_eval.h5" --data.seq_len="$GPT2_SEQ"
          --train.steps="$GPT2_STEPS" --train.batch_size="$GPT2_BATCH" --train.lr="$GPT2_LR"
          --train.warmup_steps=$((GPT2_STEPS / 10)) --train.schedule=cosine --train.weight_decay=0.1)
  else
    args=(--run.task=doc_cls --model.type=bert --model.weights= --model.vocab_size="$(h5attr "$D/doc_cls_train.h5" vocab_size)"
          --model.pad_token_id="$(h5attr "$D/doc_cls_train.h5" pad_id)" --model.hidden_size="$CLS_HIDDEN"
          --model.num_hidden_layers="$CLS_LAYERS" --model.num_attention_heads="$CLS_HEADS"
          --model.intermediate_size=$((4 * CLS_HIDDEN)) --model.max_position_embeddings="$CLS_SEQ"
          --model.type_vocab_size=2 --model.num_labels=0 --model.hidden_dropout_prob=0.1
          --model.attention_probs_dropout_prob=0.1
          --data.train="$D/doc_cls_train.h5" --data.eval="$D/doc_cls_eval.h5" --data.padding=longest
          --train.steps="$CLS_STEPS" --train.batch_size="$CLS_BATCH" --train.lr="$CLS_LR"
          --train.warmup_steps=$((CLS_STEPS / 10)) --train.schedule=linear --train.weight_decay=0.01)
  fi
  # shellcheck disable=SC2206  # BF16_ARGS: words on purpose
  [ "$p" = bf16 ] && args+=(--train.precision=bf16 --run.cpu_bf16="$CPU_BF16" $BF16_ARGS) || args+=(--train.precision=fp32)
  rm -rf "$out"
  echo "precision_check: $name ($(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
  if ! "$BIN" --run.mode=train --run.backend=cpu "${args[@]}" --train.seed="$seed" --train.grad_accum=1 \
       --train.clip=1.0 --eval.interval=0 --eval.batches=0 --checkpoint.interval=0 --run.threads="$THREADS" \
       --run.log_interval=1 --output.dir="$out" > "$RES/raw/$name.log" 2>&1; then
    tail -20 "$RES/raw/$name.log" >&2
    die "$name failed, see $RES/raw/$name.log"
  fi
  mkdir -p "$RES/raw/$name"
  cp "$out"/summary.json "$out"/metrics.jsonl "$out"/config.ini "$RES/raw/$name/"
  rm -f "$out"/*.h5
}

T0=$(date +%s)
for seed in $SEEDS; do
  for t in $TASKS; do
    for p in fp32 bf16; do run "$t" "$p" "$seed"; done
  done
done
echo "precision_check: all runs took $(( $(date +%s) - T0 )) s (a shared machine: not a timing)"
rc=0
"$PY" bench/precision_compare.py "$RES" --window "$WINDOW" --curve-tol "$CURVE_TOL" --acc-floor "$ACC_FLOOR" \
  --ppl-floor-rel "$PPL_FLOOR_REL" || rc=$?
echo "precision_check: results in $RES"
exit $rc
