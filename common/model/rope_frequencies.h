// The rotary embedding's frequencies for a config, as Hugging Face's
// rope init functions compute them: the per-pair inverse frequencies
// (theta^(-2i/hd), divided by longrope's factors, or YaRN's blend of the
// interpolated and extrapolated ones) and the scale cos and sin carry.
// The CPU and CUDA backends build their tables from this, so both rotate
// alike.
#pragma once

#include <vector>

#include "common/model/model_config.h"

namespace tandem {

struct RopeFrequencies {
  std::vector<double> inv_freq;  // [rope_dim / 2]: the whole head, or GLM-4.5's rotated part
  double mscale = 1.0;           // cos and sin are multiplied by it
};

// `long_factors`: longrope's long set (past original_max_position_embeddings);
// ignored by every other scaling.
RopeFrequencies ComputeRopeFrequencies(const ModelConfig& config, bool long_factors);

}  // namespace tandem
