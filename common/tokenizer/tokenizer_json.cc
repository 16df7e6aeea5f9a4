#include "common/tokenizer/tokenizer_json.h"

#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// Records where a SAX parse failed (nlohmann's DOM parser without exceptions
// says only that it failed).
class ErrorPosition final : public nlohmann::json_sax<Json> {
 public:
  size_t position = 0;
  std::string message;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t at, const std::string&, const nlohmann::detail::exception& e) override {
    position = at;
    message = e.what();
    return false;
  }
};

// HF's model vocabulary: {"token": id, ...}.
absl::StatusOr<std::vector<std::pair<std::string, int32_t>>> ReadVocab(const Json& model, const std::string& where) {
  const Json* vocab = FindField(model, "vocab");
  const std::string vocab_where = FieldPath(where, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return JsonError(vocab_where, "expected an object of token -> id");
  std::vector<std::pair<std::string, int32_t>> entries;
  entries.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxTokenId) {
      return JsonError(absl::StrCat(vocab_where, "[\"", it.key(), "\"]"),
                       absl::StrCat("expected a token id in [0, ", kMaxTokenId, "], got ", it->dump()));
    }
    entries.emplace_back(it.key(), static_cast<int32_t>(it->get<int64_t>()));
  }
  return entries;
}

// Merges as "a b" strings (split at the one space; "#version" lines skipped)
// or as ["a", "b"] pairs.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ReadMerges(const Json& model,
                                                                            const std::string& where) {
  const Json* merges = FindField(model, "merges");
  const std::string merges_where = FieldPath(where, "merges");
  if (merges == nullptr || !merges->is_array()) return JsonError(merges_where, "expected a list of merges");
  std::vector<std::pair<std::string, std::string>> pairs;
  pairs.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& merge = (*merges)[i];
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      if (line.rfind("#version", 0) == 0) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return JsonError(ElementPath(merges_where, i),
                         absl::StrCat("\"", line, "\" is not two tokens split by one space"));
      }
      pairs.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      pairs.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return JsonError(ElementPath(merges_where, i),
                       absl::StrCat("expected \"a b\" or [\"a\", \"b\"], got ", merge.dump()));
    }
  }
  return pairs;
}

absl::StatusOr<std::optional<std::string>> OptionalString(const Json& object, std::string_view key,
                                                          const std::string& where) {
  if (FindField(object, key) == nullptr) return std::optional<std::string>();
  TANDEM_ASSIGN_OR_RETURN(std::string value, ReadString(object, key, where));
  return std::optional<std::string>(std::move(value));
}

