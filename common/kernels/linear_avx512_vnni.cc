// int8 dot products with AVX512-VNNI (vpdpbusd): the int8_dot kernel's
// inner tile (layout and meaning in linear_isa.h). Compiled with AVX-512
// F/BW/VL/DQ + VNNI flags; includes nothing but linear_isa.h.
#include <immintrin.h>

#include "common/kernels/linear_isa.h"

namespace tandem::isa {
namespace {

constexpr int kF = static_cast<int>(kInt8TileFeatures);

// (Not _mm512_reduce_add_ps: GCC 12 warns about the undefined vector inside it.)
float Sum(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

// 64 values of levels (or the last 32 of a row: upper half zero).
inline __m512i LoadLevels(const void* p, bool half) {
  return half ? _mm512_maskz_loadu_epi8(0xffffffffULL, p) : _mm512_loadu_si512(p);
}
// The 4 group scales of 64 values (2 when half), each spread over its 4 lanes.
inline __m512 LoadScales(const float* p, bool half) {
  const __m128 four = half ? _mm_maskz_loadu_ps(0x3, p) : _mm_loadu_ps(p);
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                               _mm512_broadcast_f32x4(four));
}

// sum over groups of W offsets * x offsets, for one W row and one x row.
float OffsetDot(const float* w, const float* x, int64_t groups) {
  __m512 acc = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + 16 <= groups; g += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(w + g), _mm512_loadu_ps(x + g), acc);
  if (g < groups) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (groups - g)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, w + g), _mm512_maskz_loadu_ps(mask, x + g), acc);
  }
  return Sum(acc);
}

// kRows x rows against the tile's kF W rows: per 64 values one vpdpbusd per
// (W row, x row), its int32 lanes scaled by the W and x group scales.
template <int kRows>
void Tile(const Int8DotTile& t, int64_t r0) {
  __m512 acc[kF][kRows];
  for (int f = 0; f < kF; ++f)
    for (int r = 0; r < kRows; ++r) acc[f][r] = _mm512_setzero_ps();
  const int8_t* xq[kRows];
  const float* xl[kRows];
  for (int r = 0; r < kRows; ++r) {
    xq[r] = reinterpret_cast<const int8_t*>(reinterpret_cast<const uint8_t*>(t.x_levels) + (r0 + r) * t.x_stride);
    xl[r] = reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(t.x_scales) + (r0 + r) * t.x_stride);
  }
  for (int64_t i = 0; i < t.k; i += 64) {
    const bool half = i + 64 > t.k;
    __m512i wv[kF];
    __m512 ws[kF];
    for (int f = 0; f < kF; ++f) {
      wv[f] = LoadLevels(t.w_levels[f] + i, half);
      ws[f] = LoadScales(t.w_scales[f] + i / 16, half);
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512i xv = LoadLevels(xq[r] + i, half);
      const __m512 xs = LoadScales(xl[r] + i / 16, half);
      for (int f = 0; f < kF; ++f) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[f], xv);
        acc[f][r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), ws[f]), xs, acc[f][r]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const float* xo =
        reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(t.x_offsets) + (r0 + r) * t.x_stride);
    for (int f = 0; f < kF; ++f) t.out[(r0 + r) * kF + f] = Sum(acc[f][r]) + OffsetDot(t.w_offsets[f], xo, t.k / 16);
  }
}

}  // namespace

void Avx512VnniInt8Dot(const Int8DotTile& t) {
  int64_t r = 0;
  for (; r + 4 <= t.rows; r += 4) Tile<4>(t, r);
  switch (t.rows - r) {
    case 3: Tile<3>(t, r); break;
    case 2: Tile<2>(t, r); break;
    case 1: Tile<1>(t, r); break;
    default: break;
  }
}

// 24 independent vpdpbusd chains on registers (the int8 dot-product peak).
void Avx512VnniDotLoop(int64_t iterations) {
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
      "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm1\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm2\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm3\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm4\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm5\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm6\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm7\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm8\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm9\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm10\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm11\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm12\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm13\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm14\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm15\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm16\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm17\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm18\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm19\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm20\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm21\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm22\n\t"
      "vpdpbusd %%zmm30, %%zmm31, %%zmm23\n\t"
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
