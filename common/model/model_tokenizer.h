// Finding the tokenizer a model ships and loading it, for the server (through
// LoadModel) and tandem-tokenize alike:
//   a Hugging Face folder   tokenizer.model (SentencePiece) when present,
//                           else tokenizer.json (BPE), BOS and EOS named by
//                           tokenizer_config.json (else, when loading a
//                           model, config.json's ids), and for
//                           transformers' Llama/Gemma tokenizer classes
//                           its add_bos_token / add_eos_token;
//   a tokenizer.json file   read with the tokenizer_config.json beside it;
//   a tokenizer.model file  SentencePiece;
//   a .gguf file            its tokenizer.ggml vocabulary (gguf_tokenizer.h),
//                           vocabulary-only files included.
// Stateless functions; errors name the file.
#pragma once

#include <filesystem>
#include <memory>

#include "absl/status/statusor.h"
#include "common/chat/model_defaults.h"
#include "common/model/model_config.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

// A folder's tokenizer: nullptr when it has neither tokenizer.model nor
// tokenizer.json. `defaults` are the folder's (LoadModelDefaults); `config`
// may be null (a folder with no config.json).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadFolderTokenizer(const std::filesystem::path& dir,
                                                               const ModelDefaults& defaults,
                                                               const ModelConfig* config);

// The tokenizer at `path` (any of the forms above). NotFound when a folder
// holds no tokenizer or the path does not exist.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizerAt(const std::filesystem::path& path);

}  // namespace tandem
