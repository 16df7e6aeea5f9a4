// Text <-> token ids: the one interface every part of tandem tokenizes
// through (HTTP and gRPC endpoints, chat templates, streaming, the CLIs).
// Two implementations: SentencePieceTokenizer (common/model: a
// tokenizer.model, or a GGUF "llama" vocabulary) and BpeTokenizer
// (common/tokenizer: a tokenizer.json, or a GGUF "gpt2" vocabulary).
//
// A tokenizer is immutable once created: any thread may call its const
// methods.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct DecodeOptions {
  // Leave out special tokens (<s>, <|im_end|>, ...), as HF's
  // skip_special_tokens does.
  bool skip_special_tokens = true;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text`. `add_bos`: add the special tokens this tokenizer puts
  // around a text when asked to (HF's add_special_tokens): BOS for
  // SentencePiece and Llama 3, nothing for Qwen2; for a GGUF vocabulary,
  // what its add_bos_token / add_eos_token say. Special tokens written in
  // the text are always recognised. InvalidArgument naming the tokenizer
  // when `text` is not valid UTF-8.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const = 0;
  // What Encode(text, true) adds around the ids of `text`, added around
  // `ids` (text encoded in pieces, between special tokens): BOS for
  // SentencePiece when it has one, the post-processor's tokens for a
  // tokenizer.json, none for Qwen2.
  virtual void AddSpecialTokens(std::vector<int32_t>* ids) const = 0;

  // The text of `ids`, special tokens left out. Ids the tokenizer does not
  // hold decode to nothing rather than fail: a model's embedding may be
  // padded past the tokenizer (Phi-3.5: 32064 rows, 32000 pieces) and a
  // sampler may pick a padding row.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids) const { return Decode(ids, DecodeOptions{}); }
  virtual absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, const DecodeOptions& options) const = 0;

  // The bytes one token adds when streamed, special tokens giving nothing.
  // Raw bytes: a byte-level or byte-fallback token may end inside a UTF-8
  // character (coordinator/utf8_stream.h holds such bytes back until the
  // character completes). Concatenating the pieces of a sequence gives
  // Decode's text except where decoding strips the first token's leading
  // space (SentencePiece's dummy prefix, a Strip decoder).
  virtual std::string PieceText(int32_t id) const = 0;

  // One past the largest id the tokenizer holds (it may be fewer than the
  // model's vocab).
  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when there is none
  virtual int32_t eos_id() const = 0;  // -1 when there is none
};

}  // namespace tandem
