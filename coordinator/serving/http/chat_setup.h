// What the HTTP front end knows of the model's chat conventions, loaded once
// at start: its chat template (a folder's tokenizer_config.json and
// companions, a GGUF's tokenizer.chat_template, or a file given with
// --chat_template), the special tokens that a rendered
// prompt turns into ids (the stop ids and sampling defaults of
// generation_config.json are Model::defaults, which the scheduler applies).
// Read-only once built: any thread may use it.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/chat/chat_template.h"
#include "common/chat/model_defaults.h"
#include "common/chat/special_tokens.h"
#include "common/model/model.h"

namespace tandem {

struct ChatSetup {
  ModelDefaults defaults;                             // the model's (Model::defaults)
  std::unique_ptr<ChatTemplate> chat_template;        // null: the model has none
  std::string no_template_reason;                     // why, when null
  std::optional<SpecialTokenMatcher> special_tokens;  // when the model has added tokens

  // `messages` (and `tools`, `kwargs`) through the template. FailedPrecondition
  // naming what is missing when the model has no template; the template's
  // own InvalidArgument (raise_exception, a type error) otherwise.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                     bool add_generation_prompt, const nlohmann::ordered_json& kwargs) const;
  // A rendered prompt as ids: special tokens as their ids, the text between
  // them through the tokenizer. A chat prompt takes add_special_tokens
  // false: the template writes its own BOS, and transformers'
  // apply_chat_template tokenizes with add_special_tokens=False. True adds
  // what the tokenizer itself adds around a text (/tokenize's add_special).
  absl::StatusOr<std::vector<int32_t>> Encode(const Model& model, std::string_view prompt,
                                              bool add_special_tokens) const;
};

// `chat_template_file` (may be empty) overrides the model folder's template.
// InvalidArgument naming the file for a malformed config or a template the
// engine cannot compile.
absl::StatusOr<std::unique_ptr<ChatSetup>> LoadChatSetup(const Model& model, const std::string& chat_template_file);

}  // namespace tandem
