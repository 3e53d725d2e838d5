#!/usr/bin/env bash
# Fine-tuning speed: nlptrain vs Hugging Face Trainer, with and without per-batch padding.
#
# MODEL=bert (default) | roberta | electra: the family of the from-scratch model on both sides (nlptrain
# --model.type; hf_trainer.py --model-type: BertConfig / RobertaConfig / ElectraConfig and the task's class);
# everything else below is the same for the three. roberta: type_vocab_size 1 (the data prepared with
# --single-segment: every token type 0, also a pair's second sentence, in WORK/data/TASK-single),
# max_position_embeddings MAXPOS + pad id + 1 (its positions run from pad id + 1, so rows of MAXPOS
# tokens fit, as klue/roberta-base's 514 = 512 + pad id 1 + 1), the pad id the data's ([PAD]);
# electra: embedding_size = HIDDEN (EMBED, default HIDDEN: no embeddings_project, as the base models),
# type_vocab_size 2 and the same data as bert. Each side prints its parameter count (nlptrain's
# summary.json, HF's result.json): the report shows both and flags a difference.
#
# For each BERT task on real data (doc_cls: NSMC, pair_cls: KorNLI, ner: KLUE NER, qa: KorQuAD) both
# sides train the same from-scratch model (4 layers, hidden 256, 4 heads, intermediate 1024, kcbert
# vocabulary, dropout 0.1) with the same lr, warmup, batch (32) and number of steps (= the same
# number of examples seen), then evaluate once on a held-out file of a few hundred examples, in six
# settings, one run at a time (never in parallel), on this machine:
#   nlptrain-max_length     nlptrain --data.padding=max_length        (every row at the file's length)
#   hf-max_length           hf_trainer.py --padding max_length        (today's HF side)
#   nlptrain-longest        nlptrain --data.padding=longest           (batch at its longest row; data.pad_multiple auto = 1 on the cpu)
#   hf-longest              hf_trainer.py --padding longest           (DataCollatorWithPadding-style)
#   nlptrain-longest-group  ... --data.group_by_length=true
#   nlptrain-packed         ... --data.packing=true --data.pack_batch=examples (random order; the batch's
#                           examples share rows of the file's length: each step equals the unpacked one's)
#   nlptrain-packedrows     ... --data.packing=true --data.pack_batch=rows --train.batch_size=PACK_ROWS
#                           (rows of the file's length, each step as many examples as fill them;
#                           PACK_ROWS defaults to BATCH x the mean example length / the row length, so a
#                           step holds about BATCH examples) and --train.epochs = STEPS x BATCH / examples
#                           in place of --train.steps (the same examples seen)
#   hf-longest-group        ... --group-by-length                     (Trainer's LengthGroupedSampler)
#   hf-longest-group-compile  ... --group-by-length --torch-compile --pad-multiple 8 (torch.compile, inductor)
#   nlptrain-longest-group-bf16  ... --train.precision=bf16 (run.cpu_bf16 auto: native bf16 GEMMs where the CPU has AMX-BF16)
#   hf-longest-group-bf16     ... --group-by-length --bf16 (Trainer's bf16=True: autocast to bf16 on the CPU)
#   nlptrain-packed-bf16      ... --data.packing=true --data.pack_batch=examples --train.precision=bf16
#   nlptrain-packedrows-bf16  ... nlptrain-packedrows with --train.precision=bf16
#   nlptrain-packedrowsfixed[-bf16]  ... nlptrain-packedrows[-bf16] with --data.pack_fixed_examples=true (the
#                           heads at rows x 16 examples every step: what the fixed shape costs)
#   nlptrain-packedrowsgraph-bf16  ... nlptrain-packedrowsfixed-bf16 with --run.cuda_graph=true (GPU only:
#                           every micro-batch after the second replayed as one CUDA graph; not yet run on a GPU)
#   nlptrain-longest-groupshuffled-bf16  ... -group-bf16 with --data.group_order=shuffled (the steps' order shuffled)
#   hf-longest-groupshuffled-bf16        ... -group-bf16 with --shuffle-groups (the same order rule on HF's side)
#   nlptrain-packed-cudnn-bf16   ... --data.packing=true --train.precision=bf16 --model.attention=cudnn (GPU:
#                                packed rows through cuDNN's fused attention; model.attention = auto keeps
#                                packed rows on the native kernels until a GPU run has checked cuDNN's)
#   hf-longest-group-compile-bf16  ... --group-by-length --torch-compile --pad-multiple 8 --bf16
# On a GPU (DEVICE=cuda): nlptrain --run.backend=cuda, HF --device cuda (SDPA attention). HF's padding-free
# DataCollatorWithFlattening does not apply to these tasks: BertForSequenceClassification pools the
# first position of each row, and BERT in transformers takes packed rows only through FlashAttention-2.
# (in this order: the two sides alternate, so a slow drift of the machine's load hits both).
# nlptrain: mpirun -np 1 --bind-to none (LAUNCH), --run.threads=$THREADS; HF: one process, torch.set_num_threads($THREADS).
#
#   bash bench/finetune_speed.sh                                   # everything (defaults below)
#   TASKS=ner STEPS=5 LIMIT=300 bash bench/finetune_speed.sh       # a smoke run
#
# Environment (defaults): MODEL (bert; roberta, electra: above), EMBED (HIDDEN: electra's embedding_size),
#   TASKS ("doc_cls pair_cls ner qa"), STEPS (200), SEEDS ("1234"), SETTINGS (the
#   six above; a subset restricts), FIRST_SEED_SETTINGS (empty; those of SETTINGS run with the first of SEEDS
#   only, e.g. the slow hf-longest-group-compile once it has been seen slower than eager), RES (bench/results/finetune-speed-DATE-HARDWARE-COMMIT,
#   bench/result_dir.sh; with -MODEL after it for roberta and electra), WORK
#   (bench/finetune_speed_work: data and run folders, not for committing), LR (3e-4), WARMUP (STEPS/10),
#   BATCH (32), THREADS (2), MAXLEN (128: doc_cls, pair_cls, ner row length), QA_MAXLEN (256),
#   DOC_STRIDE (64), EVAL_N (500: NSMC test / XNLI dev examples evaluated), EVAL_FRAC (0.1: the
#   articles / sentences of KorQuAD dev / KLUE NER dev held out), LIMIT (empty: none; caps every
#   input file's examples, for smoke runs), PAD_MULTIPLE (empty: each side's default, 1 on both on the cpu;
#   on cuda nlptrain's auto is 64 with cuDNN's attention, 8 with its native kernels; a number is given to both), NLPTRAIN_BIN (build/nlptrain), PYTHON (python3), SHARED (../shared/data
#   relative to the repository root, else /work/shared/data), DEVICE (cpu; cuda: both sides on GPU 0),
#   LAUNCH (mpirun --allow-run-as-root -np 1 --bind-to none: the words before nlptrain; a GPU machine
#   without MPI takes the packed binary's wrapper), HIDDEN/LAYERS/HEADS/INTER/MAXPOS (256/4/4/1024/256: the
#   model; BERT-base is 768/12/12/3072/512), NLP_ARGS (further nlptrain overrides in every nlptrain
#   setting, e.g. "--run.cpu_gemm=openblas"), PREP_ONLY (set: make the data in WORK/data and stop).
# Output in RES: command.txt (the exact command), environment.txt, raw/<task>_<setting>_s<seed>.{log,time}
# and raw/<run>/ (nlptrain: summary.json metrics.jsonl config.ini; HF: result.json log_history.jsonl),
# then results.md (tables) and results.json (everything), made by bench/finetune_speed_report.py.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_SETTINGS="nlptrain-max_length hf-max_length nlptrain-longest hf-longest nlptrain-longest-group nlptrain-packed nlptrain-packedrows hf-longest-group hf-longest-group-compile nlptrain-longest-group-bf16 nlptrain-packed-bf16 nlptrain-packedrows-bf16 nlptrain-packedrowsfixed nlptrain-packedrowsfixed-bf16 nlptrain-packedrowsgraph-bf16 hf-longest-group-bf16 nlptrain-longest-groupshuffled-bf16 hf-longest-groupshuffled-bf16 nlptrain-packed-cudnn-bf16 hf-longest-group-compile-bf16"
MODEL=${MODEL:-bert}
case $MODEL in bert|roberta|electra) ;; *) echo "finetune_speed: MODEL=$MODEL (expected bert, roberta or electra)" >&2; exit 2;; esac
TASKS=${TASKS:-"doc_cls pair_cls ner qa"}
STEPS=${STEPS:-200}
SEEDS=${SEEDS:-1234}
SETTINGS=${SETTINGS:-$ALL_SETTINGS}
FIRST_SEED_SETTINGS=${FIRST_SEED_SETTINGS:-}
RES=${RES:-$(. bench/result_dir.sh && result_dir finetune-speed "${DEVICE:-cpu}")$([ "$MODEL" = bert ] || echo "-$MODEL")}
WORK=${WORK:-bench/finetune_speed_work}
LR=${LR:-3e-4}
WARMUP=${WARMUP:-$((STEPS / 10))}
BATCH=${BATCH:-32}
THREADS=${THREADS:-2}
MAXLEN=${MAXLEN:-128}
QA_MAXLEN=${QA_MAXLEN:-256}
DOC_STRIDE=${DOC_STRIDE:-64}
EVAL_N=${EVAL_N:-500}
EVAL_FRAC=${EVAL_FRAC:-0.1}
LIMIT=${LIMIT:-}
read -r -a NLP_ARGS <<<"${NLP_ARGS:-}"
PAD_MULTIPLE=${PAD_MULTIPLE:-}
PACK_ROWS=${PACK_ROWS:-}  # nlptrain-packedrows: train.batch_size in rows (empty: about BATCH examples a step)
BIN=${NLPTRAIN_BIN:-build/nlptrain}
PY=${PYTHON:-python3}
if [ -z "${SHARED:-}" ]; then
  if [ -d ../shared/data ]; then SHARED=$(cd ../shared/data && pwd); else SHARED=/work/shared/data; fi
