#include "coordinator/serving.h"

#include <mutex>
#include <random>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::vector<int32_t>> PromptIds(const Model& model, const std::string& text,
                                               std::span<const int32_t> ids, bool add_bos, const std::string& field) {
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
          absl::StrCat(field, ": this model has no tokenizer.model; send ", field, "_ids instead"));
    }
    absl::StatusOr<std::vector<int32_t>> encoded = model.tokenizer->Encode(text, add_bos);
    if (!encoded.ok()) return absl::InvalidArgumentError(absl::StrCat(field, ": ", encoded.status().message()));
    if (encoded->empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": the text encodes to no tokens"));
    return encoded;
  }
  return std::vector<int32_t>(ids.begin(), ids.end());
}

uint64_t FreshSeed() {
  static std::mutex mu;
  static std::random_device device;
  std::lock_guard<std::mutex> lock(mu);
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace tandem
