// AVX512-BF16 stream path for bf16 weights (decode and batched decode, up
// to kMaxRows rows of x): vdpbf16ps straight from the stored weights, W rows
// read front to back (several side by side from as many parts of the
// slice), with x split into two bf16 halves so the products keep nearly
// the f32 stream's precision.
//
// Why not the f32 stream (linear_avx512.cc) here. Widening bf16 to f32
// costs a zero-extend and a shift per 16 weights ahead of each FMA; one
// vdpbf16ps takes 32 weights as stored. With fewer instructions per byte,
// the core keeps more of a W row's cache misses in flight, and one W row
// read front to back is a single stream the hardware prefetcher follows
// (8 rows walked together are 8 streams). With a few rows of x (a server's
// batched decode hands each routed expert 2-11 rows) the widening was most
// of the f32 stream's time: per 32 weights of a W row it takes 6 + 2 m
// instructions, this pass 1 + 2 m (docs/BENCHMARKS.md, Decode GEMV).
//
// Numerics: x = hi + lo, hi = x with its low 16 bits cleared (truncation:
// never rounds a finite x to infinity), lo = bf16(x - hi) (nearest even).
// x - hi - lo is at most 2^-16 |x|: the error bound is the f32 stream's
// (K + 2) 2^-24 sum |x w| plus 2^-16 sum |x w| (linear.h), the first term
// 16 times the second at K = 4096.
// Products of bf16 pairs are exact in f32; vdpbf16ps accumulates in f32,
// flushing denormals (as the bf16 GEMM does). A NaN in x stays NaN through
// lo; an infinite x gives NaN (inf - inf), non-finite either way.
//
// x is prepared once per call: per row, hi then lo bf16, each K rounded up
// to 32 (zero past K) and one cache line of pad apart. Up to kMaxRows rows
// of x, K up to 4096 (below); other calls run the AVX-512 f32 stream.
#include <immintrin.h>

#include "common/kernels/linear_isa.h"

namespace tandem::isa {
namespace {

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
// The sum of v's 16 lanes, by halving (gcc 12's _mm512_reduce_add_ps warns
// of an uninitialized register when inlined into a many-accumulator tile).
inline float SumLanes(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xB1));
  __m128 q = _mm512_castps512_ps128(v);
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline int64_t PaddedK(int64_t k) { return (k + 31) & ~int64_t{31}; }
// hi to lo, in bf16 values: one cache line more than K, so the two x lines
// a step loads fall in different L1 sets (at K = 4096 they would be 8 KB
// apart, in one set, beside the W line).
inline int64_t HalfStride(int64_t k) { return PaddedK(k) + 32; }

// One row of x, its two halves in L1 (16 KB at K = 4096) while W rows
// stream past, 4 at a time from 4 contiguous parts of the slice (split
// streams: each x load serves 4 W rows, faster from DRAM than one W row
// at a time at every shape measured; docs/BENCHMARKS.md, Decode GEMV).
// Beyond that every W line pulls two x lines from L2 and one W row at a
// time loses to the f32 stream's 8 rows sharing each x load (measured on a
// 14336-wide Mixtral down projection): those calls run the f32 stream,
// with x unprepared. Several rows of x (StreamRowTile) share each W load
// among them; their x comes from L2 beyond L1 (measured up to K = 4096).
constexpr int64_t kMaxK = 4096;
// The built-in plans give 12 rows and more to a GEMM (kernel_plan.cc).
constexpr int64_t kMaxRows = 11;
bool Streams(int64_t m, int64_t k) { return m >= 1 && m <= kMaxRows && k <= kMaxK; }

// x . W_row for kW W rows over their k weights; hi at xh, lo at xh + half
// (bf16). Each row's sums take the same steps in the same order whatever
// kW, so a row's result is the same bits in any pass.
template <int kW>
inline void DotRows(const uint16_t* xh, int64_t half, const uint16_t* const (&w)[kW], int64_t k, float (&out)[kW]) {
  // Accumulator c of a row takes the c-th 32 weights of each 64-value step,
  // hi and lo in turn.
  __m512 acc[kW][2];
  for (int f = 0; f < kW; ++f) acc[f][0] = acc[f][1] = _mm512_setzero_ps();
  auto step = [&](int c, int64_t kk, __mmask32 mask) {
    const __m512bh hi = (__m512bh)_mm512_loadu_si512(xh + kk), lo = (__m512bh)_mm512_loadu_si512(xh + half + kk);
    for (int f = 0; f < kW; ++f) {
      // Masked: lanes past K read nothing (no fault past the row's end) and
      // meet zeros in the prepared x.
      const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[f] + kk);
      // kDecodePrefetchAheadBytes on in each stream (linear_isa.h; faster
      // than the hardware prefetcher alone, builds alternating:
      // docs/BENCHMARKS.md, Decode GEMV).
      _mm_prefetch(reinterpret_cast<const char*>(w[f] + kk) + kDecodePrefetchAheadBytes, _MM_HINT_T0);
      acc[f][c] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[f][c], hi, wv), lo, wv);
    }
  };
  int64_t kk = 0;
  for (; kk + 64 <= k; kk += 64) {
    step(0, kk, ~__mmask32{0});
    step(1, kk + 32, ~__mmask32{0});
  }
  for (; kk < k; kk += 32) {
    const int64_t valid = Min(32, k - kk);
    step(0, kk, valid == 32 ? ~__mmask32{0} : (__mmask32{1} << valid) - 1);
  }
  for (int f = 0; f < kW; ++f) out[f] = _mm512_reduce_add_ps(_mm512_add_ps(acc[f][0], acc[f][1]));
}

