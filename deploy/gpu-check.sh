#!/usr/bin/env bash
# Runs tandem's CUDA checks on a GPU machine from binaries built elsewhere.
#
# The GPU machine (an H100, sm_90, with CUDA 13's libraries, nvcc and PyTorch
# installed but none of tandem's Debian libraries, and no network) is lent
# for one command at a time, with at most 64 MiB of files carried along. So
# the build happens here and a small bundle travels:
#
#   1. Here, build for sm_90 only (a five-arch build is slower and bigger):
#        cmake -S . -B /tmp/build-cuda90 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90
#        cmake --build /tmp/build-cuda90 -j2 --target tandem-gpu-info tandem-gpu-bench tandem-scenario-bench cuda_device_test \
#          cuda_expert_pool_test cuda_quant_pool_test cuda_backend_test gpu_runtime_test
#      (building a test also builds the server, CLI and Python module it
#      depends on; that is the test CMakeLists' rule, not needed here.)
#   2. Here, bundle the binaries and every shared library `ldd` resolves for
#      them, except the C runtime (glibc, libstdc++, libgcc_s: the GPU
#      machine's are newer and compatible) and CUDA's own (libcuda is the
#      driver's; libcublas/libcublasLt are ~600 MB, far over the limit, and
#      the GPU machine has them):
#        deploy/gpu-check.sh bundle /tmp/build-cuda90 build-gpu
#      build-gpu/ is inside the repo and ignored by .gitignore (/build*/),
#      so it can be carried. It holds one file, tandem-gpu.tar.xz: the
#      stripped binaries and libraries unpacked come to ~65 MiB (libdnnl
#      alone is 38 MiB; each test binary ~5 MiB), over the 64 MiB a call
#      carries, and xz brings them to ~15 MiB. The script refuses an archive
#      over 60 MiB.
#   3. On the GPU machine, in one call (carry: ["build-gpu"]):
#        deploy/gpu-check.sh run build-gpu
#      (each mode unpacks the archive into /tmp/tandem-gpu first.)
#      It finds CUDA 13's libcublas there (/usr/local/cuda*/lib64, or the
#      nvidia-cublas Python wheel PyTorch uses), prints tandem-gpu-info,
#      runs each CUDA test, and fails if any test fails or SKIPS (a skip on
#      a GPU machine means the GPU was not seen). Logs go to $OUT when set.
#   4. On the GPU machine, the benchmarks (Fiddler App. A, PCIe peak,
#      migration overlap; bench/gpu_bench.cc), in one call:
#        deploy/gpu-check.sh bench build-gpu [tandem-gpu-bench flags...]
#      writes $OUT/gpu-bench.jsonl (JSON lines as bench/results/ holds them;
#      copy it there under a name saying the machine) and
#      $OUT/gpu-bench.log (stderr). About a minute with the defaults.
#      `deploy/gpu-check.sh all build-gpu` runs the tests, then the bench.
#   5. On the GPU machine, the CUDA tests under compute-sanitizer (its
#      memcheck, then racecheck; the toolkit's /usr/local/cuda*/bin):
#        deploy/gpu-check.sh sanitize build-gpu [TOOL...]
#      logs in $OUT/sanitize-TOOL-TEST.log; fails on any reported error.
#      Slow (racecheck instruments every shared-memory access): run it in
#      a call of its own.
#
# Exit status: 0 when every test passed on the GPU (run), when the bench
# measured (bench: tandem-gpu-bench's own status, 2 = no GPU seen), or both
# (all).
set -euo pipefail

BINARIES=(tandem-gpu-info tandem-gpu-bench tandem-scenario-bench cuda_device_test cuda_expert_pool_test cuda_quant_pool_test cuda_backend_test gpu_runtime_test)
# The GoogleTest binaries `run` runs, in this order (the cheap ones first).
TESTS=(cuda_device_test cuda_expert_pool_test cuda_quant_pool_test cuda_backend_test gpu_runtime_test)
ARCHIVE=tandem-gpu.tar.xz
UNPACKED=/tmp/tandem-gpu
LIMIT_BYTES=$((60 * 1024 * 1024))