fi
HIDDEN=${HIDDEN:-256}; LAYERS=${LAYERS:-4}; HEADS=${HEADS:-4}; INTER=${INTER:-1024}; MAXPOS=${MAXPOS:-256}
EMBED=${EMBED:-$HIDDEN}
[ "$MODEL" = electra ] || [ "$EMBED" = "$HIDDEN" ] || { echo "finetune_speed: EMBED is electra's (MODEL=electra)" >&2; exit 2; }
DROPOUT=0.1; WD=0.01
DEVICE=${DEVICE:-cpu}
LAUNCH=${LAUNCH:-"mpirun --allow-run-as-root -np 1 --bind-to none"}
case $DEVICE in cpu|cuda) ;; *) echo "finetune_speed: DEVICE=$DEVICE (expected cpu or cuda)" >&2; exit 2;; esac
VOCAB=$SHARED/vocab/kcbert-base/vocab.txt

for s in $FIRST_SEED_SETTINGS; do
  case " $SETTINGS " in *" $s "*) ;; *) echo "finetune_speed: FIRST_SEED_SETTINGS: '$s' is not in SETTINGS" >&2; exit 2;; esac
done
for s in $SETTINGS; do
  case " $ALL_SETTINGS " in *" $s "*) ;; *) echo "finetune_speed: unknown setting '$s' (known: $ALL_SETTINGS)" >&2; exit 2;; esac
