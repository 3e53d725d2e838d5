#!/usr/bin/env bash
# Step time of ZeRO stages 2 (and 3 where the binary accepts train.zero = 3) against stage 1, and of
# train.offload = optimizer against none, on CPU ranks; and the bytes each rank puts on the wire per
# step against 2x and 3x the parameter bytes, counted at the MPI interface (bench/mpi_bytes.c, a PMPI
# shim loaded with LD_PRELOAD: the elements every collective was handed, times the ring algorithm's
# share each rank sends). A benchmark, not a test: it never fails on a number.
#
# For each rank count, ROUNDS rounds; each round runs every configuration once, in turn
# (z1 z2 z3 z1off z2off, z1 z2 ...), so the configurations alternate and a paired ratio per round is
# taken against z1 of the same round; the report quotes medians over rounds [min-max]
# (bench/zero_stages_report.py). step_time_s is nlptrain's own (summary.json: the mean over the
# timed steps, the first step not timed).
#
#   bash bench/zero_stages.sh                      # PRESET=small, 2 and 4 ranks (minutes on 2 cores)
#   PRESET=124m ROUNDS=3 bash bench/zero_stages.sh # GPT-2 124M (gpt2)
#   PRESET=350m RANKS=4 bash bench/zero_stages.sh  # GPT-2 medium, 355M (4.5 GB peak RSS a rank at stage 1, 2 ranks)
#   PRESET=tiny ROUNDS=1 STEPS=3 bash bench/zero_stages.sh   # a check that the script runs (seconds)
#
# Configurations: z1 = train.zero 1, z2 = 2, z3 = 3, z1off / z2off / z3off = the same with
# train.offload = optimizer. z3 (and z3off) is skipped, with a message, when the binary refuses
# train.zero = 3 (probed with a one-step run). Every run: comm.overlap = true, one thread per rank
# (run.threads = 1, OMP_NUM_THREADS=1), grad_accum 1, no checkpoint, no evaluation, random tokens.
# More ranks than cores oversubscribe the CPU (4 ranks on 2 cores: every rank waits for a core; the
# results say so).
#
# Environment: NLPTRAIN_BIN [build/nlptrain]  PRESET [small: tiny|small|124m|350m]  RANKS ["2 4"]
#              ROUNDS [3]  STEPS [6]  BATCH [1]  SEQ [preset's]  CONFIGS ["z1 z2 z3 z1off z2off"]
#              BUCKET_MB [25]  WORK [runs/zero_stages]  RES [bench/results/zero-stages-DATE-HW-COMMIT-PRESET]
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/result_dir.sh
BIN=${NLPTRAIN_BIN:-build/nlptrain}
PRESET=${PRESET:-small}
RANKS=${RANKS:-"2 4"}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-6}
BATCH=${BATCH:-1}
CONFIGS=${CONFIGS:-"z1 z2 z3 z1off z2off"}
BUCKET_MB=${BUCKET_MB:-25}
WORK=${WORK:-runs/zero_stages}
case "$PRESET" in
  tiny) SHAPE=(--model.n_layer=2 --model.n_head=2 --model.n_embd=64 --model.vocab_size=256 --model.n_positions=128); VOCAB=256; SEQ=${SEQ:-64} ;;
  small) SHAPE=(--model.n_layer=6 --model.n_head=8 --model.n_embd=512 --model.vocab_size=8192 --model.n_positions=256); VOCAB=8192; SEQ=${SEQ:-64} ;;
  124m) SHAPE=(--model.preset=gpt2); VOCAB=50257; SEQ=${SEQ:-128} ;;
  350m) SHAPE=(--model.preset=gpt2-medium); VOCAB=50257; SEQ=${SEQ:-128} ;;
  *) echo "zero_stages.sh: PRESET=$PRESET: expected tiny, small, 124m or 350m" >&2; exit 2 ;;
esac
RES=${RES:-$(result_dir zero-stages)-$PRESET}
[ -x "$BIN" ] || { echo "zero_stages.sh: no nlptrain at $BIN (build it: cmake --build build --target nlptrain)" >&2; exit 2; }
command -v mpicc >/dev/null || { echo "zero_stages.sh: mpicc not found (needed for bench/mpi_bytes.c)" >&2; exit 2; }
mkdir -p "$WORK" "$RES/raw"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
SHIM=$(realpath "$WORK")/mpi_bytes.so
mpicc -shared -fPIC -O2 -o "$SHIM" bench/mpi_bytes.c
python3 - "$WORK/tokens.h5" "$VOCAB" <<'PY'
import sys, numpy as np, h5py
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, int(sys.argv[2]), 2_000_000).astype(np.int32))
PY

