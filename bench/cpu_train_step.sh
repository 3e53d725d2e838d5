#!/usr/bin/env bash
# CPU training-step benchmark: nlptrain vs Hugging Face transformers (PyTorch) on the same GPT-2 shape,
# the same random tokens, one rank / one process, the same number of threads. See bench/README.md.
#
#   bash bench/cpu_train_step.sh            # both GPT-2 shapes: a (4 x 128, 7.4M) and b (12 x 768, 124M)
#   bash bench/cpu_train_step.sh a          # one shape
#   bash bench/cpu_train_step.sh c          # BERT-base doc_cls (12 x 768, vocab 30522), B=8, T=128:
#                                           # BertForSequenceClassification on the torch side
#
# Environment (defaults in brackets):
#   NLPTRAIN_BIN [build/nlptrain, built when missing]   PYTHON [python3]   THREADS [2]
#   WARM_STEPS [2]   steps of every run left out of the per-step median
#   STEPS_A [10] STEPS_B [4] STEPS_C [4]   timed steps per run after WARM_STEPS, shape a / b / c
#   PAIRS [3]        counted (nlptrain, torch) run pairs per shape, after one uncounted warm-up pair
#   TORCH_MODES ["eager compile bf16"]  the PyTorch peers run in each pair (bench/torch_gpt2_step.py
#                    --mode): eager fp32, torch.compile (inductor), eager under bf16 autocast; the
#                    fastest is the peer the ratio is taken against (each mode's median is listed too)
#   NLP_PRECISION [fp32]  nlptrain's train.precision (bf16: run.cpu_bf16 = auto, native where the CPU
#                    has it; the log line "backend cpu: GEMMs ..." in the results says which)
#   NLP_ARGS [""]    further nlptrain overrides, e.g. "--run.cpu_gemm=openblas"
#   WORK [runs/bench]  scratch folder (datasets, outputs)
#
# Two measurements per shape, from the same runs:
#   1. per step, inside each process: nlptrain's metrics.jsonl step_time_s, torch's perf_counter
#      around zero_grad+forward+backward+clip+step; the median over all steps after WARM_STEPS.
#   2. the whole command (start-up, weight initialisation, data loading included), with /usr/bin/time:
#      nlptrain and torch run in turn (A B A B ...), the ratio taken pair by pair, the median quoted.
# Writes a table on stdout and everything (machine, versions, command lines, every step) to
# bench/results/cpu-step-DATE-HARDWARE-COMMIT/cpu-<date>-<time>-<shortcommit>.txt (bench/result_dir.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PY=${PYTHON:-python3}
THREADS=${THREADS:-2}
WARM=${WARM_STEPS:-2}
STEPS_A=${STEPS_A:-10}
STEPS_B=${STEPS_B:-4}
STEPS_C=${STEPS_C:-4}
PAIRS=${PAIRS:-3}
read -r -a MODES <<<"${TORCH_MODES:-eager compile bf16}"
NLP_PRECISION=${NLP_PRECISION:-fp32}
read -r -a NLP_ARGS <<<"${NLP_ARGS:-}"
WORK=${WORK:-$ROOT/runs/bench}
BIN=${NLPTRAIN_BIN:-$ROOT/build/nlptrain}
SHAPES=("$@")
[ ${#SHAPES[@]} -eq 0 ] && SHAPES=(a b)

if [ ! -x "$BIN" ]; then
  echo "cpu_train_step: $BIN not found; building it (cmake -S . -B build, target nlptrain)" >&2
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j"$(nproc)" --target nlptrain >/dev/null
  BIN=$ROOT/build/nlptrain
fi
[ -x /usr/bin/time ] || { echo "cpu_train_step: /usr/bin/time is needed (apt-get install time)" >&2; exit 1; }

mkdir -p "$WORK"
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo nocommit)
if [ "$COMMIT" != nocommit ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  COMMIT="$COMMIT-dirty"
fi
. bench/result_dir.sh
OUTDIR=$(result_dir cpu-step)
mkdir -p "$OUTDIR"
OUTFILE=$OUTDIR/cpu-$(date -u +%Y%m%d-%H%M%S)-$COMMIT.txt
export OMP_NUM_THREADS=$THREADS OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1} TRANSFORMERS_VERBOSITY=error

log() { echo "$*" >>"$OUTFILE"; }
{
  echo "# nlptrain CPU training-step benchmark"
  echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M:%S')   commit: $COMMIT   host: $(hostname)"
  echo "uptime: $(uptime)"
  echo
  echo "## lscpu | head -20"
  lscpu | head -20
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
  echo
  echo "## versions"
  echo "nlptrain: $("$BIN" --version 2>/dev/null | head -1) ($BIN)"
  "$PY" -c 'import sys, torch, transformers, numpy; print("python", sys.version.split()[0], "| torch", torch.__version__, "| transformers", transformers.__version__, "| numpy", numpy.__version__); print("torch parallel info:", " ".join(l.strip() for l in torch.__config__.parallel_info().splitlines()[:4]))'
  echo "compiler: $(grep -m1 CMAKE_CXX_COMPILER: "$(dirname "$BIN")/CMakeCache.txt" 2>/dev/null | cut -d= -f2) $(c++ --version | head -1)"
  echo "openblas: $(dpkg-query -W -f='${Package} ${Version}\n' 'libopenblas0*' 2>/dev/null | tr '\n' ' ')"
  echo
  echo "cpu flags (vector): $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|fma|amx|f16c)' | tr '\n' ' ')"
  echo "settings: NLP_PRECISION=$NLP_PRECISION NLP_ARGS=${NLP_ARGS[*]} THREADS=$THREADS WARM_STEPS=$WARM STEPS_A=$STEPS_A STEPS_B=$STEPS_B PAIRS=$PAIRS TORCH_MODES=${MODES[*]}"
} >"$OUTFILE"

# shape -> "model n_layer n_head n_embd vocab n_positions batch seq timed_steps"
shape_args() {
  case "$1" in
    a) echo "gpt2 4 4 128 50257 1024 4 64 $STEPS_A" ;;
    b) echo "gpt2 12 12 768 50257 1024 4 64 $STEPS_B" ;;
    c) echo "bert 12 12 768 30522 512 8 128 $STEPS_C" ;;
    *) echo "unknown shape '$1' (a, b or c)" >&2; exit 2 ;;
  esac
}

