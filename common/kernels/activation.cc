#include "common/kernels/activation.h"

#include <immintrin.h>

#include <cmath>

#include "common/kernels/vector_exp.h"

namespace tandem {

void SiluMul(float* gate, const float* up, int64_t count) {
  int64_t j = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; j + 8 <= count; j += 8) {
    const __m256 g = _mm256_loadu_ps(gate + j);
    const __m256 e = ExpAvx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 h = _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + j)), _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + j, h);
  }
  for (; j < count; ++j) gate[j] = gate[j] * up[j] / (1.0f + std::exp(-gate[j]));
}

}  // namespace tandem
