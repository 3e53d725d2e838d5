# shellcheck shell=bash
# common.sh: sourced by the nlptrain jobscripts (train_1node.sh, train_multinode.sh; scaling_sweep.sh
# submits train_multinode.sh). Everything the jobscripts share lives here, in one place: inputs,
# NCCL / Open MPI settings, staging to node-local scratch, launch, copy-back, cleanup, requeue.
#
# ==== The exit code 75 protocol (stop, checkpoint, requeue, resume) ================================
#  1. The jobscripts ask for `#SBATCH --signal=B:USR1@120`: 120 s (up to 60 s earlier, SLURM's event
#     resolution) before the time limit, SLURM sends SIGUSR1 to the batch shell only. `B:` because the
#     batch shell is the one process that exists with every launcher (srun or mpirun) and in every
#     phase (staging, training, copy-back): it traps USR1 and forwards it to the launcher, and srun
#     and mpirun both forward SIGUSR1 to every rank. Without `B:` SLURM would signal every job step
#     but not the batch shell: with LAUNCHER=mpirun the ranks on the first node are children of the
#     batch shell, not of a step, and would never see it, and a staging rsync step would be killed by it.
#     Test or trigger the same path by hand with `scancel --signal=USR1 --batch JOBID`.
#  2. nlptrain, on SIGUSR1 or SIGTERM to any rank, stops every rank at the next step boundary, writes
#     a checkpoint to output.dir/checkpoints/ and exits with code 75 (EX_TEMPFAIL). nlptrain takes the
#     signals from its MPI_Init on; the rank wrapper starts it with SIGUSR1 ignored (a signal before
#     that point would kill it), and the batch shell re-sends SIGUSR1 every $NLP_RESIGNAL_S s (default
#     15) until the launcher has exited.
#  3. On exit code 75 the batch shell copies the outputs back (output.dir on scratch) and cleans the
#     scratch, then runs `scontrol requeue $SLURM_JOB_ID` and exits 0 (REQUEUE=0: exits 75 instead).
#     The jobscripts carry `#SBATCH --requeue` and `--open-mode=append` (one output file for all runs).
#     A SIGTERM to the batch shell (scancel, time limit reached anyway, node shutdown) is forwarded too,
#     as SIGUSR1 (mpirun kills the ranks odls_base_sigkill_timeout s after a SIGTERM to it; a plain
#     `scancel` also sends SIGTERM to every process of the job, the ranks and mpirun included, and then
#     the checkpoint needs the step to end within that delay), but then the job
#     is not requeued: outputs are copied back and the script exits 143. After a cancellation SLURM
#     refuses new job steps, so only the first node's scratch is removed then; the other nodes'
#     scratch is left to the site's epilog / job_container (it is removed in every other case).
#  4. A requeued run (SLURM_RESTART_COUNT > 0) passes `--train.resume=true`: nlptrain continues this
#     job's run from its newest checkpoint in output.dir, or starts it from step 0 when there is none.
#     A first run passes `--train.resume=false`, so a results dir holding another run's checkpoints or
#     metrics (an earlier job, an interactive run) is refused by nlptrain, which names the ways on
#     (RESUME=true to continue that run, --output.overwrite=true to move it to output.dir/previous/). The requeued run finds the
#     checkpoint because output.dir is on shared storage (OUTPUT_ON=shared) or restored to every
#     node's scratch from the copy-back (OUTPUT_ON=scratch, the default). SLURM_RESTART_COUNT (> 0 after
#     a requeue) is printed.
#  A job also stopped this way before its first step (signal during staging) is simply requeued.
#  5. The stop file: `touch RESULTS_DIR/STOP` (any launcher, any phase) stops nlptrain at the next
#     step boundary with a checkpoint and exit code 75 like SIGUSR1, but the job is not requeued: it
#     exits 75 (resubmit with RESUME=true to continue). nlptrain removes the file.
#
# ==== Inputs (environment variables; arguments of the jobscripts) ===================================
#  jobscript [INI] [--section.key=value | --section.key value ...]
#  NLPTRAIN_INI     INI file when none is given as the first argument (optional: defaults + overrides)
#  NLPTRAIN_ARGS    more overrides, word-split (the arguments come after them, so they win)
#  NLPTRAIN         the nlptrain binary (default $SLURM_SUBMIT_DIR/build/nlptrain, else nlptrain on PATH);
#                   it must be readable on every node (shared file system)
#  LAUNCHER         srun (default: `srun --mpi=$SRUN_MPI`, SRUN_MPI default pmix) or mpirun
#                   (Open MPI's mpirun, which starts its daemons through SLURM; MPIRUN_ARGS are added)
#  SCRATCH_ROOT     node-local scratch root, evaluated on each node: default ${SLURM_TMPDIR:-${TMPDIR:-/tmp}}.
#                   This job's scratch is SCRATCH_ROOT/nlptrain.$SLURM_JOB_ID on every node.
#  STAGE            1 (default): rsync the input HDF5 files named by data.train, data.eval and
#                   model.weights (INI or overrides) to every node's scratch (one `srun
#                   --ntasks-per-node=1 rsync` over all nodes) and point nlptrain at the copies. 0: use
#                   them in place (converted to absolute paths).
#  OUTPUT_ON        scratch (default): output.dir is SCRATCH/output on every node (rank 0, on the first
#                   node, writes everything; the other nodes need the checkpoints only for a resume).
#                   Before the run, the results dir is restored into it on every node (resume); after
#                   the run it is copied back to the results dir from the first node (rsync; the
#                   checkpoints/ folder is mirrored, so pruned checkpoints disappear there too).
#                   shared: output.dir is the results dir itself, which every node must see (needed
#                   for resume since every rank reads the checkpoint); nothing is copied. Safer
#                   against node crashes (checkpoints are on shared storage as soon as written).
#  RESULTS_DIR      the results dir: default the configured output.dir (INI or overrides, default "out"),
#                   relative to the submit dir. The outputs always end up there.
#  RESUME           auto (default): true on a requeue of this job (SLURM_RESTART_COUNT > 0), else false |
#                   true | false: passed as --train.resume
#  REQUEUE          1 (default) | 0: requeue on exit code 75
#  NLP_RESIGNAL_S   seconds between SIGUSR1 re-sends while the ranks are stopping (default 15)
#  NLP_STOPFILE_S   OUTPUT_ON=scratch: seconds between looks for RESULTS_DIR/STOP (default 10)
#  SRUN_WAIT        LAUNCHER=srun: seconds srun waits after the first rank has exited before it ends
#                   the others (srun --wait; default 60). A rank that dies (a crash, the OOM killer)
#                   can leave the others waiting in MPI for ever, holding the allocation; with this
#                   the step ends and the job fails instead. Every nlptrain rank leaves MPI_Finalize
#                   at the same time, so normal exits and the exit code 75 are never cut short.
#                   0 = wait for ever (SLURM's default). (mpirun ends the job on a dead rank by itself.)
#  Ranks: one per core for the CPU backend (submit with --ntasks-per-node=<cores> --cpus-per-task=1;
#  run.threads is set to --cpus-per-task unless the INI/overrides set it), one per GPU for
#  run.backend=cuda (submit with --ntasks-per-node=<GPUs> --gpus-per-node=<GPUs>; every rank sees all
#  of its node's GPUs and uses the one of its node-local rank, so do not use --gpus-per-task).
#  Not for this file: the other SLURM settings (partition, account, ...) go on the sbatch command line.
#
# ==== Outputs ========================================================================================
#  RESULTS_DIR: log.txt, metrics.jsonl, config.ini, summary.json, checkpoints/ (see nlptrain --help).
#  The job's stdout/stderr: the jobscript's --output file in the submit dir (appended over requeues).
#  Exit status: nlptrain's (0 done; 75 becomes a requeue and 0; anything else is a failure).