absl::StatusOr<BpeModel> ReadModel(const Json& document, const std::string& source) {
  const std::string where = absl::StrCat(source, ": model");
  const Json* model = FindField(document, "model");
  if (model == nullptr || !model->is_object()) return JsonError(where, "missing (the tokenizer needs a model)");
  // HF reads a model without "type" by its fields; vocab and merges make BPE.
  const Json* type_field = FindField(*model, "type");
  const std::string type = type_field != nullptr && type_field->is_string() ? type_field->get<std::string>()
                           : FindField(*model, "merges") != nullptr         ? "BPE"
                                                                            : "";
  if (type != "BPE") {
    return JsonError(where, absl::StrCat("model type \"", type, "\" is not supported (tandem reads BPE models)"));
  }
  if (const Json* dropout = FindField(*model, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return JsonError(FieldPath(where, "dropout"),
                     absl::StrCat(dropout->dump(), ": BPE dropout randomizes encoding (training only); not supported"));
  }
  BpeModelOptions options;
  TANDEM_ASSIGN_OR_RETURN(options.unk_token, OptionalString(*model, "unk_token", where));
  TANDEM_ASSIGN_OR_RETURN(options.continuing_subword_prefix,
                          OptionalString(*model, "continuing_subword_prefix", where));
  TANDEM_ASSIGN_OR_RETURN(options.end_of_word_suffix, OptionalString(*model, "end_of_word_suffix", where));
  TANDEM_ASSIGN_OR_RETURN(options.fuse_unk, ReadBool(*model, "fuse_unk", where, false));
  TANDEM_ASSIGN_OR_RETURN(options.byte_fallback, ReadBool(*model, "byte_fallback", where, false));
  TANDEM_ASSIGN_OR_RETURN(options.ignore_merges, ReadBool(*model, "ignore_merges", where, false));
  TANDEM_ASSIGN_OR_RETURN(auto vocab, ReadVocab(*model, where));
  TANDEM_ASSIGN_OR_RETURN(const auto merges, ReadMerges(*model, where));
  return BpeModel::Create(std::move(vocab), merges, std::move(options), where);
}

absl::StatusOr<std::vector<AddedVocabulary::Token>> ReadAddedTokens(const Json& document, const std::string& source) {
  const std::string where = absl::StrCat(source, ": added_tokens");
  std::vector<AddedVocabulary::Token> tokens;
  const Json* list = FindField(document, "added_tokens");
  if (list == nullptr) return tokens;
  if (!list->is_array()) return JsonError(where, "expected a list");
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string entry_where = ElementPath(where, i);
    if (!entry.is_object()) return JsonError(entry_where, "expected an object");
    AddedVocabulary::Token token;
    TANDEM_ASSIGN_OR_RETURN(const uint64_t id, ReadUnsigned(entry, "id", entry_where, kMaxTokenId));
    token.id = static_cast<int32_t>(id);
    TANDEM_ASSIGN_OR_RETURN(token.content, ReadString(entry, "content", entry_where));
    TANDEM_ASSIGN_OR_RETURN(token.special, ReadBool(entry, "special", entry_where, false));
    TANDEM_ASSIGN_OR_RETURN(token.single_word, ReadBool(entry, "single_word", entry_where, false));
    TANDEM_ASSIGN_OR_RETURN(token.lstrip, ReadBool(entry, "lstrip", entry_where, false));
    TANDEM_ASSIGN_OR_RETURN(token.rstrip, ReadBool(entry, "rstrip", entry_where, false));
    TANDEM_ASSIGN_OR_RETURN(token.normalized, ReadBool(entry, "normalized", entry_where, !token.special));
    tokens.push_back(std::move(token));
  }
  return tokens;
}

absl::Status CheckSpecialId(int32_t id, int32_t limit, const std::string& source, const char* which) {
  if (id >= limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the ", which, " id ", id, " is outside the vocabulary [0, ", limit, ")"));
  }
  return absl::OkStatus();
}

// The id of a special token named by content (an added token's, else the
// vocabulary's), else `id`.
absl::StatusOr<int32_t> SpecialId(const std::optional<std::string>& content, int32_t id,
                                  const BpeTokenizer::Parts& parts, const char* which) {
  if (!content) return id;
  for (const AddedVocabulary::Token& token : parts.added.tokens()) {
    if (token.content == *content) return token.id;
  }
  if (std::optional<int32_t> in_vocab = parts.model.TokenToId(*content)) return *in_vocab;
  return absl::InvalidArgumentError(absl::StrCat(parts.name, ": the ", which, " token \"", *content,
                                                 "\" is neither an added token nor in the vocabulary"));
}

}  // namespace

