#include "coordinator/serving/http/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

absl::Status Bad(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Whether `body` has `field` set to something other than null.
const Json* Field(const Json& body, const char* field) {
  auto it = body.find(field);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::optional<float>> OptionalNumber(const Json& body, const char* field, double lo, double hi) {
  const Json* v = Field(body, field);
  if (v == nullptr) return std::optional<float>();
  if (!v->is_number()) return Bad(field, "must be a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    return Bad(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
  return std::optional<float>(static_cast<float>(x));
}

absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& body, const char* field, int64_t lo, int64_t hi) {
  const Json* v = Field(body, field);
  if (v == nullptr) return std::optional<int64_t>();
  if (!v->is_number_integer()) return Bad(field, "must be an integer");
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi)) {
    return Bad(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", v->get<uint64_t>()));
  }
  const int64_t x = v->get<int64_t>();
  if (x < lo || x > hi) return Bad(field, absl::StrCat("must be in [", lo, ", ", hi, "], got ", x));
  return std::optional<int64_t>(x);
}

absl::StatusOr<bool> OptionalBool(const Json& body, const char* field, bool fallback) {
  const Json* v = Field(body, field);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return Bad(field, "must be true or false");
  return v->get<bool>();
}

absl::Status ReadStop(const Json& body, OpenAiRequest& r) {
  const Json* v = Field(body, "stop");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    if (!v->get<std::string>().empty()) r.stop.push_back(v->get<std::string>());
    return absl::OkStatus();
  }
  if (!v->is_array()) return Bad("stop", "must be a string or a list of strings");
  if (v->size() > static_cast<size_t>(kMaxStopStrings)) {
    return Bad("stop", absl::StrCat("at most ", kMaxStopStrings, " strings, got ", v->size()));
  }
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) return Bad(absl::StrCat("stop[", i, "]"), "must be a string");
    if (!(*v)[i].get<std::string>().empty()) r.stop.push_back((*v)[i].get<std::string>());
  }
  return absl::OkStatus();
}

// A template given image or audio parts would drop them or render their
// JSON: either way the model would not see what the client sent.
absl::Status CheckTextParts(const Json& parts, const std::string& at) {
  for (size_t j = 0; j < parts.size(); ++j) {
    const Json& part = parts[j];
    const std::string where = absl::StrCat(at, ".content[", j, "]");
    auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string()) {
      return Bad(where, "must be a content part {\"type\": \"text\", \"text\": ...}");
    }
    if (*type != "text") {
      return Bad(absl::StrCat(where, ".type"), absl::StrCat("only text parts are supported (the model reads text), got \"",
                                                           type->get<std::string>().substr(0, 64), "\""));
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) return Bad(absl::StrCat(where, ".text"), "must be a string");
  }
  return absl::OkStatus();
}

absl::Status ReadMessages(const Json& body, OpenAiRequest& r) {
  const Json* v = Field(body, "messages");
  if (v == nullptr) return Bad("messages", "is required");
  if (!v->is_array() || v->empty()) return Bad("messages", "must be a non-empty list of messages");
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& m = (*v)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(at, "must be an object with role and content");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Bad(absl::StrCat(at, ".role"), "must be a string");
    auto content = m.find("content");
    if (content != m.end() && !content->is_null() && !content->is_string() && !content->is_array()) {
      return Bad(absl::StrCat(at, ".content"), "must be a string, a list of content parts, or null");
    }
    if (content != m.end() && content->is_array()) TANDEM_RETURN_IF_ERROR(CheckTextParts(*content, at));
  }
  r.messages = *v;
  TANDEM_ASSIGN_OR_RETURN(r.add_generation_prompt, OptionalBool(body, "add_generation_prompt", true));
  if (const Json* kwargs = Field(body, "chat_template_kwargs"); kwargs != nullptr) {
    if (!kwargs->is_object()) return Bad("chat_template_kwargs", "must be an object");
    r.chat_template_kwargs = *kwargs;
  }
  return absl::OkStatus();
}

