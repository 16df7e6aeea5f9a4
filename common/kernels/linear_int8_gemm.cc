// The int8 GEMM for block-quantized weights at many rows of x (prefill):
// lanes over W rows, as ik_llama.cpp's repacked kernels lay them (its
// *_r8 types; written here from the idea, not its code). Baseline code
// (AVX2 + FMA + F16C).
//
// Why. The int8_dot pass (linear_avx2_int8_fused.cc and the tile of
// linear_int8_dot.cc) puts K in the lanes: every (x row, W row) pair needs
// its own int32-to-f32 conversion and scale per 32 values, and re-reads W
// every few rows. Here a panel of 8 W rows is decoded once per call into
// 8-bit levels with the 8 rows side by side in each 4-byte column, so one
// broadcast of 4 x levels meets 8 W rows in one vpmaddubsw, and the f32
// work (convert, scale, offset) is done once per 32 values (16 for Q6_K)
// for 8 outputs.
//
// Layout of a panel, per 16-value group g (kGroupBytes): the levels of
// quads 0..3 (values 16g + 4q .. +3), each [8 rows][4 bytes]; then the 8
// rows' scales and offsets (f32), as the decoders give them
// (W = scale * level + offset; linear_isa.h).
//
// Arithmetic. Levels of every type but Q8_0 and IQ4_NL/IQ4_XS (signed, as
// decoded here) are in [0, 64): vpmaddubsw
// takes them as its unsigned operand and x's int8 levels as the signed one;
// a pair sum is at most 2 * 63 * 127 = 16002, so two quads add in int16
// before vpmaddwd widens. Q8_0's levels are signed (|l| <= 127): its
// products take |l| and x carrying l's sign (vpsignb), each quad widened
// alone (2 * 127 * 127 fits int16, twice that does not). The int32 lanes
// of a group are exact; then y += float(sum) * w_scale * x_scale + w_offset
// * x_offset, in f32, group by group (two groups' int32 sums first where
// the type scales per 32): the same terms as the int8_dot tile,
// summed in another order (its error bound, linear_int8_dot.h).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "common/kernels/linear_int8_dot.h"

namespace tandem {
namespace {

constexpr int kPanelRows = 8;                         // W rows per panel: one ymm of int32 lanes
constexpr int64_t kGroup = 16;                        // values per scale
constexpr int64_t kQuadBytes = kPanelRows * 4;        // one 4-value column of the panel
constexpr int64_t kGroupLevelBytes = 4 * kQuadBytes;  // 128
constexpr int64_t kGroupBytes = kGroupLevelBytes + 2 * kPanelRows * sizeof(float);  // + scales, offsets
constexpr int kRows = 4;                                                            // x rows per register tile

struct PanelView {
  const uint8_t* groups;
  int64_t num_groups;
};

inline __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// acc[r] (8 lanes: the panel's rows) += row r of x . the panel, r < kR.
// x rows `x_stride` bytes apart: levels, then scales and offsets per group.
// kPairs: the type scales per 32 values (all but Q6_K), so two groups' int32
// sums add before one f32 step (their scales and offsets are the same).
template <int kR, bool kSigned, bool kOffsets, bool kPairs>
inline void PanelTile(const PanelView& panel, const uint8_t* x, int64_t x_stride, int64_t scales_at, int64_t offsets_at,
                      float* out, int64_t ldo) {
  constexpr int kSpan = kPairs ? 2 : 1;  // groups a step
  __m256 acc[kR];
  for (int r = 0; r < kR; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < panel.num_groups; g += kSpan) {
    __m256i sum[kR];
    for (int r = 0; r < kR; ++r) sum[r] = _mm256_setzero_si256();
    for (int h = 0; h < kSpan; ++h) {
      const uint8_t* grp = panel.groups + (g + h) * kGroupBytes;
      __m256i w[4], a[4];
      for (int q = 0; q < 4; ++q) {
        w[q] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(grp + q * kQuadBytes));
        a[q] = kSigned ? _mm256_abs_epi8(w[q]) : w[q];
      }
#pragma GCC unroll 4
      for (int r = 0; r < kR; ++r) {
        const auto* xq = reinterpret_cast<const int8_t*>(x + r * x_stride + (g + h) * kGroup);
        if constexpr (kSigned) {
          __m256i s[4];
          for (int q = 0; q < 4; ++q)
            s[q] = _mm256_madd_epi16(_mm256_maddubs_epi16(a[q], _mm256_sign_epi8(Broadcast4(xq + 4 * q), w[q])), ones);
          sum[r] =
              _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3])));
        } else {
          const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(a[0], Broadcast4(xq)),
                                               _mm256_maddubs_epi16(a[1], Broadcast4(xq + 4)));
          const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(a[2], Broadcast4(xq + 8)),
                                               _mm256_maddubs_epi16(a[3], Broadcast4(xq + 12)));
          sum[r] =
              _mm256_add_epi32(sum[r], _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones)));
        }
      }
    }
    const float* params = reinterpret_cast<const float*>(panel.groups + g * kGroupBytes + kGroupLevelBytes);
    const __m256 w_scale = _mm256_loadu_ps(params);
