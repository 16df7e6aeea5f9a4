// tokenizer.json, Hugging Face's one-file tokenizer format, read into a
// BpeTokenizer: "model" (BPE: vocab, merges, unk_token, byte_fallback,
// fuse_unk, ignore_merges, continuing_subword_prefix, end_of_word_suffix),
// "added_tokens", "normalizer", "pre_tokenizer", "post_processor" and
// "decoder" (see normalizer.h, pre_tokenizer.h, post_processor.h,
// decoder.h for the component types read). "truncation" and "padding"
// shape batches for training and are not applied. Anything else the
// library does not implement (another model type, an unknown component) is
// refused by name: a tokenizer that would silently encode differently from
// HF's never loads.
//
// Errors are InvalidArgument naming the file and the field: "tokenizer.json:
// model.merges[12]: token \"Ġx\" is not in the vocabulary". Stateless
// functions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/tokenizer/bpe_tokenizer.h"
#include "common/tokenizer/json_fields.h"

namespace tandem {

// A tokenizer.json larger than this is refused before it is read (the
// largest real ones, 200k-token vocabularies, are ~30 MB).
inline constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{512} << 20;

struct TokenizerJsonOptions {
  std::string source = "tokenizer.json";  // names the file in errors
  // BOS and EOS as the model's other files name them: by content
  // (tokenizer_config.json's bos_token, looked up among the added tokens and
  // the vocabulary) or else by id (config.json's bos_token_id; -1: none).
  // Without either, BOS is the post-processor template's leading token.
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  int32_t bos_id = -1;
  int32_t eos_id = -1;
  // When set, the special tokens put around a text are BOS (when
  // add_bos_token) and EOS (when add_eos_token), replacing the file's
  // post-processor: what transformers' Llama and Gemma tokenizer classes do
  // with tokenizer_config.json's flags.
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
};

absl::StatusOr<std::unique_ptr<BpeTokenizer>> TokenizerFromJson(const Json& document,
                                                                const TokenizerJsonOptions& options);
// `text` parsed first (no exceptions; a syntax error names the byte offset).
absl::StatusOr<std::unique_ptr<BpeTokenizer>> ParseTokenizerJson(std::string_view text,
                                                                 const TokenizerJsonOptions& options);
// The file read (bounded by kMaxTokenizerJsonBytes); options.source defaults
// to its path.
absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadTokenizerJson(const std::filesystem::path& file,
                                                                TokenizerJsonOptions options = {});

// JSON text parsed without exceptions; InvalidArgument naming `source` and
// the byte offset of a syntax error.
absl::StatusOr<Json> ParseJsonText(std::string_view text, std::string_view source);

}  // namespace tandem
