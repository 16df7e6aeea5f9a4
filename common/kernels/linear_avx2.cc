// AVX2 + FMA + F16C kernels: the build's baseline, on every x86-64 CPU
// tandem runs on. Legend as in linear.h: M rows, K input features, N output
// features; a "slice" is a range of output features owned by one task.
#include <immintrin.h>

#include <algorithm>

#include "common/kernels/linear_isa.h"
#include "common/kernels/packed_panels.h"

namespace tandem::isa {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------
// Stream path: AVX2/FMA dot products, W read once per call for all M rows.
// ---------------------------------------------------------------------------

// Eight consecutive weights of one W row, widened to f32.
template <DType kDType>
inline __m256 LoadWeights8(const void* row, int64_t k);

template <>
inline __m256 LoadWeights8<DType::kF32>(const void* row, int64_t k) {
  return _mm256_loadu_ps(static_cast<const float*>(row) + k);
}

template <>
inline __m256 LoadWeights8<DType::kF16>(const void* row, int64_t k) {
  const auto* p = static_cast<const uint16_t*>(row) + k;
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// bf16 is the top half of an f32: zero-extend to 32 bits and shift left.
template <>
inline __m256 LoadWeights8<DType::kBF16>(const void* row, int64_t k) {
  const auto* p = static_cast<const uint16_t*>(row) + k;
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

template <DType kDType>
constexpr int64_t kWeightBytes = kDType == DType::kF32 ? 4 : 2;

template <DType kDType>
inline const void* WeightRow(const void* data, int64_t row, int64_t k) {
  return static_cast<const char*>(data) + row * k * kWeightBytes<kDType>;
}

inline float HorizontalSum(__m256 v) {
  __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
  sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
  return _mm_cvtss_f32(sum);
}

// Partial sums of one block of output features: acc[r][j] holds 8 lanes of
// x[r, :k] . W[j0 + j, :k] over the K blocks done so far.
constexpr int64_t kStreamBlock = 8;     // W rows walked together (one register tile row)
constexpr int64_t kStreamRows = 16;     // x rows per pass over W; more rows pass W again
constexpr int64_t kStreamBlockK = 256;  // x[16 rows, 256] f32 = 16 KB + W[8, 256] stay in L1
using StreamAccumulators = __m256[kStreamRows][kStreamBlock];

// acc[r][j0 + j] += x[r, k0:k0+kb] . W[row j, k0:k0+kb] for r < kMR, j < kNR:
// kMR x kNR accumulators in registers, each W vector loaded once for kMR rows
// and each x vector once for kNR weight rows. kb is a multiple of 8.
template <DType kDType, int kMR, int kNR>
inline void StreamTile(const float* x, int64_t ldx, const void* const* rows, int64_t k0, int64_t kb,
                       StreamAccumulators& acc_io, int r0, int j0, bool first) {
  // Local copies: the compiler keeps them in registers instead of reloading.
  const void* w[kNR];
  for (int j = 0; j < kNR; ++j) w[j] = rows[j0 + j];
  __m256 acc[kMR][kNR];
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < kNR; ++j) acc[r][j] = first ? _mm256_setzero_ps() : acc_io[r0 + r][j0 + j];
  for (int64_t kk = k0; kk < k0 + kb; kk += 8) {
    if constexpr (kMR == 1) {
      // Convert-and-use one W vector at a time: loading all kNR first would
      // need 8 + 8 + 1 registers and spill an accumulator, whose chain
      // through memory then sets the pace.
      const __m256 xv = _mm256_loadu_ps(x + kk);
      for (int j = 0; j < kNR; ++j) acc[0][j] = _mm256_fmadd_ps(xv, LoadWeights8<kDType>(w[j], kk), acc[0][j]);
    } else {
      __m256 wv[kNR];
      for (int j = 0; j < kNR; ++j) wv[j] = LoadWeights8<kDType>(w[j], kk);
      for (int r = 0; r < kMR; ++r) {
        __m256 xv = _mm256_loadu_ps(x + r * ldx + kk);
        // Load x once into a register: folded into every FMA it would be
        // loaded kNR times, and 256-bit loads (2 per cycle) become the limit.
        asm("" : "+x"(xv));
        for (int j = 0; j < kNR; ++j) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
      }
    }
  }
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < kNR; ++j) acc_io[r0 + r][j0 + j] = acc[r][j];
}

// All x rows of the chunk against kNR W rows: the W rows' K block stays in L1
// for every row group (loading the next W rows first would let rows 4 KB apart
// evict each other from the same L1 sets).
template <DType kDType, int kNR>
inline void StreamColumns(const float* x, int64_t ldx, const void* const* rows, int mc, int64_t k0, int64_t kb,
                          StreamAccumulators& acc, int j0, bool first) {
  int r = 0;
  if constexpr (kNR <= 2) {
    for (; r + 6 <= mc; r += 6) StreamTile<kDType, 6, kNR>(x + r * ldx, ldx, rows, k0, kb, acc, r, j0, first);
  }
  for (; r + 4 <= mc; r += 4) StreamTile<kDType, 4, kNR>(x + r * ldx, ldx, rows, k0, kb, acc, r, j0, first);
  switch (mc - r) {
    case 3: StreamTile<kDType, 3, kNR>(x + r * ldx, ldx, rows, k0, kb, acc, r, j0, first); break;
    case 2: StreamTile<kDType, 2, kNR>(x + r * ldx, ldx, rows, k0, kb, acc, r, j0, first); break;
    case 1: StreamTile<kDType, 1, kNR>(x + r * ldx, ldx, rows, k0, kb, acc, r, j0, first); break;
    default: break;
  }
}

// The register tile (rows x W rows) narrows as rows grow so that accumulators
// + weight vectors + one x vector fit the 16 ymm registers: 1 x 8, 2 x 4,
// then 6 x 2 (and 4/3 x 2 for the remainder).
template <DType kDType, int kNR>
inline void StreamBlock(const float* x, int64_t ldx, const void* const* rows, int mc, int nb, int64_t k0, int64_t kb,
                        StreamAccumulators& acc, bool first) {
  int j = 0;
  for (; j + kNR <= nb; j += kNR) StreamColumns<kDType, kNR>(x, ldx, rows, mc, k0, kb, acc, j, first);
  for (; j < nb; ++j) StreamColumns<kDType, 1>(x, ldx, rows, mc, k0, kb, acc, j, first);
}

// One output from its 8-lane sum over K's first k8 values: the lanes, then
// K's tail, in the order every row count uses.
template <DType kDType>
inline float FinishRow(__m256 acc, const float* x, const void* row, int64_t k8, int64_t k) {
  float sum = k8 > 0 ? HorizontalSum(acc) : 0.0f;
  for (int64_t kk = k8; kk < k; ++kk) sum += x[kk] * LoadAsF32(row, kDType, kk);
  return sum;
}

// One row of x (decode): the slice cut into kStreamBlock contiguous parts, a
// pass taking the next W row of each (isa::ForEachSplitStreamPass), each
// prefetched ahead: the same arithmetic per output as StreamTile<1, 8>, but
// every part is read front to back as its own stream, which the hardware
// prefetcher alone keeps short of the read bandwidth.
template <DType kDType>
void StreamOneRow(const LinearWeight& w, const LinearSliceArgs& a) {
  constexpr int kW = static_cast<int>(kStreamBlock);
  const int64_t k = w.k, k8 = k & ~int64_t{7};
  const float* x = a.x;
  isa::ForEachSplitStreamPass<kW>(a.n_begin, a.n_end, [&](const int64_t(&rows)[kW]) {
    const char* wr[kW];
    for (int f = 0; f < kW; ++f)  // a row past the slice repeats the first and is dropped
      wr[f] = static_cast<const char*>(WeightRow<kDType>(w.data, rows[f] >= 0 ? rows[f] : rows[0], k));
    __m256 acc[kW];
    for (int f = 0; f < kW; ++f) acc[f] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k8; kk += 8) {
      const __m256 xv = _mm256_loadu_ps(x + kk);
      for (int f = 0; f < kW; ++f) {
        _mm_prefetch(wr[f] + kk * kWeightBytes<kDType> + isa::kDecodePrefetchAheadBytes, _MM_HINT_T0);
        acc[f] = _mm256_fmadd_ps(xv, LoadWeights8<kDType>(wr[f], kk), acc[f]);
      }
    }
    for (int f = 0; f < kW; ++f) {
      if (rows[f] < 0) continue;
      const float sum = FinishRow<kDType>(acc[f], x, wr[f], k8, k);
      a.y[rows[f]] = a.bias != nullptr ? sum + a.bias[rows[f]] : sum;
    }
  });
}

