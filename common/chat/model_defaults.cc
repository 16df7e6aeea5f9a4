#include "common/chat/model_defaults.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

using nlohmann::json;

// tokenizer.json of a large vocabulary is tens of MB; nothing here is larger.
constexpr std::uintmax_t kMaxFileBytes = std::uintmax_t{512} << 20;

absl::Status FieldError(const std::string& source, std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", absl::string_view(field.data(), field.size()),
                                                 "\" ", absl::string_view(what.data(), what.size())));
}

absl::StatusOr<json> ParseObject(std::string_view text, const std::string& source) {
  json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON"));
  if (!root.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": expected a JSON object"));
  return root;
}

const json* Find(const json& object, const std::string& field) {
  auto it = object.find(field);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

absl::StatusOr<std::optional<int32_t>> OptionalId(const json& object, const std::string& field,
                                                  const std::string& source) {
  const json* v = Find(object, field);
  if (v == nullptr) return std::optional<int32_t>();
  if (!v->is_number_integer() || v->get<int64_t>() < std::numeric_limits<int32_t>::min() ||
      v->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
    return FieldError(source, field, absl::StrCat("must be a 32-bit integer, got ", v->dump()));
  }
  return std::optional<int32_t>(v->get<int32_t>());
}

absl::StatusOr<std::optional<double>> OptionalNumber(const json& object, const std::string& field,
                                                     const std::string& source) {
  const json* v = Find(object, field);
  if (v == nullptr) return std::optional<double>();
  if (!v->is_number()) return FieldError(source, field, absl::StrCat("must be a number, got ", v->dump()));
  return std::optional<double>(v->get<double>());
}

absl::StatusOr<std::optional<bool>> OptionalBool(const json& object, const std::string& field,
                                                 const std::string& source) {
  const json* v = Find(object, field);
  if (v == nullptr) return std::optional<bool>();
  if (!v->is_boolean()) return FieldError(source, field, absl::StrCat("must be true or false, got ", v->dump()));
  return std::optional<bool>(v->get<bool>());
}

// "<s>", or an AddedToken object {"content": "<s>", ...} (older configs).
absl::StatusOr<std::optional<std::string>> TokenText(const json* v, const std::string& field,
                                                     const std::string& source) {
  if (v == nullptr || v->is_null()) return std::optional<std::string>();
  if (v->is_string()) return std::optional<std::string>(v->get<std::string>());
  if (v->is_object()) {
    const json* content = Find(*v, "content");
    if (content != nullptr && content->is_string()) return std::optional<std::string>(content->get<std::string>());
  }
  return FieldError(
      source, field,
      absl::StrCat("must be a string or an AddedToken object with a \"content\" string, got ", v->dump()));
}

// One added token object, `field` naming it in errors.
absl::StatusOr<AddedToken> ParseAddedToken(const json& v, int32_t id, const std::string& field,
                                           const std::string& source) {
  if (!v.is_object()) return FieldError(source, field, absl::StrCat("must be an object, got ", v.dump()));
  AddedToken token{.id = id};
  const json* content = Find(v, "content");
  if (content == nullptr || !content->is_string() || content->get<std::string>().empty()) {
    return FieldError(source, field, "needs a non-empty \"content\" string");
  }
  token.content = content->get<std::string>();
  struct Flag {
    const char* name;
    bool* out;
  };
  for (const Flag& flag :
       {Flag{"special", &token.special}, Flag{"lstrip", &token.lstrip}, Flag{"rstrip", &token.rstrip},
        Flag{"normalized", &token.normalized}, Flag{"single_word", &token.single_word}}) {
    const json* b = Find(v, flag.name);
    if (b == nullptr) continue;
    if (!b->is_boolean()) return FieldError(source, absl::StrCat(field, ".", flag.name), "must be true or false");
    *flag.out = b->get<bool>();
  }
  return token;
}

absl::Status ParseAddedTokensDecoder(const json& decoder, const std::string& source, std::vector<AddedToken>* out) {
  if (!decoder.is_object()) return FieldError(source, "added_tokens_decoder", "must be an object of id -> token");
  for (auto it = decoder.begin(); it != decoder.end(); ++it) {
    const std::string field = absl::StrCat("added_tokens_decoder.", it.key());
    int32_t id;
    if (!absl::SimpleAtoi(it.key(), &id) || id < 0) return FieldError(source, field, "has a key that is no token id");
    TANDEM_ASSIGN_OR_RETURN(AddedToken token, ParseAddedToken(it.value(), id, field, source));
    out->push_back(std::move(token));
  }
  std::sort(out->begin(), out->end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  return absl::OkStatus();
}

// chat_template: a string, or a list of {"name", "template"} where the one
// named "default" is the template.
absl::Status ParseChatTemplate(const json* v, const std::string& source, TokenizerDefaults* out) {
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    out->chat_template = v->get<std::string>();
    out->named_chat_templates["default"] = *out->chat_template;
    out->chat_template_source = source;
    return absl::OkStatus();
  }
  if (!v->is_array()) {
    return FieldError(source, "chat_template", "must be a string or a list of {\"name\", \"template\"}");
  }
  std::map<std::string, std::string> named;
  for (size_t i = 0; i < v->size(); ++i) {
    const json& entry = (*v)[i];
    const json* name = entry.is_object() ? Find(entry, "name") : nullptr;
    const json* text = entry.is_object() ? Find(entry, "template") : nullptr;
    if (name == nullptr || !name->is_string() || text == nullptr || !text->is_string()) {
      return FieldError(source, absl::StrCat("chat_template[", i, "]"),
                        "must be {\"name\": string, \"template\": string}");
    }
    named[name->get<std::string>()] = text->get<std::string>();
  }
  out->named_chat_templates = std::move(named);
  auto it = out->named_chat_templates.find("default");
  if (it != out->named_chat_templates.end()) out->chat_template = it->second;
  out->chat_template_source = source;
  return absl::OkStatus();
}

// The special-token fields shared by tokenizer_config.json and
// special_tokens_map.json; with `only_unset`, fields already set stay.
absl::Status ParseSpecialTokenFields(const json& root, const std::string& source, bool only_unset,
                                     TokenizerDefaults* out) {
  struct Role {
    const char* field;
    std::optional<std::string>* value;
  };
  for (const Role& role : {Role{"bos_token", &out->bos_token}, Role{"eos_token", &out->eos_token},
                           Role{"unk_token", &out->unk_token}, Role{"pad_token", &out->pad_token}}) {
    if (only_unset && role.value->has_value()) continue;
    TANDEM_ASSIGN_OR_RETURN(*role.value, TokenText(Find(root, role.field), role.field, source));
  }
  if (const json* extra = Find(root, "additional_special_tokens");
      extra != nullptr && !(only_unset && !out->additional_special_tokens.empty())) {
    if (!extra->is_array()) return FieldError(source, "additional_special_tokens", "must be a list");
    out->additional_special_tokens.clear();
    for (size_t i = 0; i < extra->size(); ++i) {
      const std::string field = absl::StrCat("additional_special_tokens[", i, "]");
      TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> text, TokenText(&(*extra)[i], field, source));
      if (!text) return FieldError(source, field, "must not be null");
      out->additional_special_tokens.push_back(std::move(*text));
    }
  }
  return absl::OkStatus();
}