done
for t in $TASKS; do
  case $t in doc_cls|pair_cls|ner|qa) ;; *) echo "finetune_speed: unknown task '$t'" >&2; exit 2;; esac
done
[ "$QA_MAXLEN" -le "$MAXPOS" ] && [ "$MAXLEN" -le "$MAXPOS" ] || { echo "finetune_speed: MAXLEN/QA_MAXLEN > $MAXPOS" >&2; exit 2; }
[ -x "$BIN" ] || { echo "finetune_speed: $BIN not found (cmake --build build -j2 --target nlptrain)" >&2; exit 2; }

mkdir -p "$RES/raw" "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMP_NUM_THREADS=$THREADS

# The exact command (every setting spelled out, so that it reproduces this run whatever the defaults become).
CMD="MODEL=$MODEL TASKS=\"$TASKS\" STEPS=$STEPS SEEDS=\"$SEEDS\" SETTINGS=\"$SETTINGS\"$([ -z "$FIRST_SEED_SETTINGS" ] || echo " FIRST_SEED_SETTINGS=\"$FIRST_SEED_SETTINGS\"") RES=$RES WORK=$WORK LR=$LR WARMUP=$WARMUP"
CMD+=" BATCH=$BATCH THREADS=$THREADS MAXLEN=$MAXLEN QA_MAXLEN=$QA_MAXLEN DOC_STRIDE=$DOC_STRIDE EVAL_N=$EVAL_N"
CMD+=" EVAL_FRAC=$EVAL_FRAC LIMIT=$LIMIT PAD_MULTIPLE=$PAD_MULTIPLE PACK_ROWS=$PACK_ROWS NLPTRAIN_BIN=$BIN PYTHON=$PY SHARED=$SHARED"
CMD+=" DEVICE=$DEVICE LAUNCH=\"$LAUNCH\" HIDDEN=$HIDDEN LAYERS=$LAYERS HEADS=$HEADS INTER=$INTER MAXPOS=$MAXPOS"
[ "$MODEL" = electra ] && CMD+=" EMBED=$EMBED"
CMD+=" bash bench/finetune_speed.sh"
echo "$CMD" >> "$RES/command.txt"  # appended: a folder that gathers several invocations (one seed each) keeps every command
echo "finetune_speed: $CMD"

