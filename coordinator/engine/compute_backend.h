// What the engine asks of the device that holds the dense part of the model
// (embedding, attention, norms, router, combine, lm_head). The CPU backend
// implements it now; the CUDA backend implements the same interface.
//
// Legend: T rows in the batch, D hidden, E experts, K num_experts_per_tok, V vocab.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/engine/kv_cache.h"

namespace tandem {

// A run of consecutive new tokens of one sequence inside a batch: rows
// [row_offset, row_offset + num_tokens) hold positions
// [start_position, start_position + num_tokens) of `kv`.
struct SequenceSlice {
  SequenceKv* kv = nullptr;
  int64_t start_position = 0;
  int64_t num_tokens = 0;
  int64_t row_offset = 0;
};

// Called from the engine thread only.
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // hidden[t] = embed_tokens[tokens[t]]                      hidden: [T, D]
  virtual absl::Status Embed(std::span<const int32_t> tokens, float* hidden) = 0;

  // hidden += o_proj(attention(input_norm(hidden))), after appending these
  // rows' keys and values to each slice's cache (which must have room).
  virtual absl::Status Attention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows, float* hidden) = 0;

  // As Attention, when only the rows of `output_rows` (ascending) are read
  // afterwards (the last layer: the rows whose logits are asked for). Every
  // row's keys and values still reach the cache; hidden's other rows are
  // left unspecified. A backend may skip their queries, attention and output
  // projection; this default runs every row.
  virtual absl::Status AttentionForOutputRows(int layer, std::span<const SequenceSlice> slices, int64_t num_rows,
                                              std::span<const int64_t> output_rows, float* hidden) {
    return Attention(layer, slices, num_rows, hidden);
  }

  // moe_input = post_attention_norm(hidden)                  [T, D]
  // router_logits = gate(moe_input)                          [T, E]
  // experts, weights = the architecture's router            [T, K] each
  virtual absl::Status Router(int layer, int64_t num_rows, const float* hidden, float* moe_input, float* router_logits,
                              int32_t* experts, float* weights) = 0;

  // Qwen2-MoE's shared expert, dense work every row runs (never routed):
  //   s[t] = sigmoid(shared_expert_gate · moe_input[t]) · FFN_shared(moe_input[t])
  //   hidden[t] += s[t]; and s into `term` [T, D] when it is not null.
  // FailedPrecondition for a layer without a shared expert.
  virtual absl::Status SharedExpert(int layer, int64_t num_rows, const float* moe_input, float* hidden,
                                    float* term) = 0;

  // A dense layer's feed-forward (Qwen's mlp_only_layers), dense work like
  // attention (no router, no experts):
  //   moe_input = post_attention_norm(hidden)                [T, D]
  //   hidden[t] += down(silu(gate(moe_input[t])) * up(moe_input[t]))
  // FailedPrecondition for an MoE layer.
  virtual absl::Status DenseMlp(int layer, int64_t num_rows, float* hidden, float* moe_input) = 0;

  // hidden[t] += Σ_k weights[t,k] · expert_out[t·K + k]      expert_out: [T·K, D]
  virtual absl::Status Combine(int64_t num_rows, const float* weights, const float* expert_out, float* hidden) = 0;

  // logits[i] = lm_head(final_norm(hidden[rows[i]]))         logits: [rows, V]
  virtual absl::Status Logits(std::span<const int64_t> rows, const float* hidden, float* logits) = 0;
};

}  // namespace tandem
