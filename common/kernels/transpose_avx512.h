// 16 x 16 transposes of dwords in zmm registers, for the AVX-512 translation
// units only (linear_avx512_bf16.cc, linear_amx.cc): compiled with their
// flags, and an unnamed namespace gives each unit its own copy, so the
// linker never hands one unit's copy to another.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace tandem::isa {
namespace {

// 16 x 16 transpose of dwords: out[c] lane r = in[r] lane c.
inline void Transpose16x16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[g][c] (rows 4g..4g+3): 128-bit lane L holds column 4L + c.
  __m512i u[4][4];
  for (int g = 0; g < 4; ++g) {
    u[g][0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[g][1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[g][2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[g][3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // A 4 x 4 transpose of 128-bit lanes for each c: out[4L + c] lane g = u[g][c] lane L.
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[0][c], u[1][c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[2][c], u[3][c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// x [m, k] f32 rounded to bf16 (nearest even; vcvtne2ps2bf16 treats
// denormal inputs as zero) in blocks of 16 rows, [block][pairs][16 rows] of
// (x[2p], x[2p+1]) dwords: lanes over rows, as vdpbf16ps broadcasts meet
// them and as a tdpbf16ps B tile holds them (16 pairs x 16 rows). Rows past
// m and values past k zero; `pairs` >= ceil(k / 2) (more pads with zeros).
inline void PrepareBf16PairBlocks(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t pairs, int64_t block_begin,
                                  int64_t block_end, uint32_t* out) {
  for (int64_t block = block_begin; block < block_end; ++block) {
    uint32_t* dst = out + block * pairs * 16;
    const int64_t r0 = block * 16;
    // 16 rows x 32 values (16 pairs) at a time, transposed to [pair][row].
    for (int64_t k0 = 0; k0 < 2 * pairs; k0 += 32) {
      const int64_t valid = k - k0 < 0 ? 0 : k - k0 > 32 ? 32 : k - k0;
      const auto lo_mask = static_cast<__mmask16>(valid >= 16 ? 0xffff : (1u << valid) - 1);
      const auto hi_mask = static_cast<__mmask16>(valid >= 32 ? 0xffff : valid <= 16 ? 0 : (1u << (valid - 16)) - 1);
      __m512i v[16];
      for (int r = 0; r < 16; ++r) {
        if (r0 + r >= m) {
          v[r] = _mm512_setzero_si512();
          continue;
        }
        const float* row = x + (r0 + r) * ldx + k0;
        const __m512 lo = _mm512_maskz_loadu_ps(lo_mask, row);
        const __m512 hi = _mm512_maskz_loadu_ps(hi_mask, row + 16);
        // Element i of the result: x[k0 + i] rounded to bf16; dword i the pair.
        v[r] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
      }
      Transpose16x16(v);
      const int64_t p0 = k0 / 2;
      const int64_t count = pairs - p0 < 16 ? pairs - p0 : 16;
      for (int64_t i = 0; i < count; ++i) _mm512_store_si512(dst + (p0 + i) * 16, v[i]);
    }
  }
}

}  // namespace
}  // namespace tandem::isa
