// Template bodies of cpu_ops.h.
#pragma once

#include <immintrin.h>

#include <cmath>

namespace tandem {
namespace attention_detail {

// sum_i a[i] b[i] with 16 f32 lanes in flight: the loop a compiler keeps
// scalar (it may not reorder a float sum), which made attention ~1 FMA per
// 4 cycles. The summation order is fixed by n alone.
inline float Dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  __m256 s = _mm256_add_ps(s0, s1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float sum = _mm_cvtss_f32(h);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// y[i] += a x[i].
inline void Axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace attention_detail

template <typename KeyFn, typename ValueFn>
void AttendOneRow(const float* q, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t first_key,
                  int64_t num_keys, KeyFn key_row, ValueFn value_row, float* scores, float* out) {
  const int64_t group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int64_t h = 0; h < heads; ++h) {
    const float* qh = q + h * head_dim;
    const int64_t kvh = h / group;
    float max_score = -INFINITY;
    for (int64_t j = 0; j < num_keys; ++j) {
      scores[j] = attention_detail::Dot(qh, key_row(first_key + j) + kvh * head_dim, head_dim) * scale;
      max_score = std::max(max_score, scores[j]);
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < num_keys; ++j) {
      scores[j] = std::exp(scores[j] - max_score);
      sum += scores[j];
    }
    const float inv_sum = 1.0f / sum;
    float* oh = out + h * head_dim;
    for (int64_t i = 0; i < head_dim; ++i) oh[i] = 0.0f;
    for (int64_t j = 0; j < num_keys; ++j)
      attention_detail::Axpy(scores[j] * inv_sum, value_row(first_key + j) + kvh * head_dim, oh, head_dim);
  }
}

}  // namespace tandem
