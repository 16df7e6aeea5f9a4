#!/bin/bash
# Builds mixtral_ggml against a ggml source tree, the way llama.cpp builds
# ggml for a CPU by default (native ISA, OpenMP threads, llamafile sgemm):
#   bench/ggml_reference/build.sh GGML_SOURCE_DIR [BUILD_DIR]
# ggml is not a dependency of tandem and is not in Debian; a checkout of
# github.com/ggml-org/ggml is enough (the figures in docs/BENCHMARKS.md were
# taken with commit d99724f2b141, 2026-08-21). Writes BUILD_DIR/mixtral_ggml.
# ISA=avx2 builds ggml's AVX2 + FMA + F16C kernels instead of the native
# ones (what llama.cpp runs on a Zen 3), to set beside TANDEM_MAX_ISA=avx2.
set -eu
src=${1:?usage: build.sh GGML_SOURCE_DIR [BUILD_DIR]}
out=${2:-build-ggml}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
isa_flags=(-DGGML_NATIVE=ON) march=(-march=native)
if [ "${ISA:-native}" = avx2 ]; then
  isa_flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
             -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF)
  march=(-mavx2 -mfma -mf16c -mbmi2)
fi
cmake -S "$src" -B "$out/ggml" -DCMAKE_BUILD_TYPE=Release "${isa_flags[@]}" -DGGML_LLAMAFILE=ON -DGGML_OPENMP=ON \
  -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF > "$out/ggml-cmake.log"
cmake --build "$out/ggml" -j"$(nproc)" > "$out/ggml-build.log"
libs=$(find "$out/ggml/src" -name 'libggml*.a' | sort -r)  # ggml, ggml-cpu, ggml-base: users first
g++ -std=c++20 -O2 "${march[@]}" -fopenmp -I"$src/include" "$here/mixtral_ggml.cc" \
  -Wl,--start-group $libs -Wl,--end-group -lpthread -lm -o "$out/mixtral_ggml"
echo "built $out/mixtral_ggml"