# ---- NCCL (exported only for run.backend=cuda; a value already in the environment wins) ------------
# For the CUDA backend's NCCL communicator (src/comm/comm.h); the CPU backend only uses MPI.
nlp_nccl_settings() {
  export NCCL_DEBUG=${NCCL_DEBUG:-WARN}                 # INFO prints the topology/transport chosen (debugging)
  export NCCL_DEBUG_SUBSYS=${NCCL_DEBUG_SUBSYS:-INIT,NET}  # what NCCL_DEBUG=INFO covers
  # Network interface for NCCL's bootstrap and socket transport: exclude loopback and container bridges.
  # Set it to the cluster's fabric interface (e.g. ib0, hsn0, eth1) where the default picks the wrong one.
  export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker,virbr}
  # InfiniBand HCAs to use (e.g. mlx5_0,mlx5_1 or =mlx5_0:1); unset = all. Only exported when given.
  [ -n "${NCCL_IB_HCA:-}" ] && export NCCL_IB_HCA
  # NCCL_IB_DISABLE=1 forces TCP sockets between nodes (no InfiniBand/RoCE). Only exported when given.
  [ -n "${NCCL_IB_DISABLE:-}" ] && export NCCL_IB_DISABLE
  # GPUDirect RDMA distance (e.g. PHB, SYS); NCCL's topology detection decides when unset.
  [ -n "${NCCL_NET_GDR_LEVEL:-}" ] && export NCCL_NET_GDR_LEVEL
  # NCCL_P2P_DISABLE=1 / NCCL_SHM_DISABLE=1 (intra-node transports) and NCCL_CROSS_NIC, NCCL_IB_GID_INDEX
  # (RoCE) are left to the environment as well: sbatch exports the submitting shell's variables.
  :
}

