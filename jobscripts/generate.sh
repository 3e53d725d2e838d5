#!/usr/bin/env bash
# Text generation as a SLURM job, from text prompts to text with the model's own tokenizer (any Hugging
# Face tokenizer): tools/generate_text.py encodes the prompts, runs nlptrain (run.mode = generate,
# generate.tokenizer = ids) on one rank, and decodes the samples. Submit from the repository root:
#
#   sbatch jobscripts/generate.sh INI WEIGHTS PROMPTS.txt [--out DIR] [-- --section.key=value ...]
#   e.g. sbatch jobscripts/generate.sh inputs/gen_nsmc.ini runs/gen_nsmc/best.h5 prompts.txt
#        sbatch --gpus=1 jobscripts/generate.sh inputs/gen_nsmc.ini runs/gen_nsmc/best.h5 prompts.txt -- --run.backend=cuda
#
# Outputs: DIR (default generate/ beside WEIGHTS) gets prompts.jsonl, generated.jsonl (ids),
# generated_text.jsonl and generated.txt; the text also goes to the job's output file. The script
# runs as is outside SLURM too (bash jobscripts/generate.sh ...).
#SBATCH --job-name=nlptrain-generate
#SBATCH --nodes=1
#SBATCH --ntasks=1
#   2 CPUs fit the smallest node; ask for more with sbatch --cpus-per-task=N: the one rank runs unbound
#   (mpirun --bind-to none) with a thread per CPU of the allocation.
#SBATCH --cpus-per-task=2
#SBATCH --time=00:30:00
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-$PWD}"
if [ ! -f tools/generate_text.py ]; then
  echo "generate.sh: tools/generate_text.py not found in $PWD: submit from the repository root" >&2
  exit 1
fi
# The rank's threads: the CPUs SLURM gave the task (nlptrain reads its affinity mask).
exec python3 tools/generate_text.py "$@"
