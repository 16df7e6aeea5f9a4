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
#        cmake --build /tmp/build-cuda90 -j2 --target tandem-gpu-info cuda_device_test cuda_expert_pool_test
#      (building a test also builds the server, CLI and Python module it
#      depends on; that is the test CMakeLists' rule, not needed here.)
#   2. Here, bundle the binaries and every shared library `ldd` resolves for
#      them, except the C runtime (glibc, libstdc++, libgcc_s: the GPU
#      machine's are newer and compatible) and CUDA's own (libcuda is the
#      driver's; libcublas/libcublasLt are ~600 MB, far over the limit, and
#      the GPU machine has them):
#        deploy/gpu-check.sh bundle /tmp/build-cuda90 build-gpu
#      build-gpu/ is inside the repo and ignored by .gitignore (/build*/),
#      so it can be carried; the script refuses a bundle over 60 MiB. Seen:
#      ~51 MiB (34 libraries; libdnnl alone is 38 MiB), the repo ~2 MB more.
#   3. On the GPU machine, in one call (carry: ["build-gpu"]):
#        deploy/gpu-check.sh run build-gpu
#      It finds CUDA 13's libcublas there (/usr/local/cuda*/lib64, or the
#      nvidia-cublas Python wheel PyTorch uses), prints tandem-gpu-info,
#      runs each CUDA test, and fails if any test fails or SKIPS (a skip on
#      a GPU machine means the GPU was not seen). Logs go to $OUT when set.
#
# Exit status: 0 when every test passed on the GPU.
set -euo pipefail

BINARIES=(tandem-gpu-info cuda_device_test cuda_expert_pool_test)
LIMIT_BYTES=$((60 * 1024 * 1024))

usage() {
  echo "usage: $0 bundle BUILD_DIR [BUNDLE_DIR]   (here: collect binaries + libraries)" >&2
  echo "       $0 run [BUNDLE_DIR]                (on the GPU machine)" >&2
  exit 2
}

bundle() {
  local build=$1 dest=${2:-build-gpu}
  rm -rf "$dest"
  mkdir -p "$dest/bin" "$dest/lib"
  local bin
  for bin in "${BINARIES[@]}"; do
    if [[ ! -x "$build/bin/$bin" ]]; then
      echo "missing $build/bin/$bin: build it first (see the top of $0)" >&2
      exit 1
    fi
    cp "$build/bin/$bin" "$dest/bin/"
    strip --strip-debug "$dest/bin/$bin" 2>/dev/null || true
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)": copy the resolved path.
    ldd "$build/bin/$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
      case "$name" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) continue ;;
        libcuda.so*|libcublas.so*|libcublasLt.so*|libnvidia*) continue ;;
      esac
      [[ -e "$dest/lib/$name" ]] || cp -L "$path" "$dest/lib/$name"
    done
  done
  local bytes
  bytes=$(du -sb "$dest" | cut -f1)
  echo "bundle $dest: $(ls "$dest/lib" | wc -l) libraries, $((bytes / 1024 / 1024)) MiB"
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

run() {
  local bundle_dir=${1:-build-gpu}
  local log_dir=${OUT:-/tmp/gpu-check}
  mkdir -p "$log_dir"
  local cublas_dir
  cublas_dir=$(find_cublas_dir)
  if [[ -z "$cublas_dir" ]]; then
    echo "libcublas.so.13 not found on this machine (CUDA 13 toolkit or nvidia-cublas wheel)" >&2
    exit 1
  fi
  export LD_LIBRARY_PATH="$PWD/$bundle_dir/lib:$cublas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "== libraries: bundle + $cublas_dir"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
  local missing
  missing=$(ldd "$bundle_dir"/bin/* | grep "not found" | sort -u || true)
  if [[ -n "$missing" ]]; then
    echo "unresolved libraries:" >&2
    echo "$missing" >&2
    exit 1
  fi
  local failed=0 test
  echo "== tandem-gpu-info"
  "$bundle_dir/bin/tandem-gpu-info" 2>&1 | tee "$log_dir/tandem-gpu-info.log" || failed=1
  for test in cuda_device_test cuda_expert_pool_test; do
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
    exit 1
  fi
  echo "== all CUDA checks passed (logs in $log_dir)"
}

case "${1:-}" in
  bundle) [[ $# -ge 2 ]] || usage; bundle "$2" "${3:-build-gpu}" ;;
  run) run "${2:-build-gpu}" ;;
  *) usage ;;
esac