# ---- Open MPI (a value already in the environment wins) -------------------------------------------
nlp_ompi_settings() {
  # Root (containers, the test cluster): mpirun refuses to start otherwise.
  if [ "$(id -u)" -eq 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}
    export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
  fi
  # Not set here, on purpose (site-dependent; set them in the environment before sbatch, which exports it):
  #  OMPI_MCA_pml=ob1     faster start-up on TCP-only clusters; leave unset on InfiniBand so UCX is used
  #  OMPI_MCA_btl=self,tcp  needed when several SLURM "nodes" share one host (tests/slurm); never on real nodes
  #  OMPI_MCA_btl_tcp_if_include=ib0  the interface Open MPI's TCP traffic should use
  # mpirun binds every rank to one core by default: that would squeeze a rank's run.threads onto one
  # core when --cpus-per-task > 1 (and binds the ranks of two "nodes" sharing a host to the same core).
  # Leave CPU placement to SLURM (srun never gets bindings from Open MPI).
  export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
  export OMPI_MCA_mpi_warn_on_fork=${OMPI_MCA_mpi_warn_on_fork:-0}
  :
}

# ---- small helpers ----------------------------------------------------------------------------------
nlp_log() { printf '[nlptrain-job %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
nlp_die() { printf '[nlptrain-job %s] error: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

# Value of KEY (section.key) in INI file $1: `key = value` lines under [section], comments (#, ;)
# removed, surrounding double quotes removed. Status 3 (and no output) when the key is absent.
nlp_ini_get() {
  local file=$1 want=$2
  [ -n "$file" ] || return 3
  awk -v want="$want" '
    { sub(/\r$/, "") }
    /^[ \t]*[#;]/ { next }
    /^[ \t]*\[/ { s = $0; sub(/^[ \t]*\[[ \t]*/, "", s); sub(/[ \t]*\].*$/, "", s); sec = s; next }
    index($0, "=") {
      k = substr($0, 1, index($0, "=") - 1); v = substr($0, index($0, "=") + 1)
      sub(/#.*$/, "", v)
      gsub(/^[ \t]+|[ \t]+$/, "", k); gsub(/^[ \t]+|[ \t]+$/, "", v)
      if (v ~ /^".*"$/) v = substr(v, 2, length(v) - 2)
      if (sec "." k == want) { val = v; found = 1 }
    }
    END { if (found) { print val; exit 0 } exit 3 }' "$file"
}

# Effective value of KEY: the last --KEY=V / --KEY V in NLP_OVERRIDES, else the INI, else $2 (default).
nlp_cfg() {
  local key=$1 def=${2-} val="" found=0 i n=${#NLP_OVERRIDES[@]}
  for ((i = 0; i < n; i++)); do
    case ${NLP_OVERRIDES[i]} in
      --"$key"=*) val=${NLP_OVERRIDES[i]#--"$key"=}; found=1 ;;
      --"$key") if ((i + 1 < n)); then val=${NLP_OVERRIDES[i + 1]}; found=1; fi ;;
    esac
  done
  if ((found)); then printf '%s\n' "$val"; return; fi
  if [ -n "${NLP_INI:-}" ] && val=$(nlp_ini_get "$NLP_INI" "$key"); then printf '%s\n' "$val"; return; fi
  printf '%s\n' "$def"
}
nlp_cfg_is_set() {  # is KEY given in the overrides or the INI?
  local key=$1 a
  for a in "${NLP_OVERRIDES[@]}"; do [[ $a == --"$key" || $a == --"$key"=* ]] && return 0; done
  [ -n "${NLP_INI:-}" ] && nlp_ini_get "$NLP_INI" "$key" >/dev/null
}
nlp_abs() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$SLURM_SUBMIT_DIR/$1" ;; esac; }

# Shell code (a string) defining nlp_node_scratch, run on each node (batch shell, srun/mpirun tasks):
# SLURM_TMPDIR/TMPDIR are those of the node it runs on.
NLP_SCRATCH_FN='nlp_node_scratch() { printf "%s\n" "${SCRATCH_ROOT:-${SLURM_TMPDIR:-${TMPDIR:-/tmp}}}/nlptrain.${SLURM_JOB_ID}"; }'
eval "$NLP_SCRATCH_FN"

# Run shell code $1 once on every node of the job (extra args: its $1, $2, ...), with
# nlp_node_scratch defined. A separate step that overlaps anything still running; NLP_STEP_TIMEOUT
# (seconds, default 0 = none) bounds it.
nlp_on_every_node() {
  local code=$1; shift
  timeout "${NLP_STEP_TIMEOUT:-0}" srun --overlap --mpi=none --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" \
    --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 \
    bash -c "set -euo pipefail; $NLP_SCRATCH_FN; $code" nlptrain-node "$@"
}

# ---- setup: parse the inputs, decide ranks and paths -----------------------------------------------
# nlp_setup JOBKIND "$@"   (JOBKIND: 1node | multinode; only used in messages)
nlp_setup() {
  NLP_KIND=$1; shift
  [ -n "${SLURM_JOB_ID:-}" ] || nlp_die "not inside a SLURM job: submit with sbatch (or run under salloc)"
  : "${SLURM_SUBMIT_DIR:=$PWD}"
  NLP_INI=${NLPTRAIN_INI:-}
  if (($#)) && [[ $1 != --* ]]; then NLP_INI=$1; shift; fi
  [ -z "$NLP_INI" ] || NLP_INI=$(nlp_abs "$NLP_INI")
  [ -z "$NLP_INI" ] || [ -f "$NLP_INI" ] || nlp_die "INI file '$NLP_INI' not found"
  # shellcheck disable=SC2206
  NLP_OVERRIDES=(${NLPTRAIN_ARGS:-} "$@")
  local a
  for a in "${NLP_OVERRIDES[@]}"; do
    [[ $a == *__NODE_SCRATCH__* ]] && nlp_die "argument '$a' contains the reserved word __NODE_SCRATCH__"
  done

  if [ -z "${NLPTRAIN:-}" ]; then
    if [ -x "$SLURM_SUBMIT_DIR/build/nlptrain" ]; then NLPTRAIN=$SLURM_SUBMIT_DIR/build/nlptrain
    else NLPTRAIN=$(command -v nlptrain || true); fi
  fi
  [ -n "$NLPTRAIN" ] && [ -x "$NLPTRAIN" ] || nlp_die "nlptrain binary not found: set NLPTRAIN=/path/to/nlptrain"
  NLPTRAIN=$(nlp_abs "$NLPTRAIN")

  LAUNCHER=${LAUNCHER:-srun}
  case $LAUNCHER in srun | mpirun) ;; *) nlp_die "LAUNCHER=$LAUNCHER: use srun or mpirun" ;; esac
  SRUN_MPI=${SRUN_MPI:-pmix}
  OUTPUT_ON=${OUTPUT_ON:-scratch}
  case $OUTPUT_ON in scratch | shared) ;; *) nlp_die "OUTPUT_ON=$OUTPUT_ON: use scratch or shared" ;; esac
  STAGE=${STAGE:-1}
  RESUME=${RESUME:-auto}
  case $RESUME in
    auto) if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then RESUME=true; else RESUME=false; fi ;;
    true | false) ;;
    *) nlp_die "RESUME=$RESUME: use auto, true or false" ;;
  esac
  REQUEUE=${REQUEUE:-1}
  NLP_RESIGNAL_S=${NLP_RESIGNAL_S:-15}
  NLP_STOPFILE_S=${NLP_STOPFILE_S:-10}
  SRUN_WAIT=${SRUN_WAIT:-60}
  [[ $SRUN_WAIT =~ ^[0-9]+$ ]] || nlp_die "SRUN_WAIT=$SRUN_WAIT: give whole seconds (0 = wait for ever)"

  NLP_BACKEND=$(nlp_cfg run.backend cpu)
  NLP_NODES=${SLURM_JOB_NUM_NODES:-1}
  NLP_RPN=${SLURM_NTASKS_PER_NODE:-}
  if [ -z "$NLP_RPN" ]; then  # only --ntasks was given: spread evenly
    NLP_RPN=$(( ${SLURM_NTASKS:-1} / NLP_NODES )); ((NLP_RPN > 0)) || NLP_RPN=1
  fi
  NLP_CPT=${SLURM_CPUS_PER_TASK:-1}
  if [ "$NLP_BACKEND" = cuda ]; then
    nlp_nccl_settings
    local gpus=${SLURM_GPUS_ON_NODE:-}
    [ -z "$gpus" ] || [ "$gpus" -eq "$NLP_RPN" ] ||
      nlp_die "run.backend=cuda wants one rank per GPU: $gpus GPU(s) but $NLP_RPN task(s) per node; submit with --ntasks-per-node=$gpus"
  fi
  nlp_ompi_settings
  NLP_NTASKS=$((NLP_NODES * NLP_RPN))

  RESULTS_DIR=$(nlp_abs "${RESULTS_DIR:-$(nlp_cfg output.dir out)}")
  NLP_SCRATCH=$(nlp_node_scratch)   # this (the first) node's; the same expression on every node
  NLP_LAUNCHED=0 NLP_COPIED=0 NLP_CLEANED=0 NLP_STOP=0 NLP_TERM=0 NLP_LAUNCH_PID="" NLP_RESIGNAL_PID="" NLP_WATCH_PID=""
  trap 'nlp_on_usr1' USR1
  trap 'nlp_on_term' TERM
  trap 'nlp_on_exit' EXIT

  nlp_log "job $SLURM_JOB_ID ($NLP_KIND) restart ${SLURM_RESTART_COUNT:-0}: $NLP_NODES node(s) [${SLURM_JOB_NODELIST:-?}] x $NLP_RPN rank(s), $NLP_CPT cpu(s) per rank, backend $NLP_BACKEND, launcher $LAUNCHER"
  nlp_log "binary $NLPTRAIN | INI ${NLP_INI:-(none)} | overrides: ${NLP_OVERRIDES[*]:-(none)}"
  nlp_log "results dir $RESULTS_DIR | output.dir on $OUTPUT_ON | node scratch $NLP_SCRATCH (on each node)"
}

