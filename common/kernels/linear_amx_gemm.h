// The AMX GEMM's slices (bf16_dot path at the amx level, linear_kernels.h):
// the task's W rows as bf16 rows in scratch (bf16 weights copied, quantized
// ones dequantized, as avx512_bf16_q_dot dequantizes them), then tdpbf16ps
// tiles (linear_amx.cc) against x prepared in bf16.
//
// Numerics: bf16_dot's (linear.h): x rounded to bf16, products of bf16
// pairs exact, f32 sums; quantized W rounded to bf16 too.
//
// Internal to common/kernels/. Any thread; each call computes one slice
// with its own scratch.
#pragma once

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "common/kernels/linear_types.h"

namespace tandem {

// Writes W rows [row0, row0 + rows), all k values, as bf16 to `out` (row r
// at out + r * ldo), with `source_scratch` (the bytes the caller asked for)
// to work in.
using AmxRowSource =
    absl::FunctionRef<void(int64_t row0, int64_t rows, uint16_t* out, int64_t ldo, void* source_scratch)>;
int64_t AmxGemmScratchBytes(const LinearWeight& w, int64_t features, int64_t source_bytes);
absl::Status AmxGemmSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch, AmxRowSource source);

// W rows per task: as many as keep the task's bf16 rows within L2 beside x
// (a multiple of 32, up to 128). Used by the task split (linear.cc).
int64_t AmxTaskFeatures(int64_t k);

// bf16 weights.
int64_t AmxBf16ScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
absl::Status AmxBf16Slice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);

}  // namespace tandem
