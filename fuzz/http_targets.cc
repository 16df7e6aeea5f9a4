// The HTTP front end's untrusted JSON: a request body through the same
// steps a /v1/chat/completions, /v1/completions or /apply-template request
// takes before the scheduler (coordinator/serving/http/: bounded parse,
// field checks, the chat template over the messages and, as
// /apply-template renders them, the tools), and the JSON schemas it carries
// (response_format's, each tool's parameters) compiled into grammars that
// the first message's text is then matched against.
#include <memory>
#include "absl/strings/string_view.h"

#include "common/chat/chat_template.h"
#include "coordinator/generation/grammar_matcher.h"
#include "coordinator/generation/json_schema_grammar.h"
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

// `schema` compiled, and `text` stepped through it byte by byte.
absl::Status MatchSchema(const nlohmann::ordered_json& schema, const std::string& text) {
  Grammar grammar;
  absl::StatusOr<int32_t> root = AddJsonSchema(schema, "schema", &grammar);
  if (!root.ok()) return root.status();
  grammar.root = *root;
  GrammarMatcher matcher(&grammar);
  GrammarState state = matcher.Start(), next;
  for (char c : text) {
    if (!matcher.Step(state, static_cast<uint8_t>(c), &next)) break;
    std::swap(state, next);
  }
  matcher.CanEnd(state);
  return absl::OkStatus();
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
  std::string content;
  if (!rendered->messages.empty() && rendered->messages[0].is_object()) {
    content = rendered->messages[0].value("content", nlohmann::ordered_json("")).dump();
  }
  if (rendered->response_format == ResponseFormat::kJsonSchema) {
    MatchSchema(rendered->json_schema, content).IgnoreError();
  }
  if (rendered->tools.is_array()) {
    for (const auto& tool : rendered->tools) {
      if (tool["function"].contains("parameters")) MatchSchema(tool["function"]["parameters"], content).IgnoreError();
    }
  }
  const ChatTemplate* chat_template = Template();
  if (chat_template == nullptr) return absl::InternalError("the fuzz target's chat template does not compile");
  ChatTemplateInputs inputs;
  inputs.messages = rendered->messages;
  inputs.tools = rendered->tools;
  inputs.add_generation_prompt = rendered->add_generation_prompt;
  return chat_template->Render(inputs).status();
}

}  // namespace tandem::fuzz
