#include "common/model/gguf_tokenizer.h"


#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/chat/model_defaults.h"
#include "common/base/status_macros.h"
#include "common/model/sentencepiece_proto.h"
#include "common/tokenizer/gguf_pre_tokenizers.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

constexpr char kTokensKey[] = "tokenizer.ggml.tokens";
constexpr char kScoresKey[] = "tokenizer.ggml.scores";
constexpr char kTypesKey[] = "tokenizer.ggml.token_type";
constexpr char kBosKey[] = "tokenizer.ggml.bos_token_id";
constexpr char kEosKey[] = "tokenizer.ggml.eos_token_id";
constexpr char kUnkKey[] = "tokenizer.ggml.unknown_token_id";
constexpr char kPadKey[] = "tokenizer.ggml.padding_token_id";
constexpr char kAddSpacePrefixKey[] = "tokenizer.ggml.add_space_prefix";
constexpr char kMergesKey[] = "tokenizer.ggml.merges";
constexpr char kPreKey[] = "tokenizer.ggml.pre";
constexpr char kAddBosKey[] = "tokenizer.ggml.add_bos_token";
constexpr char kAddEosKey[] = "tokenizer.ggml.add_eos_token";

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

}  // namespace

// The converter writes int32; other integer arrays are read too.
absl::StatusOr<std::vector<int32_t>> GgufTokenTypes(const GgufMetadata& m, const std::string& source) {
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

bool IsGgufPaddingToken(const std::string& token, int32_t type, size_t id) {
  return type == static_cast<int32_t>(PieceType::kUnused) ||
         (type == static_cast<int32_t>(PieceType::kUserDefined) && token == absl::StrCat("[PAD", id, "]"));
}

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
  TANDEM_ASSIGN_OR_RETURN(const std::vector<int32_t> types, GgufTokenTypes(m, source));
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
  while (keep > 1 &&
         ((types[keep - 1] == static_cast<int32_t>(PieceType::kUnused) && tokens[keep - 1].rfind("[PAD", 0) == 0) ||
          IsGgufPaddingToken(tokens[keep - 1], static_cast<int32_t>(PieceType::kUserDefined), keep - 1))) {
    --keep;
  }
  // Older converters typed <unk> as a control token (and the padding as
  // unknown): the unknown_token_id key then says which token it is.
  TANDEM_ASSIGN_OR_RETURN(const int32_t unk, OptionalId(m, kUnkKey, keep, source));
  for (size_t i = 0; i < keep; ++i) {
    if (types[i] < static_cast<int32_t>(PieceType::kNormal) || types[i] > static_cast<int32_t>(PieceType::kByte)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key ", kTypesKey, ": token ", i, " has type ", types[i], " (types are 1..6)"));
    }
    if (types[i] == static_cast<int32_t>(PieceType::kUnknown) && spec.unk_id < 0) spec.unk_id = static_cast<int32_t>(i);
    if (types[i] == static_cast<int32_t>(PieceType::kByte)) spec.byte_fallback = true;
    spec.pieces.push_back({tokens[i], scores[i], types[i]});
  }
  if (unk >= 0 && spec.unk_id < 0) {
    spec.unk_id = unk;
    spec.pieces[unk].type = static_cast<int32_t>(PieceType::kUnknown);
  }
  if (spec.unk_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key ", kTypesKey, " marks no token as unknown (type 2); SentencePiece needs one"));
  }
  TANDEM_ASSIGN_OR_RETURN(spec.bos_id, OptionalId(m, kBosKey, keep, source));
  TANDEM_ASSIGN_OR_RETURN(spec.eos_id, OptionalId(m, kEosKey, keep, source));
  TANDEM_ASSIGN_OR_RETURN(spec.pad_id, OptionalId(m, kPadKey, keep, source));
  if (unk >= 0 && unk != spec.unk_id) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", kUnkKey, " is ", unk, " but token ", spec.unk_id,
                                                   " is the one of unknown type"));
  }
  if (m.Contains(kAddSpacePrefixKey)) {
    TANDEM_ASSIGN_OR_RETURN(spec.add_dummy_prefix, m.GetBool(kAddSpacePrefixKey));
  }
  return SerializeSentencePieceBpe(spec);
}

