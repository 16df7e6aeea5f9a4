// Pre-tokenizers: how a tokenizer cuts normalized text into the pieces
// ("words") the BPE model then encodes one by one, as tokenizer.json's
// "pre_tokenizer" gives them. Supported: ByteLevel, Split (a regex or a
// string, every SplitDelimiterBehavior, invert), Metaspace, Digits,
// Punctuation and Sequence; any other type is refused by name. Each is
// immutable after creation: any thread may pre-tokenize with it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/json_fields.h"

namespace tandem {

// One piece of text on its way to the model.
struct PreToken {
  std::string text;
  // Whether the piece starts where the whole input starts: Metaspace's
  // prepend_scheme "first" puts its marker only there.
  bool at_origin = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each piece by the pieces it splits into (in order; empty ones
  // are dropped, as HF drops them). Fails only if a regex gives up.
  virtual absl::Status PreTokenize(std::vector<PreToken>* pieces) const = 0;
};

// The pre-tokenizer `json` describes: nullptr for JSON null. InvalidArgument
// naming the field for a malformed one or an unsupported type.
absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const Json& json, const std::string& where);

}  // namespace tandem
