#!/usr/bin/env bash
# Scaling sweep: submits the same nlptrain job (jobscripts/train_multinode.sh) at 1, 2, 4, ... nodes
# (powers of two up to --max-nodes, plus --max-nodes itself), each with its own results dir, and
# prints one line per job. Run it on a login node (it calls sbatch; it is not a jobscript itself).
#
#   jobscripts/scaling_sweep.sh [options] [INI] [--section.key=value ...]
#     --max-nodes N          largest node count (default: the number of nodes sinfo reports)
#     --ntasks-per-node R    ranks per node, the same at every size (default: the jobscript's header)
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
# It is weak scaling: train.batch_size is per rank, so the global batch grows with the node count;
# compare tokens_per_s (and step_time_s, comm_s) of DIR/nodes_*/summary.json (tools/scaling_report).
# Output: "nodes=<k> job=<id> dir=<results dir>" per job, then "sweep: DIR"; DIR/jobs.tsv lists
# nodes, job id and results dir of every job.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MAX_NODES="" RPN="" OUT="" SBATCH_OPTS="" SCRIPT=$HERE/train_multinode.sh WAIT=0 DRY=0
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case $1 in
    --max-nodes) MAX_NODES=$2; shift 2 ;;
    --max-nodes=*) MAX_NODES=${1#*=}; shift ;;
    --ntasks-per-node) RPN=$2; shift 2 ;;
    --ntasks-per-node=*) RPN=${1#*=}; shift ;;
    --out) OUT=$2; shift 2 ;;
    --out=*) OUT=${1#*=}; shift ;;
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
if [ -z "$MAX_NODES" ]; then
  if ((DRY)); then MAX_NODES=$(sinfo -h -o %D 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)
  else MAX_NODES=$(sinfo -h -o %D | awk '{s += $1} END {print s + 0}'); fi
  [ -n "$MAX_NODES" ] && ((MAX_NODES > 0)) || die "cannot tell the number of nodes (sinfo): pass --max-nodes"
fi
[[ $MAX_NODES =~ ^[1-9][0-9]*$ ]] || die "--max-nodes must be a positive integer (got '$MAX_NODES')"
[ -z "$RPN" ] || [[ $RPN =~ ^[1-9][0-9]*$ ]] || die "--ntasks-per-node must be a positive integer"
OUT=${OUT:-runs/scaling-$(date +%Y%m%d-%H%M%S)}
case $OUT in /*) ;; *) OUT=$PWD/$OUT ;; esac

sizes=()
for ((k = 1; k < MAX_NODES; k *= 2)); do sizes+=("$k"); done
sizes+=("$MAX_NODES")

((DRY)) || mkdir -p "$OUT/logs"
((DRY)) || : >"$OUT/jobs.tsv"
# shellcheck disable=SC2206
extra=($SBATCH_OPTS)
jobs=()
for k in "${sizes[@]}"; do
  dir=$OUT/nodes_$k
  cmd=(sbatch --parsable --nodes="$k" --job-name="nlptrain-sweep-n$k" --output="$OUT/logs/nodes_$k-%j.out")
  [ -z "$RPN" ] || cmd+=(--ntasks-per-node="$RPN")
  cmd+=("${extra[@]}" "$SCRIPT" "$@" "--output.dir=$dir")
  if ((DRY)); then
    printf 'nodes=%s dry-run:' "$k"; printf ' %q' "${cmd[@]}"; echo
    continue
  fi
  id=$("${cmd[@]}") || die "sbatch failed for $k node(s)"
  id=${id%%;*}
  jobs+=("$id")
  printf '%s\t%s\t%s\n' "$k" "$id" "$dir" >>"$OUT/jobs.tsv"
  echo "nodes=$k job=$id dir=$dir"
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