usage() {
  echo "usage: $0 bundle BUILD_DIR [BUNDLE_DIR]   (here: collect binaries + libraries)" >&2
  echo "       $0 run [BUNDLE_DIR]                (on the GPU machine: the CUDA tests)" >&2
  echo "       $0 bench [BUNDLE_DIR] [FLAGS...]   (on the GPU machine: tandem-gpu-bench)" >&2
  echo "       $0 all [BUNDLE_DIR]                (on the GPU machine: run, then bench)" >&2
  echo "       $0 sanitize [BUNDLE_DIR] [TOOL...] (on the GPU machine: tests under compute-sanitizer)" >&2
  exit 2
}

bundle() {
  local build=$1 out=${2:-build-gpu}
  local dest
  dest=$(mktemp -d)
  mkdir -p "$dest/bin" "$dest/lib"
  local bin
  for bin in "${BINARIES[@]}"; do
    if [[ ! -x "$build/bin/$bin" ]]; then
      echo "missing $build/bin/$bin: build it first (see the top of $0)" >&2
      exit 1
    fi
    cp "$build/bin/$bin" "$dest/bin/"
    # Symbol tables too (not only debug info): the bundle is near its limit
    # and nothing on the GPU machine needs them; backtraces lose names.
    strip --strip-unneeded "$dest/bin/$bin" 2>/dev/null || true
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)": copy the resolved path.
    ldd "$build/bin/$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) continue ;;
        libcuda.so*|libcublas.so*|libcublasLt.so*|libnvidia*) continue ;;
      esac
      [[ -e "$dest/lib/$name" ]] || cp -L "$path" "$dest/lib/$name"
    done
  done
  local unpacked bytes
  unpacked=$(du -sb "$dest" | cut -f1)
  rm -rf "$out"
  mkdir -p "$out"
  tar -C "$dest" -cf - bin lib | xz -T2 -6 > "$out/$ARCHIVE"
  rm -rf "$dest"
  bytes=$(stat -c %s "$out/$ARCHIVE")
  echo "bundle $out/$ARCHIVE: ${#BINARIES[@]} binaries, $((unpacked / 1024 / 1024)) MiB unpacked, $((bytes / 1024 / 1024)) MiB packed"
  if ((bytes > LIMIT_BYTES)); then
    echo "bundle is over $((LIMIT_BYTES / 1024 / 1024)) MiB: the device call carries 64 MiB with the repo" >&2
    exit 1
  fi
}

find_cublas_dir() {
  local dir
  for dir in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -e "$dir/libcublas.so.13" ]] && { echo "$dir"; return; }
  done
  # PyTorch's wheels: nvidia/cublas/lib or nvidia/cu13/lib.
  python3 - <<'EOF' 2>/dev/null || true
import glob, os, sys
for p in sys.path:
    for hit in glob.glob(os.path.join(p, "nvidia", "*", "lib", "libcublas.so.13")):
        print(os.path.dirname(hit)); raise SystemExit
EOF
}

