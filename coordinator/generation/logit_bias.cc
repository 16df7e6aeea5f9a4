#include "coordinator/generation/logit_bias.h"

#include <cmath>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status ValidateLogitBias(std::span<const LogitBias> biases, int64_t vocab_size) {
  if (biases.size() > kMaxLogitBiasTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("logit_bias: at most ", kMaxLogitBiasTokens, " tokens, got ", biases.size()));
  }
  absl::flat_hash_set<int32_t> seen;
  for (const LogitBias& b : biases) {
    if (b.id < 0 || b.id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: key \"", b.id,
                                                     "\" is not a token id of this model's vocabulary [0, ",
                                                     vocab_size, ")"));
    }
    if (!std::isfinite(b.bias) || std::fabs(b.bias) > kMaxLogitBias) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: key \"", b.id, "\": the bias must be a number in [-",
                                                     kMaxLogitBias, ", ", kMaxLogitBias, "], got ", b.bias));
    }
    if (!seen.insert(b.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("logit_bias: key \"", b.id, "\" is given twice"));
    }
  }
  return absl::OkStatus();
}

void ApplyLogitBias(std::span<const LogitBias> biases, std::span<float> logits) {
  for (const LogitBias& b : biases) logits[static_cast<size_t>(b.id)] += b.bias;
}

}  // namespace tandem
