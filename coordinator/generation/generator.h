// Generation for one sequence: validate the request, prefill the prompt,
// decode token by token with the KV cache, stop on EOS, a stop id or
// max_tokens, and time every part. (Batched serving of many requests is the
// scheduler's job; this is its single-sequence core and the CLI's engine.)
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/kv_cache.h"
#include "coordinator/generation/sampler.h"

namespace tandem {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  int32_t max_tokens = 16;
  SamplingParams sampling;
  std::vector<int32_t> stop_ids;  // stop after emitting any of these (in addition to EOS)
  bool ignore_eos = false;
  int32_t logprobs = 0;  // top-K log probabilities per generated position, 0 = none
};

struct GeneratedToken {
  int32_t id = 0;
  std::string text;  // the token's piece ("" without a tokenizer)
  double logprob = 0.0;
  std::vector<std::pair<int32_t, double>> top_logprobs;  // highest first
};

enum class FinishReason { kEos, kStopId, kMaxTokens, kStopString };
std::string_view FinishReasonName(FinishReason reason);

struct GenerationTiming {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_ms = 0;  // prompt forward pass
  double time_to_first_token_ms = 0;
  double decode_ms = 0;  // all decode steps after the first token
  double total_ms = 0;
  double prefill_tokens_per_s = 0;
  double decode_tokens_per_s = 0;  // (generated - 1) / decode time
};

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  std::vector<GeneratedToken> tokens;
  FinishReason finish_reason = FinishReason::kMaxTokens;
  GenerationTiming timing;
};

// InvalidArgument naming the field (prompt_ids[i], stop_ids[i], max_tokens,
// logprobs, temperature, top_k, top_p, logit_bias) when `request` cannot run on a model
// with `config`; the prompt plus max_tokens must fit the context.
absl::Status ValidateGenerationRequest(const ModelConfig& config, const GenerationRequest& request);

// Borrows everything; one Generate at a time (engine thread).
// The prompt goes through the engine in chunks of at most
// kPrefillChunkTokens (llama.cpp's default micro-batch): one chunk's
// activations are all a prefill holds beside the KV cache, however long the
// prompt (docs/BENCHMARKS.md, "Long prompts").
class Generator {
 public:
  static constexpr size_t kPrefillChunkTokens = 512;

  Generator(const Model* model, Engine* engine, KvBlockPool* kv_pool)
      : model_(model), engine_(engine), kv_pool_(kv_pool) {}

  // InvalidArgument naming the field for a bad request; on_token (optional)
  // sees each token as it is produced.
  absl::StatusOr<GenerationResult> Generate(const GenerationRequest& request,
                                            const std::function<void(const GeneratedToken&)>& on_token = {});
  absl::Status Validate(const GenerationRequest& request) const;

 private:
  // The last chunk's length: the prompt's tail that the first step forwards
  // (1 to kPrefillChunkTokens tokens; 0 for an empty prompt).
  static size_t LastChunkLength(size_t prompt_length);
  // Forwards every chunk before the last into `kv`.
  absl::Status PrefillAllButLastChunk(SequenceKv& kv, std::span<const int32_t> prompt, std::vector<float>* logits);

  const Model* model_;
  Engine* engine_;
  KvBlockPool* kv_pool_;
};

}  // namespace tandem
