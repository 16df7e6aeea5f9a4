#include "common/model/sentencepiece_tokenizer.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <exception>
#include <fstream>
#include <iterator>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>

// sentencepiece declares absl::string_view as std::string_view, which clashes
// with Debian's abseil (its own absl::string_view class). Renaming the
// namespace for its two headers keeps both; parameters mangle as
// std::string_view either way, so linking is unaffected.
#define absl sentencepiece_absl
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#undef absl

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/model/sentencepiece_proto.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// Bounds the trainer's memory if pointed at a large corpus; the license
// corpus is a few thousand lines.
constexpr int kMaxTrainingSentences = 1'000'000;

// What SentencePiece's Decode prints for <unk> (its default unk_surface), so
// that streamed pieces match decoded text.
constexpr char kUnknownSurface[] = " \xE2\x81\x87 ";

// SentencePiece's status codes are absl's, number for number, except that its
// checks report bad input (a file that is no model, a vocab too small for the
// corpus) as Internal, which tandem keeps for CUDA and oneDNN failures.
absl::Status FromSentencePiece(const sentencepiece::util::Status& status, const char* action, const fs::path& path) {
  if (status.ok()) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(status.code());
  return absl::Status(code == absl::StatusCode::kInternal ? absl::StatusCode::kInvalidArgument : code,
                      absl::StrCat(action, " ", path.string(), ": ", status.message()));
}

// A real tokenizer.model is under 5 MB; a larger file is refused before it is read.
constexpr uintmax_t kMaxTokenizerModelBytes = uintmax_t{64} << 20;

// What SentencePiece cannot take without crashing, checked on tandem's own
// reading of the pieces: its piece tries (darts-clone) hold C strings and
// throw an uncaught exception for a piece that is empty or starts with a NUL
// byte (found by fuzz/ tokenizer_model); one with a NUL byte anywhere would
// be cut short there.
absl::Status CheckPieces(const std::string& model_proto, const fs::path& path) {
  absl::StatusOr<std::vector<SentencePieceEntry>> pieces = ParseSentencePiecePieces(model_proto, path.string());
  if (!pieces.ok()) return pieces.status();
  for (size_t id = 0; id < pieces->size(); ++id) {
    const std::string& piece = (*pieces)[id].piece;
    if (piece.empty() || piece.find('\0') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("cannot load tokenizer ", path.string(), ": piece ", id,
                                                     piece.empty() ? " is empty" : " holds a NUL byte"));
    }
  }
  return absl::OkStatus();
}

// The processor for a serialized model proto. Exceptions stop here: any the
// library throws on a hostile model becomes InvalidArgument naming `path`.
absl::StatusOr<std::unique_ptr<sentencepiece::SentencePieceProcessor>> LoadProcessor(const std::string& model_proto,
                                                                                     const fs::path& path) {
  if (absl::Status checked = CheckPieces(model_proto, path); !checked.ok()) return checked;
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  try {
    const absl::Status status =
        FromSentencePiece(processor->LoadFromSerializedProto(model_proto), "cannot load tokenizer", path);
    if (!status.ok()) return status;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load tokenizer ", path.string(), ": ", e.what()));
  }
  return processor;
}

