#include "common/model/gguf_tokenizer.h"

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/sentencepiece_proto.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr char kTokensKey[] = "tokenizer.ggml.tokens";
constexpr char kScoresKey[] = "tokenizer.ggml.scores";
constexpr char kTypesKey[] = "tokenizer.ggml.token_type";
constexpr char kBosKey[] = "tokenizer.ggml.bos_token_id";
constexpr char kEosKey[] = "tokenizer.ggml.eos_token_id";
constexpr char kUnkKey[] = "tokenizer.ggml.unknown_token_id";
constexpr char kPadKey[] = "tokenizer.ggml.padding_token_id";
constexpr char kAddSpacePrefixKey[] = "tokenizer.ggml.add_space_prefix";

// An optional token id key: -1 when absent; InvalidArgument outside [0, n).
absl::StatusOr<int32_t> OptionalId(const GgufMetadata& m, const char* key, size_t n, const std::string& source) {
  if (!m.Contains(key)) return -1;
  TANDEM_ASSIGN_OR_RETURN(const int64_t id, m.GetInteger(key));
  if (id < 0 || static_cast<uint64_t>(id) >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key ", key, " is ", id, ", outside the vocabulary of ", n, " tokens"));
  }
  return static_cast<int32_t>(id);
}

// Token types may be stored as any integer array; the converter writes int32.
absl::StatusOr<std::vector<int32_t>> TokenTypes(const GgufMetadata& m, const std::string& source) {
  const GgufValue* value = m.Find(kTypesKey);
  if (value == nullptr) return absl::NotFoundError(absl::StrCat(source, ": key ", kTypesKey, " not found"));
  const GgufArray* array = value->As<GgufArray>();
  if (array != nullptr) {
    if (const auto* v = array->As<int32_t>()) return *v;
    if (const auto* v = array->As<uint32_t>()) return std::vector<int32_t>(v->begin(), v->end());
    if (const auto* v = array->As<uint8_t>()) return std::vector<int32_t>(v->begin(), v->end());
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": key ", kTypesKey, " is ", value->DebugString(), ", expected an array of int32"));
}

}  // namespace

bool GgufHasTokenizer(const GgufMetadata& metadata) { return metadata.Contains(kGgufTokenizerModelKey); }

absl::StatusOr<std::string> SentencePieceProtoFromGguf(const GgufMetadata& m, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(const std::string model, m.GetString(kGgufTokenizerModelKey));
  if (model != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": key ", kGgufTokenizerModelKey, " is \"", model,
        "\"; tandem tokenizes only \"llama\" (SentencePiece) vocabularies: send token ids instead of text"));
  }
  TANDEM_ASSIGN_OR_RETURN(const GgufArray* tokens_array, m.GetArray(kTokensKey, GgufValueType::kString));
  TANDEM_ASSIGN_OR_RETURN(const GgufArray* scores_array, m.GetArray(kScoresKey, GgufValueType::kFloat32));
  TANDEM_ASSIGN_OR_RETURN(const std::vector<int32_t> types, TokenTypes(m, source));
  const std::vector<std::string>& tokens = *tokens_array->As<std::string>();
  const std::vector<float>& scores = *scores_array->As<float>();
  if (tokens.empty() || scores.size() != tokens.size() || types.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", kTokensKey, ", ", kScoresKey, " and ", kTypesKey,
                                                   " must have one entry per token, have ", tokens.size(), ", ",
                                                   scores.size(), " and ", types.size()));
  }
  SentencePieceBpeSpec spec;
  spec.unk_id = -1;
  size_t keep = tokens.size();  // drop the converter's trailing padding
  while (keep > 1 && types[keep - 1] == static_cast<int32_t>(PieceType::kUnused) &&
         tokens[keep - 1].rfind("[PAD", 0) == 0) {
    --keep;
  }
  for (size_t i = 0; i < keep; ++i) {
    if (types[i] < static_cast<int32_t>(PieceType::kNormal) || types[i] > static_cast<int32_t>(PieceType::kByte)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key ", kTypesKey, ": token ", i, " has type ", types[i], " (types are 1..6)"));
    }
    if (types[i] == static_cast<int32_t>(PieceType::kUnknown) && spec.unk_id < 0) spec.unk_id = static_cast<int32_t>(i);
    if (types[i] == static_cast<int32_t>(PieceType::kByte)) spec.byte_fallback = true;
    spec.pieces.push_back({tokens[i], scores[i], types[i]});
  }
  if (spec.unk_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key ", kTypesKey, " marks no token as unknown (type 2); SentencePiece needs one"));
  }
  TANDEM_ASSIGN_OR_RETURN(spec.bos_id, OptionalId(m, kBosKey, keep, source));
  TANDEM_ASSIGN_OR_RETURN(spec.eos_id, OptionalId(m, kEosKey, keep, source));
  TANDEM_ASSIGN_OR_RETURN(spec.pad_id, OptionalId(m, kPadKey, keep, source));
  TANDEM_ASSIGN_OR_RETURN(const int32_t unk, OptionalId(m, kUnkKey, keep, source));
  if (unk >= 0 && unk != spec.unk_id) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", kUnkKey, " is ", unk, " but token ", spec.unk_id,
                                                   " is the one of unknown type"));
  }
  if (m.Contains(kAddSpacePrefixKey)) {
    TANDEM_ASSIGN_OR_RETURN(spec.add_dummy_prefix, m.GetBool(kAddSpacePrefixKey));
  }
  return SerializeSentencePieceBpe(spec);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufMetadata& metadata, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(const std::string proto, SentencePieceProtoFromGguf(metadata, source));
  return Tokenizer::FromModelProto(proto, absl::StrCat(source, " (tokenizer.ggml vocabulary)"));
}

