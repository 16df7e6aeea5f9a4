// The HTTP front end's untrusted JSON: a request body through the same
// steps a /v1/chat/completions, /v1/completions or /apply-template request
// takes before the scheduler (coordinator/serving/http/: bounded parse,
// field checks, the chat template over the messages and, as
// /apply-template renders them, the tools).
#include <memory>
#include "absl/strings/string_view.h"

#include "common/chat/chat_template.h"
#include "coordinator/serving/http/bounded_json.h"
#include "coordinator/serving/http/openai_request.h"
#include "fuzz/fuzz_targets.h"

namespace tandem::fuzz {
namespace {

// A template that walks every message's content and the tools as values,
// as real templates do (tojson, iteration, item access).
constexpr char kTemplate[] =
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{{ m['content'] | tojson }}{% endif %}{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

// Null only if kTemplate stopped compiling (the seeds then fail loudly).
const ChatTemplate* Template() {
  static const std::unique_ptr<ChatTemplate> compiled = [] {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Create(kTemplate, {});
    return t.ok() ? std::move(*t) : nullptr;
  }();
  return compiled.get();
}

}  // namespace

absl::Status FuzzHttpRequestBody(FuzzBytes bytes) {
  const absl::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  absl::StatusOr<ParsedJson> parsed = ParseBoundedJson(text, JsonLimits{}, "the request body");
  if (!parsed.ok()) return parsed.status();
  if (!parsed->value.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  absl::StatusOr<OpenAiRequest> completion = ParseOpenAiRequest(OpenAiEndpoint::kCompletion, parsed->value);
  absl::StatusOr<OpenAiRequest> chat = ParseOpenAiRequest(OpenAiEndpoint::kChat, parsed->value);
  // Takes every body chat takes, and tools: what the template then renders.
  absl::StatusOr<OpenAiRequest> rendered = ParseOpenAiRequest(OpenAiEndpoint::kApplyTemplate, parsed->value);
  if (chat.ok() && !rendered.ok()) return absl::InternalError("a chat body /apply-template refuses");
  if (!rendered.ok()) return completion.ok() ? absl::OkStatus() : rendered.status();
  const ChatTemplate* chat_template = Template();
  if (chat_template == nullptr) return absl::InternalError("the fuzz target's chat template does not compile");
  ChatTemplateInputs inputs;
  inputs.messages = rendered->messages;
  inputs.tools = rendered->tools;
  inputs.add_generation_prompt = rendered->add_generation_prompt;
  return chat_template->Render(inputs).status();
}

}  // namespace tandem::fuzz