absl::StatusOr<std::string> ReadModelFile(const fs::path& path) {
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(path, ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot load tokenizer ", path.string()));
  if (bytes > kMaxTokenizerModelBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load tokenizer ", path.string(), ": ", bytes,
                                                   " bytes, more than a tokenizer model can be (64 MB)"));
  }
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) return absl::ErrnoToStatus(errno, absl::StrCat("cannot load tokenizer ", path.string()));
  return text;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(fs::path path,
                                               std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
    : path_(std::move(path)), processor_(std::move(processor)) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::Load(const fs::path& model_file) {
  absl::StatusOr<std::string> model_proto = ReadModelFile(model_file);
  if (!model_proto.ok()) return model_proto.status();
  return FromModelProto(*model_proto, model_file.string());
}

absl::StatusOr<std::unique_ptr<SentencePieceTokenizer>> SentencePieceTokenizer::FromModelProto(
    const std::string& model_proto, const std::string& name) {
  absl::StatusOr<std::unique_ptr<sentencepiece::SentencePieceProcessor>> processor = LoadProcessor(model_proto, name);
  if (!processor.ok()) return processor.status();
  return std::unique_ptr<SentencePieceTokenizer>(new SentencePieceTokenizer(name, *std::move(processor)));
}

absl::StatusOr<std::vector<int32_t>> SentencePieceTokenizer::Encode(std::string_view text, bool add_bos) const {
  if (add_bos && bos_id() < 0) {
    return absl::FailedPreconditionError(absl::StrCat(path_.string(), ": tokenizer has no BOS piece"));
  }
  if (absl::Status utf8 = CheckUtf8(text, absl::StrCat(path_.string(), ": text to encode")); !utf8.ok()) return utf8;
  std::vector<int32_t> ids;
  const absl::Status status = FromSentencePiece(processor_->Encode(text, &ids), "encoding with", path_);
  if (!status.ok()) return status;
  if (add_bos) ids.insert(ids.begin(), bos_id());
  return ids;
}

void SentencePieceTokenizer::AddSpecialTokens(std::vector<int32_t>* ids) const {
  if (bos_id() >= 0) ids->insert(ids->begin(), bos_id());
}

absl::StatusOr<std::string> SentencePieceTokenizer::DecodeKnown(const std::vector<int>& ids) const {
  std::string text;
  const absl::Status status = FromSentencePiece(processor_->Decode(ids, &text), "decoding with", path_);
  if (!status.ok()) return status;
  return text;
}

absl::StatusOr<std::string> SentencePieceTokenizer::Decode(std::span<const int32_t> ids,
                                                           const DecodeOptions& options) const {
  std::vector<int> known;
  known.reserve(ids.size());
  std::copy_if(ids.begin(), ids.end(), std::back_inserter(known),
               [&](int32_t id) { return id >= 0 && id < vocab_size(); });
  if (options.skip_special_tokens) return DecodeKnown(known);
  // SentencePiece always drops control pieces: decode the runs between them
  // and put the control pieces' text back in place.
  std::string text;
  std::vector<int> run;
  for (size_t i = 0; i <= known.size(); ++i) {
    if (i < known.size() && !processor_->IsControl(known[i])) {
      run.push_back(known[i]);
      continue;
    }
    absl::StatusOr<std::string> decoded = DecodeKnown(run);
    if (!decoded.ok()) return decoded.status();
    text += *decoded;
    run.clear();
    if (i < known.size()) text += processor_->IdToPiece(known[i]);
  }
  return text;
}

std::string SentencePieceTokenizer::PieceText(int32_t id) const {
  if (id < 0 || id >= vocab_size() || processor_->IsControl(id)) return "";
  if (processor_->IsUnknown(id)) return kUnknownSurface;
  const std::string& piece = processor_->IdToPiece(id);
  if (processor_->IsByte(id)) {  // "<0xHH>"
    unsigned byte = 0;
    std::from_chars(piece.data() + 3, piece.data() + 5, byte, 16);
    return std::string(1, static_cast<char>(byte));
  }
  return absl::StrReplaceAll(piece, {{"\xE2\x96\x81", " "}});  // U+2581 "▁" marks a space
}

int32_t SentencePieceTokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int32_t SentencePieceTokenizer::bos_id() const { return processor_->bos_id(); }
int32_t SentencePieceTokenizer::eos_id() const { return processor_->eos_id(); }

std::vector<fs::path> DefaultTokenizerCorpus() {
  std::vector<fs::path> files;
  std::error_code ec;
  for (fs::directory_iterator it(kDefaultTokenizerCorpusDir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (!it->is_symlink(ec) && it->is_regular_file(ec)) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

namespace {

// The trainer's settings for `options` (see TrainTokenizer), after checking
// them; shared by the file and the in-memory training so both give the same
// model.
absl::StatusOr<std::unordered_map<std::string, std::string>> TrainerFlags(const TokenizerTrainOptions& options,
                                                                          bool need_prefix) {
  if (options.input_files.empty()) {
    return absl::NotFoundError(absl::StrCat("no training text found in ", kDefaultTokenizerCorpusDir,
                                            " (or TokenizerTrainOptions.input_files is empty)"));
  }
  if ((need_prefix && options.model_prefix.empty()) || options.vocab_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer training needs a model_prefix and a positive vocab_size, got \"",
                     options.model_prefix.string(), "\" and ", options.vocab_size));
  }
  std::vector<std::string> inputs;
  for (const fs::path& file : options.input_files) {
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      return absl::NotFoundError(absl::StrCat("training text ", file.string(), " not found"));
    }
    // SentencePiece splits its input list on commas.
    if (file.string().find(',') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("training text ", file.string(), ": path contains a comma"));
    }
    inputs.push_back(file.string());
  }
  // A map rather than a flag string: paths may hold spaces.
  std::unordered_map<std::string, std::string> flags = {
      {"input", absl::StrJoin(inputs, ",")},
      {"vocab_size", absl::StrCat(options.vocab_size)},
      {"hard_vocab_limit", "false"},
      {"model_type", "bpe"},
      {"byte_fallback", "true"},  // any UTF-8 encodes, nothing maps to <unk>
      {"character_coverage", "1.0"},
      // Llama's text handling: no normalisation, spaces and digits kept as written.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", "1"},  // determinism
      {"input_sentence_size", absl::StrCat(kMaxTrainingSentences)},
      {"shuffle_input_sentence", "false"},  // beyond the bound keep the first lines: no sampling
      {"minloglevel", "2"},
  };
  // The trainer takes a prefix (and writes files) or returns the model, not
  // both. The prefix is recorded in the model's trainer spec: the only byte
  // difference between the two ways of training.
  if (need_prefix) flags["model_prefix"] = options.model_prefix.string();
  return flags;
}

}  // namespace

absl::Status TrainTokenizer(const TokenizerTrainOptions& options) {
  auto flags = TrainerFlags(options, /*need_prefix=*/true);
  if (!flags.ok()) return flags.status();
  return FromSentencePiece(sentencepiece::SentencePieceTrainer::Train(*flags), "training tokenizer",
                           options.model_prefix);
}

absl::StatusOr<std::string> TrainTokenizerInMemory(const TokenizerTrainOptions& options) {
  auto flags = TrainerFlags(options, /*need_prefix=*/false);
  if (!flags.ok()) return flags.status();
  std::string model_proto;
  const absl::Status status =
      FromSentencePiece(sentencepiece::SentencePieceTrainer::Train(*flags, nullptr, &model_proto), "training tokenizer",
                        options.model_prefix.empty() ? fs::path("(in memory)") : options.model_prefix);
  if (!status.ok()) return status;
  return model_proto;
}

}  // namespace tandem