bool FileExists(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec);
}

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path.string(), ": ", ec.message()));
  if (size > kMaxFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": ", size, " bytes is more than the ", kMaxFileBytes,
                                                   " a model folder's config files may have"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path.string(), ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// tokenizer.json's "added_tokens": [{"id", "content", "special", ...}].
absl::StatusOr<std::vector<AddedToken>> ParseTokenizerJsonAddedTokens(std::string_view text,
                                                                      const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(json root, ParseObject(text, source));
  std::vector<AddedToken> tokens;
  const json* list = Find(root, "added_tokens");
  if (list == nullptr) return tokens;
  if (!list->is_array()) return FieldError(source, "added_tokens", "must be a list");
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string field = absl::StrCat("added_tokens[", i, "]");
    const json& entry = (*list)[i];
    if (!entry.is_object()) return FieldError(source, field, "must be an object");
    TANDEM_ASSIGN_OR_RETURN(std::optional<int32_t> id, OptionalId(entry, "id", source));
    if (!id || *id < 0) return FieldError(source, field + ".id", "must be a token id");
    TANDEM_ASSIGN_OR_RETURN(AddedToken token, ParseAddedToken(entry, *id, field, source));
    tokens.push_back(std::move(token));
  }
  std::sort(tokens.begin(), tokens.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });
  return tokens;
}

}  // namespace

std::optional<int32_t> TokenizerDefaults::IdOf(std::string_view content) const {
  for (const AddedToken& token : added_tokens) {
    if (token.content == content) return token.id;
  }
  return std::nullopt;
}

