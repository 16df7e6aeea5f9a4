// The attention kernel (attention_block_body.h) on 16-lane zmm
// vectors: AVX-512F, compiled with that set's flags and reached only when
// ActiveIsa() allows it (attention_block.cc).
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "common/kernels/attention_block_types.h"

namespace tandem::isa {
namespace attention_avx512 {

struct Vec {
  using T = __m512;
  static constexpr int64_t kLanes = 16;
  static constexpr int kRegisters = 32;
  static constexpr int kValueChunks = 4;  // 4 rows x 4 zmm accumulators, 4 value vectors
  // Keys in lanes 8 rows at a time, beside 16 transposed key vectors.
  static constexpr int64_t kKeysInLanesMaxRows = kKeysInLanesMaxRowsAvx512;
  static constexpr int kKeysInLanesRowsPerPass = 8;
  static T Zero() { return _mm512_setzero_ps(); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static __mmask16 FirstN(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static T LoadN(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(FirstN(n), p); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static void StoreN(float* p, T v, int64_t n) { _mm512_mask_storeu_ps(p, FirstN(n), v); }
  static T Set1(float f) { return _mm512_set1_ps(f); }
  static T Fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm512_div_ps(a, b); }
  static T Add(T a, T b) { return _mm512_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T Max(T a, T b) { return _mm512_max_ps(a, b); }
  // s where first <= at < end, else -inf.
  static T Masked(T s, T at, T first, T end) {
    const __mmask16 outside = _mm512_cmp_ps_mask(at, first, _CMP_LT_OQ) | _mm512_cmp_ps_mask(at, end, _CMP_GE_OQ);
    return _mm512_mask_mov_ps(s, outside, _mm512_set1_ps(-INFINITY));
  }
  static T Iota() { return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
  static float ReduceMax(T v) { return _mm512_reduce_max_ps(v); }
  // t[i] element e becomes t[e] element i (16 x 16).
  static void Transpose(T (&t)[16]) {
    T a[16], b[16], c[16];
    for (int i = 0; i < 8; ++i) {
      a[2 * i] = _mm512_unpacklo_ps(t[2 * i], t[2 * i + 1]);
      a[2 * i + 1] = _mm512_unpackhi_ps(t[2 * i], t[2 * i + 1]);
    }
    // b[4i + m], 128-bit lane L: element 4L + m of rows 4i .. 4i + 3.
    for (int i = 0; i < 4; ++i) {
      b[4 * i] = Pairs(a[4 * i], a[4 * i + 2], false);
      b[4 * i + 1] = Pairs(a[4 * i], a[4 * i + 2], true);
      b[4 * i + 2] = Pairs(a[4 * i + 1], a[4 * i + 3], false);
      b[4 * i + 3] = Pairs(a[4 * i + 1], a[4 * i + 3], true);
    }
    // Element 4L + m of all rows: lane L of b[m], b[4 + m], b[8 + m],
    // b[12 + m], a 4 x 4 transpose of 128-bit lanes.
    for (int m = 0; m < 4; ++m) {
      c[m] = _mm512_shuffle_f32x4(b[m], b[4 + m], 0x44);      // lanes 0 1 of each
      c[4 + m] = _mm512_shuffle_f32x4(b[m], b[4 + m], 0xee);  // lanes 2 3
      c[8 + m] = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0x44);
      c[12 + m] = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0xee);
      t[m] = _mm512_shuffle_f32x4(c[m], c[8 + m], 0x88);      // lane 0 of all four
      t[4 + m] = _mm512_shuffle_f32x4(c[m], c[8 + m], 0xdd);  // lane 1
      t[8 + m] = _mm512_shuffle_f32x4(c[4 + m], c[12 + m], 0x88);
      t[12 + m] = _mm512_shuffle_f32x4(c[4 + m], c[12 + m], 0xdd);
    }
  }
  // The low (high) 64-bit halves of x's and y's 128-bit lanes, interleaved.
  static T Pairs(T x, T y, bool high) {
    const __m512d xd = _mm512_castps_pd(x), yd = _mm512_castps_pd(y);
    return _mm512_castpd_ps(high ? _mm512_unpackhi_pd(xd, yd) : _mm512_unpacklo_pd(xd, yd));
  }
  // e^x for x <= 0: vector_exp.h's polynomial on 16 lanes (this unit may
  // not include that baseline inline function), the same bits lane for
  // lane; exactly 0 below -87.3, -inf included.
  static T Exp(T x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_set1_ps(-87.33654f), x);  // NaN stays NaN (max returns its second operand)
    const T n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    T r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    T y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps(static_cast<__mmask16>(~tiny), y, _mm512_castsi512_ps(pow2));
  }
};

#include "common/kernels/attention_block_body.h"

}  // namespace attention_avx512

void AttendBlockAvx512(const AttentionBlockArgs& a, AttentionBlockShape shape, float* scratch) {
  attention_avx512::AttendBlockBody(a, shape, scratch);
}

}  // namespace tandem::isa
