#!/usr/bin/env bash
# The quickstart command: install what is missing, build, make the dataset, and train a small GPT-2
# on 2 ranks with `tools/nlprun -np 2 build/nlptrain inputs/quickstart.ini`, ending with a generated sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target nlptrain
bash tools/make_quickstart_data.sh
rm -rf runs/quickstart/out
ROOT=(); [ "$(id -u)" -eq 0 ] && ROOT=(--allow-run-as-root)
export OMPI_MCA_pml=ob1
tools/nlprun -np 2 "${ROOT[@]}" build/nlptrain inputs/quickstart.ini "$@"
# A sample from the final checkpoint (any checkpoint is a valid model.weights file).
mpirun -np 1 "${ROOT[@]}" build/nlptrain inputs/quickstart.ini --run.mode=generate \
  --model.weights="$(ls -1 runs/quickstart/out/checkpoints/step_*.h5 | tail -n 1)"
