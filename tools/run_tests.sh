#!/usr/bin/env bash
# The test command: install dependencies, build (CUDA compiled too when nvcc is present), run every test;
# then the sanitizer build (ASan + UBSan: unit tests and a 2-rank training run, tools/run_sanitized.sh)
# and the fuzzers (corpus replay and a short run of each, tools/run_fuzz.sh).
# Locally, NLPTRAIN_SKIP_SANITIZERS=1 and NLPTRAIN_SKIP_FUZZ=1 skip those two; CI (CI set) always runs them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)" "$@"

skip() {  # skip() VAR: true when VAR=1 and not in CI
  if [ "${!1:-0}" = 1 ]; then
    if [ -n "${CI:-}" ]; then echo "run_tests: $1 is ignored in CI"; return 1; fi
    echo "run_tests: $1=1: skipped"; return 0
  fi
  return 1
}
# NLPTRAIN_SKIP_SANITIZE is accepted as another spelling of NLPTRAIN_SKIP_SANITIZERS.
if [ -n "${NLPTRAIN_SKIP_SANITIZE:-}" ] && [ -z "${NLPTRAIN_SKIP_SANITIZERS:-}" ]; then
  NLPTRAIN_SKIP_SANITIZERS=$NLPTRAIN_SKIP_SANITIZE
fi
stage() {  # stage NAME CMD...: runs a stage and prints how long it took (CI log)
  local t0=$SECONDS
  "${@:2}"
  echo "run_tests: $1 took $((SECONDS - t0)) s"
}
skip NLPTRAIN_SKIP_SANITIZERS || stage sanitizers bash tools/run_sanitized.sh
skip NLPTRAIN_SKIP_FUZZ || stage fuzzing bash tools/run_fuzz.sh
