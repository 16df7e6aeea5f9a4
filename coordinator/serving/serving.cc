#include "coordinator/serving/serving.h"

#include <algorithm>
#include <random>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<std::vector<int32_t>> PromptIds(const Model& model, const std::string& text,
                                               std::span<const int32_t> ids, bool add_bos, const std::string& field,
                                               int64_t max_token_bytes) {
  if (!text.empty() && !ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("give exactly one of ", field, " (text) and ", field, "_ids, not both"));
  }
  if (text.empty() && ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty: give ", field, " or ", field, "_ids"));
  }
  if (ids.empty()) {
    if (model.tokenizer == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": this model has no tokenizer; send ", field, "_ids instead"));
    }
    if (max_token_bytes > 0) {
      TANDEM_RETURN_IF_ERROR(
          CheckPromptTextFits(text.size(), max_token_bytes, model.config.max_position_embeddings, field));
    }
    absl::StatusOr<std::vector<int32_t>> encoded = model.tokenizer->Encode(text, add_bos);
    if (!encoded.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", encoded.status().message()));
    if (encoded->empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": the text encodes to no tokens"));
    return encoded;
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

int64_t MaxTokenTextBytes(const Model& model) {
  if (model.tokenizer == nullptr) return 1;
  size_t longest = 1;
  for (int32_t id = 0; id < model.tokenizer->vocab_size(); ++id) {
    longest = std::max(longest, model.tokenizer->PieceText(id).size());
  }
  return static_cast<int64_t>(longest);
}

absl::Status CheckPromptTextFits(size_t text_bytes, int64_t max_token_bytes, int64_t context,
                                 const std::string& field) {
  const int64_t per_token = std::max<int64_t>(1, max_token_bytes) * kPromptTextSlack;
  const int64_t at_least = static_cast<int64_t>(text_bytes) / per_token;
  if (context > 0 && at_least > context) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", text_bytes, " bytes of text are at least ", at_least,
                                                   " tokens, more than the model's context of ", context, " tokens"));
  }
  return absl::OkStatus();
}

uint64_t FreshSeed() {
  static absl::Mutex mu(absl::kConstInit);
  static std::random_device device ABSL_GUARDED_BY(mu);
  absl::MutexLock lock(&mu);
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace tandem
