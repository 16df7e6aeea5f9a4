// A byte-pair-encoding tokenizer as Hugging Face's `tokenizers` library runs
// one: added tokens split out of the text, then normalizer, pre-tokenizer,
// BPE model per piece and post-processor; decoding through the decoder
// chain. What every current MoE model ships (Qwen2/Qwen3-MoE, DeepSeek,
// GLM, GPT-OSS, Llama 4, OLMoE), as a tokenizer.json (tokenizer_json.h) or a
// GGUF "gpt2" vocabulary (common/model/gguf_tokenizer.h).
//
// Owns its components; immutable after Create, so any thread may encode and
// decode at once.
#pragma once

#include <memory>
#include <string>

#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

class BpeTokenizer final : public Tokenizer {
 public:
  struct Parts {
    std::string name;                             // the file, in errors
    std::unique_ptr<Normalizer> normalizer;       // may be null
    std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
    BpeModel model;
    AddedVocabulary added;
    std::unique_ptr<PostProcessor> post_processor;  // may be null
    std::unique_ptr<Decoder> decoder;               // null: tokens joined by spaces, as HF does
    int32_t bos_id = -1;
    int32_t eos_id = -1;
  };
  explicit BpeTokenizer(Parts parts) : parts_(std::move(parts)) {}

  using Tokenizer::Decode;
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override;
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    if (parts_.post_processor != nullptr) parts_.post_processor->Process(ids, /*add_special_tokens=*/true);
  }
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, const DecodeOptions& options) const override;
  std::string PieceText(int32_t id) const override;
  int32_t vocab_size() const override;
  int32_t bos_id() const override { return parts_.bos_id; }
  int32_t eos_id() const override { return parts_.eos_id; }

  const AddedVocabulary& added_vocabulary() const { return parts_.added; }
  const BpeModel& model() const { return parts_.model; }
  const std::string& name() const { return parts_.name; }

 private:
  // The token string decoding starts from (an added token's text or the
  // vocabulary's), or null for an id the tokenizer does not hold.
  const std::string* TokenText(int32_t id) const;
  absl::Status EncodeText(TextPiece piece, std::vector<PreToken>* words, std::vector<int32_t>* ids) const;

  Parts parts_;
};

}  // namespace tandem