{ [ ! -s "$RES/environment.txt" ] || echo "---- the next invocation in this folder"
  echo "date: $(date -Is)"; echo "host: $(uname -a)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "nproc: $(nproc)"; echo "loadavg at start: $(cat /proc/loadavg)"
  echo "threads: nlptrain $LAUNCH --run.threads=$THREADS; HF torch.set_num_threads($THREADS); OMP_NUM_THREADS=$THREADS"
  echo "device: $DEVICE$([ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 | sed 's/^/ /')"
  echo "model: $MODEL, hidden $HIDDEN, layers $LAYERS, heads $HEADS, intermediate $INTER, max positions $MAXPOS$([ "$MODEL" = roberta ] && echo " (+ pad id + 1: roberta)")$([ "$MODEL" = electra ] && echo ", embedding size $EMBED")"
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo '?')"; git status --short 2>/dev/null | head -30 | sed 's/^/  /'
  echo "nlptrain: $("$BIN" --version 2>&1 | head -1)"
  echo "mpirun: $(mpirun --version 2>&1 | head -1)"
  "$PY" -c "import sys, torch, transformers, accelerate; print('python', sys.version.split()[0]); print('torch', torch.__version__); print('transformers', transformers.__version__); print('accelerate', accelerate.__version__); print('torch parallel:', ' | '.join(l.strip() for l in torch.__config__.parallel_info().splitlines() if l.strip()))"
} >> "$RES/environment.txt" 2>&1 || true  # a record only: a tree without git (the GPU machine's copy) or a missing package must not stop the runs
tail -n 25 "$RES/environment.txt"

