#!/usr/bin/env bash
# Per-op CPU profile of nlptrain's training step: `perf record` samples of one rank (2 threads,
# no mpirun) grouped by op, each op against its floor, for the CPU benchmark shapes:
#   gpt2a  GPT-2 4 x 128, vocabulary 50257, B=4, T=64          (bench/cpu_train_step.sh shape a)
#   gpt2b  GPT-2 124M (12 x 768), B=2, T=256                   (shape b)
#   bert   BERT doc_cls 4 x 256, vocabulary 30000, B=32, T=128, every row full (the kernel shape)
#   nsmc   the same BERT on NSMC reviews, trimmed and length-grouped (the real fine-tuning step;
#          needs ../shared/data)
#
#   bash bench/cpu_profile.sh                 # all four
#   bash bench/cpu_profile.sh bert nsmc       # some
#
# Environment: NLPTRAIN_BIN (build/nlptrain), THREADS (2), WORK (runs/cpu_profile), OUT
# (bench/results/cpu-profile-DATE-HARDWARE-COMMIT, bench/result_dir.sh), PYTHON (python3), SHARED (../shared/data).
# Writes OUT/<shape>.perf.txt (perf report: self samples per library and symbol), OUT/<shape>.metrics.jsonl, and
# OUT/README.md (bench/cpu_profile_report.py: per op, share of samples, ms per step, floor, and the
# measured GEMM rate and memory bandwidth the floors use).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${NLPTRAIN_BIN:-build/nlptrain}
THREADS=${THREADS:-2}
PY=${PYTHON:-python3}
WORK=${WORK:-runs/cpu_profile}
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo nocommit)
OUT=${OUT:-$(. bench/result_dir.sh && result_dir cpu-profile)}
SHARED=${SHARED:-../shared/data}
SHAPES=("$@")
[ ${#SHAPES[@]} -eq 0 ] && SHAPES=(gpt2a gpt2b bert nsmc)
command -v perf >/dev/null || { echo "cpu_profile: perf not found (apt-get install linux-perf)" >&2; exit 1; }
[ -x "$BIN" ] || { echo "cpu_profile: $BIN not found (cmake --build build --target nlptrain)" >&2; exit 1; }
mkdir -p "$WORK" "$OUT"

# ---- data -----------------------------------------------------------------------------------------
"$PY" - "$WORK" <<'EOF'
import sys, numpy as np, h5py
w = sys.argv[1]
rng = np.random.default_rng(0)
with h5py.File(f"{w}/gpt2.h5", "w") as f:
    f.create_dataset("tokens", data=rng.integers(0, 50257, size=400_000).astype(np.int32))
n, T = 2048, 128
ids = rng.integers(5, 30000, size=(n, T)).astype(np.int32)
ids[:, 0], ids[:, -1] = 2, 3
with h5py.File(f"{w}/bert.h5", "w") as f:
    f.create_dataset("input_ids", data=ids)
    f.create_dataset("attention_mask", data=np.ones_like(ids))
    f.create_dataset("token_type_ids", data=np.zeros_like(ids))
    f.create_dataset("labels", data=rng.integers(0, 2, size=n).astype(np.int32))
    f.attrs["num_labels"] = np.int64(2)
EOF

COMMON=(--run.threads="$THREADS" --run.log_interval=1 --eval.interval=0 --checkpoint.interval=0 --train.lr=1e-4)
BERT=(--model.type=bert --run.task=doc_cls --model.vocab_size=30000 --model.hidden_size=256 --model.num_hidden_layers=4
      --model.num_attention_heads=4 --model.intermediate_size=1024 --model.max_position_embeddings=256
      --model.num_labels=2 --train.batch_size=32)
for s in "${SHAPES[@]}"; do
  case $s in
    gpt2a) args=(--model.n_layer=4 --model.n_head=4 --model.n_embd=128 --model.vocab_size=50257 --model.n_positions=1024
                 --data.train="$WORK/gpt2.h5" --data.seq_len=64 --train.batch_size=4 --train.steps=200);;
    gpt2b) args=(--model.n_layer=12 --model.n_head=12 --model.n_embd=768 --model.vocab_size=50257 --model.n_positions=1024
                 --data.train="$WORK/gpt2.h5" --data.seq_len=256 --train.batch_size=2 --train.steps=12);;
    bert)  args=("${BERT[@]}" --data.train="$WORK/bert.h5" --data.padding=max_length --train.steps=40);;
    nsmc)
      [ -f "$SHARED/nsmc/nsmc_from_raw_train.tsv" ] || { echo "cpu_profile: nsmc: $SHARED/nsmc absent, skipped" >&2; continue; }
      [ -f "$WORK/nsmc.h5" ] || "$PY" tools/prep_doc_cls.py --vocab "$SHARED/vocab/kcbert-base/vocab.txt" \
        --input "$SHARED/nsmc/nsmc_from_raw_train.tsv" --limit 8000 --max-seq-len 128 --out "$WORK/nsmc.h5" --quiet
      args=("${BERT[@]}" --data.train="$WORK/nsmc.h5" --data.group_by_length=true --train.steps=150);;
    *) echo "cpu_profile: unknown shape '$s' (gpt2a gpt2b bert nsmc)" >&2; exit 2;;
  esac
  rm -rf "$WORK/$s"
  echo "cpu_profile: $s: perf record -F 499 -- $BIN ${args[*]} ${COMMON[*]}"
  t0=$(date +%s.%N)
  OMP_NUM_THREADS=$THREADS perf record -q -F 499 -o "$WORK/$s.data" -- "$BIN" "${args[@]}" "${COMMON[@]}" \
    --output.dir="$WORK/$s" > "$WORK/$s.log" 2>&1
  t1=$(date +%s.%N)
  # Only the training steps: start-up (first touch of the arenas, weight initialisation, data) is left
  # out by perf's time window, from the wall time and the sum of the logged step times.
  from=$("$PY" -c 'import json, sys
t0, t1, path = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
steps = sum(json.loads(l).get("step_time_s", 0) for l in open(path) if l.strip())
print(f"{max(0.0, min(99.0, 100 * (1 - (steps + 0.2) / (t1 - t0)))):.1f}")' "$t0" "$t1" "$WORK/$s/metrics.jsonl")
  echo "cpu_profile: $s: samples from $from% of the run's time on (the training steps)"
  echo "$from" > "$OUT/$s.window.txt"
  perf report -q -i "$WORK/$s.data" --no-children --sort dso,symbol --stdio --time "$from%-100%" 2>/dev/null \
    | sed 's/ *$//' > "$OUT/$s.perf.txt"
  cp "$WORK/$s/metrics.jsonl" "$OUT/$s.metrics.jsonl"
  grep -m1 "parameters" "$WORK/$s.log" > "$OUT/$s.model.txt" || true
done
"$PY" bench/cpu_profile_report.py "$OUT" "${SHAPES[@]}"
