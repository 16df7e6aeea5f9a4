// AVX-512 (F, BW, VL, DQ) kernels with f32 FMA: compiled with those flags
// only here (common/CMakeLists.txt) and reached only when ActiveIsa() is
// avx512 or above. Same two paths as the AVX2 baseline, with 16-lane
// vectors and 32 registers:
//  - stream (decode, memory-bound): each weight is loaded once per call for
//    up to 16 rows of x, widened to f32 in registers, f32 FMA;
//  - packed (prefill, compute-bound): the task's W slice widened and
//    transposed once into f32 panels of 32 features, a 14 x 32 register
//    tile of f32 FMAs (28 accumulators).
// Legend as in linear.h: M rows, K input features, N output features.
//
// Nothing here calls an inline function of a shared header (see
// linear_types.h): local helpers only, in an anonymous namespace.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "common/kernels/linear_isa.h"
#include "common/kernels/packed_panels.h"

namespace tandem::isa {
namespace {

inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }
inline int64_t Clamp(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }
inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <DType kDType>
constexpr int64_t kWeightBytes = kDType == DType::kF32 ? 4 : 2;

template <DType kDType>
inline const void* WeightRow(const void* data, int64_t row, int64_t k) {
  return static_cast<const char*>(data) + row * k * kWeightBytes<kDType>;
}

// One weight as f32 (the K tails).
template <DType kDType>
inline float WeightScalar(const void* row, int64_t k) {
  if constexpr (kDType == DType::kF32) {
    return static_cast<const float*>(row)[k];
  } else if constexpr (kDType == DType::kF16) {
    return _cvtsh_ss(static_cast<const uint16_t*>(row)[k]);
  } else {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(row)[k]) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }
}

// Sixteen consecutive weights of one W row, widened to f32.
template <DType kDType>
inline __m512 LoadWeights16(const void* row, int64_t k) {
  if constexpr (kDType == DType::kF32) {
    return _mm512_loadu_ps(static_cast<const float*>(row) + k);
  } else if constexpr (kDType == DType::kF16) {
    const auto* p = static_cast<const uint16_t*>(row) + k;
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    // bf16 is the top half of an f32: zero-extend to 32 bits and shift left.
    const auto* p = static_cast<const uint16_t*>(row) + k;
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
}

// ---------------------------------------------------------------------------
// Stream path.
// ---------------------------------------------------------------------------

constexpr int64_t kPrefetchBytes = 512;  // how far ahead in each W row the 1-row tile prefetches
template <DType kDType>
constexpr int64_t kLineElements = 64 / kWeightBytes<kDType>;  // weights per cache line (a power of two)
constexpr int64_t kStreamBlock = 8;                           // W rows walked together
constexpr int64_t kStreamRows = 16;                           // x rows per pass over W
constexpr int64_t kStreamBlockK = 256;                        // x[16, 256] f32 = 16 KB + W[8, 256] stay in L1
using StreamAccumulators = __m512[kStreamRows][kStreamBlock];

// acc[r][j0 + j] += x[r, k0:k0+kb] . W[row j, k0:k0+kb] for r < kMR, j < kNR,
// in registers; kb is a multiple of 16.
template <DType kDType, int kMR, int kNR>
inline void StreamTile(const float* x, int64_t ldx, const void* const* rows, int64_t k0, int64_t kb,
                       StreamAccumulators& acc_io, int r0, int j0, bool first) {
  const void* w[kNR];
  for (int j = 0; j < kNR; ++j) w[j] = rows[j0 + j];
  __m512 acc[kMR][kNR];
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < kNR; ++j) acc[r][j] = first ? _mm512_setzero_ps() : acc_io[r0 + r][j0 + j];
  for (int64_t kk = k0; kk < k0 + kb; kk += 16) {
    if constexpr (kMR == 1) {
      // Decode: DRAM-bound. A software prefetch 512 B ahead in each of the
      // kNR rows, once per 64-byte line, keeps more misses in flight than the
      // hardware prefetcher alone (measured at K = 4096, 2 threads).
      if (((kk - k0) & (kLineElements<kDType> - 1)) == 0)
        for (int j = 0; j < kNR; ++j)
          _mm_prefetch(static_cast<const char*>(w[j]) + kk * kWeightBytes<kDType> + kPrefetchBytes, _MM_HINT_T0);
      const __m512 xv = _mm512_loadu_ps(x + kk);
      for (int j = 0; j < kNR; ++j) acc[0][j] = _mm512_fmadd_ps(xv, LoadWeights16<kDType>(w[j], kk), acc[0][j]);
    } else {
      __m512 wv[kNR];
      for (int j = 0; j < kNR; ++j) wv[j] = LoadWeights16<kDType>(w[j], kk);
      for (int r = 0; r < kMR; ++r) {
        __m512 xv = _mm512_loadu_ps(x + r * ldx + kk);
        asm("" : "+v"(xv));  // one load, reused by kNR FMAs
        for (int j = 0; j < kNR; ++j) acc[r][j] = _mm512_fmadd_ps(xv, wv[j], acc[r][j]);
      }
    }
  }
  for (int r = 0; r < kMR; ++r)
    for (int j = 0; j < kNR; ++j) acc_io[r0 + r][j0 + j] = acc[r][j];
}

