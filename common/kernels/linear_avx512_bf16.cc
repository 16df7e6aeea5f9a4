// AVX512-BF16 GEMM for bf16 weights (prefill): vdpbf16ps straight from the
// stored weights, f32 accumulation. Compiled with -mavx512bf16 only here
// and reached only when ActiveIsa() is avx512_bf16 or above.
//
// Numerics (documented in linear.h): the GEMM input x is rounded to bf16
// (nearest even; vcvtne2ps2bf16 treats denormal inputs as zero), so each
// product carries a relative error of at most 2^-8 from x on top of f32
// accumulation: |y - y_exact| <= (2^-8 + (K + 2) 2^-24) sum_k |x_k w_k|.
// The weights are bf16 already and are used as stored. vdpbf16ps adds the
// two products of a pair into the f32 accumulator (denormals flushed).
//
// Layout. vdpbf16ps multiplies bf16 pairs: lane i of the accumulator gains
// a[2i] b[2i] + a[2i+1] b[2i+1]. Lanes run over 16 rows of x (not over
// features), so a weight pair W[j, 2p:2p+2] is one 32-bit broadcast from the
// row-major weights — no repacking of W at all — and x is prepared once per
// call as [row block of 16][K/2 pairs][16 rows] dwords. A 32-row x 12-feature
// register tile holds 24 accumulators; the result, feature-major, goes
// through a per-task [features, rows] f32 buffer that is transposed into y
// at the end.
// Legend as in linear.h: M rows, K input features, N output features.
#include <immintrin.h>

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "common/kernels/linear_isa.h"
#include "common/kernels/transpose_avx512.h"
#include "common/quant/block_formats.h"