SUMMARY=$WORK/summary.tsv
: >"$SUMMARY"

for shape in "${SHAPES[@]}"; do
  read -r MODEL L H C V P B T N <<<"$(shape_args "$shape")"
  TOTAL=$((WARM + N))
  D=$WORK/$shape
  rm -rf "$D"
  mkdir -p "$D"
  DATA=$D/tokens.h5
  ROWS=$((B * TOTAL))
  "$PY" bench/torch_gpt2_step.py --model "$MODEL" --write-data "$DATA" --rows "$ROWS" --seq "$T" --vocab "$V" --seed 1 >/dev/null
  # the model's sections, then the training sections both models share
  if [ "$MODEL" = bert ]; then
    cat >"$D/bench.ini" <<EOF
# shape $shape: BERT doc_cls $L layers, $H heads, hidden $C, vocab $V, B=$B, T=$T
[run]
task = doc_cls
[model]
type = bert
hidden_size = $C
num_hidden_layers = $L
num_attention_heads = $H
intermediate_size = $((4 * C))
vocab_size = $V
max_position_embeddings = $P
type_vocab_size = 2
num_labels = 2
hidden_dropout_prob = 0.0
attention_probs_dropout_prob = 0.0
[data]
train = $DATA
EOF
  else
    cat >"$D/bench.ini" <<EOF
# shape $shape: GPT-2 $L layers, $H heads, $C embd, vocab $V, B=$B, T=$T
[model]
type = gpt2
n_layer = $L
n_head = $H
n_embd = $C
vocab_size = $V
n_positions = $P
embd_pdrop = 0.0
attn_pdrop = 0.0
resid_pdrop = 0.0
[data]
train = $DATA
seq_len = $T
EOF
  fi
  cat >>"$D/bench.ini" <<EOF
