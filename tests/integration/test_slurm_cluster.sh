#!/usr/bin/env bash
# The SLURM workflow end to end on a real two-node SLURM cluster on this host (tests/slurm/):
#   (a) sbatch -N2 jobscripts/train_multinode.sh, 2 nodes x 1 rank, srun --mpi=pmix, output.dir on scratch:
#       COMPLETED / ExitCode 0:0 (scontrol and the jobcomp file), summary.json (world_size 2, nodes 2),
#       metrics.jsonl steps 1..N once each, the checkpoint, all copied back to the submit dir, scratch
#       removed on both nodes;
#   (b) jobscripts/train_1node.sh, 1 node x 2 ranks, LAUNCHER=mpirun;
#   (c) requeue: long jobs stopped with `scancel --signal=USR1 --batch` (the path of the jobscripts'
#       `#SBATCH --signal=B:USR1@120`) once they are running and have logged steps; each must exit 75
#       inside, requeue itself, resume from its checkpoint ("resumed from"), and COMPLETE, with
#       metrics.jsonl holding every step exactly once. (c1) srun + output.dir on scratch (restored
#       from the copy-back on both nodes), (c2) mpirun + output.dir on shared storage;
#   (d) jobscripts/scaling_sweep.sh --max-nodes 2: 1- and 2-node runs with their summary.json;
#   (e) a rank that dies (SIGKILL, before MPI_Init: the other rank would wait in MPI for ever) ends the
#       job within SRUN_WAIT s: FAILED, not requeued, "nlptrain failed" in its output, scratch removed;
#   (f) every sbatch line of README.md and jobscripts/README.md, scaled to this cluster, on tiny INIs of
#       the names they give: COMPLETED 0:0 with its results; generate.sh's text written.
#   (g) a new sbatch into (a)'s results dir (not a requeue, so no resume) is refused naming (a)'s run.
#   (h) the stop file: `touch RESULTS_DIR/STOP` on a long srun job with output.dir on scratch: nlptrain
#       checkpoints and exits 75, the job is not requeued (ExitCode 75:0), the file is gone, the
#       checkpoint copied back.
# The copied-back config.ini, log.txt and summary.json name the results dir and the inputs' own paths.
# The jobs run with SRUN_WAIT=10, so every job above also shows that srun --wait cuts neither a normal
# exit nor the exit code 75 short. A rank that crashes leaves a core file when the system allows one;
# a failure then prints its threads' backtraces (gdb).
# Job results stay in $NLPTRAIN_SLURM_TEST_OUT/submit (default OUT: test_slurm_cluster/ next to the
# binary; OUT/submit is replaced at the start), e.g. the sweep's OUT/submit/sweep/nodes_1/summary.json.
# The cluster, its scratch and its daemons are removed at the end (NLPTRAIN_KEEP_CLUSTER=1 keeps the
# cluster dir, stopped, for debugging).
# Exit: 0 pass, 1 fail, 77 skipped (SLURM/munge missing or unable to start here, with the reason).
set -euo pipefail

