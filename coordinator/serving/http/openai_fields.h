// Which top-level fields an OpenAI request may carry, per endpoint, and
// what tandem does with each: every field is either read (implemented),
// accepted where its value asks for nothing tandem lacks (`user`, `store:
// false`, `tool_choice: "none"`: they change no output), or refused with a
// 400 naming it and saying what is not supported. A field tandem does not
// know (not OpenAI's, not one of the extensions docs/http.md lists) is
// refused too: a client that sent it expects an effect it would not get.
// The table is docs/http.md's, row for row. Pure.
#pragma once

#include <nlohmann/json.hpp>

#include "absl/status/status.h"

namespace tandem {

enum class OpenAiEndpoint {
  kChat,           // POST /v1/chat/completions
  kCompletion,     // POST /v1/completions
  kApplyTemplate,  // POST /apply-template (llama.cpp's): the chat fields, and tools, only rendered
};

// OK when every field of `body` (a JSON object) is read or accepted on
// `endpoint`; else InvalidArgument "FIELD: why", its param (WithParam) the
// field. A field set to null counts as absent, except an unknown one.
absl::Status CheckOpenAiFields(OpenAiEndpoint endpoint, const nlohmann::ordered_json& body);

}  // namespace tandem
