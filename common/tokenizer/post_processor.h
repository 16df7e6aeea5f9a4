// Post-processors: the special tokens a tokenizer puts around an encoded
// text when asked to (HF's add_special_tokens), as tokenizer.json's
// "post_processor" gives them. Supported: TemplateProcessing (its "single"
// template: BOS, the text, EOS...), ByteLevel (which adds none) and
// Sequence; any other type is refused by name. Immutable after creation.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/json_fields.h"

namespace tandem {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  // `ids` with the template's tokens around them (when add_special_tokens).
  virtual void Process(std::vector<int32_t>* ids, bool add_special_tokens) const = 0;
  // The id the template puts first, when it starts with a special token of
  // one id (the BOS of Llama-style templates); -1 otherwise.
  virtual int32_t LeadingId() const { return -1; }
};

// The post-processor `json` describes: nullptr for JSON null. Ids past
// `id_limit` are refused (InvalidArgument naming the field).
absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessorFromJson(const Json& json, const std::string& where,
                                                                     int64_t id_limit);

// A TemplateProcessing that adds `bos_id` before and `eos_id` after the text
// (-1: not that one): what a GGUF file's add_bos_token / add_eos_token mean.
std::unique_ptr<PostProcessor> BosEosPostProcessor(int32_t bos_id, int32_t eos_id);

}  // namespace tandem
