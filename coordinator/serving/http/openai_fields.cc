#include "coordinator/serving/http/openai_fields.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "coordinator/serving/http/http_error.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

constexpr unsigned kChat = 1u << static_cast<unsigned>(OpenAiEndpoint::kChat);
constexpr unsigned kCompletion = 1u << static_cast<unsigned>(OpenAiEndpoint::kCompletion);
constexpr unsigned kTemplate = 1u << static_cast<unsigned>(OpenAiEndpoint::kApplyTemplate);
constexpr unsigned kChats = kChat | kTemplate;  // a chat body, rendered or run
constexpr unsigned kAll = kChats | kCompletion;

// Longer names are cut in messages: the body, not the error, may be large.
constexpr size_t kMaxNameBytes = 64;

bool IsString(const Json& v) { return v.is_string(); }
bool IsObject(const Json& v) { return v.is_object(); }
bool IsFalse(const Json& v) { return v.is_boolean() && !v.get<bool>(); }
bool IsNone(const Json& v) { return v.is_string() && v.get_ref<const std::string&>() == "none"; }
bool IsOne(const Json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; }
bool IsEmptyString(const Json& v) { return v.is_string() && v.get_ref<const std::string&>().empty(); }
bool IsTextOnly(const Json& v) { return v.is_array() && v.size() == 1 && v[0] == "text"; }

struct FieldRule {
  const char* name;
  unsigned endpoints;
  // OK for a value that asks for nothing tandem lacks. Null, with a null
  // refusal: the field is read by ParseOpenAiRequest; with a refusal: no
  // value is accepted.
  bool (*accepts)(const Json& value);
  const char* refusal;  // why a value `accepts` refuses is refused
};


// docs/http.md's table, row for row.
constexpr FieldRule kRules[] = {
    // Read: OpenAI's fields.
    {"model", kAll, nullptr, nullptr},
    {"messages", kChats, nullptr, nullptr},
    {"prompt", kCompletion, nullptr, nullptr},
    {"max_tokens", kAll, nullptr, nullptr},
    {"max_completion_tokens", kAll, nullptr, nullptr},
    {"temperature", kAll, nullptr, nullptr},
    {"top_p", kAll, nullptr, nullptr},
    {"presence_penalty", kAll, nullptr, nullptr},
    {"frequency_penalty", kAll, nullptr, nullptr},
    {"logit_bias", kAll, nullptr, nullptr},
    {"seed", kAll, nullptr, nullptr},
    {"stop", kAll, nullptr, nullptr},
    {"n", kAll, nullptr, nullptr},
    {"stream", kAll, nullptr, nullptr},
    {"stream_options", kAll, nullptr, nullptr},
    {"logprobs", kAll, nullptr, nullptr},
    {"top_logprobs", kChats, nullptr, nullptr},
    // Read: tandem's extensions (vLLM's and llama.cpp's names).
    {"top_k", kAll, nullptr, nullptr},
    {"min_p", kAll, nullptr, nullptr},
    {"repetition_penalty", kAll, nullptr, nullptr},
    {"ignore_eos", kAll, nullptr, nullptr},
    {"beam_width", kAll, nullptr, nullptr},
    {"length_penalty", kAll, nullptr, nullptr},
    {"add_generation_prompt", kChats, nullptr, nullptr},
    {"chat_template_kwargs", kChats, nullptr, nullptr},
    {"tools", kChats, nullptr, nullptr},
    {"tool_choice", kChats, nullptr, nullptr},
    {"parallel_tool_calls", kChats, nullptr, nullptr},
    {"response_format", kChats, nullptr, nullptr},
    {"json_schema", kAll, nullptr, nullptr},  // llama.cpp's
    // Accepted where they change no output.
    {"user", kAll, IsString, "must be a string (accepted and unused: tandem keeps no per-user records)"},
    {"metadata", kChats, IsObject, "must be an object (accepted and unused: tandem stores no completions)"},
    {"store", kChats, IsFalse, "only false is supported: tandem stores no completions"},
    {"service_tier", kChats, IsString, "must be a string (accepted and unused: tandem has one tier)"},
    {"prompt_cache_key", kChats, IsString, "must be a string (accepted and unused)"},
    {"safety_identifier", kChats, IsString, "must be a string (accepted and unused)"},
    {"function_call", kChats, IsNone, "the legacy function_call is not supported: use tool_choice"},
    {"modalities", kChats, IsTextOnly, "only [\"text\"] is supported: tandem generates text"},
    {"echo", kCompletion, IsFalse, "only false is supported: the prompt is not returned with the completion"},
    {"best_of", kCompletion, IsOne,
     "only 1 is supported (choosing the best of several completions is not): use n for several choices, or "
     "beam_width for beam search"},
    {"suffix", kCompletion, IsEmptyString,
     "is not supported (text after an insertion point): tandem completes a prompt at its end only"},
    // Refused: what tandem does not do.
    {"functions", kChats, nullptr, "the legacy functions field is not supported: use tools"},
    {"audio", kChats, nullptr, "audio output is not supported"},
    {"prediction", kChats, nullptr, "predicted outputs are not supported"},
    {"reasoning_effort", kChats, nullptr,
     "is not supported: the model reasons as its weights and chat template make it (see chat_template_kwargs)"},
    {"verbosity", kChats, nullptr, "is not supported"},
    {"web_search_options", kChats, nullptr, "web search is not supported"},
    {"grammar", kAll, nullptr,
     "GBNF grammars are not supported: use response_format json_schema (or json_schema)"},  // llama.cpp's
};

absl::string_view EndpointPath(OpenAiEndpoint endpoint) {
  switch (endpoint) {
    case OpenAiEndpoint::kChat: return "/v1/chat/completions";
    case OpenAiEndpoint::kCompletion: return "/v1/completions";
    case OpenAiEndpoint::kApplyTemplate: return "/apply-template";
  }
  return "";
}

absl::Status Refuse(absl::string_view name, absl::string_view why) {
  const std::string shown(name.substr(0, kMaxNameBytes));
  return WithParam(absl::InvalidArgumentError(absl::StrCat(shown, name.size() > shown.size() ? "...: " : ": ", why)),
                   shown);
}

}  // namespace

absl::Status CheckOpenAiFields(OpenAiEndpoint endpoint, const Json& body) {
  const unsigned bit = 1u << static_cast<unsigned>(endpoint);
  for (const auto& [name, value] : body.items()) {
    const FieldRule* rule = nullptr;
    bool elsewhere = false;  // a field of another endpoint
    for (const FieldRule& r : kRules) {
      if (name != r.name) continue;
      if (r.endpoints & bit) {
        rule = &r;
        break;
      }
      elsewhere = true;
    }
    if (rule == nullptr) {
      return Refuse(name, elsewhere ? absl::StrCat("is not a field of ", EndpointPath(endpoint))
                                    : "unknown field: neither OpenAI's nor one of tandem's extensions (docs/http.md "
                                      "lists them); refused rather than ignored");
    }
    if (value.is_null() || (rule->accepts == nullptr && rule->refusal == nullptr)) continue;
    if (rule->accepts != nullptr && rule->accepts(value)) continue;
    return Refuse(name, rule->refusal);
  }
  return absl::OkStatus();
}

}  // namespace tandem
