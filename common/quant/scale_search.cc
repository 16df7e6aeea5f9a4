#include "common/quant/scale_search.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace tandem {
namespace {

// Groups whose largest magnitude is below this are all-zero (ggml's GROUP_MAX_EPS).
constexpr float kGroupMaxEps = 1e-15f;
constexpr size_t kMaxGroup = 32;

}  // namespace

int NearestInt(float value) {
  const float biased = value + 12582912.0f;  // 1.5 * 2^23
  int32_t bits;
  std::memcpy(&bits, &biased, sizeof(bits));
  return (bits & 0x007fffff) - 0x00400000;
}

AffineFit FitAffineLevels(absl::Span<const float> x, absl::Span<const float> weights, const AffineSearch& search,
                          absl::Span<uint8_t> levels) {
  const size_t n = std::min({x.size(), weights.size(), levels.size(), kMaxGroup});
  if (n == 0) return {0.0f, 0.0f};
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (size_t i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill(levels.begin(), levels.begin() + n, uint8_t{0});
    return {0.0f, -min};
  }

  const int max_level = search.max_level;
  auto level_for = [&](float inverse_scale, float value) {
    return std::clamp(NearestInt(inverse_scale * (value - min)), 0, max_level);
  };

  // Start from the naive scale that maps [min, max] onto [0, max_level].
  float inverse_scale = max_level / (max - min);
  float scale = 1 / inverse_scale;
  float best_error = 0;
  for (size_t i = 0; i < n; ++i) {
    levels[i] = static_cast<uint8_t>(level_for(inverse_scale, x[i]));
    float diff = scale * levels[i] + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }

  uint8_t trial[kMaxGroup];
  for (int step = 0; step <= search.steps; ++step) {
    inverse_scale = (search.first_offset + search.step_offset * step + max_level) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (size_t i = 0; i < n; ++i) {
      const int l = level_for(inverse_scale, x[i]);
      trial[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    // Weighted least squares for x ~= scale * l + offset over these levels.
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {  // the zero point may not rise above zero: refit the scale alone
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (size_t i = 0; i < n; ++i) {
      float diff = this_scale * trial[i] + this_min - x[i];
      diff = diff * diff;
      error += weights[i] * diff;
    }
    if (error < best_error) {
      std::copy(trial, trial + n, levels.begin());
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  return {scale, -min};
}

float FitSymmetricLevels(absl::Span<const float> x, int max_level, absl::Span<int8_t> levels) {
  const size_t n = std::min(x.size(), levels.size());
  float max = 0;
  float amax = 0;
  for (size_t i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill(levels.begin(), levels.begin() + n, int8_t{0});
    return 0.0f;
  }

  auto level_for = [&](float inverse_scale, float value) {
    return std::clamp(NearestInt(inverse_scale * value), -max_level, max_level - 1);
  };
  // Sums for the least-squares scale sum(w x l) / sum(w l^2), w = x^2.
  auto accumulate = [&](float inverse_scale, float* sum_lx, float* sum_l2) {
    *sum_lx = 0;
    *sum_l2 = 0;
    for (size_t i = 0; i < n; ++i) {
      const int l = level_for(inverse_scale, x[i]);
      const float w = x[i] * x[i];
      *sum_lx += w * x[i] * l;
      *sum_l2 += w * l * l;
    }
  };
  auto store_levels = [&](float inverse_scale) {
    for (size_t i = 0; i < n; ++i) levels[i] = static_cast<int8_t>(level_for(inverse_scale, x[i]) + max_level);
  };

  float inverse_scale = -max_level / max;
  float sum_lx, sum_l2;
  accumulate(inverse_scale, &sum_lx, &sum_l2);
  store_levels(inverse_scale);
  float scale = sum_l2 ? sum_lx / sum_l2 : 0.0f;
  // For the least-squares scale the weighted error is sum(w x^2) - scale*sum_lx,
  // so the best candidate maximises sum_lx^2 / sum_l2.
  float best = scale * sum_lx;
  for (int step = -9; step <= 9; ++step) {
    if (step == 0) continue;
    inverse_scale = -(max_level + 0.1f * step) / max;
    accumulate(inverse_scale, &sum_lx, &sum_l2);
    if (sum_l2 > 0 && sum_lx * sum_lx > best * sum_l2) {
      store_levels(inverse_scale);
      scale = sum_lx / sum_l2;
      best = scale * sum_lx;
    }
  }
  return scale;
}

}  // namespace tandem