absl::Status ReadPrompt(const Json& body, OpenAiRequest& r) {
  const Json* v = Field(body, "prompt");
  if (v == nullptr) return Bad("prompt", "is required");
  if (v->is_array() && v->size() == 1 && (*v)[0].is_string()) v = &(*v)[0];
  if (v->is_string()) {
    if (v->get<std::string>().empty()) return Bad("prompt", "is empty");
    r.prompt_text = v->get<std::string>();
    return absl::OkStatus();
  }
  if (!v->is_array() || v->empty()) return Bad("prompt", "must be a string, or a non-empty list of token ids");
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& id = (*v)[i];
    if (id.is_string() || id.is_array()) {
      return Bad("prompt", "a list of several prompts is not supported: send one prompt per request");
    }
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Bad(absl::StrCat("prompt[", i, "]"), "must be a token id (an integer >= 0)");
    }
    r.prompt_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
  }
  return absl::OkStatus();
}

absl::Status ReadLogprobs(const Json& body, OpenAiRequest& r) {
  if (r.endpoint != OpenAiEndpoint::kCompletion) {
    TANDEM_ASSIGN_OR_RETURN(r.logprobs, OptionalBool(body, "logprobs", false));
    TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> top, OptionalInt(body, "top_logprobs", 0, kMaxTopLogprobs));
    if (top && !r.logprobs) return Bad("top_logprobs", "needs logprobs set to true");
    r.top_logprobs = static_cast<int32_t>(top.value_or(0));
    return absl::OkStatus();
  }
  // Completions: logprobs is the number of alternatives (0 = only the chosen).
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> top, OptionalInt(body, "logprobs", 0, kMaxTopLogprobs));
  r.logprobs = top.has_value();
  r.top_logprobs = static_cast<int32_t>(top.value_or(0));
  return absl::OkStatus();
}

// stream_options: include_usage, and include_obfuscation where it asks for
// nothing (tandem pads no events).
absl::Status ReadStreamOptions(const Json& body, OpenAiRequest& r) {
  const Json* options = Field(body, "stream_options");
  if (options == nullptr) return absl::OkStatus();
  if (!options->is_object()) return Bad("stream_options", "must be an object");
  if (!r.stream) return Bad("stream_options", "is only allowed when stream is true");
  for (const auto& [key, value] : options->items()) {
    if (key == "include_usage") continue;
    if (key == "include_obfuscation" && (value.is_null() || value == false)) continue;
    const std::string field = absl::StrCat("stream_options.", key.substr(0, 64));
    if (key == "include_obfuscation") {
      return Bad(field, "only false is supported: tandem does not pad stream events");
    }
    return Bad(field, "unknown field: only include_usage is supported");
  }
  TANDEM_ASSIGN_OR_RETURN(r.include_usage, OptionalBool(*options, "include_usage", false));
  return absl::OkStatus();
}

// logit_bias: {"token id": bias}. Keys are decimal ids as OpenAI writes
// them ("0", "15043"; no sign, no leading zero, so two keys never name one
// token), biases numbers in [-100, 100].
absl::Status ReadLogitBias(const Json& body, OpenAiRequest& r) {
  const Json* v = Field(body, "logit_bias");
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_object()) return Bad("logit_bias", "must be an object mapping token ids to biases");
  if (v->size() > kMaxLogitBiasEntries) {
    return Bad("logit_bias", absl::StrCat("at most ", kMaxLogitBiasEntries, " tokens, got ", v->size()));
  }
  for (const auto& [key, value] : v->items()) {
    const std::string shown = key.substr(0, 32);
    int32_t id = 0;
    const bool canonical = !key.empty() && key.size() <= 10 && (key == "0" || key[0] != '0') &&
                           key.find_first_not_of("0123456789") == std::string::npos;
    if (!canonical || !absl::SimpleAtoi(key, &id)) {
      return Bad("logit_bias", absl::StrCat("key \"", shown, "\" is not a token id (a decimal integer >= 0)"));
    }
    if (!value.is_number() || !std::isfinite(value.get<double>()) || std::fabs(value.get<double>()) > 100.0) {
      return Bad("logit_bias",
                 absl::StrCat("key \"", shown, "\": the bias must be a number in [-100, 100], got ", value.dump()));
    }
    r.logit_bias.emplace_back(id, value.get<float>());
  }
  return absl::OkStatus();
}