# ---- data (tools/prep_*.py as in bench/bert_accuracy/prep.sh; row lengths MAXLEN / QA_MAXLEN) ----------------
lim() { [ -n "$LIMIT" ] && echo "--limit $LIMIT" || true; }            # cap for smoke runs
limmin() { local n=$1; [ -n "$LIMIT" ] && [ "$LIMIT" -lt "$n" ] && n=$LIMIT; echo "--limit $n"; }
# $(lim) / $(limmin N) are unquoted on purpose: nothing, or the two words --limit N.
# shellcheck disable=SC2046
# roberta: one token type (--single-segment), its own folder WORK/data/TASK-single; bert and electra share WORK/data/TASK
SEG=(); DSUF=""
[ "$MODEL" = roberta ] && { SEG=(--single-segment); DSUF=-single; }
prep() {  # prep TASK -> $WORK/data/TASK$DSUF/{train,eval}.h5 (redone when its parameters change)
  local t=$1 d=$WORK/data/$1$DSUF key
  case $t in
    doc_cls)  key="nsmc train $(limmin 8000) test $(limmin "$EVAL_N") T$MAXLEN";;
    pair_cls) key="xnli test $(lim) dev $(limmin "$EVAL_N") T$MAXLEN";;
    ner)      key="klue-ner dev $(lim) split $EVAL_FRAC T$MAXLEN";;
    qa)       key="korquad dev $(lim) split $EVAL_FRAC T$QA_MAXLEN stride $DOC_STRIDE";;
  esac
  [ -n "$DSUF" ] && key+=" single-segment"
  if [ -f "$d/eval.h5" ] && [ "$(cat "$d/key" 2>/dev/null)" = "$key" ]; then return 0; fi
  rm -rf "$d"; mkdir -p "$d"
  case $t in
    doc_cls)
      "$PY" tools/prep_doc_cls.py --vocab "$VOCAB" "${SEG[@]}" --input "$SHARED/nsmc/nsmc_from_raw_train.tsv" $(limmin 8000) \
        --max-seq-len "$MAXLEN" --out "$d/train.h5"
      "$PY" tools/prep_doc_cls.py --vocab "$VOCAB" "${SEG[@]}" --input "$SHARED/nsmc/nsmc_from_raw_test.tsv" $(limmin "$EVAL_N") \
        --max-seq-len "$MAXLEN" --out "$d/eval.h5";;
    pair_cls)
      "$PY" tools/prep_pair_cls.py --vocab "$VOCAB" "${SEG[@]}" --input "$SHARED/kornli/xnli.test.ko.tsv" $(lim) \
        --max-seq-len "$MAXLEN" --out "$d/train.h5"
      "$PY" tools/prep_pair_cls.py --vocab "$VOCAB" "${SEG[@]}" --input "$SHARED/kornli/xnli.dev.ko.tsv" $(limmin "$EVAL_N") \
        --max-seq-len "$MAXLEN" --out "$d/eval.h5";;
    ner)
      "$PY" tools/prep_ner.py --vocab "$VOCAB" "${SEG[@]}" --input "$SHARED/klue-ner/klue-ner-v1.1_dev.tsv" $(lim) \
        --max-seq-len "$MAXLEN" --out "$d/train.h5" --split-eval "$EVAL_FRAC" --eval-out "$d/eval.h5";;
    qa)
      "$PY" tools/prep_qa.py --vocab "$VOCAB" "${SEG[@]}" --input "$SHARED/korquad/KorQuAD_v1.0_dev.json" $(lim) \
        --max-seq-len "$QA_MAXLEN" --doc-stride "$DOC_STRIDE" --out "$d/train.h5" --split-eval "$EVAL_FRAC" \
        --eval-out "$d/eval.h5";;
  esac
  echo "$key" > "$d/key"
}

h5attr() { "$PY" -c "import h5py,sys; print(int(h5py.File(sys.argv[1],'r').attrs[sys.argv[2]]))" "$1" "$2"; }
# the family's shape beyond BERT's keys (the same on both sides)
TYPES=2; FAMILY_ARGS=(); HF_FAMILY_ARGS=()
case $MODEL in
  roberta) TYPES=1; HF_FAMILY_ARGS=(--model-type roberta --type-vocab 1);;
  electra) FAMILY_ARGS=(--model.embedding_size=$EMBED); HF_FAMILY_ARGS=(--model-type electra --embedding-size $EMBED);;
esac
maxpos() {  # maxpos DATA_DIR: max_position_embeddings (roberta: MAXPOS + the data's pad id + 1)
  if [ "$MODEL" = roberta ]; then echo $((MAXPOS + $(h5attr "$1/train.h5" pad_id) + 1)); else echo "$MAXPOS"; fi
}

