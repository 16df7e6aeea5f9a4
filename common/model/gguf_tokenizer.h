// The tokenizer a GGUF file carries (tokenizer.ggml.*), both ways:
//
//   tokenizer.ggml.model        "llama": a SentencePiece BPE vocabulary —
//                               tokens, scores and token_type per id, plus
//                               bos/eos/unk/padding ids and add_space_prefix.
//                               Read by building a SentencePiece model proto
//                               in memory from those arrays (SentencePiece's
//                               encoder then tokenizes exactly as the
//                               original tokenizer.model, which llama.cpp's
//                               converter read them from).
//                               "gpt2": a byte-level BPE vocabulary — tokens,
//                               merges and token_type per id, special ids,
//                               add_bos/add_eos, and tokenizer.ggml.pre
//                               naming the original tokenizer.json's
//                               pre-tokenizer (common/tokenizer/
//                               gguf_pre_tokenizers.h; an unknown name is
//                               refused naming it). Read by writing the
//                               tokenizer.json it came from (control tokens
//                               as special added tokens, user-defined ones
//                               as added tokens, the converter's "[PAD<id>]"
//                               fillers left out) and reading that.
//                               Others: refused by name.
//   tokenizer.chat_template     carried as a string (the template engine is
//                               elsewhere).
//
// Writing follows the converter's _set_vocab_sentencepiece: every piece of
// tokenizer.model, padded with "[PAD<id>]" unused pieces up to the model's
// vocab_size, special ids from config.json, add_bos/add_eos and the chat
// templates the folder has (AddHfTokenizerConfigToGguf).
//
// Errors name the file (`source`) and the key. Stateless functions.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gguf/gguf_metadata.h"
#include "common/model/model_config.h"
#include "common/model/sentencepiece_tokenizer.h"
#include "common/tokenizer/json_fields.h"
#include "common/tokenizer/tokenizer.h"

namespace tandem {

inline constexpr char kGgufTokenizerModelKey[] = "tokenizer.ggml.model";
inline constexpr char kGgufChatTemplateKey[] = "tokenizer.chat_template";

// Whether the metadata has a tokenizer at all (tokenizer.ggml.model).
bool GgufHasTokenizer(const GgufMetadata& metadata);
// tokenizer.ggml.token_type, one PieceType per token (sentencepiece_proto.h).
// NotFound when absent; InvalidArgument naming `source` and the key when it
// is not an integer array.
absl::StatusOr<std::vector<int32_t>> GgufTokenTypes(const GgufMetadata& metadata, const std::string& source);
// Whether token `id` is one of the converter's fillers up to the model's
// vocab_size: unused, or (older converters) user-defined "[PAD<id>]".
bool IsGgufPaddingToken(const std::string& token, int32_t type, size_t id);

// The serialized SentencePiece model proto for a "llama" vocabulary.
// InvalidArgument naming `source` and the key for another tokenizer model,
// arrays of different lengths or wrong types, no unknown piece, or special
// ids outside the vocabulary. Trailing unused "[PAD..]" pieces (the
// converter's padding to the model's vocab_size) are left out, so the
// tokenizer has the pieces the original tokenizer.model had.
absl::StatusOr<std::string> SentencePieceProtoFromGguf(const GgufMetadata& metadata, const std::string& source);
// The tokenizer.json document a "gpt2" vocabulary stands for. InvalidArgument
// naming `source` and the key for another tokenizer model, an unknown
// tokenizer.ggml.pre, arrays of different lengths or wrong types, a token
// that is empty, not UTF-8 or listed twice, a merge that is not two tokens,
// special ids outside the vocabulary.
absl::StatusOr<Json> TokenizerJsonFromGguf(const GgufMetadata& metadata, const std::string& source);
// The tokenizer the metadata carries: SentencePieceTokenizer for "llama",
// BpeTokenizer (through TokenizerJsonFromGguf) for "gpt2".
absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufMetadata& metadata, const std::string& source);
// tokenizer.chat_template, or "" when absent (InvalidArgument if not a string).
absl::StatusOr<std::string> ChatTemplateFromGguf(const GgufMetadata& metadata);

// tokenizer.ggml.* for the SentencePiece model `model_proto` (the bytes of a
// tokenizer.model) of a model with `config`. `source` names the file.
absl::Status AddSentencePieceVocabToGguf(const std::string& model_proto, const ModelConfig& config,
                                         const std::string& source, GgufMetadata* metadata);
// The folder's tokenizer.ggml.add_bos_token, add_eos_token and
// tokenizer.chat_template (the "default" template, the others as
// tokenizer.chat_template.<name>), found as transformers finds them:
// chat_template.jinja, then chat_template.json, then tokenizer_config.json
// (LoadModelDefaults). InvalidArgument naming the file when one is
// malformed.
absl::Status AddHfTokenizerConfigToGguf(const std::filesystem::path& model_dir, GgufMetadata* metadata);

}  // namespace tandem
