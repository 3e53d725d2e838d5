#!/usr/bin/env bash
# Stops the cluster that tests/slurm/start_cluster.sh started in DIR (same default DIR):
# cancels its jobs (so that no slurmstepd or job process is left behind), waits up to 15 s for them
# to end, then stops the daemons listed in DIR/pids by PID (TERM, then KILL after 10 s).
# Idempotent: nothing to do when nothing runs. With --purge, DIR is removed afterwards (only a DIR
# made by start_cluster.sh).
set -uo pipefail

PURGE=0
[ "${1:-}" = "--purge" ] && { PURGE=1; shift; }
DIR=${1:-${NLPTRAIN_SLURM_DIR:-${TMPDIR:-/tmp}/nlptrain-slurm-$(id -u)}}
[ -d "$DIR" ] || { echo "stop_cluster: no cluster dir $DIR"; exit 0; }

alive() { kill -0 "$1" 2>/dev/null; }
if [ -f "$DIR/pids" ]; then
  ctld=$(awk '$1 == "slurmctld" {print $2}' "$DIR/pids")
  if [ -n "$ctld" ] && alive "$ctld" && [ -f "$DIR/etc/slurm.conf" ]; then
    export SLURM_CONF=$DIR/etc/slurm.conf
    if [ -n "$(timeout 10 squeue -h -o %i 2>/dev/null)" ]; then
      timeout 10 scancel --full --signal=KILL -u "$(id -un)" >/dev/null 2>&1 || true
      timeout 10 scancel -u "$(id -un)" >/dev/null 2>&1 || true
      for _ in $(seq 30); do
        [ -z "$(timeout 10 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.5
      done
    fi
  fi
  # slurmd first (its jobs end with it), then slurmctld, munged last.
  pids=$(awk '$1 ~ /^slurmd/ {print $2} $1 == "slurmctld" {c = $2} $1 == "munged" {m = $2} END {print c; print m}' "$DIR/pids")
  for pid in $pids; do alive "$pid" && kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 100); do
    left=0
    for pid in $pids; do alive "$pid" && left=1; done
    ((left)) || break
    sleep 0.1
  done
  for pid in $pids; do alive "$pid" && { echo "stop_cluster: pid $pid ignored TERM, sending KILL"; kill -KILL "$pid" 2>/dev/null; }; done
  rm -f "$DIR/pids"
  echo "stop_cluster: stopped the cluster in $DIR"
fi
if ((PURGE)) && [ -f "$DIR/.nlptrain-slurm" ]; then
  rm -rf "$DIR"
fi
exit 0
