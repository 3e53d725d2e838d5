#!/usr/bin/env bash
# Sanitizers (tests/sanitize/README.md): builds nlptrain and the C++ unit tests with AddressSanitizer
# and UndefinedBehaviorSanitizer in build-asan/ (CPU backend, -O1 -g), then runs the unit tests and a
# 2-rank training run under mpirun (tests/sanitize/test_mpi_train.sh). Called by tools/run_tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${NLPTRAIN_ASAN_BUILD:-build-asan}
cmake -S . -B "$B" -DNLPTRAIN_CUDA=OFF -DNLPTRAIN_SANITIZE=address,undefined \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g" >/dev/null
cmake --build "$B" -j"$(nproc)"
ctest --test-dir "$B" -L 'unit|sanitize' --output-on-failure -j"$(nproc)"