template <DType kDType, int kMR, int kNR>
inline void StreamRows(const float* x, int64_t ldx, const void* const* rows, int mc, int64_t k0, int64_t kb,
                       StreamAccumulators& acc, int j0, bool first) {
  int r = 0;
  for (; r + kMR <= mc; r += kMR) StreamTile<kDType, kMR, kNR>(x + r * ldx, ldx, rows, k0, kb, acc, r, j0, first);
  for (; r < mc; ++r) StreamTile<kDType, 1, kNR>(x + r * ldx, ldx, rows, k0, kb, acc, r, j0, first);
}

// Register tiles (rows x W rows) that fit 32 zmm with the weight vectors:
// 1 x 8, 2 x 8, 4 x 4, 8 x 2.
template <DType kDType>
inline void StreamBlock(const float* x, int64_t ldx, const void* const* rows, int mc, int nb, int64_t k0, int64_t kb,
                        StreamAccumulators& acc, bool first) {
  auto columns = [&](auto nr_tag, int j) {
    constexpr int kNR = decltype(nr_tag)::value;
    if (mc == 1) {
      StreamTile<kDType, 1, kNR>(x, ldx, rows, k0, kb, acc, 0, j, first);
    } else if (mc == 2) {
      StreamTile<kDType, 2, kNR>(x, ldx, rows, k0, kb, acc, 0, j, first);
    } else if (mc <= 4 || kNR > 2) {
      StreamRows<kDType, 4, kNR>(x, ldx, rows, mc, k0, kb, acc, j, first);
    } else {
      StreamRows<kDType, 8, kNR>(x, ldx, rows, mc, k0, kb, acc, j, first);
    }
  };
  int j = 0;
  if (mc <= 2) {
    for (; j + 8 <= nb; j += 8) columns(std::integral_constant<int, 8>{}, j);
  } else if (mc <= 4) {
    for (; j + 4 <= nb; j += 4) columns(std::integral_constant<int, 4>{}, j);
  } else {
    for (; j + 2 <= nb; j += 2) columns(std::integral_constant<int, 2>{}, j);
  }
  for (; j < nb; ++j) columns(std::integral_constant<int, 1>{}, j);
}

