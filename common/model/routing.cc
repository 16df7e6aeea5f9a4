#include "common/model/routing.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tandem {

void RouteSoftmaxTopK(const float* logits, int64_t num_experts, int64_t k, int32_t* experts, float* weights,
                      bool normalize) {
  // Selection by repeated argmax: K is 1–8, E at most a few hundred.
  for (int64_t slot = 0; slot < k; ++slot) {
    int32_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t s = 0; s < slot; ++s) taken |= experts[s] == e;
      if (!taken && (best < 0 || logits[e] > logits[best])) best = static_cast<int32_t>(e);
    }
    experts[slot] = best;
  }
  const float max_logit = logits[experts[0]];
  double sum = 0.0;
  for (int64_t s = 0; s < k; ++s) {
    weights[s] = std::exp(logits[experts[s]] - max_logit);
    sum += weights[s];
  }
  if (!normalize) {
    // The full softmax's values: the denominator runs over every expert.
    sum = 0.0;
    for (int64_t e = 0; e < num_experts; ++e) sum += std::exp(static_cast<double>(logits[e]) - max_logit);
  }
  for (int64_t s = 0; s < k; ++s) weights[s] = static_cast<float>(weights[s] / sum);
}

namespace {

// Softmax weight of `chosen` among the logits not masked out: the masked ones
// are those outside the band around `threshold` (and `excluded`).
float BandWeight(const float* scores, int64_t num_experts, int32_t chosen, int32_t excluded, float threshold,
                 double jitter_eps) {
  double sum = 0.0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (e == excluded) continue;
    const float factor = std::max(std::fabs(scores[e]), threshold);  // scores.abs().clamp(min=threshold)
    const bool masked = (threshold - scores[e]) / factor > 2.0 * jitter_eps;
    if (!masked) sum += std::exp(static_cast<double>(scores[e]) - threshold);
  }
  return static_cast<float>(std::exp(static_cast<double>(scores[chosen]) - threshold) / sum);
}

}  // namespace

void RouteSparseMixer(const float* scores, int64_t num_experts, double jitter_eps, int32_t* experts, float* weights) {
  int32_t first = 0;
  for (int64_t e = 1; e < num_experts; ++e) {
    if (scores[e] > scores[first]) first = static_cast<int32_t>(e);
  }
  experts[0] = first;
  weights[0] = BandWeight(scores, num_experts, first, -1, scores[first], jitter_eps);
  int32_t second = -1;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (e != first && (second < 0 || scores[e] > scores[second])) second = static_cast<int32_t>(e);
  }
  experts[1] = second;
  weights[1] = BandWeight(scores, num_experts, second, first, scores[second], jitter_eps);
}

namespace {
// Experts outside the topk_group best-scoring groups get choice 0
// (HF's masked_fill(~score_mask, 0.0)); ties go to the lower group.
void MaskAllButBestGroups(const float* group_score, int64_t n_group, int64_t topk_group, int64_t num_experts,
                          float* choice) {
  const int64_t per_group = num_experts / n_group;
  bool kept[kMaxExperts] = {};
  for (int64_t pick = 0; pick < topk_group; ++pick) {
    int64_t best = -1;
    for (int64_t g = 0; g < n_group; ++g) {
      if (!kept[g] && (best < 0 || group_score[g] > group_score[best])) best = g;
    }
    kept[best] = true;
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    if (!kept[e / per_group]) choice[e] = 0.0f;
  }
}

// Repeated argmax, ties to the lower index (K is at most a few dozen).
void TakeTopK(const float* choice, int64_t num_experts, int64_t k, int32_t* experts) {
  bool taken[kMaxExperts] = {};
  for (int64_t slot = 0; slot < k; ++slot) {
    int64_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      if (!taken[e] && (best < 0 || choice[e] > choice[best])) best = e;
    }
    taken[best] = true;
    experts[slot] = static_cast<int32_t>(best);
  }
}
}  // namespace

