// "1, 2,3" → {1, 2, 3}: the token-id lists of the CLIs' flags (--prompt_ids,
// --stop_ids). Header-only and absl-only, so that the `tandem` CLI, which
// links only the SDK, shares it with tandem-generate.
#pragma once

#include <cstdint>
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

}  // namespace tandem
