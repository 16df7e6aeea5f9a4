#include "common/model/gguf_chat_defaults.h"

#include <optional>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/sentencepiece_proto.h"

namespace tandem {
namespace {

constexpr char kTokensKey[] = "tokenizer.ggml.tokens";

// The templates: tokenizer.chat_template as "default", each
// tokenizer.chat_template.<name> under its name.
absl::Status ReadTemplates(const GgufMetadata& m, const std::string& source, TokenizerDefaults* out) {
  const std::string prefix = absl::StrCat(kGgufChatTemplateKey, ".");
  for (const auto& [key, value] : m.entries()) {
    const bool is_default = key == kGgufChatTemplateKey;
    if (!is_default && !(absl::StartsWith(key, prefix) && key.size() > prefix.size())) continue;
    const std::string* text = value.As<std::string>();
    if (text == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key ", key, " is ", value.DebugString(), ", expected a string"));
    }
    const std::string name = is_default ? "default" : key.substr(prefix.size());
    out->named_chat_templates[name] = *text;
    if (is_default) out->chat_template = *text;
  }
  if (!out->named_chat_templates.empty()) out->chat_template_source = source;
  return absl::OkStatus();
}

// The text of the token `key` names, or nullopt when the key is absent.
absl::StatusOr<std::optional<std::string>> SpecialText(const GgufMetadata& m, const char* key,
                                                       const std::vector<std::string>& tokens,
                                                       const std::string& source) {
  if (!m.Contains(key)) return std::optional<std::string>();
  TANDEM_ASSIGN_OR_RETURN(const int64_t id, m.GetInteger(key));
  if (id < 0 || static_cast<uint64_t>(id) >= tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key ", key, " is ", id, ", outside the vocabulary of ", tokens.size(), " tokens"));
  }
  return std::optional<std::string>(tokens[static_cast<size_t>(id)]);
}

// Control, user-defined and unknown tokens: what llama.cpp matches in text
// when it parses special tokens, and what a folder's added_tokens_decoder
// lists (the converter wrote the one from the other).
absl::Status ReadAddedTokens(const GgufMetadata& m, const std::vector<std::string>& tokens, const std::string& source,
                             TokenizerDefaults* out) {
  absl::StatusOr<std::vector<int32_t>> types = GgufTokenTypes(m, source);
  if (absl::IsNotFound(types.status())) return absl::OkStatus();  // "gpt2" vocabularies may leave them out
  if (!types.ok()) return types.status();
  if (types->size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", kTokensKey, " and tokenizer.ggml.token_type must have ",
                                                   "one entry per token, have ", tokens.size(), " and ",
                                                   types->size()));
  }
  absl::flat_hash_set<std::string_view> seen;  // one id per content, the first (as a vocabulary maps text)
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t type = (*types)[i];
    const bool control = type == static_cast<int32_t>(PieceType::kControl);
    const bool unknown = type == static_cast<int32_t>(PieceType::kUnknown);
    if (!control && !unknown && type != static_cast<int32_t>(PieceType::kUserDefined)) continue;
    if (tokens[i].empty() || IsGgufPaddingToken(tokens[i], type, i) || !seen.insert(tokens[i]).second) continue;
    out->added_tokens.push_back({.id = static_cast<int32_t>(i), .content = tokens[i], .special = control || unknown});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelDefaults> ModelDefaultsFromGguf(const GgufMetadata& m, const std::string& source) {
  ModelDefaults defaults;
  TokenizerDefaults& t = defaults.tokenizer;
  TANDEM_RETURN_IF_ERROR(ReadTemplates(m, source, &t));
  for (const char* key : {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"}) {
    if (!m.Contains(key)) continue;
    TANDEM_ASSIGN_OR_RETURN(const bool value, m.GetBool(key));
    (absl::EndsWith(key, "bos_token") ? t.add_bos_token : t.add_eos_token) = value;
  }
  if (!m.Contains(kTokensKey)) return defaults;
  TANDEM_ASSIGN_OR_RETURN(const GgufArray* array, m.GetArray(kTokensKey, GgufValueType::kString));
  const std::vector<std::string>& tokens = *array->As<std::string>();
  TANDEM_ASSIGN_OR_RETURN(t.bos_token, SpecialText(m, "tokenizer.ggml.bos_token_id", tokens, source));
  TANDEM_ASSIGN_OR_RETURN(t.eos_token, SpecialText(m, "tokenizer.ggml.eos_token_id", tokens, source));
  TANDEM_ASSIGN_OR_RETURN(t.unk_token, SpecialText(m, "tokenizer.ggml.unknown_token_id", tokens, source));
  TANDEM_ASSIGN_OR_RETURN(t.pad_token, SpecialText(m, "tokenizer.ggml.padding_token_id", tokens, source));
  TANDEM_RETURN_IF_ERROR(ReadAddedTokens(m, tokens, source, &t));
  return defaults;
}

}  // namespace tandem