[run]
mode = train
backend = cpu
threads = $THREADS
log_interval = 1
[data]
shuffle = false
[train]
steps = $TOTAL
batch_size = $B
lr = 1e-4
warmup_steps = 0
schedule = constant
weight_decay = 0.1
clip = 1.0
precision = $NLP_PRECISION
[checkpoint]
interval = 0
[output]
dir = $D/out
EOF
  NLP_CMD=("$BIN" "$D/bench.ini" "${NLP_ARGS[@]}")
  TORCH_CMD=("$PY" bench/torch_gpt2_step.py --model "$MODEL" --n-layer "$L" --n-head "$H" --n-embd "$C" --vocab "$V"
             --n-positions "$P" --batch "$B" --seq "$T" --warmup "$WARM" --steps "$N" --threads "$THREADS"
             --lr 1e-4 --weight-decay 0.1 --clip 1.0 --data "$DATA")
  {
    echo
    echo "================================================================================"
    echo "## shape $shape: $MODEL n_layer=$L n_head=$H n_embd=$C vocab=$V n_positions=$P, B=$B T=$T;"
    echo "## $TOTAL steps per run ($WARM left out of the per-step median), 1 warm-up pair + $PAIRS counted pairs"
    echo "nlptrain command: OMP_NUM_THREADS=$THREADS ${NLP_CMD[*]}"
    echo "--- $D/bench.ini"
    cat "$D/bench.ini"
    echo "---"
    echo "torch command:    OMP_NUM_THREADS=$THREADS ${TORCH_CMD[*]}"
  } >>"$OUTFILE"
  echo "shape $shape: $MODEL $L x $C, vocab $V, B=$B T=$T: $((PAIRS + 1)) run pairs of $TOTAL steps ..." >&2

  for ((r = 0; r <= PAIRS; r++)); do
    tag=$([ "$r" -eq 0 ] && echo "warm-up pair (not counted)" || echo "pair $r")
    rm -rf "$D/out"
    /usr/bin/time -f "%e %U %S %M" -o "$D/time_nlp_$r" "${NLP_CMD[@]}" >"$D/nlp_$r.log" 2>&1 ||
      { echo "nlptrain failed, see $D/nlp_$r.log" >&2; tail -5 "$D/nlp_$r.log" >&2; exit 1; }
    cp "$D/out/metrics.jsonl" "$D/metrics_$r.jsonl"
    for m in "${MODES[@]}"; do
      /usr/bin/time -f "%e %U %S %M" -o "$D/time_torch_${m}_$r" "${TORCH_CMD[@]}" --mode "$m" >"$D/torch_${m}_$r.log" 2>&1 ||
        { echo "torch script ($m) failed, see $D/torch_${m}_$r.log" >&2; tail -5 "$D/torch_${m}_$r.log" >&2; exit 1; }
    done
    {
      echo
      echo "### $tag"
      echo "nlptrain (wall user sys maxrss_kB): $(cat "$D/time_nlp_$r")"
      grep -E '^(\[.*\] )?(step |done:|model: [0-9]|backend cpu:)' "$D/nlp_$r.log" || true
      for m in "${MODES[@]}"; do
        echo "torch $m (wall user sys maxrss_kB): $(cat "$D/time_torch_${m}_$r")"
        grep -vE '^\[transformers\]|^\{' "$D/torch_${m}_$r.log" || true
        tail -1 "$D/torch_${m}_$r.log"
      done
    } >>"$OUTFILE"
  done

  "$PY" - "$D" "$PAIRS" "$WARM" "$shape" "$MODEL-$L" "$C" "$V" "$B" "$T" "${MODES[@]}" >>"$SUMMARY" <<'EOF'
