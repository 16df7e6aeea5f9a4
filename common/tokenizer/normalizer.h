// Normalizers: what a tokenizer does to text before it is split, as
// tokenizer.json's "normalizer" gives them. Supported: NFC, NFD, NFKC, NFKD
// (ICU), Prepend, Replace and Sequence; any other type is refused by name.
// Each is immutable after creation: any thread may normalize with it.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/json_fields.h"

namespace tandem {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Rewrites `text` (valid UTF-8, and it stays so).
  virtual absl::Status Normalize(std::string* text) const = 0;
};

// The normalizer `json` describes (`where` names it in errors): nullptr for
// JSON null. InvalidArgument naming the field for a malformed one, an
// unsupported type, or a regex that does not compile.
absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const Json& json, const std::string& where);

}  // namespace tandem
