// The GEMM-shaped attention kernel (attention_block_body.h) on 8-lane ymm
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
  // e^x (vector_exp.h), exactly 0 below -87.3 (-inf included: masked keys).
  static T Exp(T x) {
    const T tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33654f), _CMP_LT_OQ);
    return _mm256_andnot_ps(tiny, ExpAvx2(x));
  }
};

#include "common/kernels/attention_block_body.h"

}  // namespace attention_avx2

void AttendBlockAvx2(const AttentionBlockArgs& a, float* scratch) { attention_avx2::AttendBlockBody(a, scratch); }

}  // namespace tandem::isa
