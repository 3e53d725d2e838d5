#!/usr/bin/env bash
# Single-node nlptrain job: 1 node x R ranks (one per core for the CPU backend, one per
# GPU for run.backend=cuda), launched with srun --mpi=pmix (default) or mpirun (LAUNCHER=mpirun).
#
#   sbatch [--ntasks-per-node=R] [--time=...] jobscripts/train_1node.sh [INI] [--section.key=value ...]
#   e.g. sbatch --ntasks-per-node=32 jobscripts/train_1node.sh inputs/quickstart.ini --train.steps=5000
#        NLPTRAIN=$PWD/build/nlptrain LAUNCHER=mpirun sbatch jobscripts/train_1node.sh my.ini
#   GPUs: sbatch --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=8 jobscripts/train_1node.sh my.ini --run.backend=cuda
#
# What it does (jobscripts/common.sh has the details and every environment variable):
#   1. stages data.train / data.eval / model.weights (from the INI or the overrides) to node-local scratch
#      (${SCRATCH_ROOT:-${SLURM_TMPDIR:-${TMPDIR:-/tmp}}}/nlptrain.$SLURM_JOB_ID) on every node with rsync;
#   2. runs nlptrain with output.dir on that scratch (OUTPUT_ON=scratch, default; restored from the results
#      dir first, for a resume) or on shared storage (OUTPUT_ON=shared), with --train.resume=true only on a
#      requeue of this job (a first run into a results dir of another run is refused: RESUME=true continues it);
#   3. copies the outputs back to the results dir (the configured output.dir, relative to the submit dir;
#      RESULTS_DIR overrides) and removes the scratch on every node (also on errors: trap EXIT);
#   4. on exit code 75 (nlptrain stopped on SIGUSR1 with a checkpoint): scontrol requeue, exit 0; not after
#      the stop file (touch RESULTS_DIR/STOP: checkpoint, exit 75, no requeue).
#
# SBATCH headers (sbatch command-line options override them):
#SBATCH --job-name=nlptrain-1node
#   One node; one rank per core: set --ntasks-per-node to the cores per node.
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#   Cores per rank = run.threads (the CPU backend; cuda: the data/host threads of each GPU rank).
#SBATCH --cpus-per-task=1
#SBATCH --time=02:00:00
#   SIGUSR1 to the batch shell only (B:), 120 s before the time limit: the shell forwards it to the
#   launcher (srun and mpirun both pass it to every rank), nlptrain checkpoints and exits 75 and the
#   job requeues itself. B: because the batch shell exists with both launchers and in every phase;
#   without B: the mpirun-launched ranks of the first node would never be signalled (see common.sh).
#SBATCH --signal=B:USR1@120
#   Allow `scontrol requeue` (and requeue after a node failure); keep one output file over requeues.
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

# common.sh sits next to this script; SLURM runs a copy of it from its spool dir, so find the original.
nlp_here() {
  local d
  for d in "${NLPTRAIN_JOBSCRIPTS:-}" \
           "$(dirname "$(scontrol show job "${SLURM_JOB_ID:-none}" -o 2>/dev/null | grep -o 'Command=[^ ]*' | cut -d= -f2-)")" \
           "$(dirname "${BASH_SOURCE[0]}")" "${SLURM_SUBMIT_DIR:-$PWD}/jobscripts"; do
    [ -n "$d" ] && [ -f "$d/common.sh" ] && { echo "$d"; return; }
  done
  echo "train_1node.sh: cannot find jobscripts/common.sh: set NLPTRAIN_JOBSCRIPTS" >&2
  return 1
}
NLPTRAIN_JOBSCRIPTS=$(nlp_here)
# shellcheck source=jobscripts/common.sh
source "$NLPTRAIN_JOBSCRIPTS/common.sh"

nlp_main 1node "$@"