namespace tandem::isa {
namespace {

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kRowBlock = 16;     // rows per prepared block: one zmm of lanes
constexpr int kTileFeatures = 12;     // features per register tile (x 2 blocks = 24 accumulators)
constexpr int64_t kPairBlock = 128;   // K pairs per pass: x [32 rows, 256] bf16 = 16 KB
constexpr int64_t kSuperBlocks = 32;  // row blocks whose x a W tile meets in one sweep: [512, 256] bf16 = 256 KB

// With one or two row blocks (up to 32 rows: a server's batched decode, a
// short prompt) each W weight serves so few rows that the GEMM runs near the
// memory's pace: whole W rows read front to back in one pass over K, x (up
// to 512 KB) from L2, beat passes of kPairBlock that take every W row in
// 512-byte pieces, each piece a new stream for the prefetcher
// (docs/BENCHMARKS.md, Prefill GEMM).
constexpr int64_t kWholeKBlocks = 2;
constexpr int64_t kWholeKMaxXBytes = 512 << 10;
bool WholeK(int64_t blocks, int64_t pairs) {
  return blocks <= kWholeKBlocks &&
         blocks * pairs * kRowBlock * static_cast<int64_t>(sizeof(uint32_t)) <= kWholeKMaxXBytes;
}

// acc[j][b] (+)= sum_p W[j, 2p:2p+2] . x[block b rows, 2p:2p+2] over pairs
// [p0, p1), then the odd last weight when `odd_tail` (its x partner is zero).
// xp: block 0 at pair p0; blocks kBlocks apart by block_stride dwords.
// w: W[j0, 2 p0], rows `ldw` bytes apart. yt: [kNR features][ldyt] f32
// accumulators, at this row block.
// The kNR weight rows are reached from ceil(kNR / 3) pointers plus 0, 1 or
// 2 row strides, which x86 addressing encodes ([base + stride * 2]): with
// one pointer per row, 12 of them would not fit the general registers.
template <int kBlocks, int kNR>
inline void DotTile(const uint32_t* xp, int64_t block_stride, const uint16_t* w, int64_t ldw, int64_t pairs,
                    bool odd_tail, float* yt, int64_t ldyt, bool first) {
  constexpr int kBases = (kNR + 2) / 3;
  __m512 acc[kNR][kBlocks];
  for (int j = 0; j < kNR; ++j)
    for (int b = 0; b < kBlocks; ++b)
      acc[j][b] = first ? _mm512_setzero_ps() : _mm512_load_ps(yt + j * ldyt + b * kRowBlock);
  const char* base[kBases];
  for (int q = 0; q < kBases; ++q) base[q] = reinterpret_cast<const char*>(w) + 3 * q * ldw;
  const uint32_t* xq = xp;
  for (int64_t p = 0; p < pairs; ++p, xq += kRowBlock) {
    __m512i xv[kBlocks];
    for (int b = 0; b < kBlocks; ++b) xv[b] = _mm512_load_si512(xq + b * block_stride);
    for (int j = 0; j < kNR; ++j) {
      uint32_t pair;
      std::memcpy(&pair, base[j / 3] + (j % 3) * ldw, sizeof(pair));
      const __m512i wv = _mm512_set1_epi32(static_cast<int>(pair));
      for (int b = 0; b < kBlocks; ++b) acc[j][b] = _mm512_dpbf16_ps(acc[j][b], (__m512bh)wv, (__m512bh)xv[b]);
    }
    for (int q = 0; q < kBases; ++q) base[q] += sizeof(uint32_t);
  }
  if (odd_tail) {
    __m512i xv[kBlocks];
    for (int b = 0; b < kBlocks; ++b) xv[b] = _mm512_load_si512(xq + b * block_stride);
    for (int j = 0; j < kNR; ++j) {
      uint16_t last;  // the row's last weight; its pair partner (x = 0) stays zero
      std::memcpy(&last, base[j / 3] + (j % 3) * ldw, sizeof(last));
      const __m512i wv = _mm512_set1_epi32(static_cast<int>(last));
      for (int b = 0; b < kBlocks; ++b) acc[j][b] = _mm512_dpbf16_ps(acc[j][b], (__m512bh)wv, (__m512bh)xv[b]);
    }
  }
  for (int j = 0; j < kNR; ++j)
    for (int b = 0; b < kBlocks; ++b) _mm512_store_ps(yt + j * ldyt + b * kRowBlock, acc[j][b]);
}

// y[r, j] = yt[j, r] (+ bias[j]) for rows r < m, j < features: 16 x 16
// tiles transposed in registers. (A scalar copy read yt one cache line per
// value, a visible share of a prefill in perf.)
inline void StoreTransposed(const float* yt, int64_t ldyt, int64_t features, int64_t m, const float* bias, float* y,
                            int64_t ldy) {
  for (int64_t j0 = 0; j0 < features; j0 += 16) {
    const int64_t nj = Min(16, features - j0);
    const auto mask = static_cast<__mmask16>((1u << nj) - 1);
    const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias + j0) : _mm512_setzero_ps();
    for (int64_t r0 = 0; r0 < m; r0 += kRowBlock) {
      __m512i t[16];
      for (int64_t j = 0; j < 16; ++j)
        t[j] = j < nj ? _mm512_castps_si512(_mm512_load_ps(yt + (j0 + j) * ldyt + r0)) : _mm512_setzero_si512();
      Transpose16x16(t);
      for (int64_t r = 0; r < kRowBlock && r0 + r < m; ++r)
        _mm512_mask_storeu_ps(y + (r0 + r) * ldy + j0, mask, _mm512_add_ps(_mm512_castsi512_ps(t[r]), b));
    }
  }
}

template <int kBlocks, int kNR = kTileFeatures>
inline void DotTileN(int nr, const uint32_t* xp, int64_t block_stride, const uint16_t* w, int64_t ldw, int64_t pairs,
                     bool odd_tail, float* yt, int64_t ldyt, bool first) {
  if constexpr (kNR > 0) {
    if (nr == kNR) return DotTile<kBlocks, kNR>(xp, block_stride, w, ldw, pairs, odd_tail, yt, ldyt, first);
    DotTileN<kBlocks, kNR - 1>(nr, xp, block_stride, w, ldw, pairs, odd_tail, yt, ldyt, first);
  }
}

}  // namespace

