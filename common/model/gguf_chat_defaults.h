// A GGUF file's chat conventions as the ModelDefaults a Hugging Face folder
// gives (common/chat/model_defaults.h), so the chat template a model carries
// is used the same way whatever its format:
//
//   tokenizer.chat_template          the template ("default"), and
//   tokenizer.chat_template.<name>   the other named ones ("tool_use", ...);
//   tokenizer.ggml.bos_token_id ...  bos_token, eos_token, unk_token and
//                                    pad_token as their pieces' text (what
//                                    llama-server gives the template);
//   tokenizer.ggml.token_type        control, user-defined and unknown
//                                    tokens as the added vocabulary, so a
//                                    rendered prompt's "<s>" or
//                                    "<|im_start|>" becomes its id (as
//                                    llama.cpp's parse_special does);
//   tokenizer.ggml.add_bos_token /   add_bos_token / add_eos_token.
//   add_eos_token
//
// A GGUF has no generation_config.json: `generation` stays empty, and its
// stop id is config's eos_token_id (gguf_model_config.h). lstrip/rstrip of
// added tokens are not in the format: none is set.
//
// Errors name `source` (the file) and the key. Stateless.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/chat/model_defaults.h"
#include "common/gguf/gguf_metadata.h"

namespace tandem {

// `source` is also what chat_template_source names (the template's file).
// InvalidArgument for a template key that is not a string, a special id
// outside tokenizer.ggml.tokens, or token arrays of the wrong type; a file
// without a vocabulary gives the templates alone.
absl::StatusOr<ModelDefaults> ModelDefaultsFromGguf(const GgufMetadata& metadata, const std::string& source);

}  // namespace tandem
