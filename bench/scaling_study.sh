#!/usr/bin/env bash
# Scaling study on the local two-node SLURM cluster: strong and weak sweeps at 1, 2
# and 4 ranks with comm.overlap and train.zero on and off, through jobscripts/scaling_sweep.sh; the
# allreduce microbenchmark (bench/allreduce_bench) under the same launcher, placement and Open MPI
# settings; its alpha-beta fit (tools/comm_fit.py); and one tools/scaling_report per variant with
# that fit (measured vs modelled efficiency). Run it from anywhere; it works in the repository root.
#
#   bash bench/scaling_study.sh                       # everything (about 15-20 min on 2 cores)
#   STEPS=3 LAYERS=1 WIDTH=64 ZERO=0 BENCH_MAX_BYTES=1M bash bench/scaling_study.sh   # smoke run
#
# What it does, in order:
#   1. checks build/nlptrain and build/allreduce_bench (cmake --build build builds both);
#   2. uses the SLURM cluster that SLURM_CONF points at when it answers with two idle nodes, else
#      starts tests/slurm/start_cluster.sh CLUSTER_DIR (two slurmd, n1 and n2, on this host) and stops
#      it again at the end (only a cluster it started itself);
#   3. writes a random-token dataset (vocab 256) to WORK/data/tokens.h5;
#   4. runs the microbenchmark with srun --mpi=pmix --exclusive at each BENCH_SIZES placement (the
#      multi-rank placements of SIZES by default) for each of BENCH_KINDS: allreduce (blocking
#      MPI_Allreduce: comm.overlap = false), iallreduce (MPI_Iallreduce: the buckets of comm.overlap =
#      true), rs_ag (MPI_Ireduce_scatter + MPI_Iallgatherv: train.zero = 1; with overlap its
#      reduce-scatter goes out in buckets, an MPI_Ireduce_scatter each, the same bytes), and fits the
#      ring model to each kind (WORK/bench/fit_<kind>.json);
#   5. for each MODES x OVERLAP x ZERO variant, one jobscripts/scaling_sweep.sh --sizes "$SIZES"
#      --serial --wait (sbatch --exclusive: no two runs share the nodes) into WORK/sweeps/<variant>/;
#      strong: --global-batch GLOBAL_BATCH (train.batch_size = GLOBAL_BATCH / ranks), weak:
#      train.batch_size = RANK_BATCH at every size;
#   6. tools/scaling_report --comm-fit <the variant's kind> --cores <nproc> per variant into
#      WORK/report/<variant>/, and
#      bench/scaling_study_tables.py over all of them: WORK/report/study.md (all variants, one table);
#   7. copies the small files (machine.txt, commands.txt, study.md, the benchmark JSONs and the fit,
#      per variant the CSVs, scaling.md and every run's nodes_NxR/summary.json: tools/scaling_report
#      runs on such a folder as on the sweep) to RESULTS when it is set.
#
# Environment (defaults in brackets):
#   NLPTRAIN_BIN [build/nlptrain]  ALLREDUCE_BENCH [build/allreduce_bench]  WORK [runs/scaling-study]
#   RESULTS [unset: nothing copied]  CLUSTER_DIR [${TMPDIR:-/tmp}/nlptrain-scaling-study-$UID]
#   SIZES ["1x1 2x1 2x2"] (nodes x ranks per node)  MODES ["strong weak"]  OVERLAP ["false true"]
#   ZERO ["0 1"] (train.zero values; 1 is an error when the binary has no train.zero key)
#   LAYERS [4] WIDTH [256] HEADS [4] SEQ [128] STEPS [20] (the first step is not timed)
#   GLOBAL_BATCH [8] (strong, sequences per step over all ranks)  RANK_BATCH [4] (weak, per rank)
#   BENCH_SIZES [the placements of SIZES with 2+ ranks]  BENCH_MAX_BYTES [256M]  BENCH_MIN_TIME [0.5]
#   BENCH_MIN_REPS [7] BENCH_WARMUP [1] (untimed calls per size)  BENCH_MAX_BYTES_OTHER [64M] (the
#   kinds other than allreduce)  BENCH_KINDS [allreduce, + iallreduce if OVERLAP has true, + rs_ag if
#   ZERO has 1]  BUCKET_MB [2] (comm.bucket_mb: the default 25 MiB is more than this model's 12.4 MiB
#   gradient, which would then go out as one bucket after the backward, overlapping nothing)
#   EXTRA_BENCH_SIZES [""] (more placements for the blocking allreduce, fitted on their own into
#   WORK/bench/fit_allreduce_extra.json for comparison, not used by the model; e.g. "1x2")
#   EXTRA_ARGS [""] (more nlptrain overrides for every run, word-split)
# Open MPI settings exported to every job and to the benchmark: OMPI_MCA_btl=self,tcp (the two
# "nodes" share one host: no shared-memory transport between them, so every rank talks TCP over lo),
# OMPI_MCA_btl_tcp_if_include=lo, OMPI_MCA_oob_tcp_if_include=lo, OMPI_MCA_pml=ob1, OMP_NUM_THREADS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
T0=$SECONDS
say() { printf '[scaling-study %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { echo "scaling_study: error: $*" >&2; exit 1; }

NCORES=$(OMP_NUM_THREADS='' OMP_THREAD_LIMIT='' nproc)  # nproc would report OMP_NUM_THREADS
BIN=${NLPTRAIN_BIN:-build/nlptrain}
BENCH=${ALLREDUCE_BENCH:-build/allreduce_bench}
WORK=${WORK:-runs/scaling-study}
RESULTS=${RESULTS:-}
CLUSTER_DIR=${CLUSTER_DIR:-${TMPDIR:-/tmp}/nlptrain-scaling-study-$(id -u)}
SIZES=${SIZES:-"1x1 2x1 2x2"}
MODES=${MODES:-"strong weak"}
OVERLAP=${OVERLAP:-"false true"}
ZERO=${ZERO:-"0 1"}
LAYERS=${LAYERS:-4} WIDTH=${WIDTH:-256} HEADS=${HEADS:-4} SEQ=${SEQ:-128} STEPS=${STEPS:-20}
GLOBAL_BATCH=${GLOBAL_BATCH:-8} RANK_BATCH=${RANK_BATCH:-4}
EXTRA_BENCH_SIZES=${EXTRA_BENCH_SIZES:-} BUCKET_MB=${BUCKET_MB:-2}
BENCH_MAX_BYTES=${BENCH_MAX_BYTES:-256M} BENCH_MAX_BYTES_OTHER=${BENCH_MAX_BYTES_OTHER:-64M} BENCH_MIN_TIME=${BENCH_MIN_TIME:-0.5} BENCH_MIN_REPS=${BENCH_MIN_REPS:-7} BENCH_WARMUP=${BENCH_WARMUP:-1}
EXTRA_ARGS=${EXTRA_ARGS:-}
if [ -z "${BENCH_SIZES:-}" ]; then
  BENCH_SIZES=""
  for sz in $SIZES; do (( ${sz%x*} * ${sz#*x} > 1 )) && BENCH_SIZES+="$sz "; done
fi

for f in "$BIN" "$BENCH"; do
  [ -x "$f" ] || die "$f not found: build first (cmake -S . -B build -DNLPTRAIN_CUDA=OFF && cmake --build build -j2)"
done
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
BENCH=$(cd "$(dirname "$BENCH")" && pwd)/$(basename "$BENCH")
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
for d in sweeps report bench data; do rm -rf "${WORK:?}/$d"; done
mkdir -p "$WORK"/{sweeps,report,bench,data}
: >"$WORK/commands.txt"
cmdlog() { printf '%s\n' "$*" >>"$WORK/commands.txt"; }

HAS_ZERO=0
HELP=$("$BIN" --help 2>/dev/null || true)  # (grep -q on a pipe would end it early: SIGPIPE with pipefail)
grep -qE '^ *train\.zero ' <<<"$HELP" && HAS_ZERO=1
for z in $ZERO; do
  [ "$z" = 0 ] || ((HAS_ZERO)) || die "ZERO=\"$ZERO\": $BIN has no train.zero key (run with ZERO=0, or build a tree that has ZeRO)"
done

# ---- 2. the cluster
STARTED=0
cleanup() {
  local rc=$?
  set +e
  if ((STARTED)); then
    say "stopping the cluster this script started ($CLUSTER_DIR)"
    bash "$SRC/tests/slurm/stop_cluster.sh" "$CLUSTER_DIR" >/dev/null 2>&1
  fi
  exit "$rc"
}
trap cleanup EXIT
cluster_ok() { [ "$(timeout 10 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" -ge 2 ]; }
if [ -n "${SLURM_CONF:-}" ] && cluster_ok; then
  say "using the running SLURM cluster of SLURM_CONF=$SLURM_CONF"
else
  alive=0
  if [ -f "$CLUSTER_DIR/pids" ]; then
    alive=1
    while read -r _ pid; do kill -0 "$pid" 2>/dev/null || alive=0; done <"$CLUSTER_DIR/pids"
  fi
  rc=0
  bash "$SRC/tests/slurm/start_cluster.sh" "$CLUSTER_DIR" || rc=$?
  ((rc == 0)) || die "cannot start the SLURM cluster in $CLUSTER_DIR (start_cluster.sh exited $rc)"
  ((alive)) || STARTED=1
  # shellcheck disable=SC1091
  source "$CLUSTER_DIR/env.sh"
  cluster_ok || die "the cluster in $CLUSTER_DIR does not show two idle nodes"
fi
cmdlog "# SLURM: SLURM_CONF=$SLURM_CONF ($( ((STARTED)) && echo "started by this script: bash tests/slurm/start_cluster.sh $CLUSTER_DIR" || echo "already running"))"

export NLPTRAIN=$BIN
export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
unset SCRATCH_ROOT RESULTS_DIR LAUNCHER OUTPUT_ON STAGE RESUME REQUEUE NLPTRAIN_INI NLPTRAIN_ARGS
cmdlog "export NLPTRAIN=$BIN OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1"

# ---- machine and code
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)
{
  echo "date (UTC): $(date -u '+%F %T')"
  echo "commit: $COMMIT$( ((DIRTY)) && echo " (working tree differs in $DIRTY tracked file(s))")"
  echo "host: $(hostname); nproc: $NCORES; $(grep -m1 'model name' /proc/cpuinfo | sed 's/\t//')"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "kernel: $(uname -r)"
  echo "MPI: $(mpirun --version 2>/dev/null | head -1)"
  echo "SLURM: $(sinfo -V 2>/dev/null); nodes: $(sinfo -h -N -o '%N(%c cpus)' | sort -u | tr '\n' ' ')"
  echo "train.zero in the binary: $( ((HAS_ZERO)) && echo yes || echo no)"
  echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$WORK/machine.txt"
cat "$WORK/machine.txt"

# ---- 3. data
python3 - "$WORK/data/tokens.h5" <<'PY'
import sys, numpy as np, h5py
with h5py.File(sys.argv[1], "w") as f:
    f.create_dataset("tokens", data=np.random.default_rng(0).integers(0, 256, 400_000).astype(np.int32))
PY

# ---- 4. microbenchmark of the gradient collectives, and their fits
# Kinds: allreduce = blocking MPI_Allreduce (comm.overlap = false), iallreduce = MPI_Iallreduce
# (comm.overlap = true: its buckets), rs_ag = MPI_Ireduce_scatter + MPI_Iallgatherv (train.zero = 1).
kind_args() {
  case $1 in
    allreduce) echo "--max-bytes $BENCH_MAX_BYTES" ;;
    iallreduce) echo "--nonblocking --max-bytes $BENCH_MAX_BYTES_OTHER" ;;
    rs_ag) echo "--collective reduce_scatter_allgather --nonblocking --max-bytes $BENCH_MAX_BYTES_OTHER" ;;
    *) die "BENCH_KINDS: unknown kind '$1' (allreduce, iallreduce, rs_ag)" ;;
  esac
}
if [ -z "${BENCH_KINDS:-}" ]; then
  BENCH_KINDS=allreduce
  [[ " $OVERLAP " == *" true "* ]] && BENCH_KINDS+=" iallreduce"
  [[ " $ZERO " == *" 1 "* ]] && BENCH_KINDS+=" rs_ag"
