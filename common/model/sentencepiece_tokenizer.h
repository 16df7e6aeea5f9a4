// Text <-> token ids with a SentencePiece model (the tokenizer.model of Llama,
// Mistral, Mixtral and Phi-3.5, or a GGUF "llama" vocabulary), one of the
// two Tokenizer implementations (common/tokenizer/tokenizer.h), and training
// of small BPE tokenizers for synthetic models from text every Debian
// machine has.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"

// Kept out of this header: sentencepiece's headers clash with Debian's abseil
// (see tokenizer.cc).
namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tandem {

// A loaded SentencePiece model. Immutable after Load: any thread may call its
// const methods. Errors name the model file.
class SentencePieceTokenizer final : public Tokenizer {
 public:
  // NotFound or InvalidArgument naming `model_file` when it is missing or not
  // a SentencePiece model.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> Load(const std::filesystem::path& model_file);
  // From the bytes of a .model file (a serialized model proto, e.g. from
  // TrainTokenizerInMemory); `name` stands for the file in errors.
  // InvalidArgument naming `name` when the bytes are no SentencePiece model.
  static absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> FromModelProto(const std::string& model_proto,
                                                                                const std::string& name);
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  // add_bos adds the BOS piece (FailedPrecondition when the model has none).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_bos) const override;
  // BOS first when the model has one.
  void AddSpecialTokens(std::vector<int32_t>* ids) const override;
  using Tokenizer::Decode;
  // Control pieces (<s>, </s>) decode to nothing, or to their piece text
  // without skip_special_tokens.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids, const DecodeOptions& options) const override;
  // "▁" becomes a space, a byte piece (<0x0A>) its byte, a control piece
  // (<s>, </s>) or an id outside the tokenizer nothing. Decode drops the
  // leading space of the first word (the dummy prefix SentencePiece adds
  // when encoding).
  std::string PieceText(int32_t id) const override;

  // Pieces in the tokenizer, which may be fewer than the model's vocab.
  int32_t vocab_size() const override;
  int32_t bos_id() const override;  // -1 when the model has none
  int32_t eos_id() const override;  // -1 when the model has none

 private:
  SentencePieceTokenizer(std::filesystem::path path, std::unique_ptr<sentencepiece::SentencePieceProcessor> processor);
  // Decode of ids that are all known pieces, skipping control pieces.
  absl::StatusOr<std::string> DecodeKnown(const std::vector<int>& ids) const;

  std::filesystem::path path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

// Where DefaultTokenizerCorpus looks: license texts, present on every Debian
// machine, so synthetic models get a real tokenizer without any download.
inline constexpr char kDefaultTokenizerCorpusDir[] = "/usr/share/common-licenses";

// The regular files in kDefaultTokenizerCorpusDir, sorted; symlinks (GPL ->
// GPL-3) are skipped so no text counts twice. Empty when the folder is
// missing; TrainTokenizer then reports that no training text was found.
std::vector<std::filesystem::path> DefaultTokenizerCorpus();

struct TokenizerTrainOptions {
  std::vector<std::filesystem::path> input_files;  // text, one sentence per line
  std::filesystem::path model_prefix;              // writes <prefix>.model and <prefix>.vocab
  // Upper bound: a corpus too small for it yields fewer pieces, not an error.
  int vocab_size = 512;
};

// Trains a byte-fallback BPE model with ids unk=0, bos=1, eos=2 and no pad,
// the layout of Llama-family tokenizers. Deterministic: the same files and
// options give a byte-identical .model (one thread, every line read in
// order, no sampling, so SentencePiece needs no seed). Silences
// SentencePiece's own logging process-wide.
absl::Status TrainTokenizer(const TokenizerTrainOptions& options);
// The same training, returning the model (a serialized model proto, what
// TrainTokenizer writes to <prefix>.model) instead of writing any file; the
// same pieces and ids, and the same bytes except for the recorded
// model_prefix, which is empty here (so the bytes do not depend on where a
// model is written). options.model_prefix only names the model in errors.
absl::StatusOr<std::string> TrainTokenizerInMemory(const TokenizerTrainOptions& options);

}  // namespace tandem