absl::StatusOr<GenerationDefaults> ParseGenerationConfig(std::string_view json_text, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(json root, ParseObject(json_text, source));
  GenerationDefaults out;
  if (const json* eos = Find(root, "eos_token_id")) {
    const json list = eos->is_array() ? *eos : json::array({*eos});
    for (const json& id : list) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
        return FieldError(source, "eos_token_id",
                          absl::StrCat("must be a token id or a list of token ids, got ", eos->dump()));
      }
      out.eos_token_ids.push_back(id.get<int32_t>());
    }
  }
  TANDEM_ASSIGN_OR_RETURN(out.bos_token_id, OptionalId(root, "bos_token_id", source));
  TANDEM_ASSIGN_OR_RETURN(out.pad_token_id, OptionalId(root, "pad_token_id", source));
  TANDEM_ASSIGN_OR_RETURN(out.do_sample, OptionalBool(root, "do_sample", source));
  TANDEM_ASSIGN_OR_RETURN(out.temperature, OptionalNumber(root, "temperature", source));
  TANDEM_ASSIGN_OR_RETURN(out.top_p, OptionalNumber(root, "top_p", source));
  TANDEM_ASSIGN_OR_RETURN(out.top_k, OptionalId(root, "top_k", source));
  TANDEM_ASSIGN_OR_RETURN(out.min_p, OptionalNumber(root, "min_p", source));
  TANDEM_ASSIGN_OR_RETURN(out.repetition_penalty, OptionalNumber(root, "repetition_penalty", source));
  TANDEM_ASSIGN_OR_RETURN(out.max_new_tokens, OptionalId(root, "max_new_tokens", source));
  TANDEM_ASSIGN_OR_RETURN(out.max_length, OptionalId(root, "max_length", source));
  if (out.temperature && *out.temperature < 0) return FieldError(source, "temperature", "must be >= 0");
  if (out.top_p && (*out.top_p <= 0 || *out.top_p > 1)) return FieldError(source, "top_p", "must be in (0, 1]");
  if (out.top_k && *out.top_k < 0) return FieldError(source, "top_k", "must be >= 0");
  if (out.min_p && (*out.min_p < 0 || *out.min_p > 1)) return FieldError(source, "min_p", "must be in [0, 1]");
  if (out.repetition_penalty && *out.repetition_penalty <= 0)
    return FieldError(source, "repetition_penalty", "must be > 0");
  if (out.max_new_tokens && *out.max_new_tokens < 0) return FieldError(source, "max_new_tokens", "must be >= 0");
  if (out.max_length && *out.max_length < 0) return FieldError(source, "max_length", "must be >= 0");
  return out;
}

absl::StatusOr<TokenizerDefaults> ParseTokenizerConfig(std::string_view json_text, const std::string& source) {
  TANDEM_ASSIGN_OR_RETURN(json root, ParseObject(json_text, source));
  TokenizerDefaults out;
  TANDEM_RETURN_IF_ERROR(ParseChatTemplate(Find(root, "chat_template"), source, &out));
  TANDEM_RETURN_IF_ERROR(ParseSpecialTokenFields(root, source, /*only_unset=*/false, &out));
  if (const json* decoder = Find(root, "added_tokens_decoder")) {
    TANDEM_RETURN_IF_ERROR(ParseAddedTokensDecoder(*decoder, source, &out.added_tokens));
  }
  TANDEM_ASSIGN_OR_RETURN(out.add_bos_token, OptionalBool(root, "add_bos_token", source));
  TANDEM_ASSIGN_OR_RETURN(out.add_eos_token, OptionalBool(root, "add_eos_token", source));
  if (const json* v = Find(root, "tokenizer_class")) {
    if (!v->is_string())
      return FieldError(source, "tokenizer_class", absl::StrCat("must be a string, got ", v->dump()));
    out.tokenizer_class = v->get<std::string>();
  }
  return out;
}

