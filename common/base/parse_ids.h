// "1, 2,3" → {1, 2, 3}: the token-id lists of the CLIs' flags (--prompt_ids,
// --stop_ids), and --logit_bias's ID:BIAS lists. Header-only and absl-only, so that the `tandem` CLI, which
// links only the SDK, shares it with tandem-generate.
#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace tandem {

// Comma-separated integer token ids (blank entries skipped); InvalidArgument
// naming --`flag` and the entry that is not an integer.
inline absl::StatusOr<std::vector<int32_t>> ParseIds(const std::string& text, const char* flag) {
  std::vector<int32_t> ids;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": \"", part, "\" is not an integer token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

// "15043:-100, 7:2.5" → {15043: -100, 7: 2.5}: a CLI's --logit_bias.
// InvalidArgument naming --`flag` and the entry that is not ID:BIAS, or an id
// given twice; the range of each is the server's to check.
inline absl::StatusOr<std::map<int32_t, float>> ParseLogitBias(const std::string& text, const char* flag) {
  std::map<int32_t, float> biases;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits(':', 1));
    int32_t id;
    float bias;
    if (!absl::SimpleAtoi(kv.first, &id) || !absl::SimpleAtof(kv.second, &bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", part, "\" is not ID:BIAS (a token id, a colon, a number)"));
    }
    if (!biases.emplace(id, bias).second) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": token ", id, " is given twice"));
    }
  }
  return biases;
}

}  // namespace tandem