namespace {

// Merges as ["a", "b"] pairs: each entry split at its first space after the
// first byte (llama.cpp's rule).
absl::StatusOr<Json> MergesFromGguf(const GgufMetadata& m, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(const GgufArray* array, m.GetArray(kMergesKey, GgufValueType::kString));
  const std::vector<std::string>& merges = *array->As<std::string>();
  Json pairs = Json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    const size_t space = merges[i].empty() ? std::string::npos : merges[i].find(' ', 1);
    if (space == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": key ", kMergesKey, "[", i, "] is \"", merges[i],
                                                     "\", not two tokens split by a space"));
    }
    pairs.push_back(Json::array({merges[i].substr(0, space), merges[i].substr(space + 1)}));
  }
  return pairs;
}

// tokenizer.json's post_processor for add_bos_token / add_eos_token.
absl::StatusOr<Json> BosEosTemplate(const GgufMetadata& m, const GgufPreTokenizer& pre, int32_t bos, int32_t eos,
                                    const std::vector<std::string>& tokens, const std::string& source) {
  bool add_bos = pre.add_bos && bos >= 0, add_eos = false;
  if (m.Contains(kAddBosKey)) {
    TANDEM_ASSIGN_OR_RETURN(add_bos, m.GetBool(kAddBosKey));
  }
  if (m.Contains(kAddEosKey)) {
    TANDEM_ASSIGN_OR_RETURN(add_eos, m.GetBool(kAddEosKey));
  }
  if ((add_bos && bos < 0) || (add_eos && eos < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", add_bos && bos < 0 ? kAddBosKey : kAddEosKey,
                                                   " is true but the file names no ",
                                                   add_bos && bos < 0 ? "BOS" : "EOS", " token id"));
  }
  Json single = Json::array(), special_tokens = Json::object();
  auto add_special = [&](int32_t id) {
    single.push_back({{"SpecialToken", {{"id", tokens[id]}, {"type_id", 0}}}});
    special_tokens[tokens[id]] = {{"id", tokens[id]}, {"ids", {id}}, {"tokens", {tokens[id]}}};
  };
  if (add_bos) add_special(bos);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  if (add_eos) add_special(eos);
  return Json{
      {"type", "TemplateProcessing"}, {"single", single}, {"pair", Json::array()}, {"special_tokens", special_tokens}};
}

}  // namespace

