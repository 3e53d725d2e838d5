#!/usr/bin/env bash
# Exposed gradient communication with and without comm.overlap on CPU ranks.
# GPT-2 12 layers / 768 wide / vocab 256 (86M parameters), one thread per rank, the same per-rank
# batch; for each rank count, runs comm.overlap = false then true (and again, ROUNDS times, in turn),
# and prints every run's summary.json (comm_s = exposed communication per step, rank 0;
# comm_s_max_rank / comm_s_mean_rank over ranks; comm_s_min_step = per step the smallest among the
# ranks, i.e. the last rank to finish its backward: communication not hidden, without load imbalance).
# NLPTRAIN_COMM_TRACE=1 also prints, per rank, each bucket's duration and each step's wait.
#
# ZERO="0 1" does it for train.zero = 0 and 1 (with ZeRO-1, comm.overlap reduce-scatters the buckets
# during the backward instead of once after it).
#
#   bash bench/overlap.sh                    # 2 and 4 ranks
#   RANKS="2" STEPS=8 ZERO="0 1" bash bench/overlap.sh
#
# Environment: NLPTRAIN_BIN [build/nlptrain]  RANKS ["2 4"]  STEPS [6] (the first is not timed)
#              BATCH [1]  SEQ [256]  ROUNDS [1]  BUCKET_MB [25]  ZERO [0]  WORK [runs/overlap]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${NLPTRAIN_BIN:-build/nlptrain}
RANKS=${RANKS:-"2 4"}
STEPS=${STEPS:-6}
BATCH=${BATCH:-1}
SEQ=${SEQ:-256}
ROUNDS=${ROUNDS:-1}
BUCKET_MB=${BUCKET_MB:-25}
ZERO=${ZERO:-0}
WORK=${WORK:-runs/overlap}
mkdir -p "$WORK"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
python3 - "$WORK/tokens.h5" <<'PY'
import sys, numpy as np, h5py
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, 256, 400_000).astype(np.int32))
PY
COMMIT=$(git rev-parse --short HEAD)
[ -n "$(git status --porcelain --untracked-files=no)" ] && COMMIT="$COMMIT-dirty"
echo "# date (UTC) $(date -u '+%F %T') commit $COMMIT host $(hostname) cores $(OMP_NUM_THREADS= nproc --all)"
echo "# uptime: $(uptime)"
for r in $RANKS; do
  for round in $(seq "$ROUNDS"); do
    for z in $ZERO; do
      for ov in false true; do
        out=$WORK/r${r}_zero${z}_overlap_${ov}_${round}
        rm -rf "$out"
        cmd=(mpirun -np "$r" "$BIN" --data.train="$WORK/tokens.h5" --output.dir="$out"
             --model.n_layer=12 --model.n_head=12 --model.n_embd=768 --model.vocab_size=256
             --model.n_positions=1024 --data.seq_len="$SEQ" --train.batch_size="$BATCH"
             --train.steps="$STEPS" --run.threads=1 --run.log_interval=1 --train.warmup_steps=0
             --comm.overlap="$ov" --comm.bucket_mb="$BUCKET_MB" --train.zero="$z")
        echo "## ranks $r train.zero $z overlap $ov round $round"
        echo "\$ ${cmd[*]}"
        "${cmd[@]}" | grep -E "^step|gradients:" | sed 's/^/    /'
        echo "summary.json: $(cat "$out/summary.json")"
      done
    done
  done
done
echo "# uptime: $(uptime)"
# Table of every run, then the median over rounds per (ranks, overlap)
python3 - "$WORK" "$RANKS" "$ROUNDS" "$ZERO" <<'PY'
import json, statistics, sys
work, ranks, rounds, zeros = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4].split()
keys = ["step_time_s", "comm_s", "comm_s_max_rank", "comm_s_mean_rank", "comm_s_min_step"]
print("\n| ranks | train.zero | overlap | round | " + " | ".join(keys) + " |")
print("|---|---|---|---|" + "---|" * len(keys))
med = {}
for r in ranks:
    for z in zeros:
        for ov in ("false", "true"):
            for k in range(1, rounds + 1):
                s = json.load(open(f"{work}/r{r}_zero{z}_overlap_{ov}_{k}/summary.json"))
                med.setdefault((r, z, ov), []).append(s)
                print(f"| {r} | {z} | {ov} | {k} | " + " | ".join(f"{s[x]:.3f}" for x in keys) + " |")
print("\nmedian over rounds:\n\n| ranks | train.zero | overlap | " + " | ".join(keys) + " |")
print("|---|---|---|" + "---|" * len(keys))
for (r, z, ov), ss in med.items():
    print(f"| {r} | {z} | {ov} | " + " | ".join(f"{statistics.median(s[x] for s in ss):.3f}" for x in keys) + " |")
PY
