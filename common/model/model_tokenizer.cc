#include "common/model/model_tokenizer.h"

#include <algorithm>
#include <iterator>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/sentencepiece_tokenizer.h"
#include "common/tokenizer/tokenizer_json.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// BOS and EOS for a tokenizer.json: the tokens tokenizer_config.json names,
// else config.json's ids.
TokenizerJsonOptions JsonOptions(const fs::path& file, const ModelDefaults& defaults, const ModelConfig* config) {
  TokenizerJsonOptions options{.source = file.string()};
  options.bos_token = defaults.tokenizer.bos_token;
  options.eos_token = defaults.tokenizer.eos_token;
  // transformers' Llama and Gemma tokenizers rebuild the post-processor from
  // the config's flags (BOS by default, no EOS); other classes keep the
  // file's. The GGUF converter writes the same flags as add_bos_token.
  static constexpr std::string_view kRebuilding[] = {"LlamaTokenizer",     "LlamaTokenizerFast",
                                                     "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
                                                     "GemmaTokenizer",     "GemmaTokenizerFast"};
  const std::optional<std::string>& cls = defaults.tokenizer.tokenizer_class;
  if (cls && std::find(std::begin(kRebuilding), std::end(kRebuilding), *cls) != std::end(kRebuilding)) {
    options.add_bos_token = defaults.tokenizer.add_bos_token.value_or(true);
    options.add_eos_token = defaults.tokenizer.add_eos_token.value_or(false);
  }
  if (config != nullptr) {
    options.bos_id = config->bos_token_id;
    if (!config->eos_token_ids.empty()) options.eos_id = config->eos_token_ids.front();
  }
  return options;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const fs::path& path) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> checkpoint, GgufCheckpoint::Open(path));
  if (!GgufHasTokenizer(checkpoint->metadata())) {
    return absl::NotFoundError(absl::StrCat(path.string(), " has no tokenizer.ggml vocabulary"));
  }
  return TokenizerFromGguf(checkpoint->metadata(), checkpoint->Describe());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFolderTokenizer(const fs::path& dir, const ModelDefaults& defaults,
                                                               const ModelConfig* config) {
  std::error_code error;
  if (fs::exists(dir / "tokenizer.model", error)) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> tokenizer,
                            SentencePieceTokenizer::Load(dir / "tokenizer.model"));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  if (fs::exists(dir / "tokenizer.json", error)) {
    TANDEM_ASSIGN_OR_RETURN(
        std::unique_ptr<BpeTokenizer> tokenizer,
        LoadTokenizerJson(dir / "tokenizer.json", JsonOptions(dir / "tokenizer.json", defaults, config)));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerAt(const fs::path& path) {
  std::error_code error;
  if (!fs::exists(path, error)) return absl::NotFoundError(absl::StrCat(path.string(), ": no such file or folder"));
  if (fs::is_directory(path, error)) {
    // config.json is left alone: its ids only back up tokenizer_config.json's
    // tokens, and a tokenizer needs no model config to be valid.
    TANDEM_ASSIGN_OR_RETURN(const ModelDefaults defaults, LoadModelDefaults(path));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadFolderTokenizer(path, defaults, nullptr));
    if (tokenizer == nullptr) {
      return absl::NotFoundError(absl::StrCat(path.string(), " holds neither tokenizer.model nor tokenizer.json"));
    }
    return tokenizer;
  }
  if (path.extension() == ".gguf") return FromGguf(path);
  if (path.extension() == ".model") {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> tokenizer, SentencePieceTokenizer::Load(path));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  // A tokenizer.json, with the tokenizer_config.json beside it when there is one.
  TANDEM_ASSIGN_OR_RETURN(const ModelDefaults defaults,
                          LoadModelDefaults(path.parent_path().empty() ? "." : path.parent_path()));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tokenizer,
                          LoadTokenizerJson(path, JsonOptions(path, defaults, nullptr)));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace tandem