timed() {  # timed NAME CMD... : log to raw/NAME.log; wall time, load before/after, rc to raw/NAME.time
  local name=$1; shift
  local l0 t0 t1 rc=0
  l0=$(cat /proc/loadavg); t0=$(date +%s.%N)
  "$@" > "$RES/raw/$name.log" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  "$PY" -c 'import json, sys; n, t0, t1, l0, l1, rc, d = sys.argv[1:]; print(json.dumps({"name": n, "wall_s": round(float(t1) - float(t0), 3), "loadavg_before": l0, "loadavg_after": l1, "rc": int(rc), "start": d}))' \
    "$name" "$t0" "$t1" "$l0" "$(cat /proc/loadavg)" "$rc" "$(date -Is -d "@${t0%.*}")" | tee "$RES/raw/$name.time"
  [ $rc -eq 0 ] || { echo "finetune_speed: $name failed (rc $rc), see $RES/raw/$name.log" >&2; tail -20 "$RES/raw/$name.log" >&2; }
  return 0
}

run_nlptrain() {  # run_nlptrain TASK SETTING SEED
  local t=$1 s=$2 seed=$3 d=$WORK/data/$1$DSUF name=$1_$2_s$3 out=$WORK/runs/$1_$2_s$3
  local pad=longest group=false extra=()
  case $s in *max_length) pad=max_length;; esac
  case $s in *-group|*-group-bf16) group=true;; esac
  case $s in *-groupshuffled-bf16) group=true; extra+=("--data.group_order=shuffled");; esac
  case $s in *-bf16) extra+=("--train.precision=bf16");; esac
  local steps=(--train.steps=$STEPS --train.batch_size=$BATCH)
  case $s in *-packed|*-packed-bf16|*-packed-cudnn-bf16) extra+=("--data.packing=true" "--data.pack_batch=examples");; esac
  case $s in *-packedrowsfixed|*-packedrowsfixed-bf16|*-packedrowsgraph-bf16) extra+=("--data.pack_fixed_examples=true");; esac
  case $s in *-packedrowsgraph-bf16) extra+=("--run.cuda_graph=true");; esac
  case $s in *-packedrows|*-packedrows-bf16|*-packedrowsfixed|*-packedrowsfixed-bf16|*-packedrowsgraph-bf16)
    # rows for about BATCH examples a step; epochs for STEPS x BATCH examples seen
    local rows epochs
    read -r rows epochs < <("$PY" -c 'import h5py, sys
f = h5py.File(sys.argv[1], "r"); m = f["attention_mask"]; n, T = m.shape
batch, steps, want = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
mean = float(m[()].sum()) / n
print(int(want) if want else max(1, round(batch * mean / T)), steps * batch / n)' "$d/train.h5" "$BATCH" "$STEPS" "$PACK_ROWS")
    extra+=("--data.packing=true" "--data.pack_batch=rows")
    steps=(--train.epochs=$epochs --train.batch_size=$rows);;
  esac
  case $s in *-cudnn-*) extra+=("--model.attention=cudnn");; esac
  [ "$DEVICE" = cuda ] && extra+=("--run.backend=cuda")
  [ -n "$PAD_MULTIPLE" ] && extra+=("--data.pad_multiple=$PAD_MULTIPLE")
  extra+=("${NLP_ARGS[@]}")
  rm -rf "$out"
  # shellcheck disable=SC2086  # LAUNCH: words
  timed "$name" $LAUNCH "$BIN" --run.mode=train --run.task=$t \
    --model.type=$MODEL --model.weights= --model.vocab_size="$(h5attr "$d/train.h5" vocab_size)" \
    --model.pad_token_id="$(h5attr "$d/train.h5" pad_id)" --model.hidden_size=$HIDDEN --model.num_hidden_layers=$LAYERS \
    --model.num_attention_heads=$HEADS --model.intermediate_size=$INTER --model.max_position_embeddings=$(maxpos "$d") \
    --model.type_vocab_size=$TYPES "${FAMILY_ARGS[@]}" --model.num_labels=0 --model.hidden_dropout_prob=$DROPOUT \
    --model.attention_probs_dropout_prob=$DROPOUT \
    --data.train="$d/train.h5" --data.eval="$d/eval.h5" --data.padding=$pad --data.group_by_length=$group "${extra[@]}" \
    "${steps[@]}" --train.grad_accum=1 --train.lr=$LR --train.warmup_steps=$WARMUP \
    --train.schedule=linear --train.weight_decay=$WD --train.clip=1.0 --train.seed=$seed \
    --eval.interval=0 --eval.batches=0 --checkpoint.interval=0 --run.threads=$THREADS --run.log_interval=1 \
    --output.dir="$out"
  mkdir -p "$RES/raw/$name"
  cp "$out"/summary.json "$out"/metrics.jsonl "$out"/config.ini "$RES/raw/$name/" 2>/dev/null || true
  rm -f "$out"/*.h5  # best.h5: not needed here
}

run_hf() {  # run_hf TASK SETTING SEED
  local t=$1 s=$2 seed=$3 d=$WORK/data/$1$DSUF name=$1_$2_s$3 out=$WORK/runs/$1_$2_s$3
  local extra=(--padding longest)
  case $s in *max_length) extra=(--padding max_length);; esac
  case $s in *-group|*-group-compile|*-group-bf16|*-group-compile-bf16) extra+=(--group-by-length);; esac
  case $s in *-groupshuffled-bf16) extra+=(--group-by-length --shuffle-groups);; esac
  case $s in *-bf16) extra+=(--bf16);; esac
  # torch.compile as a practitioner runs it: batch lengths rounded up to 8 (what nlptrain uses on GPUs), so that
  # few shapes are compiled
  case $s in *-compile|*-compile-bf16) extra+=(--torch-compile --pad-multiple 8);; esac
  extra+=(--device "$DEVICE")
  [ -n "$PAD_MULTIPLE" ] && extra+=(--pad-multiple "$PAD_MULTIPLE")
  rm -rf "$out"
  timed "$name" "$PY" bench/bert_accuracy/hf_trainer.py --task $t --train "$d/train.h5" --eval "$d/eval.h5" \
    --out "$out" --steps $STEPS --batch $BATCH --lr $LR --warmup $WARMUP --weight-decay $WD --seed $seed \
    --threads $THREADS --hidden $HIDDEN --layers $LAYERS --heads $HEADS --intermediate $INTER --max-pos "$(maxpos "$d")" \
    --dropout $DROPOUT --log-steps 10 "${extra[@]}" "${HF_FAMILY_ARGS[@]}"
  mkdir -p "$RES/raw/$name"
  cp "$out"/result.json "$out"/log_history.jsonl "$RES/raw/$name/" 2>/dev/null || true
  rm -rf "$out/trainer"
}

T_ALL=$(date +%s)
for t in $TASKS; do
  echo "finetune_speed: data for $t"
  prep "$t" > "$RES/raw/prep_$t.log" 2>&1 || { cat "$RES/raw/prep_$t.log" >&2; exit 1; }
  grep -h "wrote" "$RES/raw/prep_$t.log" || true
  cp "$WORK/data/$t$DSUF/key" "$RES/raw/prep_$t.key"
done
if [ -n "${PREP_ONLY:-}" ]; then  # bench/gpu/prepare.sh: the data alone, for a machine without the sources
  echo "finetune_speed: PREP_ONLY: data in $WORK/data (folders TASK$DSUF)"
  exit 0
fi
for seed in $SEEDS; do
  for t in $TASKS; do
    for s in $ALL_SETTINGS; do
      case " $SETTINGS " in *" $s "*) ;; *) continue;; esac
      case " $FIRST_SEED_SETTINGS " in *" $s "*) [ "$seed" = "${SEEDS%% *}" ] || continue;; esac
      echo "finetune_speed: $t $s seed $seed ($(date +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"
      case $s in nlptrain-*) run_nlptrain "$t" "$s" "$seed";; hf-*) run_hf "$t" "$s" "$seed";; esac
    done
  done
done
echo "finetune_speed: all runs took $(( $(date +%s) - T_ALL )) s"
"$PY" bench/finetune_speed_report.py "$RES"
