// The body of an OpenAI request (POST /v1/chat/completions or
// /v1/completions) read into plain fields, every field type- and
// range-checked with an InvalidArgument that starts with the field's name
// ("temperature: ..."), so the error's `param` can name it. Sampling fields
// a request leaves out stay nullopt: the server fills them from the model's
// generation_config.json, then OpenAI's defaults.
//
// Supported: model, messages (chat), prompt (completions: a string, one
// string in a list, or a list of token ids), max_tokens /
// max_completion_tokens, temperature, top_p, top_k, min_p,
// presence_penalty, frequency_penalty, repetition_penalty, seed, stop
// (string or list), n, stream, stream_options.include_usage, logprobs
// (completions: an int; chat: a bool with top_logprobs), and the
// extensions beam_width, length_penalty, ignore_eos, add_generation_prompt,
// chat_template_kwargs. Pure: no server state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace tandem {

enum class OpenAiEndpoint { kChat, kCompletion };

inline constexpr int32_t kMaxChoices = 16;      // n
inline constexpr int32_t kMaxTopLogprobs = 20;  // as OpenAI
inline constexpr int32_t kMaxStopStrings = 16;
inline constexpr int32_t kMaxBeamWidth = 64;

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kChat;
  std::string model;  // as sent (may be empty)

  // Chat: the conversation and the template's inputs.
  nlohmann::ordered_json messages;
  nlohmann::ordered_json tools;  // null when absent
  bool add_generation_prompt = true;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // Completions: exactly one of the two.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;

  std::optional<int32_t> max_tokens;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
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
};

// `body` must be a JSON object. Unknown fields are ignored, as OpenAI's
// own server ignores fields it does not know of newer clients.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, const nlohmann::ordered_json& body);

}  // namespace tandem