absl::StatusOr<Json> TokenizerJsonFromGguf(const GgufMetadata& m, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(const std::string model, m.GetString(kGgufTokenizerModelKey));
  if (model != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", kGgufTokenizerModelKey, " is \"", model,
                                                   "\", not a \"gpt2\" (byte-level BPE) vocabulary"));
  }
  std::string pre_name;
  if (m.Contains(kPreKey)) {
    TANDEM_ASSIGN_OR_RETURN(pre_name, m.GetString(kPreKey));
  }
  absl::StatusOr<GgufPreTokenizer> pre = GgufPreTokenizerNamed(pre_name);
  if (!pre.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", kPreKey, ": ", pre.status().message(),
                                                   "; tandem cannot tokenize this vocabulary as its model was trained, "
                                                   "send token ids instead of text"));
  }
  TANDEM_ASSIGN_OR_RETURN(const GgufArray* tokens_array, m.GetArray(kTokensKey, GgufValueType::kString));
  const std::vector<std::string>& tokens = *tokens_array->As<std::string>();
  std::vector<int32_t> types(tokens.size(), static_cast<int32_t>(PieceType::kNormal));
  if (m.Contains(kTypesKey)) {
    TANDEM_ASSIGN_OR_RETURN(types, GgufTokenTypes(m, source));
  }
  if (tokens.empty() || types.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", kTokensKey, " and ", kTypesKey,
                                                   " must have one entry per token, have ", tokens.size(), " and ",
                                                   types.size()));
  }
  if (tokens.size() > static_cast<size_t>(kMaxTokenId)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", kTokensKey, " holds ", tokens.size(),
                                                   " tokens, more than tandem reads (", kMaxTokenId, ")"));
  }
  Json vocab = Json::object(), added = Json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string where = absl::StrCat(source, ": key ", kTokensKey, "[", i, "]");
    if (types[i] < static_cast<int32_t>(PieceType::kNormal) || types[i] > static_cast<int32_t>(PieceType::kByte)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": key ", kTypesKey, "[", i, "] is ", types[i], " (types are 1..6)"));
    }
    if (IsGgufPaddingToken(tokens[i], types[i], i)) continue;
    if (tokens[i].empty()) return absl::InvalidArgumentError(absl::StrCat(where, " is empty"));
    TANDEM_RETURN_IF_ERROR(CheckUtf8(tokens[i], where));
    if (auto [it, inserted] = vocab.emplace(tokens[i], i); !inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": \"", tokens[i], "\" is also token ", it->dump()));
    }
    const bool control = types[i] == static_cast<int32_t>(PieceType::kControl);
    if (control || types[i] == static_cast<int32_t>(PieceType::kUserDefined)) {
      added.push_back({{"id", i},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", control}});
    }
  }
  TANDEM_ASSIGN_OR_RETURN(Json merges, MergesFromGguf(m, source));
  TANDEM_ASSIGN_OR_RETURN(const int32_t bos, OptionalId(m, kBosKey, tokens.size(), source));
  TANDEM_ASSIGN_OR_RETURN(const int32_t eos, OptionalId(m, kEosKey, tokens.size(), source));
  TANDEM_ASSIGN_OR_RETURN(Json post_processor, BosEosTemplate(m, *pre, bos, eos, tokens, source));
  Json document = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", std::move(added)},
      {"normalizer", pre->normalizer},
      {"pre_tokenizer", pre->pre_tokenizer},
      {"post_processor", std::move(post_processor)},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}}};
  document["model"] = {{"type", "BPE"},
                       {"dropout", nullptr},
                       {"unk_token", nullptr},
                       {"continuing_subword_prefix", nullptr},
                       {"end_of_word_suffix", nullptr},
                       {"fuse_unk", false},
                       {"byte_fallback", false},
                       {"ignore_merges", pre->ignore_merges},
                       {"vocab", std::move(vocab)},
                       {"merges", std::move(merges)}};
  return document;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> TokenizerFromGguf(const GgufMetadata& metadata, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(const std::string model, metadata.GetString(kGgufTokenizerModelKey));
  const std::string name = absl::StrCat(source, " (tokenizer.ggml vocabulary)");
  if (model == "gpt2") {
    TANDEM_ASSIGN_OR_RETURN(const Json document, TokenizerJsonFromGguf(metadata, source));
    TokenizerJsonOptions options{.source = name};
    TANDEM_ASSIGN_OR_RETURN(const GgufArray* tokens, metadata.GetArray(kTokensKey, GgufValueType::kString));
    TANDEM_ASSIGN_OR_RETURN(options.bos_id, OptionalId(metadata, kBosKey, tokens->size(), source));
    TANDEM_ASSIGN_OR_RETURN(options.eos_id, OptionalId(metadata, kEosKey, tokens->size(), source));
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<BpeTokenizer> tokenizer, TokenizerFromJson(document, options));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  if (model != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", kGgufTokenizerModelKey, " is \"", model,
                                                   "\"; tandem tokenizes \"llama\" (SentencePiece) and \"gpt2\" "
                                                   "(byte-level BPE) vocabularies: send token ids instead of text"));
  }
  TANDEM_ASSIGN_OR_RETURN(const std::string proto, SentencePieceProtoFromGguf(metadata, source));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SentencePieceTokenizer> tokenizer,
                          SentencePieceTokenizer::FromModelProto(proto, name));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
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

// The folder's templates as transformers finds them (chat_template.jinja,
// then chat_template.json, then tokenizer_config.json: LoadModelDefaults),
// as (key, template) pairs in GGUF's naming.
std::vector<std::pair<std::string, std::string>> GgufChatTemplates(const TokenizerDefaults& tokenizer) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, text] : tokenizer.named_chat_templates) {
    out.emplace_back(name == "default" ? std::string(kGgufChatTemplateKey) : absl::StrCat(kGgufChatTemplateKey, ".", name),
                     text);
  }
  return out;
}

}  // namespace

absl::Status AddHfTokenizerConfigToGguf(const fs::path& dir, GgufMetadata* m) {
  TANDEM_ASSIGN_OR_RETURN(const ModelDefaults defaults, LoadModelDefaults(dir));
  if (defaults.tokenizer.add_bos_token) m->Set("tokenizer.ggml.add_bos_token", *defaults.tokenizer.add_bos_token);
  if (defaults.tokenizer.add_eos_token) m->Set("tokenizer.ggml.add_eos_token", *defaults.tokenizer.add_eos_token);
  for (auto& [key, text] : GgufChatTemplates(defaults.tokenizer)) m->Set(key, std::move(text));
  return absl::OkStatus();
}

}  // namespace tandem
