// Turns one position's logits into the next token: logit_bias, then
// penalties (repetition, presence, frequency) on the logits, then the
// grammar's mask when there is one, then greedy, or temperature → top-k →
// top-p → min-p sampling from a seeded generator.
// Also reports the top-K log probabilities of the full distribution (the
// model's with logit_bias, before any penalty or filter).
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/generation/grammar_constraint.h"
#include "coordinator/generation/logit_bias.h"

namespace tandem {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: all
  float top_p = 1.0f;        // (0, 1]
  float min_p = 0.0f;        // [0, 1]: drop tokens below min_p x the top token's probability
  // OpenAI's: logit -= presence * (count > 0) + frequency * count, over the
  // tokens generated so far; [-2, 2], 0 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // CTRL's (as HF and llama.cpp): a token seen in the prompt or the output
  // has its logit divided by this when positive, multiplied when negative;
  // > 0, 1 = off.
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  // Added to these tokens' logits first (logit_bias.h); any order.
  std::vector<LogitBias> logit_bias;
  // Constrained decoding (structured output, forced tool calls): only a
  // token the grammar allows is chosen, after every other step. Null: none.
  std::shared_ptr<const TokenGrammar> grammar;

  // InvalidArgument naming the field: temperature < 0 or not finite, top_k < 0,
  // top_p outside (0, 1], min_p outside [0, 1], presence/frequency outside
  // [-2, 2], repetition_penalty <= 0 or not finite, a logit_bias entry
  // ValidateLogitBias refuses for `vocab_size`.
  absl::Status Validate(int64_t vocab_size) const;
  bool has_penalties() const {
    return presence_penalty != 0.0f || frequency_penalty != 0.0f || repetition_penalty != 1.0f;
  }
};

// Owns its random generator and the counts of the tokens it has sampled (the
// penalties' history); one per sequence, one thread at a time.
class Sampler {
 public:
  // `prompt_ids` count for the repetition penalty only (as in HF and vLLM).
  explicit Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids = {});
  // Samples from `logits` (one row of the vocabulary, the model's) and
  // records the token (and advances the grammar by it).
  int32_t Sample(std::span<const float> logits);
  // The grammar's state (null without one).
  const GrammarConstraint* constraint() const { return constraint_.get(); }
  // The logits the last Sample chose from before penalties: its `logits`
  // with logit_bias added (the same span when there is none). What
  // reported log probabilities are of; valid until the next Sample, and
  // while that call's `logits` are.
  std::span<const float> biased() const { return biased_view_; }

 private:
  std::span<const float> Biased(std::span<const float> logits);
  std::span<const float> Penalized(std::span<const float> logits);
  int32_t SampleFiltered(std::span<const float> logits);
  int32_t SampleConstrained(std::span<const float> logits);
  static bool ByLogit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b);
  void SelectPrefix(std::span<const float> logits, float max_logit, double total, size_t k);
  int32_t DrawFromKept();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<float> weights_;                         // e^((logit - max) / T) of every token
  std::vector<int32_t> ids_;                           // the tokens at or above a cut's lower logit bound
  std::vector<std::pair<float, int32_t>> candidates_;  // (logit, id) of those
  std::vector<int32_t> kept_ids_;                      // the tokens a draw is among
  std::vector<float> kept_;                            // and their weights
  std::unordered_map<int32_t, int32_t> generated_counts_;
  std::unordered_set<int32_t> prompt_tokens_;
  std::vector<float> biased_;
  std::span<const float> biased_view_;
  std::vector<float> penalized_;
  std::unique_ptr<GrammarConstraint> constraint_;
  std::vector<uint8_t> allowed_;  // the grammar's mask
  std::vector<float> masked_;     // logits with the disallowed at -inf
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
