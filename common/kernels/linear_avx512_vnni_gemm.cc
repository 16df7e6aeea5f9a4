// The int8 GEMM for block-quantized weights at many rows of x (prefill) with
// AVX512-VNNI: the zmm form of linear_int8_gemm.cc's panels (W rows in the
// lanes, as ik_llama.cpp's repacked *_r8/_r16 types lay them; written here
// from the idea, not its code).
//
// Why. The fused VNNI pass (linear_avx512_vnni_fused.cc) puts K in the
// lanes: each (x row, W row) pair needs its own reduction and scaling per
// 32 values, and where the CPU has bf16 dot products the bf16 GEMM on
// dequantized rows beat it from 32 rows. Here 16 W rows sit side by side in
// each 4-byte column, so one vpdpbusd meets 16 W rows with 4 values of one x
// row (the x bytes broadcast from memory), and the f32 work (convert, scale,
// offset) is done once per group for 16 outputs: a group is 32 values where
// the type scales per 32 (all but Q6_K), so 8 vpdpbusd share it.
//
// Layout of a panel, per group g of kG values (kG/4 quads): the levels of
// each quad, [16 rows][4 bytes] (64 bytes, one zmm); then the 16 rows'
// scales and offsets (f32). Levels are unsigned (the decoders' to_unsigned
// form: Q8_0's +128 comes back through its offset -128 * scale), x's int8
// levels the signed operand.
//
// Arithmetic: the int32 lanes of a group are exact (32 x 255 x 128 fits);
// then y += float(sum) * (w_scale * x_scale) + w_offset * x_offset in f32,
// group by group: the int8_dot tile's terms in another order (its bound,
// linear_int8_dot.h).
#include <immintrin.h>

#include <cstring>

#include "common/kernels/linear_int8_dot.h"

namespace tandem {
namespace {

constexpr int kPanelRows = kVnniGemmPanelRows;  // one zmm of int32 lanes
constexpr int64_t kQuadBytes = kPanelRows * 4;

constexpr int64_t GroupLevelBytes(int64_t group) { return group / 4 * kQuadBytes; }
constexpr int64_t GroupBytes(int64_t group) {
  return GroupLevelBytes(group) + 2 * kPanelRows * static_cast<int64_t>(sizeof(float));
}

inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// out row r (16 floats, the panel's W rows) = row r of x . the panel, r < kR.
// x rows `x_stride` bytes apart: levels, then scales (per 32 values) and
// offsets (per 16) at scales_at / offsets_at.
template <int kR, int64_t kG, bool kOffsets>
inline void PanelTile(const uint8_t* panel, int64_t num_groups, const uint8_t* x, const Int8RowLayoutView& layout,
                      float* out) {
  constexpr int kQuads = static_cast<int>(kG / 4);
  __m512 acc[kR];
  for (int r = 0; r < kR; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < num_groups; ++g) {
    const uint8_t* grp = panel + g * GroupBytes(kG);
    __m512i w[kQuads];
    for (int q = 0; q < kQuads; ++q) w[q] = _mm512_loadu_si512(grp + q * kQuadBytes);
    const auto* params = reinterpret_cast<const float*>(grp + GroupLevelBytes(kG));
    const __m512 w_scale = _mm512_loadu_ps(params);
    // Quads outer, rows inner: kR independent vpdpbusd chains (one row's 8
    // in a row would wait out the instruction's latency each time).
    __m512i sum[kR];
    for (int r = 0; r < kR; ++r) sum[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int q = 0; q < kQuads; ++q) {
#pragma GCC unroll 8
      for (int r = 0; r < kR; ++r) {
        const auto* xq = reinterpret_cast<const int8_t*>(x + r * layout.stride) + g * kG;
        sum[r] = _mm512_dpbusd_epi32(sum[r], w[q], Broadcast4(xq + 4 * q));
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < kR; ++r) {
      const uint8_t* xr = x + r * layout.stride;
      // x scales are per 32 values, stored once per 16.
      const float x_scale = reinterpret_cast<const float*>(xr + layout.scales_at)[g * kG / 16];
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_mul_ps(w_scale, _mm512_set1_ps(x_scale)), acc[r]);
      if constexpr (kOffsets) {
        const float* xo = reinterpret_cast<const float*>(xr + layout.offsets_at) + g * kG / 16;
        const float x_offset = kG == 32 ? xo[0] + xo[1] : xo[0];
        acc[r] = _mm512_fmadd_ps(_mm512_loadu_ps(params + kPanelRows), _mm512_set1_ps(x_offset), acc[r]);
      }
    }
  }
  for (int r = 0; r < kR; ++r) _mm512_storeu_ps(out + r * kPanelRows, acc[r]);
}

template <int64_t kG, bool kOffsets>
void PanelRows(const uint8_t* panel, int64_t k, const uint8_t* x, int64_t m, const Int8RowLayoutView& layout,
               float* out) {
  const int64_t groups = k / kG;
  int64_t r = 0;
  for (; r + 8 <= m; r += 8) PanelTile<8, kG, kOffsets>(panel, groups, x + r * layout.stride, layout, out + r * 16);
  if (r + 4 <= m) {
    PanelTile<4, kG, kOffsets>(panel, groups, x + r * layout.stride, layout, out + r * 16);
    r += 4;
  }
  for (; r < m; ++r) PanelTile<1, kG, kOffsets>(panel, groups, x + r * layout.stride, layout, out + r * 16);
}

}  // namespace

int64_t VnniInt8GemmPanelBytes(int64_t k, bool pairs) {
  const int64_t group = pairs ? 32 : 16;
  return k / group * GroupBytes(group);
}

bool VnniInt8GemmPackPanel(const Int8DecodedRows& rows, int64_t k, bool pairs, uint8_t* panel) {
  const int64_t group = pairs ? 32 : 16, group_bytes = GroupBytes(group);
  // Quad q of the 16 rows into one zmm: a gather of 16 dwords, the rows'
  // distances from row 0 as indices (decoded rows sit in one scratch area).
  alignas(64) int32_t from_row0[kPanelRows];
  for (int c = 0; c < kPanelRows; ++c) from_row0[c] = static_cast<int32_t>(rows.levels[c] - rows.levels[0]);
  const __m512i index = _mm512_load_si512(from_row0);
  bool any_offset = false;
  for (int64_t g = 0; g < k / group; ++g) {
    uint8_t* grp = panel + g * group_bytes;
    for (int64_t q = 0; q < group / 4; ++q) {
      const __m512i quad = _mm512_i32gather_epi32(index, rows.levels[0] + g * group + 4 * q, 1);
      _mm512_storeu_si512(grp + q * kQuadBytes, quad);
    }
    // The decoders' scales and offsets are per 16 values.
    any_offset |=
        Int8GemmPackParams(rows, kPanelRows, g * group / 16, reinterpret_cast<float*>(grp + GroupLevelBytes(group)));
  }
  return any_offset;
}

void Avx512VnniInt8GemmPanel(const uint8_t* panel, int64_t k, bool pairs, bool offsets, const uint8_t* x, int64_t m,
                             const Int8RowLayoutView& layout, float* out) {
  if (pairs) {
    offsets ? PanelRows<32, true>(panel, k, x, m, layout, out) : PanelRows<32, false>(panel, k, x, m, layout, out);
  } else {
    offsets ? PanelRows<16, true>(panel, k, x, m, layout, out) : PanelRows<16, false>(panel, k, x, m, layout, out);
  }
}

}  // namespace tandem
