#!/usr/bin/env bash
# Scaling sweep: submits the same nlptrain job (jobscripts/train_multinode.sh) at 1, 2, 4, ... nodes
# (powers of two up to --max-nodes, plus --max-nodes itself), each with its own results dir, and
# prints one line per job. Run it on a login node (it calls sbatch; it is not a jobscript itself).
#
#   jobscripts/scaling_sweep.sh [options] [INI] [--section.key=value ...]
#     --max-nodes N          largest node count (default: the number of nodes sinfo reports)
#     --ntasks-per-node R    ranks per node, the same at every size (default: the jobscript's header)
#     --sizes "NxR ..."      instead of the two above: exactly these placements, N nodes x R ranks per
#                            node each, in this order (e.g. "1x1 2x1 2x2": 1, 2 and 4 ranks); the run
#                            of size NxR writes DIR/nodes_<N>x<R>/ (logs/nodes_<N>x<R>-<jobid>.out)
#     --global-batch B       strong scaling: train.batch_size = B / ranks for each job (B sequences per
#                            micro-step over all ranks; train.grad_accum, if set, stays the same);
#                            every rank count must divide B; do not pass --train.batch_size as well
#     --serial               each job waits for the previous one to end (--dependency=afterany):
#                            no two runs of the sweep share the machine (timing sweeps; add
#                            --sbatch --exclusive to keep other jobs off the nodes as well)
#     --out DIR              sweep dir (default runs/scaling-YYYYmmdd-HHMMSS); the run at k nodes
#                            writes DIR/nodes_<k>/ (summary.json, metrics.jsonl, log.txt, ...),
#                            its SLURM output goes to DIR/logs/nodes_<k>-<jobid>.out
#     --sbatch "OPTS"        more sbatch options for every job, word-split (e.g. "--time=00:30:00 -p gpu")
#     --script PATH          the jobscript (default: train_multinode.sh next to this file)
#     --wait                 wait until every job has finished; exit 1 unless all COMPLETED
#     --dry-run              print the sbatch commands, submit nothing
#   Everything after the options is passed to the jobscript: the INI and the overrides. The sweep adds
#   --output.dir=DIR/nodes_<k> (last, so it wins). The environment is exported to the jobs as usual
#   (NLPTRAIN, LAUNCHER, OUTPUT_ON, ... see jobscripts/common.sh).
#
# Without --global-batch it is weak scaling: train.batch_size is per rank, so the global batch grows
# with the rank count; with it, strong scaling (the global batch stays B). Compare tokens_per_s (and
# step_time_s, comm_s) of DIR/nodes_*/summary.json (tools/scaling_report).
# Output: "nodes=<k> job=<id> dir=<results dir>" per job ("nodes=<N> ranks_per_node=<R> ..." with
# --sizes), then "sweep: DIR"; DIR/jobs.tsv lists nodes, job id, results dir and ranks per node (empty
# when not given) of every job.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MAX_NODES="" RPN="" OUT="" SBATCH_OPTS="" SCRIPT=$HERE/train_multinode.sh WAIT=0 DRY=0
SIZES="" GLOBAL_BATCH="" SERIAL=0
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --max-nodes) MAX_NODES=$2; shift 2 ;;
    --max-nodes=*) MAX_NODES=${1#*=}; shift ;;
    --ntasks-per-node) RPN=$2; shift 2 ;;
    --ntasks-per-node=*) RPN=${1#*=}; shift ;;
    --out) OUT=$2; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
    --sizes) SIZES=$2; shift 2 ;;
    --sizes=*) SIZES=${1#*=}; shift ;;
    --global-batch) GLOBAL_BATCH=$2; shift 2 ;;
    --global-batch=*) GLOBAL_BATCH=${1#*=}; shift ;;
    --serial) SERIAL=1; shift ;;
    --sbatch) SBATCH_OPTS=$2; shift 2 ;;
    --sbatch=*) SBATCH_OPTS=${1#*=}; shift ;;
    --script) SCRIPT=$2; shift 2 ;;
    --script=*) SCRIPT=${1#*=}; shift ;;
    --wait) WAIT=1; shift ;;
    --dry-run) DRY=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
die() { echo "scaling_sweep: $*" >&2; exit 1; }
[ -f "$SCRIPT" ] || die "jobscript '$SCRIPT' not found"
[ -z "$GLOBAL_BATCH" ] || [[ $GLOBAL_BATCH =~ ^[1-9][0-9]*$ ]] || die "--global-batch must be a positive integer (got '$GLOBAL_BATCH')"
if [ -n "$GLOBAL_BATCH" ]; then
  for a in "$@"; do
    [[ $a == --train.batch_size || $a == --train.batch_size=* ]] &&
      die "--global-batch sets train.batch_size per job: do not pass $a as well"
  done