#pragma GCC unroll 4
    for (int r = 0; r < kR; ++r) {
      const uint8_t* xr = x + r * x_stride;
      const float x_scale = reinterpret_cast<const float*>(xr + scales_at)[g];
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(w_scale, _mm256_set1_ps(x_scale)), acc[r]);
      if constexpr (kOffsets) {
        const float* xo = reinterpret_cast<const float*>(xr + offsets_at) + g;
        const float x_offset = kPairs ? xo[0] + xo[1] : xo[0];
        acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(params + kPanelRows), _mm256_set1_ps(x_offset), acc[r]);
      }
    }
  }
  for (int r = 0; r < kR; ++r) _mm256_storeu_ps(out + r * ldo, acc[r]);
}

template <bool kSigned, bool kOffsets, bool kPairs>
void PanelRows(const PanelView& panel, const uint8_t* x, int64_t m, const Int8RowLayoutView& layout, float* out) {
  int64_t r = 0;
  for (; r + kRows <= m; r += kRows)
    PanelTile<kRows, kSigned, kOffsets, kPairs>(panel, x + r * layout.stride, layout.stride, layout.scales_at,
                                                layout.offsets_at, out + r * kPanelRows, kPanelRows);
  for (; r < m; ++r)
    PanelTile<1, kSigned, kOffsets, kPairs>(panel, x + r * layout.stride, layout.stride, layout.scales_at,
                                            layout.offsets_at, out + r * kPanelRows, kPanelRows);
}

}  // namespace

int64_t Int8GemmPanelBytes(int64_t k) { return k / kGroup * kGroupBytes; }

// out[c] lane i = in[i] lane c, 8 x 8 dwords.
inline void Transpose8x8(__m256i r[8]) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
    const __m256i* th = t + 4 * h;
    u[4 * h + 0] = _mm256_unpacklo_epi64(th[0], th[2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(th[0], th[2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(th[1], th[3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(th[1], th[3]);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2x128_si256(u[c], u[4 + c], 0x31);
  }
}

bool Int8GemmPackPanel(const Int8DecodedRows& rows, int64_t k, uint8_t* panel) {
  // 32 values (two groups) of the 8 rows at a time: quad q of every row
  // lands in lane order by one transpose.
  for (int64_t b = 0; b < k / 32; ++b) {
    __m256i v[8];
    for (int c = 0; c < kPanelRows; ++c)
      v[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.levels[c] + 32 * b));
    Transpose8x8(v);
    for (int q = 0; q < 8; ++q)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + (2 * b + q / 4) * kGroupBytes + (q % 4) * kQuadBytes),
                          v[q]);
  }
  bool any_offset = false;
  for (int64_t g = 0; g < k / kGroup; ++g)
    any_offset |=
        Int8GemmPackParams(rows, kPanelRows, g, reinterpret_cast<float*>(panel + g * kGroupBytes + kGroupLevelBytes));
  return any_offset;
}

void Avx2Int8GemmPanel(const uint8_t* panel, int64_t k, bool is_signed, bool offsets, bool pairs, const uint8_t* x,
                       int64_t m, const Int8RowLayoutView& layout, float* out) {
  const PanelView view{panel, k / kGroup};
  if (pairs) {
    if (is_signed) {
      offsets ? PanelRows<true, true, true>(view, x, m, layout, out)
              : PanelRows<true, false, true>(view, x, m, layout, out);
    } else {
      offsets ? PanelRows<false, true, true>(view, x, m, layout, out)
              : PanelRows<false, false, true>(view, x, m, layout, out);
    }
  } else {
    offsets ? PanelRows<false, true, false>(view, x, m, layout, out)
            : PanelRows<false, false, false>(view, x, m, layout, out);
  }
}

}  // namespace tandem
