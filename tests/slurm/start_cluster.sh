#!/usr/bin/env bash
# Starts a throw-away two-node SLURM cluster on this one host, for tests and for trying the jobscripts.
#
#   tests/slurm/start_cluster.sh [DIR]        then   source DIR/env.sh; sinfo; sbatch ...
#   tests/slurm/stop_cluster.sh  [DIR]
#
# DIR (default $NLPTRAIN_SLURM_DIR, else ${TMPDIR:-/tmp}/nlptrain-slurm-$UID) receives everything:
#   etc/slurm.conf, etc/task_prolog.sh   configuration (written here, never /etc)
#   munge/                               munged's own key, socket, pid, seed and log
#   state/ spool/n1 spool/n2             slurmctld state, per-node slurmd spool (pmix dirs must not collide)
#   tmp/n1 tmp/n2                        per-node TmpFS
#   scratch/n1 scratch/n2                per-node "node-local" scratch: every task sees SLURM_TMPDIR=DIR/scratch/<node>
#                                        (set by the TaskProlog, as many sites do), so staging really is per node
#   log/                                 daemon logs, jobcomp.txt (JobCompType=jobcomp/filetxt: one line per
#                                        finished job with its JobState and ExitCode; there is no sacct)
#   pids                                 "name pid" of every daemon started here (stop_cluster.sh kills these)
#   env.sh                               export SLURM_CONF=...; source it before sinfo/sbatch/squeue/scontrol
#
# The cluster: slurmctld + two slurmd (-N n1, -N n2) as two nodes on 127.0.0.1 with distinct ports
# (SlurmdParameters=config_overrides), CPUs=$NLPTRAIN_SLURM_CPUS (default 2) per node (the host's
# cores are oversubscribed by design), partition "debug" (default), select/cons_tres with CR_CPU,
# proctrack/linuxproc and task/none (no cgroups, no systemd), MpiDefault=pmix, no accounting database,
# SlurmUser = SlurmdUser = the user running this script (root in CI; as another user slurmd may refuse),
# cred_expire=5 (a requeued job may start again after 6 s instead of 121 s).
# Ports are picked free at start-up, so several clusters (e.g. concurrent test runs) can coexist.
#
# Idempotent: when DIR already holds a running cluster that answers, nothing is started. Leftovers of
# a dead one are stopped and replaced. Waits (up to $NLPTRAIN_SLURM_START_TIMEOUT s, default 60) until
# sinfo shows both nodes idle.
# Exit status: 0 = up; 77 = cannot start here (binaries missing, daemons refuse to start: reason printed);
# 1 = usage error.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DIR=${1:-${NLPTRAIN_SLURM_DIR:-${TMPDIR:-/tmp}/nlptrain-slurm-$(id -u)}}
CPUS=${NLPTRAIN_SLURM_CPUS:-2}
TIMEOUT=${NLPTRAIN_SLURM_START_TIMEOUT:-60}
NODES=(n1 n2)

