#!/usr/bin/env bash
# Builds everything and runs every test (GoogleTest under ctest). This is what
# CI runs (.ci/run), on a clean machine. Then, each from its own build dir:
#   build-fuzz  a short pass of every libFuzzer target over its seeds and kept
#               regressions (fuzz/, TANDEM_FUZZ_SECONDS each; docs/fuzzing.md);
#               TANDEM_TEST_FUZZ=0 skips it.
#   build-asan  the whole suite again under AddressSanitizer and
#               UndefinedBehaviorSanitizer (TANDEM_SANITIZE=ON, CUDA off).
#               Opt-in for now (TANDEM_TEST_ASAN=1): the whole suite has not
#               yet been verified under ASan nor timed against CI's 90 minutes
#               (docs/fuzzing.md says what was).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="$(nproc)"
deploy/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

if [ "${TANDEM_TEST_FUZZ:-1}" = 1 ]; then
  cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DTANDEM_FUZZ=ON -DTANDEM_FUZZ_SECONDS="${TANDEM_FUZZ_SECONDS:-20}" -DTANDEM_ENABLE_CUDA=OFF \
    -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF
  cmake --build build-fuzz -j"$jobs" --target tandem_fuzzers
  ctest --test-dir build-fuzz --output-on-failure -j"$jobs" -L fuzz
fi

if [ "${TANDEM_TEST_ASAN:-0}" = 1 ]; then
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTANDEM_SANITIZE=ON -DTANDEM_ENABLE_CUDA=OFF
  cmake --build build-asan -j"$jobs"
  # Every child process (servers, workers, CLIs) inherits these. A UB report
  # aborts (-fno-sanitize-recover=undefined); leaks fail the process at exit.
  ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
fi
