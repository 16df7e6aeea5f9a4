#include "coordinator/generation/sampling_defaults.h"

namespace tandem {

SamplingParams ResolveSampling(const SamplingRequest& request, const GenerationDefaults& model) {
  SamplingParams p;
  const bool sample_by_default = model.do_sample.value_or(true);
  const float model_temperature = sample_by_default ? static_cast<float>(model.temperature.value_or(1.0)) : 0.0f;
  p.temperature = request.temperature.value_or(model_temperature);
  p.top_p = request.top_p.value_or(static_cast<float>(model.top_p.value_or(1.0)));
  p.top_k = request.top_k.value_or(model.top_k.value_or(0));
  p.min_p = request.min_p.value_or(static_cast<float>(model.min_p.value_or(0.0)));
  p.repetition_penalty =
      request.repetition_penalty.value_or(static_cast<float>(model.repetition_penalty.value_or(1.0)));
  return p;
}

int32_t DefaultMaxTokens(const GenerationDefaults& model, int32_t server_default) {
  return model.max_new_tokens.value_or(server_default);
}

}  // namespace tandem
