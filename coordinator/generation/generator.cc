#include "coordinator/generation/generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopId: return "stop_id";
    case FinishReason::kMaxTokens: return "max_tokens";
    case FinishReason::kStopString: return "stop_string";
  }
  return "?";
}

absl::Status Generator::Validate(const GenerationRequest& request) const {
  return ValidateGenerationRequest(model_->config, request);
}

absl::Status ValidateGenerationRequest(const ModelConfig& config, const GenerationRequest& request) {
  if (request.prompt_ids.empty()) return absl::InvalidArgumentError("prompt is empty: give at least one token");
  for (size_t i = 0; i < request.prompt_ids.size(); ++i) {
    const int32_t id = request.prompt_ids[i];
    if (id < 0 || id >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_ids[", i, "] = ", id, " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  for (size_t i = 0; i < request.stop_ids.size(); ++i) {
    if (request.stop_ids[i] < 0 || request.stop_ids[i] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("stop_ids[", i, "] = ", request.stop_ids[i],
                                                     " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  if (request.max_tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", request.max_tokens));
  }
  const int64_t needed = static_cast<int64_t>(request.prompt_ids.size()) + request.max_tokens;
  if (needed > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("prompt (", request.prompt_ids.size(), " tokens) + max_tokens (",
                                                   request.max_tokens, ") exceeds the model's context of ",
                                                   config.max_position_embeddings, " positions"));
  }
  if (request.logprobs < 0 || request.logprobs > config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("logprobs must be in [0, ", config.vocab_size, "], got ", request.logprobs));
  }
  return request.sampling.Validate(config.vocab_size);
}

size_t Generator::LastChunkLength(size_t prompt_length) {
  if (prompt_length == 0) return 0;
  return prompt_length - (prompt_length - 1) / kPrefillChunkTokens * kPrefillChunkTokens;
}

absl::Status Generator::PrefillAllButLastChunk(SequenceKv& kv, std::span<const int32_t> prompt,
                                               std::vector<float>* logits) {
  const size_t ahead = prompt.size() - LastChunkLength(prompt.size());
  for (size_t begin = 0; begin < ahead; begin += kPrefillChunkTokens) {
    ForwardInput chunk{&kv, prompt.subspan(begin, kPrefillChunkTokens), false};
    TANDEM_RETURN_IF_ERROR(engine_->Forward({&chunk, 1}, logits));
  }
  return absl::OkStatus();
}

absl::StatusOr<GenerationResult> Generator::Generate(const GenerationRequest& request,
                                                     const std::function<void(const GeneratedToken&)>& on_token) {
  TANDEM_RETURN_IF_ERROR(Validate(request));
  const ModelConfig& config = model_->config;
  const auto start = std::chrono::steady_clock::now();
  GenerationResult result;
  result.prompt_ids = request.prompt_ids;
  SequenceKv kv(kv_pool_);
  Sampler sampler(request.sampling, request.prompt_ids);
  std::vector<float> logits;
  const size_t vocab = static_cast<size_t>(config.vocab_size);
  const std::vector<int32_t> eos = model_->EosIds();

  TANDEM_RETURN_IF_ERROR(PrefillAllButLastChunk(kv, request.prompt_ids, &logits));
  std::vector<int32_t> next(request.prompt_ids.end() - LastChunkLength(request.prompt_ids.size()),
                            request.prompt_ids.end());
  for (int32_t step = 0; step < request.max_tokens; ++step) {
    ForwardInput input{&kv, next, false};
    TANDEM_RETURN_IF_ERROR(engine_->Forward({&input, 1}, &logits));
    std::span<const float> position_logits(logits.data(), vocab);
    TANDEM_RETURN_IF_ERROR(CheckFiniteLogits(position_logits));
    GeneratedToken token;
    token.id = sampler.Sample(position_logits);
    token.logprob = LogProbability(sampler.biased(), token.id);
    if (request.logprobs > 0) token.top_logprobs = TopLogprobs(sampler.biased(), request.logprobs);
    if (model_->tokenizer) token.text = model_->tokenizer->PieceText(token.id);
    if (step == 0) {
      result.timing.prefill_ms = MillisSince(start);
      result.timing.time_to_first_token_ms = result.timing.prefill_ms;
    }
    if (on_token) on_token(token);
    result.tokens.push_back(std::move(token));
    const int32_t id = result.tokens.back().id;
    if (!request.ignore_eos && std::find(eos.begin(), eos.end(), id) != eos.end()) {
      result.finish_reason = FinishReason::kEos;
      break;
    }
    if (std::find(request.stop_ids.begin(), request.stop_ids.end(), id) != request.stop_ids.end()) {
      result.finish_reason = FinishReason::kStopId;
      break;
    }
    next.assign(1, id);
  }
  GenerationTiming& timing = result.timing;
  timing.total_ms = MillisSince(start);
  timing.prompt_tokens = static_cast<int64_t>(request.prompt_ids.size());
  timing.generated_tokens = static_cast<int64_t>(result.tokens.size());
  timing.decode_ms = timing.total_ms - timing.prefill_ms;
  if (timing.prefill_ms > 0) timing.prefill_tokens_per_s = 1000.0 * timing.prompt_tokens / timing.prefill_ms;
  if (timing.generated_tokens > 1 && timing.decode_ms > 0) {
    timing.decode_tokens_per_s = 1000.0 * (timing.generated_tokens - 1) / timing.decode_ms;
  }
  return result;
}

}  // namespace tandem
