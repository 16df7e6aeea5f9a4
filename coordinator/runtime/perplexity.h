// Perplexity of a model over a token stream, and the KL divergence of its
// next-token distributions from a reference model's (e.g. a quantized copy
// against the bf16 original), computed from full logit rows of the engine's
// own forward pass (Engine::Forward with all_logits), so what is measured is
// what tandem-generate and tandem-server compute.
//
// The stream is cut into windows of `context` tokens whose starts advance by
// `stride`; each window is a fresh sequence (an empty KV cache), and a token
// is scored once, in the first window that holds it with at least one token
// before it (Hugging Face's sliding-window perplexity). With stride < context
// every token but the first is scored, with at least context - stride tokens
// before it from the second window on; with stride = context (disjoint
// windows) each window's first token has nothing before it and is not scored.
//
// Legend: N tokens in the stream, C context, V vocab.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "coordinator/runtime/local_runtime.h"

namespace tandem {

struct PerplexityOptions {
  int64_t context = 512;  // tokens per window, in [2, max_position_embeddings]
  int64_t stride = 0;     // window start advance in [1, context]; 0: context / 2
};

struct PerplexityResult {
  int64_t tokens = 0;     // N
  int64_t scored = 0;     // predictions scored (see the file comment)
  int64_t windows = 0;    // forward passes per model
  double mean_nll = 0;    // nats per scored token
  double perplexity = 0;  // exp(mean_nll)
  // With a reference: the mean and largest per-token KL(reference || model)
  // in nats, and the share of positions where both models' most likely
  // token is the same.
  bool has_reference = false;
  double mean_kl = 0, max_kl = 0, top1_agreement = 0;
  double seconds = 0;  // wall time of the forward passes and the scoring
};

// The stride `options` means (0: context / 2).
int64_t EffectiveStride(const PerplexityOptions& options);

// InvalidArgument naming --context or --stride when one is out of range for
// `config`.
absl::Status CheckPerplexityOptions(const PerplexityOptions& options, const ModelConfig& config);

// Runs `model` (and `reference`, when not null) over `tokens` (the caller's
// thread; the runtimes are used by nobody else meanwhile). InvalidArgument
// when the options do not fit (see CheckPerplexityOptions), the stream has
// fewer than 2 tokens or an id outside the vocabulary, or the reference's
// vocabulary size differs; the engine's error otherwise.
absl::StatusOr<PerplexityResult> MeasurePerplexity(LocalRuntime& model, LocalRuntime* reference,
                                                   std::span<const int32_t> tokens, const PerplexityOptions& options);

}  // namespace tandem
