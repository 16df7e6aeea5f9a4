#include "common/chat/chat_template.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_errors.h"
#include "common/chat/jinja_json.h"
#include "common/chat/jinja_parser.h"
#include "common/chat/unicode.h"

namespace tandem {
namespace {

constexpr absl::string_view kReserved[] = {"messages", "tools", "documents", "add_generation_prompt"};

absl::Status Named(const absl::Status& status, const std::string& name) {
  if (status.ok() || jinja::IsRaisedByTemplate(status)) return status;
  absl::Status named(status.code(), absl::StrCat(name, ": ", status.message()));
  status.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) { named.SetPayload(url, payload); });
  return named;
}

// The text of the last message to continue: its content, or the last text
// part of a content list (transformers' rule).
absl::StatusOr<std::string> FinalMessageText(const nlohmann::ordered_json& messages) {
  if (!messages.is_array() || messages.empty() || !messages.back().is_object()) {
    return absl::InvalidArgumentError("continue_final_message needs a last message to continue");
  }
  auto content = messages.back().find("content");
  if (content != messages.back().end() && content->is_string()) return content->get<std::string>();
  if (content != messages.back().end() && content->is_array()) {
    for (auto it = content->rbegin(); it != content->rend(); ++it) {
      auto text = it->is_object() ? it->find("text") : it->end();
      if (it->is_object() && text != it->end() && text->is_string()) return text->get<std::string>();
    }
  }
  return absl::InvalidArgumentError(
      "continue_final_message is set but we could not find any text to continue in the final message");
}

// Cuts the rendered prompt right after the final message's text, as
// transformers does for continue_final_message.
absl::StatusOr<std::string> CutAfterFinalMessage(std::string rendered, const std::string& final_message) {
  const absl::string_view stripped = jinja::StripPython(final_message, nullptr, true, true);
  const size_t at = absl::string_view(rendered).rfind(stripped);
  if (stripped.empty() || at == std::string::npos) {
    return absl::InvalidArgumentError(
        "continue_final_message is set but the final message does not appear in the chat after applying the chat "
        "template");
  }
  const absl::string_view lstripped = jinja::StripPython(final_message, nullptr, true, false);
  if (absl::string_view(rendered).substr(at, lstripped.size()) == final_message) {
    rendered.resize(at + lstripped.size());  // the template kept the message's spacing
  } else {
    rendered.resize(at + stripped.size());
  }
  return rendered;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, ChatTemplateOptions options, std::unique_ptr<jinja::Template> tmpl)
    : source_(std::move(source)), options_(std::move(options)), template_(std::move(tmpl)) {}

ChatTemplate::~ChatTemplate() = default;

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(std::string_view source,
                                                                   const ChatTemplateOptions& options) {
  jinja::ParseOptions parse_options;
  parse_options.lexer.trim_blocks = options.trim_blocks;
  parse_options.lexer.lstrip_blocks = options.lstrip_blocks;
  parse_options.max_nesting = options.max_nesting;
  absl::StatusOr<std::unique_ptr<jinja::Template>> tmpl =
      jinja::ParseTemplate(absl::string_view(source.data(), source.size()), parse_options);
  if (!tmpl.ok()) return Named(tmpl.status(), options.name);
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(std::string(source), options, std::move(*tmpl)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const ChatTemplateInputs& inputs) const {
  if (inputs.add_generation_prompt && inputs.continue_final_message) {
    return absl::InvalidArgumentError(
        "continue_final_message and add_generation_prompt are not compatible: use continue_final_message to continue "
        "the last message, add_generation_prompt to start a new assistant message");
  }
  if (!inputs.messages.is_array()) return absl::InvalidArgumentError("chat template input: messages must be a list");
  if (!inputs.extra_context.is_object()) {
    return absl::InvalidArgumentError("chat template input: extra_context must be an object");
  }
  const int depth = options_.limits.max_value_depth;
  auto globals = std::make_shared<jinja::Scope>();
  jinja::AddGlobals(*globals);
  auto add = [&](const std::string& name, const nlohmann::ordered_json& json) -> absl::Status {
    absl::StatusOr<jinja::Value> value = jinja::FromJson(json, depth);
    if (!value.ok())
      return absl::InvalidArgumentError(absl::StrCat("chat template input '", name, "': ", value.status().message()));
    globals->vars[name] = std::move(*value);
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(add("messages", inputs.messages));
  TANDEM_RETURN_IF_ERROR(add("tools", inputs.tools));
  TANDEM_RETURN_IF_ERROR(add("documents", inputs.documents));
  globals->vars["add_generation_prompt"] = jinja::Value::Bool(inputs.add_generation_prompt);
  for (auto it = inputs.extra_context.begin(); it != inputs.extra_context.end(); ++it) {
    for (absl::string_view reserved : kReserved) {
      if (it.key() == reserved) {
        return absl::InvalidArgumentError(
            absl::StrCat("chat template input: extra_context may not set '", it.key(), "'"));
      }
    }
    TANDEM_RETURN_IF_ERROR(add(it.key(), it.value()));
  }

  jinja::Interpreter interpreter(options_.limits);
  absl::StatusOr<std::string> rendered = interpreter.Render(*template_, std::move(globals));
  if (!rendered.ok()) return Named(rendered.status(), options_.name);
  if (!inputs.continue_final_message) return rendered;
  TANDEM_ASSIGN_OR_RETURN(std::string final_message, FinalMessageText(inputs.messages));
  return CutAfterFinalMessage(std::move(*rendered), final_message);
}

bool IsRaisedByTemplate(const absl::Status& status) { return jinja::IsRaisedByTemplate(status); }

}  // namespace tandem