fi
# Placements: "N R" per job.
placements=()
if [ -n "$SIZES" ]; then
  [ -z "$MAX_NODES" ] && [ -z "$RPN" ] || die "--sizes replaces --max-nodes and --ntasks-per-node: give one or the other"
  for sz in $SIZES; do
    [[ $sz =~ ^([1-9][0-9]*)x([1-9][0-9]*)$ ]] || die "--sizes: '$sz' is not NODESxRANKS_PER_NODE (e.g. 2x2)"
    placements+=("${BASH_REMATCH[1]} ${BASH_REMATCH[2]}")
  done
  ((${#placements[@]})) || die "--sizes is empty"
  [ "$(printf '%s\n' $SIZES | sort | uniq -d)" = "" ] || die "--sizes lists a placement twice: $SIZES"
fi
if [ -z "$SIZES" ] && [ -z "$MAX_NODES" ]; then
  if ((DRY)); then MAX_NODES=$(sinfo -h -o %D 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)
  else MAX_NODES=$(sinfo -h -o %D | awk '{s += $1} END {print s + 0}'); fi
  [ -n "$MAX_NODES" ] && ((MAX_NODES > 0)) || die "cannot tell the number of nodes (sinfo): pass --max-nodes"
fi
if [ -z "$SIZES" ]; then
  [[ $MAX_NODES =~ ^[1-9][0-9]*$ ]] || die "--max-nodes must be a positive integer (got '$MAX_NODES')"
  [ -z "$RPN" ] || [[ $RPN =~ ^[1-9][0-9]*$ ]] || die "--ntasks-per-node must be a positive integer"
  for ((k = 1; k < MAX_NODES; k *= 2)); do placements+=("$k $RPN"); done
  placements+=("$MAX_NODES $RPN")
fi
if [ -n "$GLOBAL_BATCH" ]; then
  for pl in "${placements[@]}"; do
    read -r k r <<<"$pl"
    [ -n "$r" ] || die "--global-batch needs the ranks of every job: give --ntasks-per-node or --sizes"
    ((GLOBAL_BATCH % (k * r) == 0)) ||
      die "--global-batch $GLOBAL_BATCH is not divisible by the $((k * r)) ranks of ${k}x$r"
  done
fi
OUT=${OUT:-runs/scaling-$(date +%Y%m%d-%H%M%S)}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac

((DRY)) || mkdir -p "$OUT/logs"
((DRY)) || : >"$OUT/jobs.tsv"
# shellcheck disable=SC2206
extra=($SBATCH_OPTS)
jobs=()
prev=""
for pl in "${placements[@]}"; do
  read -r k r <<<"$pl"
  if [ -n "$SIZES" ]; then name=nodes_${k}x$r what="nodes=$k ranks_per_node=$r" jname=nlptrain-sweep-${k}x$r
  else name=nodes_$k what="nodes=$k" jname=nlptrain-sweep-n$k; fi
  dir=$OUT/$name
  cmd=(sbatch --parsable --nodes="$k" --job-name="$jname" --output="$OUT/logs/$name-%j.out")
  [ -z "$r" ] || cmd+=(--ntasks-per-node="$r")
  if ((SERIAL)) && [ -n "$prev" ]; then cmd+=(--dependency="afterany:$prev"); fi
  per_job=()
  [ -z "$GLOBAL_BATCH" ] || per_job+=("--train.batch_size=$((GLOBAL_BATCH / (k * r)))")
  cmd+=("${extra[@]}" "$SCRIPT" "$@" "${per_job[@]}" "--output.dir=$dir")
  if ((DRY)); then
    printf '%s dry-run:' "$what"; printf ' %q' "${cmd[@]}"; echo
    prev=PREVIOUS_JOB
    continue
  fi
  id=$("${cmd[@]}") || die "sbatch failed for $what"
  id=${id%%;*}
  jobs+=("$id")
  prev=$id
  printf '%s\t%s\t%s\t%s\n' "$k" "$id" "$dir" "$r" >>"$OUT/jobs.tsv"
  echo "$what job=$id dir=$dir"
done
echo "sweep: $OUT"
((WAIT)) && ((${#jobs[@]})) || exit 0

# --wait: poll until every job has left the queue; then report each job's final state.
while :; do
  left=0
  for id in "${jobs[@]}"; do
    st=$(scontrol show job "$id" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true)
    case $st in PENDING | RUNNING | CONFIGURING | COMPLETING | REQUEUED | RESIZING | SUSPENDED) left=1 ;; esac
  done
  ((left)) || break
  sleep 2
done
bad=0
for id in "${jobs[@]}"; do
  st=$(scontrol show job "$id" -o 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true)
  echo "job $id: ${st:-unknown (no longer known to slurmctld)}"
  [ "$st" = COMPLETED ] || bad=1
done
exit "$bad"
