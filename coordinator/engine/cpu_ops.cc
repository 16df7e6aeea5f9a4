#include "coordinator/engine/cpu_ops.h"

#include <algorithm>
#include <cmath>

#include "common/model/rope_frequencies.h"

namespace tandem {

void RmsNorm(const float* x, int64_t rows, int64_t d, const float* weight, double eps, float* y) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * d;
    float* yt = y + t * d;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < d; ++i) sum_sq += static_cast<double>(xt[i]) * xt[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(d) + eps));
    for (int64_t i = 0; i < d; ++i) yt[i] = xt[i] * inv * weight[i];
  }
}

void LayerNorm(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, double eps, float* y) {
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * d;
    float* yt = y + t * d;
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += xt[i];
    const double mean = sum / static_cast<double>(d);
    double var = 0.0;
    for (int64_t i = 0; i < d; ++i) var += (xt[i] - mean) * (xt[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(d) + eps));
    const float mean_f = static_cast<float>(mean);
    for (int64_t i = 0; i < d; ++i) yt[i] = (xt[i] - mean_f) * inv * weight[i] + bias[i];
  }
}

void ApplyNorm(const ModelConfig& config, const NormWeights& norm, const float* x, int64_t rows, float* y) {
  if (config.norm_kind() == NormKind::kLayerNorm) {
    LayerNorm(x, rows, config.hidden_size, norm.weight.data(), norm.bias.data(), config.rms_norm_eps, y);
  } else {
    RmsNorm(x, rows, config.hidden_size, norm.weight.data(), config.rms_norm_eps, y);
  }
}

RotaryEmbedding::RotaryEmbedding(const ModelConfig& config) : head_dim_(config.head_dim), rope_dim_(config.rope_dim()) {
  const RopeFrequencies short_set = ComputeRopeFrequencies(config, /*long_factors=*/false);
  const RopeFrequencies long_set = ComputeRopeFrequencies(config, /*long_factors=*/true);
  inv_freq_short_ = short_set.inv_freq, mscale_short_ = short_set.mscale;
  inv_freq_long_ = long_set.inv_freq, mscale_long_ = long_set.mscale;
  if (config.rope_scaling.type == "longrope") original_max_ = config.rope_scaling.original_max_position_embeddings;
}

bool RotaryEmbedding::UseLongFactors(int64_t max_position) const {
  return original_max_ > 0 && max_position + 1 > original_max_;
}

void RotaryEmbedding::Apply(float* x, int64_t heads, int64_t position, bool long_factors) const {
  const int64_t half = rope_dim_ / 2;
  const std::vector<double>& inv_freq = long_factors ? inv_freq_long_ : inv_freq_short_;
  const double mscale = long_factors ? mscale_long_ : mscale_short_;
  // cos/sin once per row, shared by every head.
  float cos_v[512], sin_v[512];
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq[i];
    cos_v[i] = static_cast<float>(std::cos(angle) * mscale);
    sin_v[i] = static_cast<float>(std::sin(angle) * mscale);
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim_;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos_v[i] - b * sin_v[i];
      v[i + half] = b * cos_v[i] + a * sin_v[i];
    }
  }
}

void RotaryEmbedding::ApplyInterleaved(float* x, int64_t heads, int64_t stride, int64_t position) const {
  const int64_t half = rope_dim_ / 2;
  float cos_v[512], sin_v[512];
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq_short_[static_cast<size_t>(i)];
    cos_v[i] = static_cast<float>(std::cos(angle) * mscale_short_);
    sin_v[i] = static_cast<float>(std::sin(angle) * mscale_short_);
  }
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * stride;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * cos_v[i] - b * sin_v[i];
      v[2 * i + 1] = b * cos_v[i] + a * sin_v[i];
    }
  }
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void PackRows(float* data, int64_t cols, std::span<const int64_t> rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t from = rows[i];  // ascending, so from >= i: row i is not needed any more
    if (from != static_cast<int64_t>(i)) std::copy_n(data + from * cols, cols, data + static_cast<int64_t>(i) * cols);
  }
}

}  // namespace tandem
