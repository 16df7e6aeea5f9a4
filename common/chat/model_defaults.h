// A model's own stops, sampling defaults, special tokens and chat template,
// read from the files of a Hugging Face folder: generation_config.json,
// tokenizer_config.json (and the files newer transformers split out of it:
// chat_template.jinja, chat_template.json, special_tokens_map.json; and
// tokenizer.json's added_tokens when the config has no
// added_tokens_decoder). Plain structs, filled once at load; read-only
// afterwards, so any thread may read them.
//
// Every file is optional. A file that is there but malformed is an
// InvalidArgument naming the file and the field, never a silent default.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/chat/special_tokens.h"

namespace tandem {

// generation_config.json: what `model.generate()` does when the caller says
// nothing. Absent fields stay nullopt (the server's own defaults apply).
struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;  // eos_token_id: one id or a list
  std::optional<int32_t> bos_token_id;
  std::optional<int32_t> pad_token_id;
  std::optional<bool> do_sample;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int32_t> top_k;
  std::optional<double> min_p;
  std::optional<double> repetition_penalty;
  std::optional<int32_t> max_new_tokens;
  std::optional<int32_t> max_length;  // prompt + new tokens
};

// One entry of added_tokens_decoder ("32000": {"content": "<|endoftext|>",
// "special": true, "rstrip": false, ...}).
struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;  // absorbs the whitespace before it when splitting
  bool rstrip = false;  // absorbs the whitespace after it
  bool normalized = false;
  bool single_word = false;
};

// tokenizer_config.json and its companions.
struct TokenizerDefaults {
  // The template apply_chat_template uses: the string, or the entry named
  // "default" of a list of {name, template}. nullopt when none is given.
  std::optional<std::string> chat_template;
  // Every named template of a list form ("default", "tool_use", "rag", ...).
  std::map<std::string, std::string> named_chat_templates;
  std::string chat_template_source;  // the file it came from, for errors
  // Special tokens by role: a string or an AddedToken object's "content".
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  std::optional<std::string> unk_token;
  std::optional<std::string> pad_token;
  std::vector<std::string> additional_special_tokens;
  std::vector<AddedToken> added_tokens;  // sorted by id
  std::optional<bool> add_bos_token;
  std::optional<bool> add_eos_token;
  // transformers' class for the tokenizer ("LlamaTokenizerFast", ...): some
  // rebuild the post-processor from add_bos_token / add_eos_token.
  std::optional<std::string> tokenizer_class;

  // The id of an added token with this content, or nullopt.
  std::optional<int32_t> IdOf(std::string_view content) const;
};

struct ModelDefaults {
  GenerationDefaults generation;
  TokenizerDefaults tokenizer;

  // The ids that end generation: generation_config's eos_token_id, else
  // the id of the tokenizer's eos_token. Empty when neither says (callers
  // then keep config.json's eos_token_id).
  std::vector<int32_t> StopTokenIds() const;
  // The variables transformers passes to the template besides messages:
  // bos_token, eos_token, unk_token, pad_token (those that are set) and
  // additional_special_tokens. Use as ChatTemplateInputs::extra_context.
  nlohmann::ordered_json TemplateContext() const;
  // Every added token as a pattern for SpecialTokenMatcher (content -> id,
  // with its lstrip/rstrip).
  std::vector<SpecialTokenPattern> SpecialTokenPatterns() const;
  // The chat template `name` ("default" is chat_template) compiled with
  // `options` (its name defaults to "<file> chat_template"). NotFound when
  // the model has none by that name; InvalidArgument when it cannot load.
  absl::StatusOr<std::unique_ptr<ChatTemplate>> CompileChatTemplate(const std::string& name = "default",
                                                                    ChatTemplateOptions options = {}) const;
};

// The contents of one file; `source` names it in errors.
absl::StatusOr<GenerationDefaults> ParseGenerationConfig(std::string_view json_text, const std::string& source);
absl::StatusOr<TokenizerDefaults> ParseTokenizerConfig(std::string_view json_text, const std::string& source);

// Reads whichever of the files above `dir` has. chat_template.jinja (then
// chat_template.json's "chat_template") replaces tokenizer_config's default
// template, as transformers does; special_tokens_map.json fills the special
// tokens tokenizer_config leaves unset.
absl::StatusOr<ModelDefaults> LoadModelDefaults(const std::filesystem::path& dir);

}  // namespace tandem