absl::StatusOr<Json> ParseJsonText(std::string_view text, std::string_view source) {
  Json document = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!document.is_discarded()) return document;
  ErrorPosition error;
  Json::sax_parse(text, &error, nlohmann::detail::input_format_t::json, /*strict=*/true);
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(source), ": not valid JSON at byte ", error.position, ": ", error.message));
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> TokenizerFromJson(const Json& document,
                                                                const TokenizerJsonOptions& options) {
  const std::string& source = options.source;
  if (!document.is_object()) return JsonError(source, "expected a JSON object");
  TANDEM_ASSIGN_OR_RETURN(const std::string version, ReadString(document, "version", source, "1.0"));
  if (version != "1.0")
    return JsonError(FieldPath(source, "version"), absl::StrCat("unknown version \"", version, "\""));
  BpeTokenizer::Parts parts;
  parts.name = source;
  const Json null_json;
  auto component = [&](std::string_view key) -> const Json& {
    const Json* value = FindField(document, key);
    return value == nullptr ? null_json : *value;
  };
  TANDEM_ASSIGN_OR_RETURN(parts.normalizer,
                          NormalizerFromJson(component("normalizer"), FieldPath(source, "normalizer")));
  TANDEM_ASSIGN_OR_RETURN(parts.pre_tokenizer,
                          PreTokenizerFromJson(component("pre_tokenizer"), FieldPath(source, "pre_tokenizer")));
  TANDEM_ASSIGN_OR_RETURN(parts.decoder, DecoderFromJson(component("decoder"), FieldPath(source, "decoder")));
  TANDEM_ASSIGN_OR_RETURN(parts.model, ReadModel(document, source));
  TANDEM_ASSIGN_OR_RETURN(std::vector<AddedVocabulary::Token> added, ReadAddedTokens(document, source));
  TANDEM_ASSIGN_OR_RETURN(parts.added, AddedVocabulary::Create(std::move(added), parts.model, parts.normalizer.get(),
                                                               absl::StrCat(source, ": added_tokens")));
  const int32_t id_limit = std::max(parts.model.id_limit(), parts.added.id_limit());
  TANDEM_ASSIGN_OR_RETURN(parts.post_processor, PostProcessorFromJson(component("post_processor"),
                                                                      FieldPath(source, "post_processor"), id_limit));
  TANDEM_ASSIGN_OR_RETURN(parts.bos_id, SpecialId(options.bos_token, options.bos_id, parts, "BOS"));
  if (parts.bos_id < 0 && parts.post_processor != nullptr) parts.bos_id = parts.post_processor->LeadingId();
  TANDEM_ASSIGN_OR_RETURN(parts.eos_id, SpecialId(options.eos_token, options.eos_id, parts, "EOS"));
  if (options.add_bos_token || options.add_eos_token) {
    const bool add_bos = options.add_bos_token.value_or(false), add_eos = options.add_eos_token.value_or(false);
    if ((add_bos && parts.bos_id < 0) || (add_eos && parts.eos_id < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": add_", add_bos && parts.bos_id < 0 ? "bos" : "eos",
                                                     "_token is true but the tokenizer names no such token"));
    }
    parts.post_processor = BosEosPostProcessor(add_bos ? parts.bos_id : -1, add_eos ? parts.eos_id : -1);
  }
  TANDEM_RETURN_IF_ERROR(CheckSpecialId(parts.bos_id, id_limit, source, "BOS"));
  TANDEM_RETURN_IF_ERROR(CheckSpecialId(parts.eos_id, id_limit, source, "EOS"));
  return std::make_unique<BpeTokenizer>(std::move(parts));
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> ParseTokenizerJson(std::string_view text,
                                                                 const TokenizerJsonOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(const Json document, ParseJsonText(text, options.source));
  return TokenizerFromJson(document, options);
}

absl::StatusOr<std::unique_ptr<BpeTokenizer>> LoadTokenizerJson(const std::filesystem::path& file,
                                                                TokenizerJsonOptions options) {
  if (options.source == TokenizerJsonOptions().source) options.source = file.string();
  std::error_code error;
  const uintmax_t bytes = std::filesystem::file_size(file, error);
  if (error) return absl::NotFoundError(absl::StrCat(file.string(), ": cannot read: ", error.message()));
  if (bytes > kMaxTokenizerJsonBytes) {
    return absl::InvalidArgumentError(absl::StrCat(file.string(), ": ", bytes,
                                                   " bytes, more than a tokenizer.json can be (",
                                                   kMaxTokenizerJsonBytes >> 20, " MB)"));
  }
  std::ifstream in(file, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in && !in.eof()) return absl::NotFoundError(absl::StrCat(file.string(), ": cannot read"));
  return ParseTokenizerJson(text, options);
}

}  // namespace tandem
