// The GEMM-shaped attention kernel (attention_block_body.h) on 16-lane zmm
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
    const __mmask16 outside =
        _mm512_cmp_ps_mask(at, first, _CMP_LT_OQ) | _mm512_cmp_ps_mask(at, end, _CMP_GE_OQ);
    return _mm512_mask_mov_ps(s, outside, _mm512_set1_ps(-INFINITY));
  }
  // e^x for x <= 0: vector_exp.h's polynomial on 16 lanes (this unit may
  // not include that baseline inline function), the same bits lane for
  // lane; exactly 0 below -87.3, -inf included.
  static T Exp(T x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
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

void AttendBlockAvx512(const AttentionBlockArgs& a, float* scratch) { attention_avx512::AttendBlockBody(a, scratch); }

}  // namespace tandem::isa