template <DType kDType>
void StreamSlice(const LinearWeight& w, const LinearSliceArgs& a) {
  const int64_t k = w.k, m = a.m, ldx = a.ldx, ldy = a.ldy, n_begin = a.n_begin, n_end = a.n_end;
  const float* x = a.x;
  const float* bias = a.bias;
  float* y = a.y;
  const int64_t k16 = k & ~int64_t{15};
  alignas(64) StreamAccumulators acc;
  for (int64_t row0 = 0; row0 < m; row0 += kStreamRows) {
    const int mc = static_cast<int>(Min(kStreamRows, m - row0));
    const float* xc = x + row0 * ldx;
    for (int64_t j0 = n_begin; j0 < n_end; j0 += kStreamBlock) {
      const int nb = static_cast<int>(Min(kStreamBlock, n_end - j0));
      const void* rows[kStreamBlock];
      for (int j = 0; j < nb; ++j) rows[j] = WeightRow<kDType>(w.data, j0 + j, k);
      // One row of x needs no K blocking (it is the only x in L1); whole W
      // rows read front to back are what the hardware prefetcher streams best.
      const int64_t block_k = mc == 1 ? Max(k16, 16) : kStreamBlockK;
      for (int64_t k0 = 0; k0 < k16; k0 += block_k) {
        StreamBlock<kDType>(xc, ldx, rows, mc, nb, k0, Min(block_k, k16 - k0), acc, k0 == 0);
      }
      for (int r = 0; r < mc; ++r) {
        for (int j = 0; j < nb; ++j) {
          float sum = k16 > 0 ? _mm512_reduce_add_ps(acc[r][j]) : 0.0f;
          for (int64_t kk = k16; kk < k; ++kk) sum += xc[r * ldx + kk] * WeightScalar<kDType>(rows[j], kk);
          if (bias != nullptr) sum += bias[j0 + j];
          y[(row0 + r) * ldy + j0 + j] = sum;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Packed path: BLIS-style f32 GEMM with 32-feature panels.
// ---------------------------------------------------------------------------

constexpr int kTileRows = 14;        // rows of x per micro-kernel call: 28 accumulators
constexpr int64_t kPanel = 32;       // output features per panel: two zmm
constexpr int64_t kBlockK = 128;     // K block: one panel block is 16 KB f32, L1-resident
constexpr int64_t kBlockRows = 140;  // rows of x per pass: [140, 128] f32 = 70 KB, L2-resident

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

template <DType kDType>
inline __m256 LoadWeights8(const void* row, int64_t k) {
  if constexpr (kDType == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(row) + k);
  } else if constexpr (kDType == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + k)));
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(row) + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
  }
}

// panel[kk * 32 + jj] = W[n0 + jj, kk] as f32 for kk < k, jj < 32; features
// at or beyond n_end are zero so the micro-kernel needs no N tail. Each group
// of 8 W rows is read front to back (8 sequential streams).
template <DType kDType>
void PackPanel(const void* w, int64_t k, int64_t n0, int64_t n_end, float* panel) {
  for (int group = 0; group < 4; ++group) {
    const int64_t j0 = n0 + 8 * group;
    const int valid = static_cast<int>(Clamp(n_end - j0, 0, 8));
    float* out = panel + 8 * group;
    if (valid == 0) {
      for (int64_t kk = 0; kk < k; ++kk) _mm256_storeu_ps(out + kk * kPanel, _mm256_setzero_ps());
      continue;
    }
    const void* rows[8];
    for (int j = 0; j < 8; ++j) rows[j] = WeightRow<kDType>(w, j < valid ? j0 + j : j0, k);
    int64_t kk = 0;
    for (; kk + 8 <= k; kk += 8) {
      __m256 r[8];
      for (int j = 0; j < 8; ++j) r[j] = j < valid ? LoadWeights8<kDType>(rows[j], kk) : _mm256_setzero_ps();
      Transpose8x8(r);
      for (int t = 0; t < 8; ++t) _mm256_storeu_ps(out + (kk + t) * kPanel, r[t]);
    }
    for (; kk < k; ++kk)
      for (int j = 0; j < 8; ++j) out[kk * kPanel + j] = j < valid ? WeightScalar<kDType>(rows[j], kk) : 0.0f;
  }
}

// c[r, 0:32] (+)= sum_kk x[r, kk] * panel[kk, 0:32] for r < kRows: 2 x kRows
// accumulators, two panel vectors, one broadcast (31 of 32 zmm at 14 rows).
// The x rows are reached from ceil(kRows / 3) pointers plus 0, 1 or 2 row
// strides ([base + stride * 2] addressing): 14 pointers would not fit the
// general registers.
template <int kRows>
inline void MicroKernel(const float* x, int64_t ldx, const float* panel, int64_t kb, float* c, int64_t ldc,
                        bool accumulate) {
  constexpr int kBases = (kRows + 2) / 3;
  __m512 acc[kRows][2];
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = accumulate ? _mm512_loadu_ps(c + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = accumulate ? _mm512_loadu_ps(c + r * ldc + 16) : _mm512_setzero_ps();
  }
  const float* base[kBases];
  for (int q = 0; q < kBases; ++q) base[q] = x + 3 * q * ldx;
  for (int64_t kk = 0; kk < kb; ++kk) {
    const __m512 b0 = _mm512_loadu_ps(panel + kk * kPanel);
    const __m512 b1 = _mm512_loadu_ps(panel + kk * kPanel + 16);
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(base[r / 3][(r % 3) * ldx]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
    }
    for (int q = 0; q < kBases; ++q) ++base[q];
  }
  for (int r = 0; r < kRows; ++r) {
    _mm512_storeu_ps(c + r * ldc, acc[r][0]);
    _mm512_storeu_ps(c + r * ldc + 16, acc[r][1]);
  }
}

template <int kRows = kTileRows>
inline void MicroKernelRows(int rows, const float* x, int64_t ldx, const float* panel, int64_t kb, float* c,
                            int64_t ldc, bool accumulate) {
  if constexpr (kRows > 0) {
    if (rows == kRows) return MicroKernel<kRows>(x, ldx, panel, kb, c, ldc, accumulate);
    MicroKernelRows<kRows - 1>(rows, x, ldx, panel, kb, c, ldc, accumulate);
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
  // The whole slice is packed up front, over all of K, so W is read from
  // DRAM once whatever M is; the f32 panels then live in L2/L3.
  const int64_t panels = CeilDiv(n_end - n_begin, kPanel);
  const int64_t panel_stride = kPanel * k;
  float* packed = static_cast<float*>(scratch);
  for (int64_t p = 0; p < panels; ++p)
    PackPanel<kDType>(w.data, k, n_begin + p * kPanel, n_end, packed + p * panel_stride);

  MultiplyPackedPanels(a, k, packed);
}

}  // namespace

void Avx512StreamF32(const LinearWeight& w, const LinearSliceArgs& a) { StreamSlice<DType::kF32>(w, a); }
void Avx512StreamF16(const LinearWeight& w, const LinearSliceArgs& a) { StreamSlice<DType::kF16>(w, a); }
void Avx512StreamBf16(const LinearWeight& w, const LinearSliceArgs& a) { StreamSlice<DType::kBF16>(w, a); }

static_assert(kPanel == isa::kAvx512Panel);
void Avx512MultiplyPanels(const LinearSliceArgs& a, int64_t k, const float* packed) {
  MultiplyPackedPanels(a, k, packed);
}

int64_t Avx512PackedScratchBytes(int64_t k, int64_t features) {
  return CeilDiv(features, kPanel) * kPanel * k * static_cast<int64_t>(sizeof(float));
}
void Avx512PackedF32(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  PackedSlice<DType::kF32>(w, a, scratch);
}
void Avx512PackedF16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  PackedSlice<DType::kF16>(w, a, scratch);
}
void Avx512PackedBf16(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  PackedSlice<DType::kBF16>(w, a, scratch);
}

// 24 independent zmm FMA chains: enough for latency 4 x 2 pipes with room to
// spare on every AVX-512 core; register-only, as Avx2FmaLoop.
void Avx512FmaLoop(int64_t iterations) {
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
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm0\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm1\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm2\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm3\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm4\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm5\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm6\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm7\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm8\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm9\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm10\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm11\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm12\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm13\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm14\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm15\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm16\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm17\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm18\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm19\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm20\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm21\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm22\n\t"
      "vfmadd231ps %%zmm30, %%zmm31, %%zmm23\n\t"
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