int64_t Bf16DotRowBlocks(int64_t m) { return CeilDiv(m, kRowBlock); }

int64_t Bf16DotPreparedBytes(int64_t m, int64_t k) {
  return Bf16DotRowBlocks(m) * CeilDiv(k, 2) * kRowBlock * static_cast<int64_t>(sizeof(uint32_t));
}

void Bf16DotPrepare(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                    void* prepared) {
  PrepareBf16PairBlocks(x, ldx, m, k, CeilDiv(k, 2), block_begin, block_end, static_cast<uint32_t*>(prepared));
}

int64_t Bf16DotScratchBytes(int64_t m, int64_t features) {
  return features * Bf16DotRowBlocks(m) * kRowBlock * static_cast<int64_t>(sizeof(float));
}

void Bf16DotBf16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  const int64_t k = w.k, m = a.m, n_begin = a.n_begin, n_end = a.n_end, features = n_end - n_begin;
  const int64_t blocks = Bf16DotRowBlocks(m), pairs = CeilDiv(k, 2), full_pairs = k / 2;
  const bool odd = (k & 1) != 0;
  const int64_t block_stride = pairs * kRowBlock;                  // dwords between row blocks
  const int64_t ldw = k * static_cast<int64_t>(sizeof(uint16_t));  // bytes between W rows
  const auto* xp = static_cast<const uint32_t*>(a.prepared);
  const auto* weights = static_cast<const uint16_t*>(w.data);
  // yt: [features][blocks * 16] f32, the accumulators between K passes.
  float* yt = static_cast<float*>(scratch);
  const int64_t ldyt = blocks * kRowBlock;

  const int64_t pair_block = WholeK(blocks, pairs) ? Max(full_pairs, 1) : kPairBlock;
  const int64_t passes = full_pairs == 0 ? 1 : CeilDiv(full_pairs, pair_block);
  for (int64_t pass = 0; pass < passes; ++pass) {
    const int64_t p0 = pass * pair_block, p1 = Min(full_pairs, p0 + pair_block);
    const bool last = pass == passes - 1;
    // A W tile (12 rows x 512 B) stays in L1 across the row blocks of a
    // super-block, whose x (256 KB at most) stays in L2: W is read from
    // memory once per 512 rows. (Row blocks outermost, x in L1 across the
    // features, read W once per 32 rows, and were slower from DRAM at every
    // row count measured; docs/BENCHMARKS.md, Prefill GEMM.)
    for (int64_t super = 0; super < blocks; super += kSuperBlocks) {
      const int64_t super_end = Min(blocks, super + kSuperBlocks);
      for (int64_t j0 = n_begin; j0 < n_end; j0 += kTileFeatures) {
        const int nr = static_cast<int>(Min(kTileFeatures, n_end - j0));
        const uint16_t* w_at = weights + j0 * k + 2 * p0;  // the tile, fixed across the row blocks
        for (int64_t b = super; b < super_end; b += 2) {
          const bool two = b + 1 < super_end;
          const uint32_t* x_at = xp + b * block_stride + p0 * kRowBlock;
          float* y_at = yt + (j0 - n_begin) * ldyt + b * kRowBlock;
          if (two) {
            DotTileN<2>(nr, x_at, block_stride, w_at, ldw, p1 - p0, last && odd, y_at, ldyt, pass == 0);
          } else {
            DotTileN<1>(nr, x_at, block_stride, w_at, ldw, p1 - p0, last && odd, y_at, ldyt, pass == 0);
          }
        }
      }
    }
  }

  StoreTransposed(yt, ldyt, features, m, a.bias != nullptr ? a.bias + n_begin : nullptr, a.y + n_begin, a.ldy);
}

