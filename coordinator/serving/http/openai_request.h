// The body of an OpenAI request (POST /v1/chat/completions or
// /v1/completions, and /apply-template's chat body) read into plain fields,
// every field type- and range-checked with an InvalidArgument that starts
// with the field's name ("temperature: ..."), so the error's `param` can
// name it. Sampling fields a request leaves out stay nullopt: the server
// fills them from the model's generation_config.json, then OpenAI's
// defaults.
//
// Which fields are read, accepted as no-ops, or refused is
// openai_fields.h's table (docs/http.md lists it): nothing unknown is
// ignored. Pure: no server state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "coordinator/serving/http/openai_fields.h"

namespace tandem {

inline constexpr int32_t kMaxChoices = 16;      // n
inline constexpr int32_t kMaxTopLogprobs = 20;  // as OpenAI
inline constexpr int32_t kMaxStopStrings = 16;
inline constexpr int32_t kMaxBeamWidth = 64;
inline constexpr size_t kMaxLogitBiasEntries = 1024;  // as the scheduler's kMaxLogitBiasTokens

inline constexpr size_t kMaxTools = 128;

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };
enum class ResponseFormat { kText, kJsonObject, kJsonSchema };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kChat;
  std::string model;  // as sent (may be empty)

  // Chat: the conversation and the template's inputs.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null when absent (or tool_choice "none" on a chat)
  bool add_generation_prompt = true;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // Completions: exactly one of the two.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;

  std::optional<int32_t> max_tokens;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  // (token id, bias): the keys of logit_bias parsed, the biases in
  // [-100, 100]; whether each id is in the model's vocabulary is the
  // scheduler's check (ValidateLogitBias).
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // report the chosen tokens' log probabilities
  int32_t top_logprobs = 0;    // and this many alternatives per position
  bool ignore_eos = false;
  int32_t beam_width = 0;  // >= 2: beam search (no streaming); n results
  float length_penalty = 1.0f;

  // Tool calling (chat): tools is the checked list. tool_choice: "auto"
  // (the default with tools; calls parsed out of the output), "required"
  // or a named function (the output is forced to be a call).
  ToolChoice tool_choice = ToolChoice::kNone;
  std::string tool_choice_name;  // kNamed
  bool parallel_tool_calls = true;

  // Structured output: response_format json_object (any JSON object) or
  // json_schema (this schema; also llama.cpp's top-level json_schema).
  ResponseFormat response_format = ResponseFormat::kText;
  nlohmann::ordered_json json_schema;
};

// `body` must be a JSON object whose every field CheckOpenAiFields accepts.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, const nlohmann::ordered_json& body);

}  // namespace tandem