void RouteSigmoidGroupedTopK(const float* logits, const float* correction_bias, int64_t num_experts, int64_t k,
                             int64_t n_group, int64_t topk_group, bool normalize, double scale, int32_t* experts,
                             float* weights) {
  // f32 throughout, as the HF router computes (router_logits.float()).
  float scores[kMaxExperts], choice[kMaxExperts];
  for (int64_t e = 0; e < num_experts; ++e) {
    scores[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    choice[e] = scores[e] + (correction_bias != nullptr ? correction_bias[e] : 0.0f);
  }
  if (n_group > 1) {
    // A group scores by the sum of its two best choice values.
    const int64_t per_group = num_experts / n_group;
    float group_score[kMaxExperts];
    for (int64_t g = 0; g < n_group; ++g) {
      const float* c = choice + g * per_group;
      float first = -std::numeric_limits<float>::infinity(), second = first;
      for (int64_t i = 0; i < per_group; ++i) {
        if (c[i] > first) {
          second = first, first = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = first + second;
    }
    MaskAllButBestGroups(group_score, n_group, topk_group, num_experts, choice);
  }
  TakeTopK(choice, num_experts, k, experts);
  SigmoidRouterWeights(logits, experts, k, normalize, scale, weights);
}

void SigmoidRouterWeights(const float* logits, const int32_t* experts, int64_t k, bool normalize, double scale,
                          float* weights) {
  double sum = 0.0;
  for (int64_t slot = 0; slot < k; ++slot) {
    weights[slot] = 1.0f / (1.0f + std::exp(-logits[experts[slot]]));
    sum += weights[slot];
  }
  // HF: topk_weights / (sum + 1e-20) in f32, then * routed_scaling_factor.
  const float denominator = static_cast<float>(sum) + 1e-20f;
  for (int64_t slot = 0; slot < k; ++slot) {
    const float w = normalize ? weights[slot] / denominator : weights[slot];
    weights[slot] = static_cast<float>(w * scale);
  }
}

namespace {
// softmax(logits) in f32, as torch's softmax(dtype=float32): max-shifted
// exponentials over their sum.
void SoftmaxScores(const float* logits, int64_t num_experts, float* scores) {
  float max = logits[0];
  for (int64_t e = 1; e < num_experts; ++e) max = std::max(max, logits[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < num_experts; ++e) sum += scores[e] = std::exp(logits[e] - max);
  for (int64_t e = 0; e < num_experts; ++e) scores[e] /= sum;
}

void WeighChosenScores(const float* scores, const int32_t* experts, int64_t k, bool normalize, double scale,
                       float* weights) {
  float sum = 0.0f;
  for (int64_t slot = 0; slot < k; ++slot) sum += weights[slot] = scores[experts[slot]];
  for (int64_t slot = 0; slot < k; ++slot) {
    weights[slot] = normalize && k > 1 ? weights[slot] / (sum + 1e-20f)
                                       : static_cast<float>(weights[slot] * static_cast<float>(scale));
  }
}
}  // namespace

void RouteSoftmaxGroupedTopK(const float* logits, int64_t num_experts, int64_t k, int64_t n_group, int64_t topk_group,
                             bool normalize, double scale, int32_t* experts, float* weights) {
  float scores[kMaxExperts], choice[kMaxExperts];
  SoftmaxScores(logits, num_experts, scores);
  std::copy_n(scores, num_experts, choice);
  if (n_group > 1) {
    // A group scores by its best expert.
    const int64_t per_group = num_experts / n_group;
    float group_score[kMaxExperts];
    for (int64_t g = 0; g < n_group; ++g)
      group_score[g] = *std::max_element(scores + g * per_group, scores + (g + 1) * per_group);
    MaskAllButBestGroups(group_score, n_group, topk_group, num_experts, choice);
  }
  TakeTopK(choice, num_experts, k, experts);
  WeighChosenScores(scores, experts, k, normalize, scale, weights);
}

void SoftmaxGroupedRouterWeights(const float* logits, int64_t num_experts, const int32_t* experts, int64_t k,
                                 bool normalize, double scale, float* weights) {
  float scores[kMaxExperts];
  SoftmaxScores(logits, num_experts, scores);
  WeighChosenScores(scores, experts, k, normalize, scale, weights);
}

void Route(const ModelConfig& config, const float* correction_bias, const float* logits, int64_t num_tokens,
           int32_t* experts, float* weights) {
  const int64_t e = config.num_local_experts;
  const int64_t k = config.num_experts_per_tok;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (config.router_kind() == RouterKind::kSigmoidGroupedTopK) {
      RouteSigmoidGroupedTopK(logits + t * e, correction_bias, e, k, config.n_group, config.topk_group,
                              config.norm_topk_prob, config.routed_scaling_factor, experts + t * k, weights + t * k);
    } else if (config.router_kind() == RouterKind::kSoftmaxGroupedTopK) {
      RouteSoftmaxGroupedTopK(logits + t * e, e, k, config.n_group, config.topk_group, config.norm_topk_prob,
                              config.routed_scaling_factor, experts + t * k, weights + t * k);
    } else if (config.router_kind() == RouterKind::kSparseMixer) {
      RouteSparseMixer(logits + t * e, e, config.router_jitter_noise, experts + t * k, weights + t * k);
    } else {
      RouteSoftmaxTopK(logits + t * e, e, k, experts + t * k, weights + t * k, config.norm_topk_prob);
    }
  }
}

}  // namespace tandem
