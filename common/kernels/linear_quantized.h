// Linear-layer kernels for block-quantized weights (Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS; layouts in
// common/quant/block_formats.h), entries of the
// dispatch table (linear_kernels.h) beside the float kernels:
//
//   stream (decode): each W row is dequantized one block at a time into an
//     L1 buffer (the reference block decoders of common/quant, bit-exact
//     with ggml) and dotted with up to 8 rows of x in f32 FMAs: the stored
//     (quantized) bytes are read once per call for every 8 rows.
//   packed (prefill): the task's W slice is dequantized once into the f32
//     panels of the ISA's packed GEMM (AVX2 16 features, AVX-512 32) and
//     multiplied by that GEMM's own register tiles: the dequantization is
//     paid once per call, the FMAs run at the f32 packed kernel's speed.
//
// Numerics: W is exactly its dequantized f32 values (what ggml computes
// for the same blocks); products and sums in f32, as the float kernels.
// x is never quantized. Rows must be whole blocks (K a multiple of the
// type's block size: ValidateLinear checks it).
//
// Internal to common/kernels/ (only linear_kernels.cc calls these). Any
// thread; each call computes one slice with its own scratch.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/kernels/linear_types.h"

namespace tandem {

absl::Status QuantizedStreamSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);

// The packed path at AVX2 and at AVX-512 (their panel widths and tiles).
int64_t QuantizedAvx2PackedScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
absl::Status QuantizedAvx2PackedSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
int64_t QuantizedAvx512PackedScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
absl::Status QuantizedAvx512PackedSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);

}  // namespace tandem
