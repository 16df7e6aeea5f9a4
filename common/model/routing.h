// Router functions: from one token's router logits to the experts it visits
// and the weight of each. Pure functions, shared by every backend and the
// planner's simulator.
//
// Legend: T tokens, E experts, K = num_experts_per_tok.
#pragma once

#include <cstdint>

#include "common/model/model_config.h"

namespace tandem {

// Mixtral (and Qwen3 with norm_topk_prob): top-K logits, weights = softmax
// over the K chosen logits (equal to the renormalised top-K of the full
// softmax). `normalize` false (Qwen3 without norm_topk_prob): the full
// softmax's values at the K, not renormalised. Ties go to the lower index.
void RouteSoftmaxTopK(const float* logits, int64_t num_experts, int64_t k, int32_t* experts, float* weights,
                      bool normalize = true);

// PhiMoE's sparsemixer at inference (Hugging Face modeling_phimoe.py, top-2):
// expert 1 = argmax; its weight = softmax over the logits within the jitter
// band of the max, |max - s| / max(|s|, max) <= 2·jitter_eps; expert 2 = argmax
// of the rest, weighted the same way within its band (expert 1 masked out).
// The weights are not renormalised.
void RouteSparseMixer(const float* logits, int64_t num_experts, double jitter_eps, int32_t* experts, float* weights);

// Routes `num_tokens` rows of `logits` [T, E] by the config's router into
// experts [T, K] and weights [T, K].
void Route(const ModelConfig& config, const float* logits, int64_t num_tokens, int32_t* experts, float* weights);

}  // namespace tandem
