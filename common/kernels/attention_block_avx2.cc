// The attention kernel (attention_block_body.h) on 8-lane ymm
// vectors: the build's AVX2 + FMA baseline.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "common/kernels/attention_block_types.h"
#include "common/kernels/vector_exp.h"

namespace tandem::isa {
namespace attention_avx2 {

struct Vec {
  using T = __m256;
  static constexpr int64_t kLanes = 8;
  static constexpr int kRegisters = 16;
  static constexpr int kValueChunks = 2;  // 4 rows x 2 ymm accumulators, 2 value vectors
  // Keys in lanes 4 rows at a time: 8 transposed key vectors and 4
  // accumulators leave room for the transpose in 16 registers.
  static constexpr int64_t kKeysInLanesMaxRows = kKeysInLanesMaxRowsAvx2;
  static constexpr int kKeysInLanesRowsPerPass = 4;
  static T Zero() { return _mm256_setzero_ps(); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256i FirstN(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static T LoadN(const float* p, int64_t n) { return _mm256_maskload_ps(p, FirstN(n)); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static void StoreN(float* p, T v, int64_t n) { _mm256_maskstore_ps(p, FirstN(n), v); }
  static T Set1(float f) { return _mm256_set1_ps(f); }
  static T Fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm256_div_ps(a, b); }
  static T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T Max(T a, T b) { return _mm256_max_ps(a, b); }
  // s where first <= at < end, else -inf.
  static T Masked(T s, T at, T first, T end) {
    const T outside = _mm256_or_ps(_mm256_cmp_ps(at, first, _CMP_LT_OQ), _mm256_cmp_ps(at, end, _CMP_GE_OQ));
    return _mm256_blendv_ps(s, _mm256_set1_ps(-INFINITY), outside);
  }
  static T Iota() { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
  static float ReduceMax(T v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  // t[i] element e becomes t[e] element i (8 x 8).
  static void Transpose(T (&t)[8]) {
    T a[8], b[8];
    for (int i = 0; i < 4; ++i) {
      a[2 * i] = _mm256_unpacklo_ps(t[2 * i], t[2 * i + 1]);
      a[2 * i + 1] = _mm256_unpackhi_ps(t[2 * i], t[2 * i + 1]);
    }
    // b[4i + m], 128-bit lane L: element 4L + m of rows 4i .. 4i + 3.
    for (int i = 0; i < 2; ++i) {
      b[4 * i] = Pairs(a[4 * i], a[4 * i + 2], false);
      b[4 * i + 1] = Pairs(a[4 * i], a[4 * i + 2], true);
      b[4 * i + 2] = Pairs(a[4 * i + 1], a[4 * i + 3], false);
      b[4 * i + 3] = Pairs(a[4 * i + 1], a[4 * i + 3], true);
    }
    for (int m = 0; m < 4; ++m) {
      t[m] = _mm256_permute2f128_ps(b[m], b[4 + m], 0x20);
      t[4 + m] = _mm256_permute2f128_ps(b[m], b[4 + m], 0x31);
    }
  }
  // The low (high) 64-bit halves of x's and y's 128-bit lanes, interleaved.
  static T Pairs(T x, T y, bool high) {
    const __m256d xd = _mm256_castps_pd(x), yd = _mm256_castps_pd(y);
    return _mm256_castpd_ps(high ? _mm256_unpackhi_pd(xd, yd) : _mm256_unpacklo_pd(xd, yd));
  }
  // e^x (vector_exp.h), exactly 0 below -87.3 (-inf included: masked keys).
  static T Exp(T x) {
    const T tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
    return _mm256_andnot_ps(tiny, ExpAvx2(x));
  }
};

#include "common/kernels/attention_block_body.h"

}  // namespace attention_avx2

void AttendBlockAvx2(const AttentionBlockArgs& a, AttentionBlockShape shape, float* scratch) {
  attention_avx2::AttendBlockBody(a, shape, scratch);
}

}  // namespace tandem::isa
