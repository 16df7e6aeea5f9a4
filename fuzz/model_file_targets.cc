// The fuzz entry points for model files a user downloads: safetensors
// (file and index), config.json, tokenizer.model, tokenizer.json and GGUF.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/model/gguf_model_config.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/sentencepiece_proto.h"
#include "common/model/sentencepiece_tokenizer.h"
#include "common/tokenizer/tokenizer_json.h"
#include "fuzz/fuzz_scratch.h"
#include "fuzz/fuzz_targets.h"

namespace tandem::fuzz {
namespace {

namespace fs = std::filesystem;

std::string_view AsText(FuzzBytes bytes) { return {reinterpret_cast<const char*>(bytes.data()), bytes.size()}; }

// The folder SafetensorsCheckpoint::Open reads, made once; each input
// replaces its index.
absl::StatusOr<fs::path> IndexModelDir() {
  static const absl::StatusOr<fs::path> dir = []() -> absl::StatusOr<fs::path> {
    const fs::path path = FuzzScratchDir() / "index-model";
    std::error_code ec;
    fs::create_directory(path, ec);
    if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create ", path.string()));
    const std::vector<TensorToWrite> tensors = IndexFolderTensors();
    TANDEM_RETURN_IF_ERROR(WriteSafetensorsCheckpoint(path, {&tensors[0], &tensors[1]}, kIndexFolderShards));
    return path;
  }();
  return dir;
}

// What every user of a tokenizer does with it: encode (with and without
// BOS), decode, and the streamed text of each piece.
absl::Status ExerciseTokenizer(const Tokenizer& tokenizer) {
  static constexpr std::string_view kText = "Hello, w\xc3\xb6rld! 123 \xe2\x96\x81<s>\n\t\xf0\x9f\x98\x80 end";
  TANDEM_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer.Encode(kText, /*add_bos=*/false));
  if (tokenizer.bos_id() >= 0) TANDEM_RETURN_IF_ERROR(tokenizer.Encode(kText, /*add_bos=*/true).status());
  TANDEM_RETURN_IF_ERROR(tokenizer.Decode(ids).status());
  for (int32_t id : ids) (void)tokenizer.PieceText(id);
  const int32_t probes[] = {-1, 0, 1, 2, tokenizer.vocab_size() - 1, tokenizer.vocab_size()};
  for (int32_t id : probes) (void)tokenizer.PieceText(id);
  return tokenizer.Decode(probes).status();
}

}  // namespace

std::vector<TensorToWrite> IndexFolderTensors() {
  std::vector<TensorToWrite> tensors(2);
  tensors[0] = {.name = "a", .dtype = DType::kF32, .shape = {2}, .data = std::vector<uint8_t>(8, 1)};
  tensors[1] = {.name = "b", .dtype = DType::kBF16, .shape = {2, 2}, .data = std::vector<uint8_t>(8, 2)};
  return tensors;
}

absl::Status FuzzSafetensorsFile(FuzzBytes bytes) {
  const fs::path path = FuzzScratchDir() / "fuzz.safetensors";
  TANDEM_RETURN_IF_ERROR(WriteFuzzFile(path, bytes));
  TANDEM_ASSIGN_OR_RETURN(const std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  // Every view the parser hands out must lie inside the mapping: touch both ends.
  uint8_t sum = 0;
  for (const auto& [name, view] : file->tensors()) {
    if (view.size_bytes == 0) continue;
    sum ^= static_cast<const uint8_t*>(view.data)[0];
    sum ^= static_cast<const uint8_t*>(view.data)[view.size_bytes - 1];
  }
  volatile uint8_t sink = sum;  // the reads must happen
  (void)sink;
  return absl::OkStatus();
}

absl::Status FuzzSafetensorsIndex(FuzzBytes bytes) {
  TANDEM_ASSIGN_OR_RETURN(const fs::path dir, IndexModelDir());
  TANDEM_RETURN_IF_ERROR(WriteFuzzFile(dir / "model.safetensors.index.json", bytes));
  return SafetensorsCheckpoint::Open(dir).status();
}

absl::Status FuzzModelConfig(FuzzBytes bytes) { return ParseModelConfig(AsText(bytes), "fuzz config.json").status(); }

absl::Status FuzzTokenizerModel(FuzzBytes bytes) {
  const std::string proto(AsText(bytes));
  TANDEM_RETURN_IF_ERROR(ParseSentencePiecePieces(proto, "fuzz tokenizer.model").status());
  TANDEM_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer,
                          SentencePieceTokenizer::FromModelProto(proto, "fuzz tokenizer.model"));
  return ExerciseTokenizer(*tokenizer);
}

absl::Status FuzzTokenizerJson(FuzzBytes bytes) {
  TANDEM_ASSIGN_OR_RETURN(const std::unique_ptr<BpeTokenizer> tokenizer,
                          ParseTokenizerJson(AsText(bytes), {.source = "fuzz tokenizer.json"}));
  TANDEM_RETURN_IF_ERROR(ExerciseTokenizer(*tokenizer));
  TANDEM_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer->Encode("<s>a\xe2\x96\x81 b", /*add_bos=*/true));
  return tokenizer->Decode(ids, {.skip_special_tokens = false}).status();
}

absl::Status FuzzGgufFile(FuzzBytes bytes) {
  const fs::path path = FuzzScratchDir() / "fuzz.gguf";
  TANDEM_RETURN_IF_ERROR(WriteFuzzFile(path, bytes));
  TANDEM_ASSIGN_OR_RETURN(const std::unique_ptr<GgufCheckpoint> checkpoint, GgufCheckpoint::Open(path));
  // The config and the tokenizer are read independently: one failing must
  // not keep the other from being fuzzed.
  const absl::Status config = ModelConfigFromGguf(*checkpoint).status();
  absl::Status tokenizer = absl::OkStatus();
  if (GgufHasTokenizer(checkpoint->metadata())) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> loaded = TokenizerFromGguf(checkpoint->metadata(), path.string());
    tokenizer = loaded.ok() ? ExerciseTokenizer(**loaded) : loaded.status();
  }
  const absl::Status chat_template = ChatTemplateFromGguf(checkpoint->metadata()).status();
  TANDEM_RETURN_IF_ERROR(config);
  TANDEM_RETURN_IF_ERROR(tokenizer);
  return chat_template;
}

}  // namespace tandem::fuzz
