// Internal to common/kernels/: the entry points of the hand-written kernels,
// one translation unit per instruction set, each compiled with that ISA's
// flags (common/CMakeLists.txt). Only the dispatch table (linear_kernels.cc)
// calls them, and only for an ISA level ActiveIsa() allows.
//
// Every slice function computes one LinearSliceArgs on the calling thread,
// with `scratch` of at least its *ScratchBytes (64-byte aligned). Each
// output element's arithmetic depends only on its x row and W row (never on
// the slice bounds or the thread count, and never on M but in the bf16
// stream, whose one-row calls differ), so a result is the same however the
// work is split.
#pragma once

#include <cstdint>

#include "common/kernels/linear_types.h"

namespace tandem::isa {

// ---- AVX2 + FMA + F16C (linear_avx2.cc) ----
void Avx2StreamF32(const LinearWeight& w, const LinearSliceArgs& a);
void Avx2StreamF16(const LinearWeight& w, const LinearSliceArgs& a);
void Avx2StreamBf16(const LinearWeight& w, const LinearSliceArgs& a);
int64_t Avx2PackedScratchBytes(int64_t k, int64_t features);
void Avx2PackedF32(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
void Avx2PackedF16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
void Avx2PackedBf16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
// The packed GEMM on panels already in f32 ([panels, K, kAvx2Panel], from
// another packer: the quantized kernels'); a.x, a.y, a.bias as above.
inline constexpr int64_t kAvx2Panel = 16;
void Avx2MultiplyPanels(const LinearSliceArgs& a, int64_t k, const float* packed);
// 12 independent ymm FMA chains for `iterations` rounds (the f32 peak).
void Avx2FmaLoop(int64_t iterations);
inline constexpr int64_t kAvx2FmaLoopFlops = 12 * 8 * 2;  // per iteration

// ---- AVX-512 F/BW/VL/DQ (linear_avx512.cc) ----
void Avx512StreamF32(const LinearWeight& w, const LinearSliceArgs& a);
void Avx512StreamF16(const LinearWeight& w, const LinearSliceArgs& a);
void Avx512StreamBf16(const LinearWeight& w, const LinearSliceArgs& a);
int64_t Avx512PackedScratchBytes(int64_t k, int64_t features);
void Avx512PackedF32(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
void Avx512PackedF16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
void Avx512PackedBf16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
inline constexpr int64_t kAvx512Panel = 32;
void Avx512MultiplyPanels(const LinearSliceArgs& a, int64_t k, const float* packed);
void Avx512FmaLoop(int64_t iterations);
inline constexpr int64_t kAvx512FmaLoopFlops = 24 * 16 * 2;

// ---- AVX512-BF16 (linear_avx512_bf16.cc) ----
// x is prepared once per call: rounded to bf16 (nearest even) and laid out
// in blocks of 16 rows, [block][K/2 pairs][16 rows] of (x[2p], x[2p+1])
// pairs, rows past M zero. Blocks [block_begin, block_end) are written, so
// the preparation can be split across threads.
int64_t Bf16DotPreparedBytes(int64_t m, int64_t k);
int64_t Bf16DotRowBlocks(int64_t m);
void Bf16DotPrepare(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                    void* prepared);
int64_t Bf16DotScratchBytes(int64_t m, int64_t features);
// bf16 weights only: vdpbf16ps over the stored weights, f32 accumulation.
void Bf16DotBf16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch);
void Bf16DotLoop(int64_t iterations);
inline constexpr int64_t kBf16DotLoopFlops = 24 * 32 * 2;
// One decoded row of quantized weights (signed 8-bit levels with an f32
// scale and offset per 16 values; k a multiple of 32, as every block
// type's rows are) to bf16: out[i] = bf16(scales[i/16] * levels[i] +
// offsets[i/16]), the f32 value rounded to nearest even (vcvtne2ps2bf16;
// dequantized blocks never hold f32 denormals, so its flush does not apply).
void Bf16FromLevels(const int8_t* levels, const float* scales, const float* offsets, int64_t k, uint16_t* out);
// A Q8_0 row (k / 32 blocks) straight to bf16: d * q rounded as above.
void Bf16FromQ8_0(const uint8_t* row, int64_t k, uint16_t* out);

// ---- AVX512-BF16 stream (linear_avx512_bf16_stream.cc) ----
// Decode GEMV on bf16 weights, 1 to 11 rows of x with K <= 4096 (other
// calls run Avx512StreamBf16, x unprepared: PreparedBytes 0). x is prepared
// once per call: per row, hi then lo halves of each value in bf16 (x = hi +
// lo to 2^-16), K rounded up to 32 and zero-padded, plus a cache line.
int64_t Bf16StreamPreparedBytes(int64_t m, int64_t k);
int64_t Bf16StreamRowBlocks(int64_t m);
void Bf16StreamPrepare(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t row_begin, int64_t row_end,
                       void* prepared);
void Bf16StreamBf16(const LinearWeight& w, const LinearSliceArgs& a);

// ---- int8 dot products on quantized activations (linear_int8_dot.cc) ----
// Both sides in one layout, per row of K values: levels [K] 8-bit, then
// scales [K/16] f32 and offsets [K/16] f32, one of each per 16 values:
//   x row:  x[i] ~ scales[i/16] * q[i] (q int8; both 16-value halves of a
//           32-value block carry its scale), offsets[g] = scales[g] * the
//           sum of q over values 16g..16g+15;
//   W row:  W[i] = scales[i/16] * level[i] + offsets[i/16].
// So x . W = sum over 4-value int32 lanes (dot of levels) * W scale * x scale
//          + sum over groups W offset * x offset.
// W levels are signed (int8) for the AVX2 kernel and unsigned (uint8, +128
// folded into the offsets where a type is signed) for VNNI's vpdpbusd.
inline constexpr int64_t kInt8TileFeatures = 4;  // W rows per register tile
struct Int8DotTile {
  int64_t k = 0;
  // kInt8TileFeatures decoded W rows (a tail tile repeats its last row).
  const uint8_t* w_levels[kInt8TileFeatures];
  const float* w_scales[kInt8TileFeatures];
  const float* w_offsets[kInt8TileFeatures];
  // `rows` prepared x rows, `x_stride` bytes apart (each section's start).
  int64_t rows = 0;
  int64_t x_stride = 0;
  const int8_t* x_levels = nullptr;
  const float* x_scales = nullptr;
  const float* x_offsets = nullptr;
  float* out = nullptr;  // out[r * kInt8TileFeatures + f]: row r . W row f
};
// (The AVX2 tile is baseline code, in linear_int8_dot.cc.)

// The fused kernels: x prepared in the layout above, W blocks unpacked in
// registers straight into the dot products (no decoded tile in memory).
// The VNNI kernel reads K-quants' x levels group-major: within each
// 256-value block, the 4-value quad s of 16-value group l (values 16l + 4s
// .. 16l + 4s + 3) at bytes 64s + 4l .. 64s + 4l + 3, so every int32 lane of
// a 64-value step stays in one group (Int8DotPrepareGroupMajor); scales and
// offsets as above.
// They take up to kInt8FusedRows x rows per pass over the slice's W rows
// (each output's arithmetic the same whatever the pass), and return false,
// computing nothing, for a type they have no pass for (the VNNI kernel:
// Q3_K, Q2_K, IQ4_NL, IQ4_XS, which the VNNI entry runs on the AVX2 pass;
// group-major blocks at AVX2: the tile path). Each y[r, j] is the sum plus bias[j].
inline constexpr int64_t kInt8FusedRows = 8;
// Up to this K, x (K bytes of levels, up to K / 2 of scales and offsets)
// stays in L1 beside the W streams. One x row (decode) reads split streams
// (several W rows a pass, each from its own contiguous part of the slice,
// each prefetched kDecodePrefetchAheadBytes ahead) at any K, at AVX2 and
// AVX-512 VNNI alike; AVX-512 VNNI reads them for two x rows up to this K
// (K = 6400 is Phi-3.5-MoE's down projection; why there,
// linear_avx512_vnni_fused.cc, Rows).
inline constexpr int64_t kInt8OneRowMaxK = 6400;
// How far ahead of each step, in each sequential W stream it reads, a
// decode GEMV prefetches its own lines into L1 (the VNNI split streams, the
// AVX2 one-row stream, the bf16 stream): the hardware prefetcher alone
// stays too close behind a kernel that computes about as fast as DRAM
// streams. Chosen with the variants alternating call by call (shorter and
// longer distances helped less; docs/BENCHMARKS.md, Decode GEMV; why:
// linear_avx512_vnni_fused.cc, PrefetchStep).
inline constexpr int64_t kDecodePrefetchAheadBytes = 1536;
// The W rows [n_begin, n_end) as kW split streams: the range cut into kW
// contiguous parts, pass(rows) called with the next row of each part in
// turn (-1 where a shorter last part has none).
template <int kW, class PassFn>
inline void ForEachSplitStreamPass(int64_t n_begin, int64_t n_end, PassFn&& pass) {
  const int64_t part = (n_end - n_begin + kW - 1) / kW;
  for (int64_t i = 0; i < part; ++i) {
    int64_t rows[kW];
    for (int f = 0; f < kW; ++f) {
      const int64_t j = n_begin + f * part + i;
      rows[f] = j < n_end ? j : -1;
    }
    pass(rows);
  }
}
struct Int8PreparedX {
  const void* base = nullptr;  // row r at base + r * stride: levels, then scales, offsets
  int64_t stride = 0;
  int64_t scales_at = 0;
  int64_t offsets_at = 0;
};
// Baseline (linear_avx2_int8_fused.cc): vpmaddubsw + vpmaddwd, 32 values a step.
bool Avx2Int8Fused(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& x);

// ---- AVX512-VNNI (linear_avx512_vnni.cc, linear_avx512_vnni_fused.cc) ----
void Avx512VnniInt8Dot(const Int8DotTile& t);
// vpdpbusd, 64 values a step.
bool Avx512VnniInt8Fused(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& x);
// 24 independent vpdpbusd zmm chains (the int8 dot-product peak); "ops" as
// flops: a multiply and an add per int8 product.
void Avx512VnniDotLoop(int64_t iterations);
inline constexpr int64_t kVnniDotLoopOps = 24 * 64 * 2;

// ---- AMX-BF16 (linear_amx.cc): tdpbf16ps on 16 x 32 bf16 tiles ----
// One tile op multiplies 16 W rows by 16 x rows over 32 K values into a
// 16 x 16 f32 accumulator (products of bf16 pairs exact, sums in f32,
// denormals flushed): bf16_dot's rounding. W rows are the A tiles, read
// as bf16 rows; x is the B tiles, prepared once per call as Bf16DotPrepare
// lays it out ([block of 16 rows][pairs][16 rows] dwords) with the pairs
// padded to AmxPaddedK(k) / 2, zero past k and past m.
inline constexpr int64_t kAmxRows = 16;   // W rows per A tile; x rows per B tile
inline constexpr int64_t kAmxChunk = 32;  // K values per tile op
int64_t AmxPaddedK(int64_t k);
int64_t AmxRowBlocks(int64_t m);
int64_t AmxPreparedBytes(int64_t m, int64_t k);
void AmxPrepare(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                void* prepared);
// y[r, j] = W row j . x row r (+ bias[j]) for j < w_rows and x rows r in
// row blocks [block_begin, block_end), r < m.
struct AmxProduct {
  // bf16 W rows `ldw` values apart, each AmxPaddedK(k) values (zero past
  // k), rounded up to whole pairs of 16 rows.
  const uint16_t* w = nullptr;
  int64_t ldw = 0;
  int64_t w_rows = 0;
  const void* x = nullptr;  // prepared x
  int64_t k = 0;
  int64_t block_begin = 0, block_end = 0, m = 0;
  const float* bias = nullptr;  // [w_rows] or null
  float* y = nullptr;           // at W row 0's column
  int64_t ldy = 0;
};
// Loads the tile configuration on the calling thread (tile state is per
// thread); AmxRelease returns the tiles (so the thread's next context
// switch saves no tile data).
void AmxMultiply(const AmxProduct& p);
void AmxRelease();
// Four independent 16 x 16 x 32 tdpbf16ps chains on tiles (the AMX peak).
void AmxDotLoop(int64_t iterations);
inline constexpr int64_t kAmxDotLoopFlops = 4 * kAmxRows * kAmxRows * kAmxChunk * 2;

}  // namespace tandem::isa
