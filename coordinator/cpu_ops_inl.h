// Template bodies of cpu_ops.h.
#pragma once

#include <cmath>

namespace tandem {

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
      const float* k = key_row(first_key + j) + kvh * head_dim;
      float dot = 0.0f;
      for (int64_t i = 0; i < head_dim; ++i) dot += qh[i] * k[i];
      scores[j] = dot * scale;
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
    for (int64_t j = 0; j < num_keys; ++j) {
      const float p = scores[j] * inv_sum;
      const float* v = value_row(first_key + j) + kvh * head_dim;
      for (int64_t i = 0; i < head_dim; ++i) oh[i] += p * v[i];
    }
  }
}

}  // namespace tandem