bool IsFunctionName(const std::string& name) {
  return !name.empty() && name.size() <= 64 &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
             std::string::npos;
}

// tools: [{"type": "function", "function": {"name", "description",
// "parameters", "strict"}}], names distinct.
absl::Status ReadTools(const Json& body, OpenAiRequest& r) {
  const Json* tools = Field(body, "tools");
  if (tools == nullptr) return absl::OkStatus();
  if (!tools->is_array()) return Bad("tools", "must be a list of {\"type\": \"function\", \"function\": {...}}");
  if (tools->size() > kMaxTools) return Bad("tools", absl::StrCat("at most ", kMaxTools, " tools"));
  std::vector<std::string> names;
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string at = absl::StrCat("tools[", i, "]");
    if (!t.is_object() || t.value("type", Json()) != "function") return Bad(at + ".type", "must be \"function\"");
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) return Bad(at + ".function", "must be an object with a name");
    for (const auto& [key, value] : f->items()) {
      if (key != "name" && key != "description" && key != "parameters" && key != "strict") {
        return Bad(absl::StrCat(at, ".function.", key.substr(0, 64)), "unknown field");
      }
    }
    auto name = f->find("name");
    if (name == f->end() || !name->is_string() || !IsFunctionName(name->get<std::string>())) {
      return Bad(at + ".function.name", "must be 1-64 letters, digits, '_', '-' or '.'");
    }
    if (std::find(names.begin(), names.end(), name->get<std::string>()) != names.end()) {
      return Bad(at + ".function.name", absl::StrCat("\"", name->get<std::string>(), "\" is given twice"));
    }
    names.push_back(name->get<std::string>());
    if (auto d = f->find("description"); d != f->end() && !d->is_string() && !d->is_null()) {
      return Bad(at + ".function.description", "must be a string");
    }
    if (auto p = f->find("parameters"); p != f->end() && !p->is_object() && !p->is_null()) {
      return Bad(at + ".function.parameters", "must be a JSON schema object");
    }
    if (auto s = f->find("strict"); s != f->end() && !s->is_boolean() && !s->is_null()) {
      return Bad(at + ".function.strict", "must be true or false");
    }
  }
  r.tools = *tools;
  r.tool_choice = tools->empty() ? ToolChoice::kNone : ToolChoice::kAuto;
  return absl::OkStatus();
}