// x rows r < kMR (chunk-major: Bf16StreamPrepare) . W_row for kW W rows:
// each W load serves every row, each x load every W row; kMR x kW
// accumulators, each taking hi then lo in turn (the chains are many enough
// to hide the dot products' latency).
template <int kMR, int kW>
inline void DotRowTile(const uint16_t* x, const uint16_t* const (&w)[kW], int64_t k, float (&out)[kMR][kW]) {
  __m512 acc[kMR][kW];
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 16
    for (int f = 0; f < kW; ++f) acc[r][f] = _mm512_setzero_ps();
  // One loop body, the K tail masked in its last pass: a second (tail)
  // body made gcc keep the accumulators in memory, storing all of them
  // every pass.
  for (int64_t kk = 0; kk < k; kk += 32) {
    const __mmask32 mask = k - kk >= 32 ? ~__mmask32{0} : (__mmask32{1} << (k - kk)) - 1;
    __m512bh wv[kW];
#pragma GCC unroll 16
    for (int f = 0; f < kW; ++f) {
      wv[f] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w[f] + kk);
      _mm_prefetch(reinterpret_cast<const char*>(w[f] + kk) + kDecodePrefetchAheadBytes, _MM_HINT_T0);
    }
#pragma GCC unroll 16
    for (int r = 0; r < kMR; ++r) {
      const uint16_t* xr = x + kk * 2 * kMR + r * 64;  // this chunk's row r: hi, then lo
      const __m512bh hi = (__m512bh)_mm512_loadu_si512(xr), lo = (__m512bh)_mm512_loadu_si512(xr + 32);
#pragma GCC unroll 16
      for (int f = 0; f < kW; ++f) acc[r][f] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc[r][f], hi, wv[f]), lo, wv[f]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 16
    for (int f = 0; f < kW; ++f) out[r][f] = SumLanes(acc[r][f]);
}

// Split streams (as the int8 pass, linear_avx512_vnni_fused.cc): the slice
// cut into kW contiguous parts, a pass taking the next W row of each, so
// each x load serves kW rows and every part is still read front to back.
// `dot(wrows, rows)` computes the pass and writes the rows that exist.
template <int kW, typename DotFn>
inline void SplitStreams(const LinearWeight& w, const LinearSliceArgs& a, DotFn dot) {
  const auto* weights = static_cast<const uint16_t*>(w.data);
  isa::ForEachSplitStreamPass<kW>(a.n_begin, a.n_end, [&](const int64_t(&rows)[kW]) {
    const uint16_t* wrows[kW];
    for (int f = 0; f < kW; ++f)  // a row past the slice repeats the first and is dropped
      wrows[f] = weights + (rows[f] >= 0 ? rows[f] : rows[0]) * w.k;
    dot(wrows, rows);
  });
}

