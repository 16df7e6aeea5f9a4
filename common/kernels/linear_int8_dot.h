// The int8_dot path for block-quantized weights: integer dot products on
// activations quantized to int8, entries of the dispatch table
// (linear_kernels.h) at AVX2 (vpmaddubsw + vpmaddwd) and AVX512-VNNI
// (vpdpbusd).
//
//   prepare: each x row is quantized once per call to int8, one f32 scale
//     per 32 values (d = max |x| / 127, q = round-to-nearest-even(x / d)),
//     with the scaled sum of q per 16 values (for the types whose values
//     carry an offset: Q4_0's -8, Q4_1's min, Q4_K's dmin, ...).
//   slice (every type; Q3_K, Q2_K, IQ4_NL and IQ4_XS on the AVX2 pass at
//     either level): fused, W blocks unpacked in
//     registers straight into the integer dot products, up to 8 x rows per
//     pass over the slice's W rows (linear_avx2_int8_fused.cc,
//     linear_avx512_vnni_fused.cc): decode reads the stored bytes once with
//     no decoded row in memory. The group scales multiply the int32 lanes in
//     f32; the offsets (Q4_K's mins, Q6_K's -32, Q4_1/Q5_1's mins) come in once per block
//     through x's sums per 16 values, Q8_0's +128 and Q4_0's -8 through
//     vpdpbusd's start value (VNNI) or signed levels (AVX2).
//   GEMM (from kInt8GemmMinRows x rows, every type): the slice's W rows
//     decoded once into panels of rows side by side, each broadcast of 4 x
//     levels multiplied with a panel's rows at once, the f32 scaling once
//     per group for all of them: AVX2 panels of 8 rows, scaled per 32
//     values (16 for Q6_K, Q3_K, Q2_K; linear_int8_gemm.cc); AVX512-VNNI panels of 16, scaled per 32
//     (linear_avx512_vnni_gemm.cc).
//   tile slice (group-major blocks under an AVX2 cap, and every type in the
//     *_int8_tile entries, the A/B reference of the fused slice):
//     W rows are decoded 4 at a time by vectorized block decoders into
//     the tile layout (8-bit levels, one f32 scale and offset per 16
//     values; see linear_isa.h), then dotted with up to 4 x rows per
//     register tile: integer products and sums of 4 values, scaled and
//     summed in f32. The stored bytes are read once per call for up to 16
//     x rows (decode), once per 16 rows beyond.
//
// Numerics: y is the exact product of the dequantized W (as ggml computes
// it) with x rounded per 32-value block: |x_i - x~_i| <= d/2 = max_b |x| /
// 254, so |y - y_exact| <= sum_i |W_i| max_b(i) |x| / 254, plus f32
// accumulation error (K + 4) 2^-24 sum_i (|W_i| + 2 |offset_i|) |x_i|.
// That is the rounding llama.cpp applies to its activations (q8_0/q8_1
// blocks of 32). KernelPlan::Exact() never takes this path (its stream and
// packed kernels read x in f32).
//
// Internal to common/kernels/ (only linear_kernels.cc calls these). Any
// thread; each call computes one slice with its own scratch.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/kernels/linear_types.h"