say() { echo "start_cluster: $*"; }
cannot() {  # cannot start here: print why (with the daemon logs) and exit 77
  echo "start_cluster: cannot start SLURM: $*" >&2
  for f in "$DIR"/munge/munged.log "$DIR"/log/*.log; do
    [ -s "$f" ] && { echo "---- tail $f" >&2; tail -n 15 "$f" >&2; }
  done
  bash "$HERE/stop_cluster.sh" "$DIR" >/dev/null 2>&1 || true
  exit 77
}

declare -A BIN
for b in munged slurmctld slurmd sinfo sbatch squeue scontrol scancel srun; do
  p=$(command -v "$b" || true)
  [ -n "$p" ] || for d in /usr/sbin /sbin; do [ -x "$d/$b" ] && p="$d/$b" && break; done
  [ -n "$p" ] || { echo "start_cluster: cannot start SLURM: '$b' not found (Debian packages slurmd slurmctld slurm-client munge; tools/install_deps.sh installs them)" >&2; exit 77; }
  BIN[$b]=$p
done
[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/mpi_pmix.so ] || [ -n "$(find /usr/lib* -name mpi_pmix.so -path '*slurm*' 2>/dev/null | head -1)" ] ||
  { echo "start_cluster: cannot start SLURM: the mpi/pmix plugin is missing (slurm-wlm-basic-plugins)" >&2; exit 77; }

# Already up?
if [ -f "$DIR/pids" ] && [ -f "$DIR/env.sh" ]; then
  alive=1
  while read -r name pid; do kill -0 "$pid" 2>/dev/null || alive=0; done <"$DIR/pids"
  if ((alive)) && SLURM_CONF="$DIR/etc/slurm.conf" timeout 10 sinfo -h >/dev/null 2>&1; then
    say "already running in $DIR"
    exit 0
  fi
  say "stopping the leftovers of a previous cluster in $DIR"
  bash "$HERE/stop_cluster.sh" "$DIR" >/dev/null 2>&1 || true
fi
# Only files of our own layout are removed: refuse a non-empty DIR that is not ours.
if [ -d "$DIR" ] && [ -n "$(ls -A "$DIR")" ] && [ ! -f "$DIR/.nlptrain-slurm" ]; then
  echo "start_cluster: $DIR exists and is not a cluster dir of this script; pick another DIR" >&2
  exit 1
fi
rm -rf "${DIR:?}"/{etc,munge,state,spool,tmp,scratch,log,pids,env.sh}
mkdir -p "$DIR"/{etc,munge,state,log} "${NODES[@]/#/$DIR/spool/}" "${NODES[@]/#/$DIR/tmp/}" "${NODES[@]/#/$DIR/scratch/}"
touch "$DIR/.nlptrain-slurm"
DIR=$(cd "$DIR" && pwd)
chmod 755 "$DIR" "$DIR/munge"  # clients must reach munged's socket (its directory must be o+x)
: >"$DIR/pids"

# Free TCP ports: slurmctld and one slurmd per node.
read -r PORT_CTLD PORT_N1 PORT_N2 < <(python3 - <<'EOF' 2>/dev/null || echo "$((17000 + RANDOM % 2000)) $((19000 + RANDOM % 2000)) $((21000 + RANDOM % 2000))"
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
EOF
)
HOST=$(hostname -s 2>/dev/null || hostname)

# ---- munge: its own key, socket, pid, seed and log files
M=$DIR/munge
dd if=/dev/urandom of="$M/munge.key" bs=1024 count=1 status=none
chmod 400 "$M/munge.key"
"${BIN[munged]}" --foreground --force --key-file="$M/munge.key" --socket="$M/munge.socket.2" \
  --pid-file="$M/munged.pid" --seed-file="$M/munged.seed" --log-file="$M/munged.log" \
  </dev/null >>"$DIR/log/munged.out" 2>&1 &
echo "munged $!" >>"$DIR/pids"
for _ in $(seq 50); do [ -S "$M/munge.socket.2" ] && break; sleep 0.1; done
[ -S "$M/munge.socket.2" ] || cannot "munged did not create its socket $M/munge.socket.2"

# ---- slurm.conf (cgroup-free: no cgroup.conf is read with these plugins)
cat >"$DIR/etc/task_prolog.sh" <<EOF
#!/bin/sh
# TaskProlog: every task (batch script and srun tasks) gets its node's own scratch dir, like a
# site that sets SLURM_TMPDIR to node-local disk. Lines "export NAME=value" go into the task's env.
echo "export SLURM_TMPDIR=$DIR/scratch/\$SLURMD_NODENAME"
EOF
chmod 755 "$DIR/etc/task_prolog.sh"

cat >"$DIR/etc/slurm.conf" <<EOF
# Written by tests/slurm/start_cluster.sh: two simulated nodes on one host.
ClusterName=nlptrain
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT_CTLD
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$M/munge.socket.2,cred_expire=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/state/slurmctld.pid
SlurmdPidFile=$DIR/spool/slurmd.%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$DIR/etc/task_prolog.sh
SwitchType=switch/none
MpiDefault=pmix
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
KillWait=5
MinJobAge=600
SchedulerParameters=sched_interval=2
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
NodeName=n1 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$PORT_N1 CPUs=$CPUS State=UNKNOWN
NodeName=n2 NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$PORT_N2 CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$DIR/env.sh" <<EOF
# source me: the client commands (sinfo, sbatch, squeue, scontrol, scancel, srun) then use this cluster
export SLURM_CONF=$DIR/etc/slurm.conf
export NLPTRAIN_SLURM_DIR=$DIR
EOF
export SLURM_CONF=$DIR/etc/slurm.conf

# ---- daemons, in the foreground of background jobs so that $! is the daemon's PID
"${BIN[slurmctld]}" -D -c -f "$SLURM_CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 &
echo "slurmctld $!" >>"$DIR/pids"
for n in "${NODES[@]}"; do
  "${BIN[slurmd]}" -D -N "$n" -f "$SLURM_CONF" </dev/null >>"$DIR/log/slurmd.$n.out" 2>&1 &
  echo "slurmd.$n $!" >>"$DIR/pids"
done

# ---- wait until both nodes are idle
t0=$SECONDS
while :; do
  while read -r name pid; do
    kill -0 "$pid" 2>/dev/null || cannot "$name (pid $pid) exited during start-up"
  done <"$DIR/pids"
  states=$(timeout 10 sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | tr '\n' ' ' || true)
  if [ "$(timeout 10 sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)" -eq 2 ]; then break; fi
  ((SECONDS - t0 < TIMEOUT)) || cannot "nodes not idle after ${TIMEOUT}s (sinfo: ${states:-no answer})"
  sleep 0.5
done
say "up in $DIR after $((SECONDS - t0))s (slurmctld :$PORT_CTLD, n1 :$PORT_N1, n2 :$PORT_N2, $CPUS CPUs per node); source $DIR/env.sh"
