// What a request gets for the sampling fields it leaves unset: the model's
// generation_config.json first, then the server's own defaults (OpenAI's:
// temperature 1, top_p 1, no top_k, min_p or penalties). Shared by the gRPC
// service and the HTTP front end, so both sample alike. Pure functions.
#pragma once

#include <cstdint>
#include <optional>

#include "common/chat/model_defaults.h"
#include "coordinator/generation/sampler.h"

namespace tandem {

// The fields a request may leave unset (nullopt).
struct SamplingRequest {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
};

// Per field: the request's value, else generation_config.json's, else the
// server default. generation_config's `do_sample: false` makes the default
// temperature 0 (greedy), as in transformers. Seed and presence/frequency
// penalties are the caller's.
SamplingParams ResolveSampling(const SamplingRequest& request, const GenerationDefaults& model);

// max_tokens when the request leaves it unset: generation_config's
// max_new_tokens, else `server_default`.
int32_t DefaultMaxTokens(const GenerationDefaults& model, int32_t server_default);

}  // namespace tandem
