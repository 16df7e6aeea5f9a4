// Beam search's selection rule, apart from the model: given the next-token
// logits of every live beam, pick the next live beams and collect finished
// hypotheses. The scheduler runs all live beams of a request as one batch
// through the engine (larger expert batches: the point of beam search in a
// CPU-GPU system) and forks their KV caches by block table (kv_cache.h).
//
// The rule is Hugging Face's BeamSearchScorer, so results are comparable:
//   - each step, every live beam b offers its 2W best next tokens t with
//     score(b) + log p(t | b) (p of the logits plus any logit_bias); the 2W
//     best offers overall are taken in order
//     (ties: lower beam, then lower token id);
//   - an offer of an end token (EOS unless ignored, or a stop id) ranked
//     among the first W becomes a finished hypothesis, otherwise it is
//     skipped; other offers become live beams until W are found;
//   - a hypothesis scores sum_logprob / length^length_penalty, length =
//     generated tokens (the end token included); the W best are kept;
//   - done when W hypotheses are finished and either early_stopping, or the
//     best live beam, scored at its current length, cannot beat the worst
//     of them (HF's heuristic); or at max_tokens, when the live beams join
//     the hypotheses; or when no beam is left.
//
// Legend: W beam width, V vocabulary.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/generation/logit_bias.h"

namespace tandem {

// |length_penalty| at most this (HF's default is 1; useful values lie in
// [-2, 2]): the scores stay finite for any length up to the context.
inline constexpr float kMaxLengthPenalty = 10.0f;

struct BeamSearchParams {
  int32_t beam_width = 1;
  int32_t max_tokens = 16;
  float length_penalty = 1.0f;
  bool early_stopping = false;
  int32_t num_return_sequences = 1;
  std::vector<int32_t> end_ids;  // tokens that finish a beam (EOS, stop ids)
  // Added to every beam's logits before log p(t | b) (logit_bias.h), so
  // scores are of the biased distribution, as sampling's logprobs are.
  std::vector<LogitBias> logit_bias;

  // InvalidArgument naming the field.
  absl::Status Validate(int64_t vocab_size) const;
};

enum class BeamEnd : uint8_t { kEndToken, kMaxTokens };

struct BeamHypothesis {
  std::vector<int32_t> ids;  // generated ids, the end token included
  double sum_logprob = 0;
  double score = 0;
  BeamEnd end = BeamEnd::kMaxTokens;
};

struct LiveBeam {
  std::vector<int32_t> ids;
  double sum_logprob = 0;
};

// Which live beam a new live beam continues, and with which token.
struct BeamChoice {
  int32_t parent = 0;
  int32_t token = 0;
};

// One request's search; one thread at a time.
class BeamSearchState {
 public:
  // Starts with one live beam: the prompt, nothing generated.
  explicit BeamSearchState(BeamSearchParams params);

  // `logits`: [live().size(), V], row i for live beam i. Returns the new
  // live beams (the new live() in order), each as its parent's row and token.
  std::vector<BeamChoice> Step(std::span<const float> logits, int64_t vocab);

  bool done() const { return done_; }
  int32_t step() const { return step_; }
  const std::vector<LiveBeam>& live() const { return live_; }
  int32_t num_finished() const { return static_cast<int32_t>(finished_.size()); }
  // The num_return_sequences best hypotheses, best first (call when done).
  std::vector<BeamHypothesis> Results() const;

 private:
  double Score(double sum_logprob, size_t length) const;
  void AddHypothesis(BeamHypothesis hypothesis);
  bool IsEnd(int32_t token) const;

  BeamSearchParams params_;
  std::vector<LiveBeam> live_;
  std::vector<BeamHypothesis> finished_;  // best first, at most W
  int32_t step_ = 0;
  bool done_ = false;
};

// log_softmax of one row, in double.
void LogSoftmax(std::span<const float> logits, std::vector<double>* out);

}  // namespace tandem