namespace tandem {

// The prepare step (shared by both ISAs): x [m, k] into the prepared layout,
// one block per row.
int64_t Int8DotPreparedBytes(int64_t m, int64_t k);
int64_t Int8DotPrepareBlocks(int64_t m);
void Int8DotPrepare(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                    void* prepared);

// The same with one scale per 256 values (x's max over them / 127; K-quant
// blocks are 256 wide): what the AVX2 pass reads for Q4_K, Q5_K and Q6_K, which
// then sums a block's steps in int32 and converts once per block (as
// llama.cpp's q8_K activations). x moves by up to max|x| of its 256 values
// / 254 rather than of its 32.
void Int8DotPrepareSuperBlocks(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin,
                               int64_t block_end, void* prepared);

// The same with each 256-value block's levels group-major (linear_isa.h):
// what the VNNI slice reads for Q4_K, Q5_K and Q6_K weights.
void Int8DotPrepareGroupMajor(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                              void* prepared);

int64_t Int8DotScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
// The AVX2 slice's: the GEMM's from kInt8GemmMinRows rows.
int64_t Avx2Int8DotScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
absl::Status Avx2Int8DotSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
absl::Status Avx512VnniInt8DotSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
// The AVX2 int8 GEMM (linear_int8_gemm.cc) alone: panels of 8 decoded W
// rows with the rows in the lanes, every x row against each panel. The AVX2
// slice above takes it from kInt8GemmMinRows rows of x.
inline constexpr int64_t kInt8GemmMinRows = 32;
inline constexpr int64_t kInt8GemmRowBlock = 32;  // x rows that meet every panel before the next block
absl::Status Avx2Int8GemmSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
int64_t Int8GemmScratchBytes(const LinearWeight& w, int64_t m, int64_t features);

// Decoded W rows and the prepared x layout, as the GEMM's panel kernel
// reads them (linear_int8_dot.cc decodes, linear_int8_gemm.cc multiplies).
inline constexpr int kVnniGemmPanelRows = 16;
struct Int8DecodedRows {  // the AVX2 panel's 8 rows, the VNNI panel's 16
  const uint8_t* levels[kVnniGemmPanelRows];
  const float* scales[kVnniGemmPanelRows];   // per 16 values
  const float* offsets[kVnniGemmPanelRows];  // per 16 values
};
struct Int8RowLayoutView {
  int64_t stride = 0, scales_at = 0, offsets_at = 0;
};
// A panel group's scales then offsets, `panel_rows` of each, from the
// decoded rows' 16-value group `group16`; returns whether an offset is
// nonzero. Baseline code, shared by both GEMMs' packing.
bool Int8GemmPackParams(const Int8DecodedRows& rows, int panel_rows, int64_t group16, float* params);
int64_t Int8GemmPanelBytes(int64_t k);
// Packs 8 decoded W rows into `panel` (Int8GemmPanelBytes(k)); returns
// whether any of their offsets is nonzero.
bool Int8GemmPackPanel(const Int8DecodedRows& rows, int64_t k, uint8_t* panel);
// out[r * 8 + c] = x row r . W row c of the packed `panel`, for r < m.
// `is_signed`: Q8_0's levels (the others' are in [0, 64)); `offsets`: add
// the offsets' terms (Int8GemmPackPanel said some are nonzero); `pairs`:
// each two 16-value groups share their scales and offsets (every type but
// Q6_K; a signed type must be one).
void Avx2Int8GemmPanel(const uint8_t* panel, int64_t k, bool is_signed, bool offsets, bool pairs, const uint8_t* x,
                       int64_t m, const Int8RowLayoutView& layout, float* out);

// The AVX512-VNNI GEMM (linear_avx512_vnni_gemm.cc): panels of 16 decoded
// W rows (levels unsigned), vpdpbusd on 4 broadcast x levels against 16 W
// rows; `pairs`: groups of 32 values share one scale and offset per row
// (every type but Q6_K), else groups of 16. The VNNI slice takes it from
// kInt8GemmMinRows rows of x.
absl::Status Avx512VnniInt8GemmSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
int64_t VnniInt8GemmScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
int64_t Avx512VnniInt8DotScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
int64_t VnniInt8GemmPanelBytes(int64_t k, bool pairs);
// Packs 16 decoded rows; returns whether any of their offsets is nonzero.
bool VnniInt8GemmPackPanel(const Int8DecodedRows& rows, int64_t k, bool pairs, uint8_t* panel);
// out[r * 16 + c] = x row r . W row c of the packed `panel`, for r < m
// (x in the plain, not group-major, order).
void Avx512VnniInt8GemmPanel(const uint8_t* panel, int64_t k, bool pairs, bool offsets, const uint8_t* x, int64_t m,
                             const Int8RowLayoutView& layout, float* out);

// The tile path alone, for every type (the fused kernels' reference in
// tests and benchmarks).
absl::Status Avx2Int8TileSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
absl::Status Avx512VnniInt8TileSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);

// Prefill at AVX512-BF16: the slice's W rows dequantized (the same
// decoders, then isa::Bf16FromLevels; Q8_0 rows straight from their
// blocks, isa::Bf16FromQ8_0) to bf16, then the bf16 dot-product GEMM of bf16 weights
// (linear_isa.h; x prepared as Bf16DotPrepare). Rounds x to bf16 as
// bf16_dot does, and W to bf16 too: |y - y_exact| grows by at most
// (2^-8 + 2^-18) sum_i |x_i W_i| over the f32 bound.
int64_t QuantizedBf16DotScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
absl::Status QuantizedBf16DotSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);

// Prefill at AMX: the same dequantization to bf16, then the AMX GEMM
// (linear_amx_gemm.h); the same numerics.
int64_t QuantizedAmxScratchBytes(const LinearWeight& w, int64_t m, int64_t features);
absl::Status QuantizedAmxSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);

}  // namespace tandem
