#!/usr/bin/env bash
# Installs what nlptrain needs on a fresh Debian 12 machine: the build dependencies (apt-get) and the
# Python packages used by tools/ and tests/ (pip). Safe to run again; skips what is present.
set -euo pipefail

APT_PKGS=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libhdf5-dev hdf5-tools
          libboost-program-options-dev libopenblas-dev libopenblas-openmp-dev libdnnl-dev libgtest-dev slurmd slurmctld slurm-client munge rsync
          clang libclang-rt-dev  # clang + its runtime libraries (libFuzzer, sanitizers): tests/fuzz/
          gdb)  # backtraces of a crashed rank's core in the SLURM test's diagnostics
# pip name, or pip-name:import-name when they differ. nvidia-cudnn-frontend: the header-only cuDNN
# frontend (include/cudnn_frontend.h in the interpreter's purelib) for the CUDA backend's fused attention.
PY_PKGS=(numpy h5py tokenizers transformers safetensors torch pytest matplotlib seqeval accelerate tensorboard pyarrow
         nvidia-cudnn-frontend:cudnn)

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
need_py=()
for p in "${PY_PKGS[@]}"; do
  "$PY" -c "import ${p#*:}" >/dev/null 2>&1 || need_py+=("${p%%:*}")
done
if ((${#need_py[@]})); then
  echo "install_deps: pip install ${need_py[*]}"
  "$PY" -m pip install --quiet --disable-pip-version-check "${need_py[@]}"
fi
echo "install_deps: ok"