// tool_choice: "none", "auto", "required" or {"type": "function",
// "function": {"name"}}; parallel_tool_calls.
absl::Status ReadToolChoice(const Json& body, OpenAiRequest& r) {
  TANDEM_ASSIGN_OR_RETURN(r.parallel_tool_calls, OptionalBool(body, "parallel_tool_calls", true));
  const Json* v = Field(body, "tool_choice");
  if (v == nullptr) return absl::OkStatus();
  if (*v == "none") {
    r.tool_choice = ToolChoice::kNone;
    return absl::OkStatus();
  }
  if (r.tools.is_null() || r.tools.empty()) return Bad("tool_choice", "needs tools");
  if (*v == "auto") {
    r.tool_choice = ToolChoice::kAuto;
  } else if (*v == "required") {
    r.tool_choice = ToolChoice::kRequired;
  } else if (v->is_object() && v->value("type", Json()) == "function" && v->contains("function") &&
             (*v)["function"].is_object() && (*v)["function"].value("name", Json()).is_string()) {
    r.tool_choice = ToolChoice::kNamed;
    r.tool_choice_name = (*v)["function"]["name"].get<std::string>();
    bool known = false;
    for (const Json& t : r.tools) known = known || t["function"]["name"] == r.tool_choice_name;
    if (!known) {
      return Bad("tool_choice", absl::StrCat("names \"", r.tool_choice_name.substr(0, 64), "\", which is not in tools"));
    }
  } else {
    return Bad("tool_choice",
               "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  return absl::OkStatus();
}

// response_format: {"type": "text" | "json_object" | "json_schema",
// "json_schema": {"name", "schema", "strict", "description"}}; or
// llama.cpp's top-level json_schema.
absl::Status ReadResponseFormat(const Json& body, OpenAiRequest& r) {
  if (const Json* schema = Field(body, "json_schema"); schema != nullptr) {
    if (!schema->is_object()) return Bad("json_schema", "must be a JSON schema object");
    r.response_format = ResponseFormat::kJsonSchema;
    r.json_schema = *schema;
  }
  const Json* v = Field(body, "response_format");
  if (v == nullptr) return absl::OkStatus();
  if (r.response_format != ResponseFormat::kText) return Bad("response_format", "and json_schema: send one of them");
  if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string()) {
    return Bad("response_format", "must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}");
  }
  const std::string type = (*v)["type"].get<std::string>();
  for (const auto& [key, value] : v->items()) {
    if (key != "type" && !(key == "json_schema" && type == "json_schema")) {
      return Bad(absl::StrCat("response_format.", key.substr(0, 64)), "unknown field");
    }
  }
  if (type == "text") return absl::OkStatus();
  if (type == "json_object") {
    r.response_format = ResponseFormat::kJsonObject;
    return absl::OkStatus();
  }
  if (type != "json_schema") {
    return Bad("response_format.type", absl::StrCat("must be text, json_object or json_schema, got \"",
                                                    type.substr(0, 64), "\""));
  }
  auto js = v->find("json_schema");
  if (js == v->end() || !js->is_object()) {
    return Bad("response_format.json_schema", "must be {\"name\", \"schema\", \"strict\"}");
  }
  for (const auto& [key, value] : js->items()) {
    if (key != "name" && key != "schema" && key != "strict" && key != "description") {
      return Bad(absl::StrCat("response_format.json_schema.", key.substr(0, 64)), "unknown field");
    }
  }
  auto schema = js->find("schema");
  if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
    return Bad("response_format.json_schema.schema", "must be a JSON schema object");
  }
  r.response_format = ResponseFormat::kJsonSchema;
  r.json_schema = *schema;
  return absl::OkStatus();
}