// Two 16-value groups per step: widen, scale in f32, one rounding
// instruction for the 32 results. (The AVX2 form before it rounded with
// integer adds and shifts 8 values at a time, about four times the
// instructions, and slower in every round measured; docs/BENCHMARKS.md,
// Prefill GEMM.)
void Bf16FromLevels(const int8_t* levels, const float* scales, const float* offsets, int64_t k, uint16_t* out) {
  for (int64_t g = 0; g < k / 16; g += 2) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(levels + 16 * g));
    const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))),
                                      _mm512_set1_ps(scales[g]), _mm512_set1_ps(offsets[g]));
    const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))),
                                      _mm512_set1_ps(scales[g + 1]), _mm512_set1_ps(offsets[g + 1]));
    _mm512_storeu_si512(out + 16 * g, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// One block per step, no levels or scales stored in between; prefetching
// as far ahead as the block decoders of linear_int8_dot.cc do.
void Bf16FromQ8_0(const uint8_t* row, int64_t k, uint16_t* out) {
  constexpr int64_t kBlock = sizeof(BlockQ8_0), kPrefetchBytes = 1024;
  for (int64_t b = 0; b < k / kQ8_0BlockSize; ++b) {
    const uint8_t* block = row + b * kBlock;
    _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchBytes, _MM_HINT_T0);
    uint16_t d;
    std::memcpy(&d, block + offsetof(BlockQ8_0, d), sizeof(d));
    const __m512 scale = _mm512_set1_ps(_cvtsh_ss(d));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + offsetof(BlockQ8_0, qs)));
    const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))), scale);
    const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))), scale);
    _mm512_storeu_si512(out + kQ8_0BlockSize * b, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// 24 independent vdpbf16ps chains on registers (the bf16 dot-product peak).
void Bf16DotLoop(int64_t iterations) {
  if (iterations <= 0) return;
  asm volatile(
      "vpxord %%zmm0, %%zmm0, %%zmm0\n\t"
      "vmovaps %%zmm0, %%zmm1\n\t"
      "vmovaps %%zmm0, %%zmm2\n\t"
      "vmovaps %%zmm0, %%zmm3\n\t"
      "vmovaps %%zmm0, %%zmm4\n\t"
      "vmovaps %%zmm0, %%zmm5\n\t"
      "vmovaps %%zmm0, %%zmm6\n\t"
      "vmovaps %%zmm0, %%zmm7\n\t"
      "vmovaps %%zmm0, %%zmm8\n\t"
      "vmovaps %%zmm0, %%zmm9\n\t"
      "vmovaps %%zmm0, %%zmm10\n\t"
      "vmovaps %%zmm0, %%zmm11\n\t"
      "vmovaps %%zmm0, %%zmm12\n\t"
      "vmovaps %%zmm0, %%zmm13\n\t"
      "vmovaps %%zmm0, %%zmm14\n\t"
      "vmovaps %%zmm0, %%zmm15\n\t"
      "vmovaps %%zmm0, %%zmm16\n\t"
      "vmovaps %%zmm0, %%zmm17\n\t"
      "vmovaps %%zmm0, %%zmm18\n\t"
      "vmovaps %%zmm0, %%zmm19\n\t"
      "vmovaps %%zmm0, %%zmm20\n\t"
      "vmovaps %%zmm0, %%zmm21\n\t"
      "vmovaps %%zmm0, %%zmm22\n\t"
      "vmovaps %%zmm0, %%zmm23\n\t"
      "vmovaps %%zmm0, %%zmm30\n\t"
      "vmovaps %%zmm0, %%zmm31\n\t"
      "1:\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm0\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm1\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm2\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm3\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm4\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm5\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm6\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm7\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm8\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm9\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm10\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm11\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm12\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm13\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm14\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm15\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm16\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm17\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm18\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm19\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm20\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm21\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm22\n\t"
      "vdpbf16ps %%zmm30, %%zmm31, %%zmm23\n\t"
      "dec %0\n\t"
      "jnz 1b\n\t"
      "vzeroupper\n\t"
      : "+r"(iterations)
      :
      : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", "xmm23", "xmm30",
        "xmm31");
}

}  // namespace tandem::isa