// Output features are walked in blocks of kStreamBlock W rows, K in blocks of
// kStreamBlockK, so the x block and the W rows in use stay in L1: DRAM sees
// each weight once per kStreamRows rows of x, and L2 is not the bottleneck
// (without K blocking, 4+ rows of x at K = 4096 spill to L2).
template <DType kDType>
void StreamSlice(const LinearWeight& w, const LinearSliceArgs& a) {
  if (a.m == 1) return StreamOneRow<kDType>(w, a);
  const int64_t k = w.k, m = a.m, ldx = a.ldx, ldy = a.ldy, n_begin = a.n_begin, n_end = a.n_end;
  const float* x = a.x;
  const float* bias = a.bias;
  float* y = a.y;
  const int64_t k8 = k & ~int64_t{7};
  alignas(32) StreamAccumulators acc;
  for (int64_t row0 = 0; row0 < m; row0 += kStreamRows) {
    const int mc = static_cast<int>(std::min(kStreamRows, m - row0));
    const float* xc = x + row0 * ldx;
    for (int64_t j0 = n_begin; j0 < n_end; j0 += kStreamBlock) {
      const int nb = static_cast<int>(std::min(kStreamBlock, n_end - j0));
      const void* rows[kStreamBlock];
      for (int j = 0; j < nb; ++j) rows[j] = WeightRow<kDType>(w.data, j0 + j, k);
      // One row of x needs no K blocking (it is the only x in L1), and whole
      // W rows read front to back are what the hardware prefetcher streams best.
      const int64_t block_k = mc == 1 ? std::max<int64_t>(k8, 8) : kStreamBlockK;
      for (int64_t k0 = 0; k0 < k8; k0 += block_k) {
        const int64_t kb = std::min(block_k, k8 - k0);
        const bool first = k0 == 0;
        if (mc == 1) {
          StreamBlock<kDType, 8>(xc, ldx, rows, mc, nb, k0, kb, acc, first);
        } else if (mc == 2) {
          StreamBlock<kDType, 4>(xc, ldx, rows, mc, nb, k0, kb, acc, first);
        } else {
          StreamBlock<kDType, 2>(xc, ldx, rows, mc, nb, k0, kb, acc, first);
        }
      }
      for (int r = 0; r < mc; ++r) {
        for (int j = 0; j < nb; ++j) {
          const float sum = FinishRow<kDType>(acc[r][j], xc + r * ldx, rows[j], k8, k);
          y[(row0 + r) * ldy + j0 + j] = bias != nullptr ? sum + bias[j0 + j] : sum;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Packed path: BLIS-style f32 GEMM. W is widened and transposed into panels
// of kPanel output features (K-major, f32), once per task and call; then a
// 6 x 16 register tile of y accumulates x[6 rows] (broadcast) times a panel.
// ---------------------------------------------------------------------------

constexpr int kTileRows = 6;         // rows of x per micro-kernel call
constexpr int64_t kPanel = 16;       // output features per panel: two ymm
constexpr int64_t kBlockK = 256;     // K block: one panel is 16 KB f32, L1-resident
constexpr int64_t kBlockRows = 144;  // rows of x per pass: x block [144, 256] f32 = 144 KB, L2-resident

// Transposes 8 rows of 8 f32 (r[j][t]) so that out[t][j] = r[j][t].
inline void Transpose8x8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// panel[kk * 16 + jj] = W[n0 + jj, k0 + kk] as f32 for kk < kb, jj < 16;
// features at or beyond n_end are zero so the micro-kernel needs no N tail.
template <DType kDType>
void PackPanel(const void* w, int64_t k, int64_t n0, int64_t n_end, int64_t k0, int64_t kb, float* panel) {
  for (int half = 0; half < 2; ++half) {
    const int64_t j0 = n0 + 8 * half;
    const int valid = static_cast<int>(std::clamp<int64_t>(n_end - j0, 0, 8));
    const void* rows[8];
    for (int j = 0; j < 8; ++j) rows[j] = WeightRow<kDType>(w, j < valid ? j0 + j : j0, k);
    int64_t kk = 0;
    for (; kk + 8 <= kb; kk += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = j < valid ? LoadWeights8<kDType>(rows[j], k0 + kk) : _mm256_setzero_ps();
      Transpose8x8(r);
      for (int t = 0; t < 8; ++t) _mm256_storeu_ps(panel + (kk + t) * kPanel + 8 * half, r[t]);
    }
    for (; kk < kb; ++kk)
      for (int j = 0; j < 8; ++j)
        panel[kk * kPanel + 8 * half + j] = j < valid ? LoadAsF32(rows[j], kDType, k0 + kk) : 0.0f;
  }
}

// c[r, 0:16] (+)= sum_kk x[r, kk] * panel[kk, 0:16] for r < kRows. 2 x kRows
// accumulators, two panel vectors and one broadcast: 15 of 16 ymm at kRows = 6.
template <int kRows>
inline void MicroKernel(const float* x, int64_t ldx, const float* panel, int64_t kb, float* c, int64_t ldc,
                        bool accumulate) {
  __m256 acc[kRows][2];
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = accumulate ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = accumulate ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t kk = 0; kk < kb; ++kk) {
    const __m256 b0 = _mm256_loadu_ps(panel + kk * kPanel);
    const __m256 b1 = _mm256_loadu_ps(panel + kk * kPanel + 8);
    for (int r = 0; r < kRows; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * ldx + kk);
      acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

inline void MicroKernelRows(int rows, const float* x, int64_t ldx, const float* panel, int64_t kb, float* c,
                            int64_t ldc, bool accumulate) {
  switch (rows) {
    case 6: MicroKernel<6>(x, ldx, panel, kb, c, ldc, accumulate); break;
    case 5: MicroKernel<5>(x, ldx, panel, kb, c, ldc, accumulate); break;
    case 4: MicroKernel<4>(x, ldx, panel, kb, c, ldc, accumulate); break;
    case 3: MicroKernel<3>(x, ldx, panel, kb, c, ldc, accumulate); break;
    case 2: MicroKernel<2>(x, ldx, panel, kb, c, ldc, accumulate); break;
    case 1: MicroKernel<1>(x, ldx, panel, kb, c, ldc, accumulate); break;
    default: break;
  }
}

// y (+ bias) from x and the slice's f32 panels, with this ISA's tiles.
void MultiplyPackedPanels(const LinearSliceArgs& a, int64_t k, const float* packed) {
  MultiplyPanels<PanelBlocking{kPanel, kTileRows, kBlockRows, kBlockK}>(
      a, k, packed,
      [](int rows, const float* xr, int64_t ldx, const float* panel, int64_t kb, float* c, int64_t ldc,
         bool accumulate) { MicroKernelRows(rows, xr, ldx, panel, kb, c, ldc, accumulate); });
}

template <DType kDType>
void PackedSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  const int64_t k = w.k, n_begin = a.n_begin, n_end = a.n_end;
  // The whole slice is packed up front, over all of K: each group of 8 W rows
  // is read front to back (8 sequential streams the hardware prefetcher
  // follows; packing per K block would touch every row of the slice at once
  // and wait on DRAM latency), and W is read from DRAM once whatever M is.
  // The f32 panels (a few MB, see LinearTaskFeatures) then live in L2/L3.
  const int64_t panels = CeilDiv(n_end - n_begin, kPanel);
  const int64_t panel_stride = kPanel * k;
  float* packed = static_cast<float*>(scratch);  // [panels, k, kPanel], Avx2PackedScratchBytes
  for (int64_t p = 0; p < panels; ++p)
    PackPanel<kDType>(w.data, k, n_begin + p * kPanel, n_end, 0, k, packed + p * panel_stride);

  MultiplyPackedPanels(a, k, packed);
}

}  // namespace

void Avx2StreamF32(const LinearWeight& w, const LinearSliceArgs& a) { StreamSlice<DType::kF32>(w, a); }
void Avx2StreamF16(const LinearWeight& w, const LinearSliceArgs& a) { StreamSlice<DType::kF16>(w, a); }
void Avx2StreamBf16(const LinearWeight& w, const LinearSliceArgs& a) { StreamSlice<DType::kBF16>(w, a); }

static_assert(kPanel == isa::kAvx2Panel);
void Avx2MultiplyPanels(const LinearSliceArgs& a, int64_t k, const float* packed) {
  MultiplyPackedPanels(a, k, packed);
}

int64_t Avx2PackedScratchBytes(int64_t k, int64_t features) {
  return CeilDiv(features, kPanel) * kPanel * k * static_cast<int64_t>(sizeof(float));
}
void Avx2PackedF32(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  PackedSlice<DType::kF32>(w, a, scratch);
}
void Avx2PackedF16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  PackedSlice<DType::kF16>(w, a, scratch);
}
void Avx2PackedBf16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  PackedSlice<DType::kBF16>(w, a, scratch);
}

// 12 independent chains: FMA latency 4-5 and 2 FMA ports need >= 10 to keep
// both busy. Assembly because compilers keep an accumulator array in memory,
// and store forwarding then sets the pace instead of the FMA units. Operands
// are zero: FMA timing does not depend on the values.
void Avx2FmaLoop(int64_t iterations) {
  if (iterations <= 0) return;
  asm volatile(
      "vxorps %%ymm0, %%ymm0, %%ymm0\n\t"
      "vxorps %%ymm1, %%ymm1, %%ymm1\n\t"
      "vxorps %%ymm2, %%ymm2, %%ymm2\n\t"
      "vxorps %%ymm3, %%ymm3, %%ymm3\n\t"
      "vxorps %%ymm4, %%ymm4, %%ymm4\n\t"
      "vxorps %%ymm5, %%ymm5, %%ymm5\n\t"
      "vxorps %%ymm6, %%ymm6, %%ymm6\n\t"
      "vxorps %%ymm7, %%ymm7, %%ymm7\n\t"
      "vxorps %%ymm8, %%ymm8, %%ymm8\n\t"
      "vxorps %%ymm9, %%ymm9, %%ymm9\n\t"
      "vxorps %%ymm10, %%ymm10, %%ymm10\n\t"
      "vxorps %%ymm11, %%ymm11, %%ymm11\n\t"
      "vxorps %%ymm14, %%ymm14, %%ymm14\n\t"
      "vxorps %%ymm15, %%ymm15, %%ymm15\n\t"
      "1:\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm0\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm1\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm2\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm3\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm4\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm5\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm6\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm7\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm8\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm9\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm10\n\t"
      "vfmadd231ps %%ymm14, %%ymm15, %%ymm11\n\t"
      "dec %0\n\t"
      "jnz 1b\n\t"
      "vzeroupper\n\t"
      : "+r"(iterations)
      :
      : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm14",
        "xmm15");
}

}  // namespace tandem::isa
