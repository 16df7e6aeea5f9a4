// AMX-BF16 GEMM (prefill): tdpbf16ps, 16 W rows times 16 x rows over 32 K
// values per instruction. Compiled with -mamx-tile -mamx-bf16 only here and
// reached only when ActiveIsa() is amx (the process then holds Linux's
// grant of the tile state: cpu_features.cc).
//
// Why. On the Intel CPUs that have it, a core's tile unit multiplies bf16
// at several times the rate of its vpdpbusd int8 dot products and tens of
// times that of its vdpbf16ps (peak_gflops in tandem-expert-ffn-bench's
// output): prefill moves from the vector units to the tiles.
//
// Layout. W rows are the A operand as they are stored (bf16 rows, 32
// values a tile row), so W needs no repacking: bf16 weights are copied,
// quantized ones dequantized, row by row (linear_amx_gemm.cc). x is the B
// operand: 16 pairs x 16 rows per tile, the bf16 GEMM's prepared layout.
// The accumulators come out W-row-major and are transposed into y.
//
// Blocking. Eight tile registers: four 16 x 16 f32 accumulators (32 W rows
// x 32 x rows), two A tiles of W and two B tiles of x per 32-value chunk,
// each tile loaded serving two tile ops; the accumulators stay in tiles for
// the whole of K.
#include <immintrin.h>

#include <cstring>

#include "common/kernels/linear_isa.h"
#include "common/kernels/transpose_avx512.h"

namespace tandem::isa {
namespace {

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kRowBytes = kAmxChunk * static_cast<int64_t>(sizeof(uint16_t));  // 64: one tile row
constexpr int64_t kTileValues = kAmxRows * kAmxChunk;                              // bf16 values in a tile

// ldtilecfg's 64-byte operand (Intel SDM, palette 1): every tile 16 rows of 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

void ConfigureTiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = kRowBytes;
    config.rows[t] = kAmxRows;
  }
  _tile_loadconfig(&config);
}

// acc: [16 W rows][16 x rows] f32 into y[x row][W row] (+ bias), x rows
// from x0 below m, W rows from j0 below w_rows.
void StoreTransposed(const float* acc, const AmxProduct& p, int64_t j0, int64_t x0) {
  __m512i t[16];
  for (int i = 0; i < 16; ++i) t[i] = _mm512_load_si512(acc + i * kAmxRows);
  Transpose16x16(t);
  const int64_t nj = p.w_rows - j0 < 16 ? p.w_rows - j0 : 16;
  if (nj <= 0) return;
  const auto mask = static_cast<__mmask16>(nj == 16 ? 0xffff : (1u << nj) - 1);
  const __m512 bias = p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + j0) : _mm512_setzero_ps();
  for (int64_t r = 0; r < 16 && x0 + r < p.m; ++r)
    _mm512_mask_storeu_ps(p.y + (x0 + r) * p.ldy + j0, mask, _mm512_add_ps(_mm512_castsi512_ps(t[r]), bias));
}

// Tiles: 0-3 accumulators (C[i][j] = W tile i times x tile j, at 2 i + j),
// 4-5 W, 6-7 x.
template <bool kTwoW, bool kTwoX>
void Block(const AmxProduct& p, int64_t j0, int64_t block) {
  _tile_zero(0);
  if constexpr (kTwoX) _tile_zero(1);
  if constexpr (kTwoW) _tile_zero(2);
  if constexpr (kTwoW && kTwoX) _tile_zero(3);
  const int64_t kp = AmxPaddedK(p.k), chunks = kp / kAmxChunk;
  const uint16_t* w0 = p.w + j0 * p.ldw;
  const uint16_t* w1 = w0 + kAmxRows * p.ldw;
  const int64_t ldw_bytes = p.ldw * static_cast<int64_t>(sizeof(uint16_t));
  const auto* x0 = static_cast<const uint16_t*>(p.x) + block * kAmxRows * kp;
  const uint16_t* x1 = x0 + kAmxRows * kp;
  for (int64_t c = 0; c < chunks; ++c) {
    _tile_loadd(4, w0 + c * kAmxChunk, ldw_bytes);
    if constexpr (kTwoW) _tile_loadd(5, w1 + c * kAmxChunk, ldw_bytes);
    _tile_loadd(6, x0 + c * kTileValues, kRowBytes);
    if constexpr (kTwoX) _tile_loadd(7, x1 + c * kTileValues, kRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kTwoX) _tile_dpbf16ps(1, 4, 7);
    if constexpr (kTwoW) _tile_dpbf16ps(2, 5, 6);
    if constexpr (kTwoW && kTwoX) _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float acc[4][kAmxRows * kAmxRows];
  constexpr int64_t kAccBytes = kAmxRows * static_cast<int64_t>(sizeof(float));
  _tile_stored(0, acc[0], kAccBytes);
  if constexpr (kTwoX) _tile_stored(1, acc[1], kAccBytes);
  if constexpr (kTwoW) _tile_stored(2, acc[2], kAccBytes);
  if constexpr (kTwoW && kTwoX) _tile_stored(3, acc[3], kAccBytes);
  const int64_t r0 = block * kAmxRows;
  StoreTransposed(acc[0], p, j0, r0);
  if constexpr (kTwoX) StoreTransposed(acc[1], p, j0, r0 + kAmxRows);
  if constexpr (kTwoW) StoreTransposed(acc[2], p, j0 + kAmxRows, r0);
  if constexpr (kTwoW && kTwoX) StoreTransposed(acc[3], p, j0 + kAmxRows, r0 + kAmxRows);
}

}  // namespace

int64_t AmxPaddedK(int64_t k) { return CeilDiv(k, kAmxChunk) * kAmxChunk; }
int64_t AmxRowBlocks(int64_t m) { return CeilDiv(m, kAmxRows); }
int64_t AmxPreparedBytes(int64_t m, int64_t k) {
  return AmxRowBlocks(m) * kAmxRows * AmxPaddedK(k) * static_cast<int64_t>(sizeof(uint16_t));
}

void AmxPrepare(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                void* prepared) {
  PrepareBf16PairBlocks(x, ldx, m, k, AmxPaddedK(k) / 2, block_begin, block_end, static_cast<uint32_t*>(prepared));
}

void AmxMultiply(const AmxProduct& p) {
  ConfigureTiles();
  for (int64_t j0 = 0; j0 < p.w_rows; j0 += 2 * kAmxRows) {
    const bool two_w = j0 + kAmxRows < p.w_rows;
    for (int64_t b = p.block_begin; b < p.block_end; b += 2) {
      const bool two_x = b + 1 < p.block_end;
      if (two_w) {
        two_x ? Block<true, true>(p, j0, b) : Block<true, false>(p, j0, b);
      } else {
        two_x ? Block<false, true>(p, j0, b) : Block<false, false>(p, j0, b);
      }
    }
  }
}

void AmxRelease() { _tile_release(); }

void AmxDotLoop(int64_t iterations) {
  if (iterations <= 0) return;
  ConfigureTiles();
  alignas(64) static const uint16_t kZeros[kTileValues] = {};
  _tile_loadd(4, kZeros, kRowBytes);
  _tile_loadd(5, kZeros, kRowBytes);
  _tile_loadd(6, kZeros, kRowBytes);
  _tile_loadd(7, kZeros, kRowBytes);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float sink[kAmxRows * kAmxRows];
  _tile_stored(0, sink, kAmxRows * static_cast<int64_t>(sizeof(float)));
  asm volatile("" : : "r"(sink) : "memory");
  _tile_release();
}

}  // namespace tandem::isa
