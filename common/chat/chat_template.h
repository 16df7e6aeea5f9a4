// A model's chat template (tokenizer_config.json's `chat_template`, a
// chat_template.jinja file, or a GGUF's `tokenizer.chat_template`) turned
// into a prompt the way transformers' apply_chat_template does it: the same
// Jinja semantics (trim_blocks and lstrip_blocks on, raise_exception,
// tojson as json.dumps with ensure_ascii=False, jinja2's default Undefined)
// and the same variables (messages, tools, documents, add_generation_prompt,
// the special tokens and any extra keyword).
//
// The template is parsed once by Create; every filter, test and tag it names
// must be one the engine implements, so an unsupported template fails at
// load with the construct and its line, not at the first request. A
// ChatTemplate is immutable: any thread may call Render, concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/chat/jinja_interpreter.h"

namespace tandem {

namespace jinja {
struct Template;
}

struct ChatTemplateOptions {
  // Names the template in errors: "tokenizer_config.json chat_template".
  std::string name = "chat template";
  bool trim_blocks = true;  // transformers sets both
  bool lstrip_blocks = true;
  int max_nesting = 128;  // of blocks and expressions in the source
  jinja::RenderLimits limits;
};

// The arguments of apply_chat_template. JSON objects keep their key order
// when given as ordered_json: parse requests with nlohmann::ordered_json so a
// tool schema renders in the client's order (tojson shows it).
struct ChatTemplateInputs {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();  // [{"role", "content", ...}]
  nlohmann::ordered_json tools;      // null: the template sees None (no tools), as transformers passes
  nlohmann::ordered_json documents;  // null: None
  bool add_generation_prompt = false;
  // Leave the last (assistant) message open for the model to continue:
  // the prompt ends right after its content (transformers'
  // continue_final_message). Exclusive with add_generation_prompt.
  bool continue_final_message = false;
  // Further template variables: bos_token, eos_token, ... (see
  // ModelDefaults::TemplateContext) and keywords some templates read
  // (enable_thinking, date_string). May not redefine the names above.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // InvalidArgument naming options.name and the construct, with its line
  // and column: a syntax error, or an unsupported tag, filter or test.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(std::string_view source,
                                                              const ChatTemplateOptions& options = {});
  ~ChatTemplate();
  ChatTemplate(const ChatTemplate&) = delete;
  ChatTemplate& operator=(const ChatTemplate&) = delete;

  // The prompt. Errors: InvalidArgument with raise_exception's message as
  // the template wrote it (IsRaisedByTemplate), or naming the failing
  // construct and its position (an undefined variable used, a type error);
  // ResourceExhausted when a limit of options.limits is hit.
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

  const std::string& source() const { return source_; }
  const std::string& name() const { return options_.name; }

 private:
  ChatTemplate(std::string source, ChatTemplateOptions options, std::unique_ptr<jinja::Template> tmpl);

  std::string source_;
  ChatTemplateOptions options_;
  std::unique_ptr<jinja::Template> template_;
};

// Whether `status` is the template's own raise_exception (a message meant
// for the user, such as "Conversation roles must alternate
// user/assistant/user/assistant/...").
bool IsRaisedByTemplate(const absl::Status& status);

}  // namespace tandem
