#include "common/model/rope_frequencies.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace tandem {
namespace {

// YaRN (modeling_rope_utils.py _compute_yarn_parameters): the pair whose
// wavelength makes `rotations` turns over the original context.
double CorrectionDim(double rotations, double dim, double base, double original_max) {
  return dim * std::log(original_max / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
}

void ApplyYarn(const ModelConfig& c, std::vector<double>& inv_freq) {
  const RopeScaling& s = c.rope_scaling;
  const double dim = static_cast<double>(c.rope_dim());
  const double original = static_cast<double>(s.original_max_position_embeddings);
  double low = CorrectionDim(s.beta_fast, dim, c.rope_theta, original);
  double high = CorrectionDim(s.beta_slow, dim, c.rope_theta, original);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, dim - 1.0);
  if (low == high) high += 0.001;  // no division by zero in the ramp
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    // Pairs below `low` keep their frequency (extrapolation), above `high`
    // are divided by the factor (interpolation), linear in between.
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double extrapolation = 1.0 - ramp;
    const double extrapolated = inv_freq[i], interpolated = inv_freq[i] / s.factor;
    inv_freq[i] = interpolated * (1.0 - extrapolation) + extrapolated * extrapolation;
  }
}

}  // namespace

RopeFrequencies ComputeRopeFrequencies(const ModelConfig& c, bool long_factors) {
  RopeFrequencies f;
  // Partial RoPE (GLM-4.5): the frequencies of a rope_dim-wide head.
  const int64_t dim = c.rope_dim(), half = dim / 2;
  for (int64_t i = 0; i < half; ++i)
    f.inv_freq.push_back(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(dim)));
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "longrope") {
    const std::vector<double>& factors = long_factors ? s.long_factor : s.short_factor;
    for (int64_t i = 0; i < half && i < static_cast<int64_t>(factors.size()); ++i)
      f.inv_freq[static_cast<size_t>(i)] /= factors[static_cast<size_t>(i)];
    f.mscale = long_factors ? s.long_mscale : s.short_mscale;
  } else if (s.type == "yarn") {
    ApplyYarn(c, f.inv_freq);
    f.mscale = s.attention_factor;
  }
  return f;
}

}  // namespace tandem