import json, statistics, sys
d, pairs, warm, shape, L, C, V, B, T, *modes = sys.argv[1:]
pairs, warm = int(pairs), int(warm)
med = statistics.median
# The peer: the PyTorch mode with the smallest median step (compile's warm-up steps are its compilation)
per_mode = {}
for m in modes:
    steps = []
    for r in range(1, pairs + 1):
        steps += json.loads(open(f"{d}/torch_{m}_{r}.log").read().strip().splitlines()[-1])["times_ms"]
    per_mode[m] = steps
best = min(modes, key=lambda m: med(per_mode[m]))
nlp_steps, torch_steps, walls_n, walls_t, ratios, cpu_ratios = [], per_mode[best], [], [], [], []
for r in range(1, pairs + 1):
    rows = [json.loads(l) for l in open(f"{d}/metrics_{r}.jsonl") if l.strip()]
    nlp_steps += [x["step_time_s"] * 1e3 for x in rows if "step_time_s" in x and x["step"] > warm]
    tn = [float(x) for x in open(f"{d}/time_nlp_{r}").read().split()[:3]]    # wall user sys
    tt = [float(x) for x in open(f"{d}/time_torch_{best}_{r}").read().split()[:3]]
    walls_n.append(tn[0]); walls_t.append(tt[0]); ratios.append(tn[0] / tt[0])
    cpu_ratios.append((tn[1] + tn[2]) / (tt[1] + tt[2]))
mn, mt = med(nlp_steps), med(torch_steps)
modes_txt = " ".join(f"{m}={med(per_mode[m]):.1f}" for m in modes)
print("\t".join(map(str, [shape, f"{L}x{C} V={V} B={B} T={T}", f"{mn:.1f}", f"{min(nlp_steps):.1f}",
      f"{max(nlp_steps):.1f}", f"{mt:.1f}", f"{min(torch_steps):.1f}", f"{max(torch_steps):.1f}",
      f"{mn / mt:.2f}", f"{med(walls_n):.2f}", f"{med(walls_t):.2f}", f"{med(ratios):.2f}",
      f"{min(ratios):.2f}", f"{max(ratios):.2f}", f"{med(cpu_ratios):.2f}", len(nlp_steps),
      len(torch_steps), best, modes_txt])))
EOF
done

TABLE=$("$PY" - "$SUMMARY" "$THREADS" "$NLP_PRECISION ${NLP_ARGS[*]}" <<'EOF'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
th, nlp_setting = sys.argv[2], sys.argv[3].strip()
out = [f"CPU training step, nlptrain train.precision = {nlp_setting}, 1 rank / 1 process, {th} threads; per step: median [min-max] over the timed steps",
       "(nlptrain: metrics.jsonl step_time_s; torch: forward+backward+clip+AdamW step);",
       "whole command: median wall seconds of the paired runs and the median of the pairwise ratios [min-max];",
       "cpu ratio: median pairwise ratio of user+sys CPU seconds (less sensitive to a busy machine than wall).",
       "",
       f"{'shape':<6}{'model':<30}{'nlptrain ms/step':<26}{'torch ms/step':<26}{'ratio':>6}  |"
       f" {'nlptrain s':>10} {'torch s':>8} {'ratio (pairs)':>20} {'cpu ratio':>9}"]
for r in rows:
    (shape, model, mn, mn0, mn1, mt, mt0, mt1, ratio, wn, wt, wr, wr0, wr1, cr, nn, nt, best, modes_txt) = r
    out.append(f"{shape:<6}{model:<30}{f'{mn} [{mn0}-{mn1}]':<26}{f'{mt} [{mt0}-{mt1}] {best}':<26}{ratio:>6}  |"
               f" {wn:>10} {wt:>8} {f'{wr} [{wr0}-{wr1}]':>20} {cr:>9}")
    out.append(f"{'':<6}torch median ms/step per mode: {modes_txt}")
out.append("")
out.append("ratio = nlptrain / torch's fastest mode (named after its ms/step; below 1: nlptrain is faster)")
print("\n".join(out))
EOF
)
{
  echo
  echo "================================================================================"
  echo "## summary"
  echo "$TABLE"
  echo "uptime at the end: $(uptime)"
} >>"$OUTFILE"
echo "$TABLE"
echo "raw output: $OUTFILE"