absl::StatusOr<std::string> ChatTemplateFromGguf(const GgufMetadata& metadata) {
  if (!metadata.Contains(kGgufChatTemplateKey)) return std::string();
  return metadata.GetString(kGgufChatTemplateKey);
}

absl::Status AddSentencePieceVocabToGguf(const std::string& model_proto, const ModelConfig& config,
                                         const std::string& source, GgufMetadata* m) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<SentencePieceEntry> pieces, ParseSentencePiecePieces(model_proto, source));
  const size_t vocab = std::max(static_cast<size_t>(config.vocab_size), pieces.size());
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  int32_t unk = -1;
  for (size_t i = 0; i < vocab; ++i) {
    if (i < pieces.size()) {
      tokens.push_back(pieces[i].piece);
      scores.push_back(pieces[i].score);
      types.push_back(pieces[i].type);
      if (unk < 0 && pieces[i].type == static_cast<int32_t>(PieceType::kUnknown)) unk = static_cast<int32_t>(i);
    } else {  // the converter's padding up to the embedding's rows
      tokens.push_back(absl::StrCat("[PAD", i, "]"));
      scores.push_back(-10000.0f);
      types.push_back(static_cast<int32_t>(PieceType::kUnused));
    }
  }
  m->Set(kGgufTokenizerModelKey, "llama");
  m->Set("tokenizer.ggml.pre", "default");
  m->Set(kTokensKey, GgufArray(std::move(tokens)));
  m->Set(kScoresKey, GgufArray(std::move(scores)));
  m->Set(kTypesKey, GgufArray(std::move(types)));
  m->Set(kBosKey, static_cast<uint32_t>(config.bos_token_id));
  if (!config.eos_token_ids.empty()) m->Set(kEosKey, static_cast<uint32_t>(config.eos_token_ids.front()));
  if (unk >= 0) m->Set(kUnkKey, static_cast<uint32_t>(unk));
  return absl::OkStatus();
}

namespace {

// tokenizer_config.json, or null when the folder has none.
absl::StatusOr<json> ReadTokenizerConfig(const fs::path& dir) {
  const fs::path path = dir / "tokenizer_config.json";
  std::error_code ec;
  if (!fs::exists(path, ec)) return json();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot read"));
  try {
    json j = json::parse(text.str());
    if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a JSON object"));
    return j;
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", e.what()));
  }
}

// The templates a tokenizer_config.json or chat_template.jinja holds, as
// (key, template) pairs in GGUF's naming.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ChatTemplates(const fs::path& dir) {
  TANDEM_ASSIGN_OR_RETURN(const json config, ReadTokenizerConfig(dir));
  std::vector<std::pair<std::string, std::string>> out;
  if (config.is_object() && config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      out.emplace_back(kGgufChatTemplateKey, t.get<std::string>());
    } else if (t.is_array()) {
      for (const json& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat((dir / "tokenizer_config.json").string(),
                                                         ": chat_template entries need a name and a template"));
        }
        const std::string name = entry["name"].get<std::string>();
        out.emplace_back(
            name == "default" ? std::string(kGgufChatTemplateKey) : absl::StrCat(kGgufChatTemplateKey, ".", name),
            entry["template"].get<std::string>());
      }
    }
    return out;
  }
  std::error_code ec;
  if (fs::exists(dir / "chat_template.jinja", ec)) {
    std::ifstream in(dir / "chat_template.jinja");
    std::stringstream text;
    text << in.rdbuf();
    out.emplace_back(kGgufChatTemplateKey, text.str());
  }
  return out;
}

}  // namespace

absl::Status AddHfTokenizerConfigToGguf(const fs::path& dir, GgufMetadata* m) {
  TANDEM_ASSIGN_OR_RETURN(const json config, ReadTokenizerConfig(dir));
  if (config.is_object()) {
    for (const char* key : {"add_bos_token", "add_eos_token"}) {
      if (config.contains(key) && config[key].is_boolean()) {
        m->Set(absl::StrCat("tokenizer.ggml.", key), config[key].get<bool>());
      }
    }
  }
  TANDEM_ASSIGN_OR_RETURN(auto templates, ChatTemplates(dir));
  for (auto& [key, text] : templates) m->Set(key, std::move(text));
  return absl::OkStatus();
}

absl::StatusOr<std::string> HfChatTemplate(const fs::path& dir) {
  TANDEM_ASSIGN_OR_RETURN(auto templates, ChatTemplates(dir));
  for (auto& [key, text] : templates) {
    if (key == kGgufChatTemplateKey) return std::move(text);
  }
  return std::string();
}

}  // namespace tandem
