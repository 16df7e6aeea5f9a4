// The pre-tokenizer names llama.cpp writes as tokenizer.ggml.pre in a GGUF
// "gpt2" vocabulary, each mapped to the normalizer and pre-tokenizer of the
// original Hugging Face tokenizer.json it stands for (in tokenizer.json's
// own JSON form, so one parser reads both): "qwen2" is NFC then the Qwen2
// regex then ByteLevel, "llama-bpe" the Llama 3 regex with ignore_merges,
// and so on. Constant data; any thread may read it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/json_fields.h"

namespace tandem {

struct GgufPreTokenizer {
  Json normalizer;     // null when the original has none
  Json pre_tokenizer;  // tokenizer.json's "pre_tokenizer"
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's default when the file has no add_bos_token
};

// The pipeline for `name` ("" or "default": GPT-2's, the byte-level
// pre-tokenizer every older GGUF file meant). NotFound listing the known
// names for any other.
absl::StatusOr<GgufPreTokenizer> GgufPreTokenizerNamed(std::string_view name);
// Every name GgufPreTokenizerNamed knows, sorted.
std::vector<std::string> KnownGgufPreTokenizers();

}  // namespace tandem