// The sampling fields and max_tokens.
absl::Status ReadSampling(const Json& body, OpenAiRequest& r) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, OptionalInt(body, "max_tokens", 1, kIntMax));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> max_completion,
                          OptionalInt(body, "max_completion_tokens", 1, kIntMax));
  if (max_completion) max_tokens = max_completion;
  if (max_tokens) r.max_tokens = static_cast<int32_t>(*max_tokens);
  TANDEM_ASSIGN_OR_RETURN(r.temperature, OptionalNumber(body, "temperature", 0, 100));
  TANDEM_ASSIGN_OR_RETURN(r.top_p, OptionalNumber(body, "top_p", 0, 1));
  if (r.top_p && *r.top_p == 0.0f) return Bad("top_p", "must be in (0, 1], got 0");
  TANDEM_ASSIGN_OR_RETURN(r.min_p, OptionalNumber(body, "min_p", 0, 1));
  TANDEM_ASSIGN_OR_RETURN(r.repetition_penalty, OptionalNumber(body, "repetition_penalty", 0, 100));
  if (r.repetition_penalty && *r.repetition_penalty == 0.0f) return Bad("repetition_penalty", "must be > 0, got 0");
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, OptionalInt(body, "top_k", -1, kIntMax));
  if (top_k) r.top_k = static_cast<int32_t>(std::max<int64_t>(*top_k, 0));  // -1 (vLLM) and 0: off
  TANDEM_ASSIGN_OR_RETURN(std::optional<float> presence, OptionalNumber(body, "presence_penalty", -2, 2));
  TANDEM_ASSIGN_OR_RETURN(std::optional<float> frequency, OptionalNumber(body, "frequency_penalty", -2, 2));
  r.presence_penalty = presence.value_or(0.0f);
  r.frequency_penalty = frequency.value_or(0.0f);
  TANDEM_RETURN_IF_ERROR(ReadLogitBias(body, r));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> seed, OptionalInt(body, "seed", std::numeric_limits<int64_t>::min(),
                                                                   std::numeric_limits<int64_t>::max()));
  if (seed) r.seed = static_cast<uint64_t>(*seed);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, const Json& body) {
  if (!body.is_object()) return absl::InvalidArgumentError("the request body must be a JSON object");
  TANDEM_RETURN_IF_ERROR(CheckOpenAiFields(endpoint, body));
  OpenAiRequest r;
  r.endpoint = endpoint;
  if (const Json* model = Field(body, "model"); model != nullptr) {
    if (!model->is_string()) return Bad("model", "must be a string");
    r.model = model->get<std::string>();
  }
  TANDEM_RETURN_IF_ERROR(endpoint == OpenAiEndpoint::kCompletion ? ReadPrompt(body, r) : ReadMessages(body, r));
  if (endpoint != OpenAiEndpoint::kCompletion) {
    TANDEM_RETURN_IF_ERROR(ReadTools(body, r));
    TANDEM_RETURN_IF_ERROR(ReadToolChoice(body, r));
    // tool_choice "none": the model is not told of the tools at all.
    if (endpoint == OpenAiEndpoint::kChat && r.tool_choice == ToolChoice::kNone) r.tools = nullptr;
  }
  TANDEM_RETURN_IF_ERROR(ReadResponseFormat(body, r));
  TANDEM_RETURN_IF_ERROR(ReadSampling(body, r));
  TANDEM_RETURN_IF_ERROR(ReadStop(body, r));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> n, OptionalInt(body, "n", 1, kMaxChoices));
  r.n = static_cast<int32_t>(n.value_or(1));
  TANDEM_ASSIGN_OR_RETURN(r.stream, OptionalBool(body, "stream", false));
  TANDEM_RETURN_IF_ERROR(ReadStreamOptions(body, r));
  TANDEM_RETURN_IF_ERROR(ReadLogprobs(body, r));
  TANDEM_ASSIGN_OR_RETURN(r.ignore_eos, OptionalBool(body, "ignore_eos", false));
  TANDEM_ASSIGN_OR_RETURN(std::optional<int64_t> beam_width, OptionalInt(body, "beam_width", 1, kMaxBeamWidth));
  r.beam_width = static_cast<int32_t>(beam_width.value_or(0));
  TANDEM_ASSIGN_OR_RETURN(std::optional<float> length_penalty, OptionalNumber(body, "length_penalty", -10, 10));
  r.length_penalty = length_penalty.value_or(1.0f);
  if (r.beam_width >= 2) {
    if (r.stream) return Bad("beam_width", "beam search does not stream: set stream to false");
    if (r.n > r.beam_width)
      return Bad("n", absl::StrCat("must be <= beam_width (", r.beam_width, ") with beam search"));
    if (r.logprobs) return Bad("logprobs", "is not available with beam search");
    if (r.response_format != ResponseFormat::kText || r.tool_choice == ToolChoice::kRequired ||
        r.tool_choice == ToolChoice::kNamed) {
      return Bad("beam_width", "beam search is not constrained: it cannot be combined with structured output or a "
                               "forced tool call");
    }
  }
  if (r.response_format != ResponseFormat::kText) {
    if (r.tool_choice != ToolChoice::kNone) {
      return Bad("response_format",
                 "cannot be combined with tools (the output is a tool call or the JSON, not both): send tool_choice "
                 "\"none\" or leave response_format out");
    }
    if (r.ignore_eos) return Bad("ignore_eos", "cannot be combined with structured output: the JSON ends the output");
  }
  if ((r.tool_choice == ToolChoice::kRequired || r.tool_choice == ToolChoice::kNamed) && r.ignore_eos) {
    return Bad("ignore_eos", "cannot be combined with a forced tool call: the call ends the output");
  }
  return r;
}

}  // namespace tandem