zero_of() { local c=${1#z}; echo "${c%off}"; }
offload_of() { case "$1" in *off) echo optimizer ;; *) echo none ;; esac; }
cmd_of() {  # cmd_of RANKS CONFIG OUT
  local z; z=$(zero_of "$2")
  echo mpirun -np "$1" -x LD_PRELOAD="$SHIM" -x MPI_BYTES_OUT="$3/mpi_bytes" "$BIN"
  echo --data.train="$WORK/tokens.h5" --output.dir="$3" "${SHAPE[@]}" --data.seq_len="$SEQ"
  echo --train.batch_size="$BATCH" --train.grad_accum=1 --train.steps="$STEPS" --train.warmup_steps=0
  echo --run.threads=1 --run.log_interval=1 --checkpoint.interval=0 --comm.overlap=true
  echo --comm.bucket_mb="$BUCKET_MB" --train.zero="$z" --train.offload="$(offload_of "$2")"
}

# Does the binary accept train.zero = 3? (one step of a one-layer shape on 2 ranks, with the preset's
# vocabulary: the token file holds ids up to VOCAB, and a smaller vocab_size refuses the data, not the stage)
Z3=yes
probe=$WORK/probe_z3
rm -rf "$probe"
if ! mpirun -np 2 "$BIN" --data.train="$WORK/tokens.h5" --output.dir="$probe" --model.n_layer=1 --model.n_head=1 \
     --model.n_embd=16 --model.vocab_size="$VOCAB" --model.n_positions=32 --data.seq_len=16 --train.batch_size=1 \
     --train.steps=1 --run.threads=1 --checkpoint.interval=0 --train.zero=3 >"$WORK/probe_z3.log" 2>&1; then
  Z3=no
  echo "zero_stages.sh: this nlptrain refuses train.zero = 3, so z3 and z3off are skipped:"
  grep -m1 -i "error" "$WORK/probe_z3.log" | sed 's/^/    /' || true
fi
RUN_CONFIGS=""
for c in $CONFIGS; do
  if [ "$(zero_of "$c")" = 3 ] && [ "$Z3" = no ]; then continue; fi
  RUN_CONFIGS="$RUN_CONFIGS $c"
done

{
  echo "date (UTC): $(date -u '+%F %T')"
  echo "commit: $(result_commit)"
  echo "host: $(hostname), cores: $(OMP_NUM_THREADS= nproc --all), memory: $(free -g | awk '/^Mem/{print $2}') GiB"
  LC_ALL=C lscpu | grep -E '^(Model name|CPU family|Model|Thread|Core|Socket|Flags)' | cut -c1-200
  echo "mpirun: $(mpirun --version 2>&1 | head -1)"
  echo "nlptrain: $("$BIN" --version 2>&1 | head -1 || true)"
  echo "preset: $PRESET (${SHAPE[*]}), seq $SEQ, batch per rank $BATCH, steps $STEPS (first not timed)"
  echo "ranks: $RANKS, rounds: $ROUNDS, configurations: $RUN_CONFIGS (train.zero = 3 accepted: $Z3)"
  echo "uptime before: $(uptime)"
} | tee "$RES/environment.txt"
: >"$RES/commands.txt"
for r in $RANKS; do
  for round in $(seq "$ROUNDS"); do
    for c in $RUN_CONFIGS; do
      out=$WORK/r${r}_${c}_${round}
      rm -rf "$out"
      mkdir -p "$out"
      mapfile -t parts < <(cmd_of "$r" "$c" "$out")
      read -ra cmd <<<"${parts[*]}"
      echo "ranks $r round $round $c: ${cmd[*]}" >>"$RES/commands.txt"
      echo "## ranks $r round $round $c (load $(cut -d' ' -f1-3 /proc/loadavg))"
      rc=0
      "${cmd[@]}" >"$out/stdout.txt" 2>&1 || rc=$?
      grep -E "^done:" "$out/stdout.txt" | cut -c1-120 | sed 's/^/    /' || true
      [ "$rc" = 0 ] || { echo "    exit $rc:"; tail -5 "$out/stdout.txt" | sed 's/^/    /'; }
      dst=$RES/raw/r${r}_${c}_${round}
      mkdir -p "$dst"
      echo "$rc" >"$dst/exit_code"
      cp "$out/stdout.txt" "$dst/"
      cp "$out"/summary.json "$out"/mpi_bytes.rank*.json "$dst/" 2>/dev/null || true
    done
  done
done
echo "uptime after: $(uptime)" | tee -a "$RES/environment.txt"
python3 bench/zero_stages_report.py "$RES" | tee "$RES/results.md"
echo "results: $RES"