// kMR rows of x: as many W rows side by side as the registers hold with
// kMR x kW accumulators (kW + 2 more for the loads).
template <int kMR>
void StreamRowTile(const LinearWeight& w, const LinearSliceArgs& a) {
  constexpr int kW = 28 / (kMR + 1) < 6 ? 28 / (kMR + 1) : 6;
  static_assert(kW >= 1 && kMR * kW + kW + 2 <= 32);
  const auto* x = static_cast<const uint16_t*>(a.prepared);
  SplitStreams<kW>(w, a, [&](const uint16_t* const(&wrows)[kW], const int64_t(&rows)[kW]) {
    float dots[kMR][kW];
    DotRowTile<kMR, kW>(x, wrows, w.k, dots);
    for (int r = 0; r < kMR; ++r)
      for (int f = 0; f < kW; ++f)
        if (rows[f] >= 0) a.y[r * a.ldy + rows[f]] = dots[r][f] + (a.bias != nullptr ? a.bias[rows[f]] : 0.0f);
  });
}

template <int kMR = kMaxRows>
void StreamRows(const LinearWeight& w, const LinearSliceArgs& a) {
  if constexpr (kMR >= 2) {
    if (a.m == kMR) return StreamRowTile<kMR>(w, a);
    StreamRows<kMR - 1>(w, a);
  }
}

}  // namespace

int64_t Bf16StreamPreparedBytes(int64_t m, int64_t k) {
  if (!Streams(m, k)) return 0;
  return m * 2 * HalfStride(k) * static_cast<int64_t>(sizeof(uint16_t));
}

int64_t Bf16StreamRowBlocks(int64_t m) { return m; }

void Bf16StreamPrepare(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t row_begin, int64_t row_end,
                       void* prepared) {
  if (!Streams(m, k)) return;
  const int64_t kp = PaddedK(k), half = HalfStride(k);
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  auto* out = static_cast<uint16_t*>(prepared);
  // One row: hi then lo, each K long, HalfStride apart. Several rows:
  // chunk-major, each 32 values' chunk holding every row's hi and lo side
  // by side, so a pass reaches them at constant offsets from one pointer.
  const int64_t lo_offset = m == 1 ? half : 32;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t kk = 0; kk < kp; kk += 16) {
      const int64_t valid = Min(16, k - kk);
      const __mmask16 mask = valid >= 16  ? __mmask16{0xffff}
                             : valid <= 0 ? __mmask16{0}
                                          : static_cast<__mmask16>((1u << valid) - 1);
      const __m512 v = _mm512_maskz_loadu_ps(mask, x + r * ldx + kk);
      const __m512i top = _mm512_and_si512(_mm512_castps_si512(v), high_half);
      const __m512 rest = _mm512_sub_ps(v, _mm512_castsi512_ps(top));
      uint16_t* hi = m == 1 ? out + kk : out + (kk / 32) * m * 64 + r * 64 + kk % 32;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi), _mm512_cvtepi32_epi16(_mm512_srli_epi32(top, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + lo_offset), (__m256i)_mm512_cvtneps_pbh(rest));
    }
  }
}

void Bf16StreamBf16(const LinearWeight& w, const LinearSliceArgs& a) {
  if (!Streams(a.m, w.k)) return Avx512StreamBf16(w, a);
  if (a.m > 1) return StreamRows(w, a);
  const int64_t k = w.k, half = HalfStride(k);
  const auto* xh = static_cast<const uint16_t*>(a.prepared);
  constexpr int kW = 4;
  SplitStreams<kW>(w, a, [&](const uint16_t* const(&wrows)[kW], const int64_t(&rows)[kW]) {
    float dots[kW];
    DotRows<kW>(xh, half, wrows, k, dots);
    for (int f = 0; f < kW; ++f)
      if (rows[f] >= 0) a.y[rows[f]] = dots[f] + (a.bias != nullptr ? a.bias[rows[f]] : 0.0f);
  });
}

}  // namespace tandem::isa
