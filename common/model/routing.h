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

// DeepSeek-V3's noaux_tc router, as GLM-4.5 runs it (modeling_glm4_moe.py
// Glm4MoeTopkRouter), in f32: scores = sigmoid(logits); the experts are
// chosen by score + correction_bias (null: zeros), only within the
// topk_group groups (of n_group equal runs of experts) whose two best
// choice values sum highest, experts of the other groups taking choice 0;
// weights = the chosen scores, divided by their sum (+ 1e-20) when
// `normalize`, times `scale`. Ties go to the lower index. E <= kMaxExperts.
void RouteSigmoidGroupedTopK(const float* logits, const float* correction_bias, int64_t num_experts, int64_t k,
                             int64_t n_group, int64_t topk_group, bool normalize, double scale, int32_t* experts,
                             float* weights);

// That router's weights for the K chosen `experts`: their sigmoid scores
// (the correction bias only chooses), divided by their sum (+ 1e-20) when
// `normalize`, times `scale`; in f32. Also what DAOP re-weights a
// pre-computed set with.
void SigmoidRouterWeights(const float* logits, const int32_t* experts, int64_t k, bool normalize, double scale,
                          float* weights);

// DeepSeek-V2's router (modeling_deepseek.py MoEGate, "greedy" and
// "group_limited_greedy"), in f32: scores = softmax(logits); with n_group
// > 1 only the experts of the topk_group groups (n_group equal runs) whose
// best score is highest may be chosen; the K highest scores; weights = the
// chosen scores divided by their sum (+ 1e-20) when `normalize` (and K >
// 1), else times `scale`. Ties go to the lower index. E <= kMaxExperts.
void RouteSoftmaxGroupedTopK(const float* logits, int64_t num_experts, int64_t k, int64_t n_group, int64_t topk_group,
                             bool normalize, double scale, int32_t* experts, float* weights);

// That router's weights for the K chosen `experts` (their full-softmax
// scores, renormalised or scaled as above): what DAOP re-weights a
// pre-computed set with.
void SoftmaxGroupedRouterWeights(const float* logits, int64_t num_experts, const int32_t* experts, int64_t k,
                                 bool normalize, double scale, float* weights);

// Routes `num_tokens` rows of `logits` [T, E] by the config's router into
// experts [T, K] and weights [T, K]. `correction_bias`: the layer's [E]
// e_score_correction_bias when config.router_correction_bias(), else null.
void Route(const ModelConfig& config, const float* correction_bias, const float* logits, int64_t num_tokens,
           int32_t* experts, float* weights);

}  // namespace tandem