absl::StatusOr<ModelDefaults> LoadModelDefaults(const std::filesystem::path& dir) {
  ModelDefaults defaults;
  auto read = [&](const char* name) -> absl::StatusOr<std::optional<std::string>> {
    const std::filesystem::path path = dir / name;
    if (!FileExists(path)) return std::optional<std::string>();
    TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    return std::optional<std::string>(std::move(text));
  };
  auto source = [&](const char* name) { return (dir / name).string(); };

  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> generation, read("generation_config.json"));
  if (generation) {
    TANDEM_ASSIGN_OR_RETURN(defaults.generation, ParseGenerationConfig(*generation, source("generation_config.json")));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> tokenizer, read("tokenizer_config.json"));
  if (tokenizer) {
    TANDEM_ASSIGN_OR_RETURN(defaults.tokenizer, ParseTokenizerConfig(*tokenizer, source("tokenizer_config.json")));
  }
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> special_map, read("special_tokens_map.json"));
  if (special_map) {
    TANDEM_ASSIGN_OR_RETURN(json root, ParseObject(*special_map, source("special_tokens_map.json")));
    TANDEM_RETURN_IF_ERROR(
        ParseSpecialTokenFields(root, source("special_tokens_map.json"), /*only_unset=*/true, &defaults.tokenizer));
  }
  // Newer transformers save the template beside the config; it wins.
  TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> jinja, read("chat_template.jinja"));
  if (jinja) {
    defaults.tokenizer.chat_template = *jinja;
    defaults.tokenizer.named_chat_templates["default"] = std::move(*jinja);
    defaults.tokenizer.chat_template_source = source("chat_template.jinja");
  } else {
    TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> template_json, read("chat_template.json"));
    if (template_json) {
      TANDEM_ASSIGN_OR_RETURN(json root, ParseObject(*template_json, source("chat_template.json")));
      TokenizerDefaults from_file;
      TANDEM_RETURN_IF_ERROR(ParseChatTemplate(Find(root, "chat_template"), source("chat_template.json"), &from_file));
      if (from_file.chat_template || !from_file.named_chat_templates.empty()) {
        defaults.tokenizer.chat_template = std::move(from_file.chat_template);
        defaults.tokenizer.named_chat_templates = std::move(from_file.named_chat_templates);
        defaults.tokenizer.chat_template_source = std::move(from_file.chat_template_source);
      }
    }
  }
  if (defaults.tokenizer.added_tokens.empty()) {
    TANDEM_ASSIGN_OR_RETURN(std::optional<std::string> tokenizer_json, read("tokenizer.json"));
    if (tokenizer_json) {
      TANDEM_ASSIGN_OR_RETURN(defaults.tokenizer.added_tokens,
                              ParseTokenizerJsonAddedTokens(*tokenizer_json, source("tokenizer.json")));
    }
  }
  return defaults;
}

std::vector<int32_t> ModelDefaults::StopTokenIds() const {
  if (!generation.eos_token_ids.empty()) return generation.eos_token_ids;
  if (tokenizer.eos_token) {
    if (std::optional<int32_t> id = tokenizer.IdOf(*tokenizer.eos_token)) return {*id};
  }
  return {};
}

nlohmann::ordered_json ModelDefaults::TemplateContext() const {
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  if (tokenizer.bos_token) context["bos_token"] = *tokenizer.bos_token;
  if (tokenizer.eos_token) context["eos_token"] = *tokenizer.eos_token;
  if (tokenizer.unk_token) context["unk_token"] = *tokenizer.unk_token;
  if (tokenizer.pad_token) context["pad_token"] = *tokenizer.pad_token;
  if (!tokenizer.additional_special_tokens.empty()) {
    context["additional_special_tokens"] = tokenizer.additional_special_tokens;
  }
  return context;
}

std::vector<SpecialTokenPattern> ModelDefaults::SpecialTokenPatterns() const {
  std::vector<SpecialTokenPattern> patterns;
  patterns.reserve(tokenizer.added_tokens.size());
  for (const AddedToken& token : tokenizer.added_tokens) {
    patterns.push_back({.content = token.content, .id = token.id, .lstrip = token.lstrip, .rstrip = token.rstrip});
  }
  return patterns;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ModelDefaults::CompileChatTemplate(const std::string& name,
                                                                                 ChatTemplateOptions options) const {
  auto it = tokenizer.named_chat_templates.find(name);
  if (it == tokenizer.named_chat_templates.end()) {
    if (tokenizer.named_chat_templates.empty()) {
      return absl::NotFoundError(
          "the model has no chat template (no chat_template in tokenizer_config.json, "
          "no chat_template.jinja)");
    }
    std::string names;
    for (const auto& [known, text] : tokenizer.named_chat_templates)
      absl::StrAppend(&names, names.empty() ? "" : ", ", known);
    return absl::NotFoundError(
        absl::StrCat("the model has no chat template named \"", name, "\" (it has: ", names, ")"));
  }
  if (options.name == ChatTemplateOptions().name) {
    options.name = absl::StrCat(tokenizer.chat_template_source, " chat_template",
                                name == "default" ? "" : absl::StrCat(" \"", name, "\""));
  }
  return ChatTemplate::Create(it->second, options);
}

}  // namespace tandem
