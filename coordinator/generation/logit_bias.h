// OpenAI's logit_bias: per token id, a bias in [-100, 100] added to that
// token's logit before it is chosen (sampled, taken greedily, or offered as
// a beam's next token). -100 all but bans a token, +100 all but forces it.
// The log probabilities tandem reports are those of the biased logits (the
// distribution the token was chosen from), as OpenAI's were: docs/http.md.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

inline constexpr float kMaxLogitBias = 100.0f;     // |bias|, OpenAI's range
inline constexpr size_t kMaxLogitBiasTokens = 1024;  // entries per request

struct LogitBias {
  int32_t id = 0;
  float bias = 0.0f;
  bool operator==(const LogitBias&) const = default;
};

// InvalidArgument starting with "logit_bias" and naming the key: more than
// kMaxLogitBiasTokens entries, an id twice or outside [0, vocab_size), a
// bias that is not a number in [-kMaxLogitBias, kMaxLogitBias].
absl::Status ValidateLogitBias(std::span<const LogitBias> biases, int64_t vocab_size);

// logits[id] += bias for every entry (ids already validated).
void ApplyLogitBias(std::span<const LogitBias> biases, std::span<float> logits);

}  // namespace tandem
