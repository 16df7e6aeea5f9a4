#!/usr/bin/env bash
# Builds everything and runs every test (GoogleTest under ctest). This is what
# CI runs (.ci/run), on a clean machine. Then, each from its own build dir:
#   build-fuzz  a short pass of every libFuzzer target over its seeds and kept
#               regressions (fuzz/, TANDEM_FUZZ_SECONDS each; docs/fuzzing.md);
#               TANDEM_TEST_FUZZ=0 skips it.
#   build-asan  the whole suite again under AddressSanitizer and
#               UndefinedBehaviorSanitizer (TANDEM_SANITIZE=ON, CUDA off),
#               building only the tests and the programs they start;
#               TANDEM_TEST_ASAN=0 skips it. Timings: docs/fuzzing.md.
# Each phase prints how long it took, so a slow CI run says where.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="$(nproc)"
phase_start=$SECONDS
phase_done() {
  echo "== test.sh: $1 took $(((SECONDS - phase_start) / 60)) min $(((SECONDS - phase_start) % 60)) s"
  phase_start=$SECONDS
}

deploy/install-deps.sh
phase_done "install-deps"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
phase_done "build"
ctest --test-dir build --output-on-failure -j"$jobs"
phase_done "ctest"

if [ "${TANDEM_TEST_FUZZ:-1}" = 1 ]; then
  cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTANDEM_FUZZ=ON -DTANDEM_FUZZ_SECONDS="${TANDEM_FUZZ_SECONDS:-20}" -DTANDEM_ENABLE_CUDA=OFF \
    -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF
  cmake --build build-fuzz -j"$jobs" --target tandem_fuzzers
  ctest --test-dir build-fuzz --output-on-failure -j"$jobs" -L fuzz
  phase_done "fuzz (build and short pass)"
fi

if [ "${TANDEM_TEST_ASAN:-1}" = 1 ]; then
  # -O1 -g1 (as build-fuzz): what ASan's authors recommend, and line tables
  # are all a report's stack needs; -O2 -g costs build time CI does not have.
  cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DTANDEM_SANITIZE=ON -DTANDEM_ENABLE_CUDA=OFF
  cmake --build build-asan -j"$jobs" --target tandem_tests
  phase_done "asan build"
  # Every child process (servers, workers, CLIs) inherits these. A UB report
  # aborts (-fno-sanitize-recover=undefined); leaks fail the process at exit.
  ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
  phase_done "asan ctest"
fi
