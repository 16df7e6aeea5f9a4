#!/usr/bin/env bash
# Builds everything and runs every test (GoogleTest under ctest). This is what
# CI runs (.ci/run), on a clean machine, in four phases, each timed:
#   install-deps  Debian packages (with node and chromium: the browser and
#                 openai-client tests run, never skip) and the tests' npm packages
#   build         everything, Release (build/)
#   ctest         every test: `unit` (in-process) and `process` (real servers,
#                 workers, CLIs); `ctest --test-dir build -L unit` alone takes
#                 a few minutes
#   sanitize      one clang build (build-sanitize/) with ASan + UBSan and fuzzing
#                 instrumentation: a short pass of every libFuzzer target over
#                 its seeds and kept regressions (TANDEM_FUZZ_SECONDS each), then
#                 the tests of tests/CMakeLists.txt's TANDEM_SANITIZE_TESTS (the
#                 parsers of untrusted bytes, shared memory and IPC, the HTTP
#                 transport) under the sanitizers; TANDEM_TEST_SANITIZE=0 skips
#                 it. docs/fuzzing.md.
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="$(nproc)"
start=$SECONDS
phase_start=$SECONDS
phase_done() {
  echo "== test.sh: $1 took $(((SECONDS - phase_start) / 60)) min $(((SECONDS - phase_start) % 60)) s" \
       "($(((SECONDS - start) / 60)) min in all)"
  phase_start=$SECONDS
}

deploy/install-deps.sh --with-optional
phase_done "install-deps"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
phase_done "build"
ctest --test-dir build --output-on-failure -j"$jobs"
phase_done "ctest (unit and process)"

if [ "${TANDEM_TEST_SANITIZE:-1}" = 1 ]; then
  # -O0 -g1: line tables are all a report's stack needs, and at -O0 this
  # build and its tests take 9.1 min here against 11.0 at -O1 (the tests
  # run slower, the build 2.4 min faster; bench/results/test-sh-phases-zen5-2core.jsonl).
  # -gz (compressed line tables) and -no-pie (no dynamic relocations for the
  # sanitizers' tables) keep the folder small: CI's disk is bounded.
  cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -gz -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O0 -g1 -gz -DNDEBUG" \
    -DCMAKE_EXE_LINKER_FLAGS="-no-pie" \
    -DTANDEM_FUZZ=ON -DTANDEM_FUZZ_SECONDS="${TANDEM_FUZZ_SECONDS:-10}" -DTANDEM_ENABLE_CUDA=OFF \
    -DTANDEM_BUILD_BENCH=OFF -DTANDEM_TESTS=sanitize
  cmake --build build-sanitize -j"$jobs" --target tandem_fuzzers tandem_tests
  phase_done "sanitize build"
  ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -L fuzz
  # A UB report aborts (-fno-sanitize-recover=undefined); leaks fail the process at exit.
  ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1:check_initialization_order=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
    ctest --test-dir build-sanitize --output-on-failure -j"$jobs" -LE fuzz
  phase_done "sanitize (fuzz pass and sanitizer tests)"
fi
echo "== test.sh: every phase passed in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
