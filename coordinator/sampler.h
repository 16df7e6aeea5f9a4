// Turns one position's logits into the next token: greedy, or temperature →
// top-k → top-p sampling from a seeded generator. Also reports the top-K log
// probabilities of the full distribution (the raw model, before any filter).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: all
  float top_p = 1.0f;        // (0, 1]
  uint64_t seed = 0;

  // InvalidArgument naming the field: temperature < 0 or not finite, top_k < 0,
  // top_p outside (0, 1].
  absl::Status Validate() const;
};

// Owns its random generator; one per sequence, one thread at a time.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int32_t Sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
};

// OK when every logit is finite; DataLoss otherwise, counting the NaN and
// Inf entries and naming the first: sampling from them would pick a token
// (token 0, with a null logprob) that means nothing. Weights holding NaN or
// Inf, or activations that overflowed, are the causes.
absl::Status CheckFiniteLogits(std::span<const float> logits);

// log_softmax(logits)[id].
double LogProbability(std::span<const float> logits, int32_t id);
// The `k` most likely tokens with their log probabilities, highest first
// (ties: lower id first).
std::vector<std::pair<int32_t, double>> TopLogprobs(std::span<const float> logits, int32_t k);

}  // namespace tandem