SRC=${NLPTRAIN_SOURCE_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
BIN=${NLPTRAIN_BIN:-$SRC/build/nlptrain}
T0=$SECONDS
say() { printf '[slurm-test %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
skip() { echo "SKIPPED: $*"; exit 77; }

[ -x "$BIN" ] || { echo "FAIL: nlptrain binary '$BIN' not found (set NLPTRAIN_BIN)" >&2; exit 1; }
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
for b in sbatch squeue scontrol scancel sinfo srun slurmctld slurmd munged rsync mpirun; do
  command -v "$b" >/dev/null || [ -x "/usr/sbin/$b" ] ||
    skip "'$b' is not installed (tools/install_deps.sh installs slurmd slurmctld slurm-client munge rsync openmpi-bin)"
done

OUT=${NLPTRAIN_SLURM_TEST_OUT:-$(dirname "$BIN")/test_slurm_cluster}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/submit"   # the previous run's results (everything this test writes is under OUT/submit)
CL=$(mktemp -d "${TMPDIR:-/tmp}/nlptrain-slurm-test.XXXXXX")
cleanup() {
  local rc=$?
  set +e
  bash "$SRC/tests/slurm/stop_cluster.sh" "$CL" >/dev/null 2>&1
  if [ "${NLPTRAIN_KEEP_CLUSTER:-0}" = 1 ]; then echo "kept the cluster dir $CL"; else rm -rf "$CL"; fi
  exit "$rc"
}
trap cleanup EXIT

# Everything printed on a failure: the job's output, its state, the daemons' logs.
diagnose() {
  local j=${1:-}
  echo "---- diagnostics"
  if [ -n "$j" ]; then
    scontrol show job "$j" 2>&1 | sed 's/^/  /'
    local f
    for f in "$OUT"/submit/slurm-*-"$j".out "$OUT"/submit/sweep/logs/*-"$j".out; do
      [ -f "$f" ] && { echo "---- $f (last 100 lines: a crashed rank's report is about 30)"; tail -n 100 "$f"; }
    done
  fi
  local c
  while IFS= read -r c; do  # a crashed rank's core (core_pattern "core" or "core.PID" in its cwd)
    echo "---- $c ($(stat -c '%y' "$c" 2>/dev/null))"
    if command -v gdb >/dev/null; then
      gdb -q -batch -ex 'info threads' -ex 'thread apply all bt 25' "$BIN" "$c" 2>&1 | tail -n 150
    else
      echo "  (gdb is not installed: no backtrace)"
    fi
  done < <(find "$OUT/submit" -maxdepth 4 -type f \( -name core -o -name 'core.[0-9]*' \) 2>/dev/null)
  echo "---- squeue"; squeue 2>&1 | tail -n 20
  echo "---- sinfo"; sinfo 2>&1
  [ -f "$CL/log/jobcomp.txt" ] && { echo "---- jobcomp.txt"; cat "$CL/log/jobcomp.txt"; }
  for f in "$CL"/log/slurmctld.log "$CL"/log/slurmd.n1.log "$CL"/log/slurmd.n2.log; do
    [ -f "$f" ] && { echo "---- $f (last 25 lines)"; tail -n 25 "$f"; }
  done
}
fail() { echo "FAIL: $1" >&2; diagnose "${2:-}" >&2; exit 1; }

# ---- the cluster
say "starting a two-node SLURM in $CL"
rc=0
bash "$SRC/tests/slurm/start_cluster.sh" "$CL" || rc=$?
((rc == 0)) || { ((rc == 77)) && skip "SLURM cannot run on this machine (see the reason above)"; fail "start_cluster.sh exited $rc"; }
# shellcheck disable=SC1091
source "$CL/env.sh"
[ "$(sinfo -h -N -t idle -o %N | sort -u | tr '\n' ' ')" = "n1 n2 " ] || fail "nodes n1 n2 are not idle"

# ---- the environment the jobs inherit (sbatch exports it)
export NLPTRAIN=$BIN
export OMPI_MCA_btl=self,tcp     # two SLURM "nodes" on one host: no shared-memory transport between them
export OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo  # both "nodes" are 127.0.0.1
export OMPI_MCA_pml=ob1 OMP_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export SRUN_WAIT=10              # (e) ends 10 s after its rank died; every other job runs with it too
ulimit -c unlimited 2>/dev/null || true  # a rank that crashes leaves a core for diagnose()
unset SCRATCH_ROOT RESULTS_DIR LAUNCHER OUTPUT_ON STAGE RESUME REQUEUE NLPTRAIN_INI NLPTRAIN_ARGS
JS=$SRC/jobscripts

# ---- a small dataset and the model (in the submit dir: shared storage for these nodes)
SUB=$OUT/submit
mkdir -p "$SUB/data"
cd "$SUB"
mapfile -t texts < <(ls "$SRC"/src/*/*.cpp "$SRC"/src/*/*.h | head -n 40)
python3 "$SRC/tools/make_dataset.py" --tokenizer byte --layout stream --out data/train.h5 "${texts[@]}" \
  >make_dataset.log 2>&1 || { cat make_dataset.log; fail "tools/make_dataset.py could not write the dataset"; }
cat >tiny.ini <<'EOF'
# A tiny GPT-2 for the SLURM tests: a few hundredths of a second per step on one core.
[run]
log_interval = 1
[model]
vocab_size = 256
n_layer = 2
n_head = 2
n_embd = 32
n_positions = 64
[data]
train = data/train.h5
seq_len = 64
[train]
batch_size = 4
steps = 20
[checkpoint]
interval = 10
EOF

# ---- helpers
field() {  # field JOB NAME: a field of `scontrol show job` (empty when the job is unknown)
  scontrol show job "$1" -o 2>/dev/null | tr ' ' '\n' | awk -F= -v k="$2" '$1 == k {sub(/^[^=]*=/, ""); print; exit}'
}
wait_done() {  # wait_done JOB [TIMEOUT] [MIN_RESTARTS]: until a final state, left in $st
  local j=$1 limit=${2:-300} restarts=${3:-0} t=$SECONDS done_early=0
  while :; do
    st=$(field "$j" JobState)
    case $st in
      COMPLETED)
        (($(field "$j" Restarts) >= restarts)) && break
        # COMPLETED without the restart for 5 s: it ran to its end before the stop signal reached it
        ((++done_early < 5)) ||
          fail "job $j COMPLETED without being requeued: it finished its steps before the stop signal came" "$j"
        ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED) break ;;
      "") fail "job $j is unknown to slurmctld" "$j" ;;
    esac
    ((SECONDS - t < limit)) || fail "job $j not finished after ${limit}s (state $st)" "$j"
    sleep 1
  done
}
check_completed() {  # JobState=COMPLETED, ExitCode=0:0, and the jobcomp file agrees
  local j=$1 st=$2 what=$3
  [ "$st" = COMPLETED ] || fail "$what: job $j ended $st, not COMPLETED" "$j"
  [ "$(field "$j" ExitCode)" = 0:0 ] || fail "$what: job $j ExitCode $(field "$j" ExitCode), not 0:0" "$j"
  local line
  line=$(grep "^JobId=$j " "$CL/log/jobcomp.txt" | tail -n 1 || true)
  [[ $line == *" JobState=COMPLETED "* && $line == *" ExitCode=0:0 "* ]] ||
    fail "$what: jobcomp.txt has no 'JobState=COMPLETED ... ExitCode=0:0' line for job $j: $line" "$j"
}
check_results() {  # check_results DIR JOB WORLD NODES RPN STEPS [RESUMED]: summary, metrics, checkpoint
  local dir=$1 j=$2
  [ -f "$dir/summary.json" ] || fail "no summary.json in $dir" "$j"
  python3 - "$dir" "$3" "$4" "$5" "$6" "${7:-0}" <<'EOF' || fail "results in $dir are wrong (see above)" "$j"
import json, os, re, sys
d, world, nodes, rpn, steps, resumed = sys.argv[1], *map(int, sys.argv[2:])
bad = []
s = json.load(open(os.path.join(d, "summary.json")))
for k, v in (("world_size", world), ("nodes", nodes), ("ranks_per_node", rpn), ("completed", True), ("backend", "cpu")):
    if s.get(k) != v:
        bad.append(f"summary.json: {k} = {s.get(k)!r}, expected {v!r}")
if not s.get("tokens_per_s", 0) > 0:
    bad.append(f"summary.json: tokens_per_s = {s.get('tokens_per_s')!r}")
got = [json.loads(l)["step"] for l in open(os.path.join(d, "metrics.jsonl")) if l.strip() and '"split"' not in l]
if got != list(range(1, steps + 1)):
    dup = sorted({x for x in got if got.count(x) > 1})
    miss = sorted(set(range(1, steps + 1)) - set(got))
    bad.append(f"metrics.jsonl: {len(got)} step lines, expected steps 1..{steps} once each in order "
               f"(duplicated {dup[:10]}, missing {miss[:10]})")
ck = os.path.join(d, "checkpoints", "step_%08d.h5" % steps)
log = open(os.path.join(d, "log.txt")).read()
if resumed:
    m = re.findall(r"resumed from '.*step_(\d+)\.h5' at step (\d+)", log)
    if not m:
        bad.append("log.txt: no 'resumed from' line")
    elif not 0 < int(m[-1][1]) < steps:
        bad.append(f"log.txt: resumed at step {m[-1][1]}, expected between 1 and {steps - 1}")
    else:
        print(f"  {d}: resumed at step {m[-1][1]} of {steps}")
    if "stop signal received" not in log:
        bad.append("log.txt: no 'stop signal received' line")
elif not os.path.isfile(ck):
    bad.append(f"no checkpoint {ck}")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
EOF
}
check_scratch_clean() {  # no nlptrain.JOB left in any node's scratch
  local j=$1 left
  left=$(find "$CL/scratch" -maxdepth 2 -name "nlptrain.$j" 2>/dev/null)
  [ -z "$left" ] || fail "scratch not removed after job $j: $left" "$j"
}
wait_steps() {  # wait_steps JOB FILE N: until FILE shows nlptrain's step N (the job is RUNNING)
  local j=$1 f=$2 n=$3 t=$SECONDS
  while :; do
    [ "$(field "$j" JobState)" = RUNNING ] && [ -f "$f" ] &&
      grep -Eq "^step +$n/" "$f" && return 0
    case $(field "$j" JobState) in PENDING | RUNNING | CONFIGURING) ;; *) fail "job $j ended before it was signalled" "$j" ;; esac
    ((SECONDS - t < 120)) || fail "job $j did not log step $n within 120 s" "$j"
    sleep 0.3
  done
}

# ---- submit everything; the cluster runs what fits (2 nodes x 2 CPUs) and queues the rest
LONG=2000  # long enough (about 10 s of steps here) that the stop signal comes first on a fast machine
say "submitting (a) 2x1 srun, (b) 1x2 mpirun, (c1) 2x1 srun requeue, (c2) 2x1 mpirun requeue, (d) sweep"
JA=$(sbatch --parsable -N2 --ntasks-per-node=1 "$JS/train_multinode.sh" tiny.ini --output.dir=results/a) ||
  fail "sbatch (a) failed"
JB=$(LAUNCHER=mpirun sbatch --parsable --ntasks-per-node=2 "$JS/train_1node.sh" tiny.ini --output.dir=results/b) ||
  fail "sbatch (b) failed"
JC1=$(sbatch --parsable -N2 --ntasks-per-node=1 "$JS/train_multinode.sh" tiny.ini \
        --train.steps=$LONG --checkpoint.interval=0 --output.dir=results/c1) || fail "sbatch (c1) failed"
JC2=$(LAUNCHER=mpirun OUTPUT_ON=shared sbatch --parsable -N2 --ntasks-per-node=1 "$JS/train_multinode.sh" tiny.ini \
        --train.steps=$LONG --checkpoint.interval=0 --output.dir=results/c2) || fail "sbatch (c2) failed"
"$JS/scaling_sweep.sh" --max-nodes 2 --ntasks-per-node 1 --out "$SUB/sweep" tiny.ini >sweep.txt ||
  { cat sweep.txt; fail "scaling_sweep.sh failed"; }
cat sweep.txt
mapfile -t JD < <(cut -f2 "$SUB/sweep/jobs.tsv")
[ "${#JD[@]}" = 2 ] || fail "the sweep submitted ${#JD[@]} jobs, expected 2 (1 and 2 nodes)"
# (e) rank 1 is killed before it starts nlptrain (the OOM killer, a crash in MPI_Init); rank 0 is nlptrain
cat >rank_dies.sh <<EOF
#!/usr/bin/env bash
[ "\${SLURM_PROCID:-0}" = 1 ] && kill -KILL \$\$
exec "$BIN" "\$@"
EOF
chmod +x rank_dies.sh
JE=$(NLPTRAIN=$SUB/rank_dies.sh sbatch --parsable -N2 --ntasks-per-node=1 "$JS/train_multinode.sh" tiny.ini \
       --output.dir=results/e) || fail "sbatch (e) failed"
# (h) a long job stopped by the stop file (looked for every second)
JH=$(NLP_STOPFILE_S=1 sbatch --parsable -N2 --ntasks-per-node=1 "$JS/train_multinode.sh" tiny.ini \
       --train.steps=$((LONG * 5)) --checkpoint.interval=0 --output.dir=results/h) || fail "sbatch (h) failed"
say "jobs: a=$JA b=$JB c1=$JC1 c2=$JC2 sweep=${JD[*]} e=$JE h=$JH"

# ---- (c) signal the long jobs once they are training, the way --signal=B:USR1 does
for j in "$JC1" "$JC2"; do
  wait_steps "$j" "$SUB/slurm-nlptrain-multinode-$j.out" 5
  scancel --signal=USR1 --batch "$j" || fail "scancel --signal=USR1 --batch $j failed" "$j"
  say "(c) job $j running: sent SIGUSR1 to its batch shell"
done

wait_steps "$JH" "$SUB/slurm-nlptrain-multinode-$JH.out" 5
touch "$SUB/results/h/STOP"
say "(h) job $JH running: created results/h/STOP"

# ---- (a)
wait_done "$JA"
check_completed "$JA" "$st" "(a) train_multinode 2x1"
check_results "$SUB/results/a" "$JA" 2 2 1 20
grep -q "staged 1 input file(s) to 2 node(s)" "$SUB/slurm-nlptrain-multinode-$JA.out" || fail "(a) no staging to 2 nodes" "$JA"
# The copied-back files name the paths the user reads, not the job's node scratch.
! grep -l "nlptrain\.$JA/" "$SUB/results/a/config.ini" "$SUB/results/a/log.txt" "$SUB/results/a/summary.json" ||
  fail "(a) node scratch paths in the copied-back files" "$JA"
grep -qx "dir = $SUB/results/a" "$SUB/results/a/config.ini" || fail "(a) config.ini: output.dir is not results/a" "$JA"
grep -qx "train = $SUB/data/train.h5" "$SUB/results/a/config.ini" || fail "(a) config.ini: data.train is not data/train.h5" "$JA"
check_scratch_clean "$JA"
say "(a) pass: 2 nodes x 1 rank COMPLETED 0:0, results copied back to results/a, scratch removed"

# ---- (g) a new sbatch into (a)'s results dir is not a requeue: refused, (a)'s run left as it was
a_metrics=$(md5sum < "$SUB/results/a/metrics.jsonl")
JF=$(sbatch --parsable -N2 --ntasks-per-node=1 "$JS/train_multinode.sh" tiny.ini --output.dir=results/a) ||
  fail "sbatch (g) failed"
wait_done "$JF" 240
[ "$st" = FAILED ] || fail "(g) job $JF into a used results dir: ended $st, expected FAILED" "$JF"
grep -q "holds another training run (run $(cat "$SUB/results/a/run_id"))" "$SUB/slurm-nlptrain-multinode-$JF.out" ||
  fail "(g) job $JF: no refusal naming (a)'s run" "$JF"
[ "$(md5sum < "$SUB/results/a/metrics.jsonl")" = "$a_metrics" ] || fail "(g) job $JF changed (a)'s metrics.jsonl" "$JF"
check_scratch_clean "$JF"
say "(g) pass: a fresh sbatch into (a)'s results dir was refused, (a)'s files unchanged"

# ---- (b)
wait_done "$JB"
check_completed "$JB" "$st" "(b) train_1node 1x2 mpirun"
check_results "$SUB/results/b" "$JB" 2 1 2 20
check_scratch_clean "$JB"
say "(b) pass: 1 node x 2 ranks (mpirun) COMPLETED 0:0"

# ---- (d)
for i in 0 1; do
  n=$((i + 1))
  wait_done "${JD[i]}"
  check_completed "${JD[i]}" "$st" "(d) sweep at $n node(s)"
  check_results "$SUB/sweep/nodes_$n" "${JD[i]}" "$n" "$n" 1 20
  check_scratch_clean "${JD[i]}"
done
say "(d) pass: sweep summaries in $SUB/sweep/nodes_1/summary.json and $SUB/sweep/nodes_2/summary.json"
# The scaling report on the real 1- and 2-node sweep: table, CSV and plots.
python3 "$SRC/tools/scaling_report" --out "$SUB/sweep/report" "$SUB/sweep" > "$SUB/sweep/report.txt" \
  || fail "(d) tools/scaling_report failed on the sweep: $(tail -3 "$SUB/sweep/report.txt")"
[ "$(grep -c '^| 1 |\|^| 2 |' "$SUB/sweep/report/scaling.md")" -ge 2 ] \
  || fail "(d) scaling.md lacks the 1- and 2-node rows"
for png in throughput efficiency step_breakdown model; do
  head -c 8 "$SUB/sweep/report/$png.png" | od -An -tx1 | grep -q '89 50 4e 47' \
    || fail "(d) $png.png is not a PNG"
done
say "(d) pass: scaling_report on the sweep -> $SUB/sweep/report/scaling.md and 4 PNG plots"

# ---- (e)
wait_done "$JE" 240
f=$SUB/slurm-nlptrain-multinode-$JE.out
[ "$st" = FAILED ] || fail "(e) job $JE, one rank killed: ended $st, expected FAILED" "$JE"
[ "$(field "$JE" Restarts)" = 0 ] || fail "(e) job $JE was requeued after a dead rank" "$JE"
line=$(grep "nlptrain exited with code" "$f" | tail -n 1)
[[ $line =~ "exited with code "([0-9]+)" after "([0-9]+)" s" ]] || fail "(e) job $JE: no 'nlptrain exited' line" "$JE"
code=${BASH_REMATCH[1]} secs=${BASH_REMATCH[2]}
((code != 0 && code != 75)) || fail "(e) job $JE: launcher exit code $code after a dead rank" "$JE"
((secs <= SRUN_WAIT + 30)) || fail "(e) job $JE: the step took $secs s to end after a dead rank (SRUN_WAIT=$SRUN_WAIT)" "$JE"
grep -q "nlptrain failed (exit code" "$f" || fail "(e) job $JE: no 'nlptrain failed' line" "$JE"
check_scratch_clean "$JE"
say "(e) pass: a killed rank ended the step after $secs s (SRUN_WAIT=$SRUN_WAIT), job FAILED with code $code, not requeued"

# ---- (c)
for j in "$JC1" "$JC2"; do
  wait_done "$j" 300 1
  check_completed "$j" "$st" "(c) requeue"
  r=$(field "$j" Restarts)
  [ "$r" = 1 ] || fail "(c) job $j restarted $r times, expected 1" "$j"
  f=$SUB/slurm-nlptrain-multinode-$j.out
  grep -q "nlptrain exited with code 75" "$f" || fail "(c) job $j: nlptrain did not exit 75 on SIGUSR1" "$j"
  grep -q "requeueing job $j" "$f" || fail "(c) job $j did not requeue itself" "$j"
  grep -q "restart 1:" "$f" || fail "(c) job $j: no second run in its output" "$j"
  grep -q "^JobId=$j .* JobState=COMPLETED " "$CL/log/jobcomp.txt" || fail "(c) job $j: no COMPLETED jobcomp line" "$j"
  check_scratch_clean "$j"
done
check_results "$SUB/results/c1" "$JC1" 2 2 1 $LONG 1
check_results "$SUB/results/c2" "$JC2" 2 2 1 $LONG 1
say "(c) pass: SIGUSR1 -> checkpoint, exit 75, requeue, resume, COMPLETED (srun+scratch, mpirun+shared)"

# ---- (h)
wait_done "$JH" 300
f=$SUB/slurm-nlptrain-multinode-$JH.out
[ "$st" = FAILED ] && [ "$(field "$JH" ExitCode)" = 75:0 ] ||
  fail "(h) job $JH stopped by the stop file: ended $st $(field "$JH" ExitCode), expected FAILED 75:0" "$JH"
[ "$(field "$JH" Restarts)" = 0 ] || fail "(h) job $JH was requeued after the stop file" "$JH"
grep -q "stop file $SUB/results/h/STOP: moved to the scratch output.dir" "$f" || fail "(h) job $JH: the stop file was not moved" "$JH"
grep -q "stopped by the stop file with a checkpoint; not requeued" "$f" || fail "(h) job $JH: no 'stopped by the stop file' line" "$JH"
[ ! -e "$SUB/results/h/STOP" ] || fail "(h) job $JH: results/h/STOP is still there" "$JH"
line=$(grep -F "stop file '$SUB/results/h/STOP' found by 1 of 2 rank(s) (each looks in its own output.dir) and removed: checkpoint" \
  "$SUB/results/h/log.txt") ||
  fail "(h) job $JH: log.txt has no stop file line" "$JH"
[[ $line =~ "written at step "([0-9]+) ]] || fail "(h) job $JH: $line" "$JH"
[ -f "$SUB/results/h/checkpoints/step_$(printf %08d "${BASH_REMATCH[1]}").h5" ] ||
  fail "(h) job $JH: the checkpoint of step ${BASH_REMATCH[1]} was not copied back" "$JH"
check_scratch_clean "$JH"
say "(h) pass: the stop file -> checkpoint at step ${BASH_REMATCH[1]}, exit 75, not requeued, file removed"

# ---- (f) every sbatch line of README.md and jobscripts/README.md, at this cluster's size
# The lines are read from the two READMEs; their sizes are scaled to the cluster (at most 2 nodes,
# ranks x CPUs per node <= 2, no GPUs, the CUDA backend replaced by the CPU's), and each INI they name
# (and my.ini) is replaced by a tiny GPT-2 INI with that INI's name, on data tokenised with a small
# Hub-style tokenizer folder (tokenizer.json, trained here on the sources), so that generate.sh finds
# the model's tokenizer as a user's job would. What runs is each line's jobscript, at each line's
# node/rank/CPU shape, through sbatch; the generate.sh lines run on the model of the gen_nsmc line.
say "(f) the READMEs' sbatch lines, scaled to 2 nodes x 2 CPUs"
mkdir -p f/tok
ln -sfn "$SRC/jobscripts" "$SUB/jobscripts"
ln -sfn "$SRC/tools" "$SUB/tools"
python3 - "$SRC" "${texts[@]}" >f/lines.tsv <<'PYEOF' || fail "(f) could not read the READMEs' sbatch lines"
import os, re, shlex, sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
src, texts = sys.argv[1], sys.argv[2:]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(texts, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False,
                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save("f/tok/tokenizer.json")
lines, seen = [], set()
for readme in ("README.md", "jobscripts/README.md"):
    text = open(os.path.join(src, readme), encoding="utf-8").read().replace("\\\n", " ")
    for m in re.finditer(r"(?:^|`)\s*(sbatch [^`\n]*)", text, re.M):
        line = re.sub(r"\s+", " ", m.group(1).split(" #")[0]).strip()
        if "..." in line or line in seen:
            continue
        seen.add(line)
        lines.append((readme, line))
for k, (readme, line) in enumerate(lines):
    args = shlex.split(line)[1:]
    i = next(j for j, a in enumerate(args) if a.startswith("jobscripts/"))
    opts, script, rest = args[:i], args[i], args[i + 1:]
    o, j = {}, 0
    while j < len(opts):
        if opts[j] == "-N":
            o["--nodes"], j = opts[j + 1], j + 2
            continue
        key, _, v = opts[j].partition("=")
        o[key], j = v, j + 1
    cpt = min(int(o.get("--cpus-per-task", "1")), 2)
    scaled = [f"--cpus-per-task={cpt}"] if "--cpus-per-task" in o else []  # else the jobscript's header
    if "--nodes" in o:
        scaled.append(f"--nodes={min(int(o['--nodes']), 2)}")
    if "--ntasks-per-node" in o:
        scaled.append(f"--ntasks-per-node={max(1, min(int(o['--ntasks-per-node']), 2 // cpt))}")
    rest = ["--run.backend=cpu" if a == "--run.backend=cuda" else a for a in rest]
    if script != "jobscripts/generate.sh":
        rest.append(f"--output.dir=results/f{k}")
    print(k, readme, line, script, shlex.join(["sbatch", "--parsable"] + scaled + [script] + rest), sep="\t")
PYEOF
VOCAB=$(python3 -c 'import json; print(len(json.load(open("f/tok/tokenizer.json"))["model"]["vocab"]))')
python3 "$SRC/tools/make_dataset.py" --tokenizer f/tok --out data/f.h5 "${texts[@]}" >f/make_dataset.log 2>&1 ||
  { cat f/make_dataset.log; fail "(f) make_dataset.py with the tokenizer folder failed"; }
while IFS=$'\t' read -r _ _ line _ _; do
  for ini in $(grep -o '[^ ]*\.ini' <<<"$line"); do
    mkdir -p "$(dirname "$ini")"
    cat >"$ini" <<INIEOF
# a tiny stand-in for $ini (tests/integration/test_slurm_cluster.sh (f))
[run]
log_interval = 1
[model]
type = gpt2
vocab_size = $VOCAB
n_layer = 1
n_head = 2
n_embd = 32
n_positions = 64
[data]
train = data/f.h5
eval = data/f.h5
seq_len = 32
[train]
batch_size = 2
steps = 4
[eval]
interval = 2
batches = 1
[generate]
max_new_tokens = 4
num_samples = 1
INIEOF
  done
done <f/lines.tsv
printf 'int main\nreturn\n' >prompts.txt
declare -A FJOB
gen_k=""
while IFS=$'\t' read -r k readme line script cmd; do
  [ "$script" != jobscripts/generate.sh ] || continue
  FJOB[$k]=$(eval "$cmd") || fail "(f) $readme: '$line' could not be submitted ($cmd)"
  say "(f) $readme: $line -> $cmd: job ${FJOB[$k]}"
  [[ -n $gen_k || $line != *gen_nsmc.ini* ]] || gen_k=$k
done <f/lines.tsv
while IFS=$'\t' read -r k readme line script cmd; do
  [ "$script" != jobscripts/generate.sh ] || continue
  wait_done "${FJOB[$k]}" 300
  check_completed "${FJOB[$k]}" "$st" "(f) $readme: $line"
  [ -f "results/f$k/summary.json" ] || fail "(f) $readme: '$line' wrote no results/f$k/summary.json" "${FJOB[$k]}"
  check_scratch_clean "${FJOB[$k]}"
done <f/lines.tsv
[ -n "$gen_k" ] && [ -f "results/f$gen_k/best.h5" ] || fail "(f) no gen_nsmc line with a best.h5 for generate.sh"
mkdir -p runs/gen_nsmc && cp "results/f$gen_k/best.h5" runs/gen_nsmc/best.h5
while IFS=$'\t' read -r k readme line script cmd; do
  [ "$script" = jobscripts/generate.sh ] || continue
  rm -rf runs/gen_nsmc/generate runs/gen_nsmc/generate_job
  j=$(NLPTRAIN_BIN=$BIN eval "$cmd") || fail "(f) $readme: '$line' could not be submitted ($cmd)"
  say "(f) $readme: $line -> $cmd: job $j"
  wait_done "$j" 300
  check_completed "$j" "$st" "(f) $readme: $line"
  out=runs/gen_nsmc/generate
  [[ $line != *"--out "* ]] || out=$(sed 's/.*--out \([^ ]*\).*/\1/' <<<"$line")
  [ -s "$out/generated.txt" ] || fail "(f) $readme: '$line' wrote no $out/generated.txt" "$j"
  grep -q -- "--bind-to none" "$SUB/slurm-nlptrain-generate-$j.out" ||
    fail "(f) $readme: '$line': generate_text.py did not run its rank unbound" "$j"
done <f/lines.tsv
say "(f) pass: $(wc -l <f/lines.tsv) sbatch lines of the READMEs COMPLETED at the cluster's size"

[ -z "$(squeue -h -o %i)" ] || fail "jobs left in the queue: $(squeue -h -o %i | tr '\n' ' ')"
say "PASS (results in $SUB; sweep: $SUB/sweep/nodes_1/summary.json, $SUB/sweep/nodes_2/summary.json)"