# ---- staging: input files to every node's scratch; restore the outputs there for a resume -----------
nlp_stage() {
  NLP_ARGS=() NLP_STAGED=()
  local key src name pairs=()
  for key in data.train data.eval model.weights; do
    src=$(nlp_cfg "$key" "")
    [ -n "$src" ] || continue
    src=$(nlp_abs "$src")
    [ -f "$src" ] || nlp_die "$key: '$src' not found (paths are relative to the submit dir $SLURM_SUBMIT_DIR)"
    if [ "$STAGE" = 1 ]; then
      name="$key-$(basename "$src")"
      pairs+=("$src" "$name")
      NLP_ARGS+=("--$key=__NODE_SCRATCH__/data/$name")
      NLP_STAGED+=("$NLP_SCRATCH/data/$name" "$src")
    else
      NLP_ARGS+=("--$key=$src")
    fi
  done
  if [ "$OUTPUT_ON" = scratch ]; then
    NLP_ARGS+=("--output.dir=__NODE_SCRATCH__/output")
  else
    NLP_ARGS+=("--output.dir=$RESULTS_DIR")
  fi
  mkdir -p "$RESULTS_DIR"
  local restore=""
  if [ "$OUTPUT_ON" = scratch ] && [ -n "$(ls -A "$RESULTS_DIR" 2>/dev/null)" ]; then restore=$RESULTS_DIR; fi
  if ((${#pairs[@]})) || [ -n "$restore" ] || [ "$OUTPUT_ON" = scratch ]; then
    local t0=$SECONDS
    # $1 = results dir to restore (or ""), then pairs: source, name.
    nlp_on_every_node '
      S=$(nlp_node_scratch); mkdir -p "$S/data" "$S/output"
      restore=$1; shift
      while (($#)); do rsync -a --partial "$1" "$S/data/$2"; shift 2; done
      [ -z "$restore" ] || rsync -a --exclude=/STOP "$restore/" "$S/output/"' "$restore" "${pairs[@]}" ||
      nlp_die "staging to the node-local scratch failed"
    nlp_log "staged $((${#pairs[@]} / 2)) input file(s)${restore:+ and restored $restore} to $NLP_NODES node(s) in $((SECONDS - t0)) s"
  fi
}

# ---- launch and wait ----------------------------------------------------------------------------------
# The rank wrapper: replaces __NODE_SCRATCH__ in the arguments by this node's scratch and execs nlptrain
# with SIGUSR1 ignored until nlptrain installs its own handler (its training loop); see the protocol.
NLP_RANK_WRAPPER='S=$(nlp_node_scratch); trap "" USR1; exec "${@//__NODE_SCRATCH__/$S}"'

nlp_launch() {
  local args=()
  [ -z "$NLP_INI" ] || args+=("$NLP_INI")
  args+=("${NLP_OVERRIDES[@]}")
  if [ "$NLP_BACKEND" = cpu ] && ! nlp_cfg_is_set run.threads; then args+=("--run.threads=$NLP_CPT"); fi
  args+=("${NLP_ARGS[@]}" "--train.resume=$RESUME")
  local pre
  # No --kill-on-bad-exit: every rank exits 75 after MPI_Finalize when stopped, and killing the
  # others as soon as the first one is out would turn 75 into a signal status. --wait instead: a rank
  # that dies before the others have a connection to it (in or just after MPI_Init) leaves them
  # waiting in MPI for ever; srun ends them SRUN_WAIT s after the first rank has exited.
  if [ "$LAUNCHER" = srun ]; then
    pre=(srun --mpi="$SRUN_MPI" --nodes="$NLP_NODES" --ntasks="$NLP_NTASKS" --ntasks-per-node="$NLP_RPN"
         --cpus-per-task="$NLP_CPT" --wait="$SRUN_WAIT")
  else
    # shellcheck disable=SC2206
    pre=(mpirun -np "$NLP_NTASKS" --map-by "ppr:$NLP_RPN:node" ${MPIRUN_ARGS:-})
  fi
  local cmd=("${pre[@]}" bash -c "$NLP_SCRATCH_FN; $NLP_RANK_WRAPPER" nlptrain-rank "$NLPTRAIN" "${args[@]}")
  nlp_log "launch: ${pre[*]} <rank wrapper> $NLPTRAIN ${args[*]}"
  if ((NLP_STOP)); then
    nlp_log "stop requested before the launch: not starting nlptrain"
    NLP_RC=75
    return
  fi
  NLP_LAUNCHED=1
  local t0=$SECONDS
  "${cmd[@]}" &
  NLP_LAUNCH_PID=$!
  nlp_watch_stop_file
  NLP_RC=0
  wait "$NLP_LAUNCH_PID" || NLP_RC=$?
  # wait returns early (> 128) when a trapped signal arrives: wait again until the launcher is gone.
  while kill -0 "$NLP_LAUNCH_PID" 2>/dev/null; do
    NLP_RC=0
    wait "$NLP_LAUNCH_PID" || NLP_RC=$?
  done
  NLP_LAUNCH_PID=""
  if [ -n "$NLP_WATCH_PID" ]; then
    kill "$NLP_WATCH_PID" 2>/dev/null || true
    wait "$NLP_WATCH_PID" 2>/dev/null || true
    NLP_WATCH_PID=""
  fi
  if [ -n "$NLP_RESIGNAL_PID" ]; then
    kill "$NLP_RESIGNAL_PID" 2>/dev/null || true
    wait "$NLP_RESIGNAL_PID" 2>/dev/null || true
    NLP_RESIGNAL_PID=""
  fi
  nlp_log "nlptrain exited with code $NLP_RC after $((SECONDS - t0)) s"
  # Both launchers report 75 when every rank exits 75.
}

# ---- the stop file -------------------------------------------------------------------------------------
# touch RESULTS_DIR/STOP stops the run like SIGUSR1 (checkpoint, exit code 75), but the job is not
# requeued. nlptrain looks for STOP in its output.dir at every step boundary: with OUTPUT_ON=shared
# that is the results dir itself; with OUTPUT_ON=scratch this loop moves RESULTS_DIR/STOP into the
# first node's scratch output.dir (rank 0's; any rank seeing it stops them all) every NLP_STOPFILE_S s.
nlp_watch_stop_file() {
  [ "$OUTPUT_ON" = scratch ] || return 0
  ( trap - USR1 TERM EXIT
    while kill -0 "$NLP_LAUNCH_PID" 2>/dev/null; do
      if [ -e "$RESULTS_DIR/STOP" ] && mv -f "$RESULTS_DIR/STOP" "$NLP_SCRATCH/output/STOP" 2>/dev/null; then
        nlp_log "stop file $RESULTS_DIR/STOP: moved to the scratch output.dir; nlptrain stops after the step in progress with a checkpoint (no requeue)"
      fi
      sleep "$NLP_STOPFILE_S"
    done ) &
  NLP_WATCH_PID=$!
}

# Whether nlptrain's newest stop was the stop file's (its log.txt, copied back to the results dir).
nlp_stopped_by_file() {
  [ -f "$RESULTS_DIR/log.txt" ] || return 1
  grep -E "^(stop signal received|stop file '.*' found|signal: )" "$RESULTS_DIR/log.txt" | tail -n 1 | grep -q "^stop file "
}

# ---- signals ------------------------------------------------------------------------------------------
nlp_on_usr1() {
  NLP_STOP=1
  if [ -n "$NLP_LAUNCH_PID" ]; then
    nlp_log "SIGUSR1: asking nlptrain to checkpoint and stop (exit 75 -> requeue)"
    kill -USR1 "$NLP_LAUNCH_PID" 2>/dev/null || true
    if [ -z "$NLP_RESIGNAL_PID" ]; then  # re-send until the launcher exits (ranks still starting up)
      ( trap - USR1 TERM EXIT
        while sleep "$NLP_RESIGNAL_S"; kill -0 "$NLP_LAUNCH_PID" 2>/dev/null; do
          kill -USR1 "$NLP_LAUNCH_PID" 2>/dev/null || true
        done ) &
      NLP_RESIGNAL_PID=$!
    fi
  else
    nlp_log "SIGUSR1 before nlptrain started: the job will be requeued without training"
  fi
}
nlp_on_term() {
  NLP_TERM=1 NLP_STOP=1
  # Passed on as SIGUSR1: mpirun kills the ranks odls_base_sigkill_timeout (1) s after a SIGTERM to it.
  nlp_log "SIGTERM (job cancelled or out of time): asking nlptrain to checkpoint and stop (SIGUSR1 to the launcher), no requeue"
  [ -z "$NLP_LAUNCH_PID" ] || kill -USR1 "$NLP_LAUNCH_PID" 2>/dev/null || true
}

# ---- copy-back, cleanup, requeue --------------------------------------------------------------------
nlp_copy_back() {
  ((NLP_LAUNCHED)) && ((!NLP_COPIED)) && [ "$OUTPUT_ON" = scratch ] || return 0
  NLP_COPIED=1
  local src=$NLP_SCRATCH/output
  [ -d "$src" ] || { nlp_log "copy-back: $src does not exist (nothing written)"; return 0; }
  mkdir -p "$RESULTS_DIR"
  local ok=1
  if [ -d "$src/checkpoints" ]; then
    rsync -a --delete "$src/checkpoints/" "$RESULTS_DIR/checkpoints/" || ok=0
  fi
  rsync -a --exclude=/checkpoints "$src/" "$RESULTS_DIR/" || ok=0
  ((!ok)) || nlp_unscratch_paths || ok=0
  if ((ok)); then nlp_log "copied $src back to $RESULTS_DIR"
  else nlp_log "copy-back of $src to $RESULTS_DIR FAILED (scratch kept)"; NLP_CLEANED=1; return 1; fi
}

# The copied-back config*.ini, log.txt and summary.json name the paths the user reads: the staged
# inputs' own paths and the results dir instead of this job's node-local scratch.
nlp_unscratch_paths() {
  local f i expr=() esc_from esc_to
  nlp_sed_escape() { printf '%s' "$1" | sed 's/[][\\.*^$|/&]/\\&/g'; }
  for ((i = 0; i < ${#NLP_STAGED[@]}; i += 2)); do
    esc_from=$(nlp_sed_escape "${NLP_STAGED[i]}"); esc_to=$(nlp_sed_escape "${NLP_STAGED[i + 1]}")
    expr+=(-e "s|$esc_from|$esc_to|g")
  done
  esc_from=$(nlp_sed_escape "$NLP_SCRATCH/output"); esc_to=$(nlp_sed_escape "$RESULTS_DIR")
  expr+=(-e "s|$esc_from|$esc_to|g")
  for f in "$RESULTS_DIR"/config*.ini "$RESULTS_DIR"/log.txt "$RESULTS_DIR"/summary.json; do
    [ -f "$f" ] || continue
    sed -i "${expr[@]}" "$f" || return 1
  done
}

nlp_cleanup() {
  ((!NLP_CLEANED)) || return 0
  NLP_CLEANED=1
  # The other nodes' scratch needs a job step; after a cancellation SLURM may refuse new steps, and
  # then only the site's epilog (or job_container/tmpfs) can remove it.
  if ((NLP_NODES > 1)); then
    local limit=120; ((!NLP_TERM)) || limit=5
    NLP_STEP_TIMEOUT=$limit nlp_on_every_node 'rm -rf "$(nlp_node_scratch)"' >/dev/null 2>&1 ||
      nlp_log "cleanup: could not run a step on every node (the scratch may be left on some)"
  fi
  rm -rf "$NLP_SCRATCH"
  nlp_log "removed the node-local scratch nlptrain.$SLURM_JOB_ID"
}

# Final step of the jobscripts: copy back, clean up, then exit / requeue according to NLP_RC.
nlp_finish() {
  local rc=${NLP_RC:-1}
  nlp_copy_back || { ((rc != 0)) || rc=1; }
  nlp_cleanup
  trap - EXIT
  if ((rc == 75)); then
    if ((NLP_TERM)); then
      nlp_log "stopped by SIGTERM with a checkpoint; not requeued (resubmit to continue)"
      exit 143
    fi
    if nlp_stopped_by_file; then
      nlp_log "stopped by the stop file with a checkpoint; not requeued (resubmit with RESUME=true to continue)"
      exit 75
    fi
    if [ "$REQUEUE" = 1 ]; then
      nlp_log "exit code 75: requeueing job $SLURM_JOB_ID (it resumes from the newest checkpoint)"
      if scontrol requeue "$SLURM_JOB_ID"; then exit 0; fi
      nlp_log "scontrol requeue failed: exiting 75 (resubmit to continue)"
    fi
    exit 75
  fi
  if ((rc == 0)); then nlp_log "done: outputs in $RESULTS_DIR"
  else nlp_log "nlptrain failed (exit code $rc); outputs in $RESULTS_DIR"; fi
  exit "$rc"
}

nlp_on_exit() {  # an early exit (error, set -e): still copy back what exists and clean the scratch
  local rc=$?
  set +e
  [ -z "$NLP_LAUNCH_PID" ] || kill -TERM "$NLP_LAUNCH_PID" 2>/dev/null
  [ -z "$NLP_RESIGNAL_PID" ] || kill "$NLP_RESIGNAL_PID" 2>/dev/null
  [ -z "$NLP_WATCH_PID" ] || kill "$NLP_WATCH_PID" 2>/dev/null
  nlp_copy_back
  nlp_cleanup
  exit "$rc"
}

# The whole job: setup, staging, launch, finish. Used by train_1node.sh and train_multinode.sh.
nlp_main() {  # nlp_main JOBKIND "$@"
  nlp_setup "$@"
  nlp_stage
  nlp_launch
  nlp_finish
}