# Unpacks BUNDLE_DIR's archive into $UNPACKED (python3's tarfile where xz is
# missing), points LD_LIBRARY_PATH at it and CUDA 13's cuBLAS, and checks
# that every binary's libraries resolve. Sets log_dir and bundle_dir (the
# unpacked bundle: bin/, lib/).
setup_env() {
  local archive=$1/$ARCHIVE
  if [[ ! -f "$archive" ]]; then
    echo "$archive not found: make it here with '$0 bundle BUILD_DIR $1' and carry $1" >&2
    exit 1
  fi
  rm -rf "$UNPACKED"
  mkdir -p "$UNPACKED"
  if command -v xz > /dev/null; then
    xz -dc "$archive" | tar -C "$UNPACKED" -xf -
  else
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$archive" "$UNPACKED"
  fi
  bundle_dir=$UNPACKED
  log_dir=${OUT:-/tmp/gpu-check}
  mkdir -p "$log_dir"
  local cublas_dir
  cublas_dir=$(find_cublas_dir)
  if [[ -z "$cublas_dir" ]]; then
    echo "libcublas.so.13 not found on this machine (CUDA 13 toolkit or nvidia-cublas wheel)" >&2
    exit 1
  fi
  export LD_LIBRARY_PATH="$bundle_dir/lib:$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== libraries: bundle + $cublas_dir"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
  local missing
  missing=$(ldd "$bundle_dir"/bin/* | grep "not found" | sort -u || true)
  if [[ -n "$missing" ]]; then
    echo "unresolved libraries:" >&2
    echo "$missing" >&2
    exit 1
  fi
}

run() {
  setup_env "${1:-build-gpu}"
  local failed=0 test
  echo "== tandem-gpu-info"
  "$bundle_dir/bin/tandem-gpu-info" 2>&1 | tee "$log_dir/tandem-gpu-info.log" || failed=1
  for test in "${TESTS[@]}"; do
    echo "== $test"
    if ! "$bundle_dir/bin/$test" --gtest_color=no 2>&1 | tee "$log_dir/$test.log"; then
      failed=1
    fi
    if grep -q "^\[  SKIPPED \]" "$log_dir/$test.log"; then
      echo "$test skipped on a GPU machine: the GPU was not seen" >&2
      failed=1
    fi
  done
  if ((failed)); then
    echo "== FAILED (logs in $log_dir)"
    return 1
  fi
  echo "== all CUDA checks passed (logs in $log_dir)"
}

# tandem-gpu-bench with the default measurements (extra flags pass through),
# JSON lines to $OUT/gpu-bench.jsonl. Its exit status is the answer: 2 when
# it saw no GPU, so an empty run never passes for a measurement.
bench() {
  local carried=${1:-build-gpu}
  shift || true
  setup_env "$carried"
  local jsonl="$log_dir/gpu-bench.jsonl" status=0
  echo "== tandem-gpu-bench $*"
  # stderr to the log (kept in $OUT even if the call is cut short), then shown.
  "$bundle_dir/bin/tandem-gpu-bench" --out "$jsonl" "$@" 2>"$log_dir/gpu-bench.log" || status=$?
  cat "$log_dir/gpu-bench.log" >&2
  if ((status != 0)); then
    echo "== tandem-gpu-bench FAILED with status $status (log in $log_dir/gpu-bench.log)" >&2
    return "$status"
  fi
  echo "== tandem-gpu-bench: $(wc -l < "$jsonl") records in $jsonl"
}

# The CUDA tests under compute-sanitizer, one tool at a time (default:
# memcheck, racecheck). A skip counts as a failure, as in run.
sanitize() {
  setup_env "${1:-build-gpu}"
  shift || true
  local tools=("$@")
  ((${#tools[@]})) || tools=(memcheck racecheck)
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
  if [[ -z "$sanitizer" ]]; then
    echo "compute-sanitizer not found (PATH, /usr/local/cuda*/bin)" >&2
    return 1
  fi
  local failed=0 tool test log
  for tool in "${tools[@]}"; do
    for test in "${TESTS[@]}"; do
      log="$log_dir/sanitize-$tool-$test.log"
      echo "== compute-sanitizer --tool $tool $test"
      if ! "$sanitizer" --tool "$tool" --error-exitcode 3 "$bundle_dir/bin/$test" --gtest_color=no > "$log" 2>&1; then
        echo "$test under $tool FAILED (log $log)" >&2
        grep -E "=========.*(ERROR|error|Error)|^\[  FAILED" "$log" | head -20 >&2 || true
        failed=1
      elif grep -q "^\[  SKIPPED \]" "$log"; then
        echo "$test skipped under $tool: the GPU was not seen" >&2
        failed=1
      else
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -1 || true
      fi
    done
  done
  if ((failed)); then
    echo "== sanitize FAILED (logs in $log_dir)"
    return 1
  fi
  echo "== compute-sanitizer ${tools[*]}: clean (logs in $log_dir)"
}

case "${1:-}" in
  bundle) [[ $# -ge 2 ]] || usage; bundle "$2" "${3:-build-gpu}" ;;
  run) run "${2:-build-gpu}" ;;
  bench) shift; bench "$@" ;;
  sanitize) shift; sanitize "$@" ;;
  all)
    run_status=0
    run "${2:-build-gpu}" || run_status=$?
    bench "${2:-build-gpu}" || exit $?
    exit "$run_status"
    ;;
  *) usage ;;
esac
