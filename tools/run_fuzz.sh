#!/usr/bin/env bash
# Fuzzing (tests/fuzz/README.md): builds the libFuzzer harnesses with clang, ASan and UBSan in
# build-fuzz/ (only the fuzzed sources, not the whole program), replays the committed corpora
# (every seed and regression input must pass), then fuzzes each harness for NLPTRAIN_FUZZ_SECONDS
# (default 20; the five run two at a time on 2 cores, about a minute). Called by tools/run_tests.sh.
#   NLPTRAIN_FUZZ_SECONDS=600 bash tools/run_fuzz.sh     # a longer run
set -euo pipefail
cd "$(dirname "$0")/.."
B=${NLPTRAIN_FUZZ_BUILD:-build-fuzz}
cmake -S . -B "$B" -DNLPTRAIN_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNLPTRAIN_FUZZ_SECONDS="${NLPTRAIN_FUZZ_SECONDS:-20}" \
  -DNLPTRAIN_FUZZ_SEED="${NLPTRAIN_FUZZ_SEED:-1}" >/dev/null
cmake --build "$B" -j"$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$B" -L fuzz --output-on-failure -j"$(nproc)"