fi
run_bench() {  # run_bench KIND NxR
  local kind=$1 sz=$2 n=${2%x*} r=${2#*x}
  local out=$WORK/bench/${kind}_$sz.json log=$WORK/bench/${kind}_$sz.txt
  # shellcheck disable=SC2207
  local cmd=(srun --mpi=pmix --exclusive --kill-on-bad-exit=1 --nodes="$n" --ntasks-per-node="$r" --cpus-per-task=1
             --job-name="bench-$kind-$sz" "$BENCH" $(kind_args "$kind") --min-time "$BENCH_MIN_TIME"
             --min-reps "$BENCH_MIN_REPS" --warmup "$BENCH_WARMUP" --label "$sz" --out "$out")
  say "benchmark $kind at $n node(s) x $r rank(s) [load $(cut -d' ' -f1 /proc/loadavg)]"
  cmdlog "${cmd[*]}"
  # One retry: a rank of the benchmark once died in start-up here (SIGSEGV before its first size;
  # not reproduced in 6 further launches); the failed attempt's output is kept next to the result.
  if ! timeout 900 "${cmd[@]}" >"$log" 2>&1; then
    mv "$log" "${log%.txt}.failed.txt"
    say "the benchmark $kind at $sz failed ($(grep -m1 -iE 'error|signal' "${log%.txt}.failed.txt" || echo 'no message')): once more"
    timeout 900 "${cmd[@]}" >"$log" 2>&1 || { tail -20 "$log"; die "the benchmark $kind at $sz failed twice"; }
  fi
}
fit() {  # fit NAME FILES...
  local name=$1; shift
  cmdlog "python3 tools/comm_fit.py --out $WORK/bench/$name.json $*"
  python3 tools/comm_fit.py --out "$WORK/bench/$name.json" "$@" 2>&1 | tee "$WORK/bench/$name.txt"
}
[ -n "$BENCH_SIZES" ] || die "no multi-rank placement to benchmark (SIZES=\"$SIZES\", BENCH_SIZES empty)"
for kind in $BENCH_KINDS; do
  files=()
  for sz in $BENCH_SIZES; do run_bench "$kind" "$sz"; files+=("$WORK/bench/${kind}_$sz.json"); done
  fit "fit_$kind" "${files[@]}"
done
if [ -n "$EXTRA_BENCH_SIZES" ]; then
  files=()
  for sz in $EXTRA_BENCH_SIZES; do run_bench allreduce "$sz"; files+=("$WORK/bench/allreduce_$sz.json"); done
  fit fit_allreduce_extra "${files[@]}"
fi
fit_of() {  # the fit a variant's runs are modelled with: fit_of OVERLAP ZERO
  if [ "$2" != 0 ] && [[ " $BENCH_KINDS " == *" rs_ag "* ]]; then echo rs_ag
  elif [ "$1" = true ] && [[ " $BENCH_KINDS " == *" iallreduce "* ]]; then echo iallreduce
  else echo allreduce; fi
}

# ---- 5. sweeps
model_args=(--data.train="$WORK/data/tokens.h5" --model.vocab_size=256 --model.n_layer="$LAYERS"
            --model.n_head="$HEADS" --model.n_embd="$WIDTH" --model.n_positions="$SEQ" --data.seq_len="$SEQ"
            --train.steps="$STEPS" --train.warmup_steps=0 --run.log_interval=1 --checkpoint.interval=0
            --comm.bucket_mb="$BUCKET_MB")
# shellcheck disable=SC2206
extra=($EXTRA_ARGS)
variants=()
for mode in $MODES; do
  for ov in $OVERLAP; do
    for z in $ZERO; do
      v=$mode-overlap_$ov-zero_$z
      args=("${model_args[@]}" --comm.overlap="$ov")
      ((HAS_ZERO)) && args+=(--train.zero="$z")
      args+=("${extra[@]}")
      sweep=(jobscripts/scaling_sweep.sh --sizes "$SIZES" --serial --sbatch "--exclusive --time=00:20:00"
             --wait --out "$WORK/sweeps/$v")
      case $mode in
        strong) sweep+=(--global-batch "$GLOBAL_BATCH") ;;
        weak) args+=(--train.batch_size="$RANK_BATCH") ;;
        *) die "MODES: '$mode' is neither strong nor weak" ;;
      esac
      say "sweep $v: $SIZES [load $(cut -d' ' -f1 /proc/loadavg)]"
      cmdlog "$(printf '%q ' "${sweep[@]}" -- "${args[@]}")"
      echo "$v start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$WORK/timeline.txt"
      "${sweep[@]}" -- "${args[@]}" >"$WORK/sweeps/$v.txt" 2>&1 ||
        { cat "$WORK/sweeps/$v.txt"; tail -30 "$WORK/sweeps/$v"/logs/*.out 2>/dev/null; die "sweep $v failed"; }
      echo "$v end   $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >>"$WORK/timeline.txt"
      variants+=("$v:$mode:$(fit_of "$ov" "$z")")
    done
  done
done

# ---- 6. reports
for vm in "${variants[@]}"; do
  IFS=: read -r v mode kind <<<"$vm"
  rep=(python3 tools/scaling_report --mode "$mode" --comm-fit "$WORK/bench/fit_$kind.json" --cores "$NCORES"
       --out "$WORK/report/$v" "$WORK/sweeps/$v")
  cmdlog "${rep[*]}"
  "${rep[@]}" >"$WORK/report/$v.txt" 2>&1 || { cat "$WORK/report/$v.txt"; die "scaling_report failed for $v"; }
done
tab=(python3 bench/scaling_study_tables.py --out "$WORK/report/study.md")
for kind in $BENCH_KINDS; do tab+=(--fit "$WORK/bench/fit_$kind.json"); done
for vm in "${variants[@]}"; do
  IFS=: read -r v _ kind <<<"$vm"
  tab+=("$WORK/report/$v=$kind")
done
cmdlog "${tab[*]}"
"${tab[@]}"
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$WORK/machine.txt"
say "report: $WORK/report/study.md (per variant: $WORK/report/<variant>/scaling.md)"

# ---- 7. small files to RESULTS
if [ -n "$RESULTS" ]; then
  mkdir -p "$RESULTS"
  cp "$WORK/machine.txt" "$WORK/commands.txt" "$WORK/timeline.txt" "$WORK/report/study.md" "$RESULTS/"
  mkdir -p "$RESULTS/bench"
  cp "$WORK"/bench/*.json "$WORK"/bench/*.txt "$RESULTS/bench/"
  for vm in "${variants[@]}"; do
    v=${vm%%:*}
    mkdir -p "$RESULTS/$v"
    cp "$WORK/report/$v"/{scaling.csv,fit_model.csv,model.csv} "$RESULTS/$v/"
    # the plots stay in WORK (about 170 KB per variant): tools/scaling_report remakes them from the summaries
    sed 's|^!\[throughput\](throughput.png).*$|(Plots not kept here: `tools/scaling_report --comm-fit ... --out DIR` on this folder makes them.)|' \
      "$WORK/report/$v/scaling.md" >"$RESULTS/$v/scaling.md"
    for d in "$WORK/sweeps/$v"/nodes_*/; do
      [ -f "$d/summary.json" ] || continue
      mkdir -p "$RESULTS/$v/$(basename "$d")"
      cp "$d/summary.json" "$RESULTS/$v/$(basename "$d")/summary.json"
    done
  done
  say "copied the small files to $RESULTS"
fi
say "done in $((SECONDS - T0)) s"
