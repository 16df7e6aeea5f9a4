// The model's weights, read-only, by lifetime separate from the config (the
// blueprint) and the run state (activations). Large matrices are views into
// their TensorSource (an mmap'd checkpoint or an in-memory synthetic model);
// small vectors (norms, biases) are converted to f32 once at load.
//
// Legend: V vocab, D hidden, I intermediate, Is shared expert's, Id dense layers', E experts, Hq = heads * head_dim,
// Hkv = kv heads * head_dim.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/tensor_view.h"
#include "common/kernels/linear.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"

namespace tandem {

struct NormWeights {
  std::vector<float> weight;  // [D] f32
  std::vector<float> bias;    // [D] f32 for LayerNorm, empty for RMSNorm
};

struct ExpertWeights {
  LinearWeight w1;  // gate_proj [I, D]
  LinearWeight w2;  // down_proj [D, I]
  LinearWeight w3;  // up_proj   [I, D]
};

// DeepSeek's multi-head latent attention (R kv_lora_rank, Rq q_lora_rank,
// qhd = nope + rope, H heads). The absorbed form's per-head matrices are
// derived from kv_b_proj at load: k_b_h = (kv_b's key rows of head h)^T
// ([R, nope], so q_nope folds into the latent: q_lat = k_b_h q_nope), and
// v_b_h = its value rows ([v, R], viewed in place).
struct LatentAttentionWeights {
  LinearWeight q_a_proj;         // [Rq, D]; null without q_lora_rank (LayerWeights::q_proj [H qhd, D])
  std::vector<float> q_a_norm;   // [Rq] f32
  LinearWeight q_b_proj;         // [H qhd, Rq]
  LinearWeight kv_a_proj;        // [R + rope, D] kv_a_proj_with_mqa
  std::vector<float> kv_a_norm;  // [R] f32
  LinearWeight kv_b_proj;        // [H (nope + v), R]
  LinearWeight k_b;              // [H R, nope], in k_b_bytes (F32 when kv_b is, else BF16)
  std::vector<uint8_t> k_b_bytes;

  // Head h's slices: k_b_h [R, nope] and v_b_h [v, R].
  LinearWeight KeyAbsorb(int64_t head) const;
  LinearWeight ValueUp(int64_t head, int64_t nope, int64_t v) const;
};

struct LayerWeights {
  NormWeights input_norm;
  LinearWeight q_proj;                                // [Hq, D]
  LinearWeight k_proj;                                // [Hkv, D]
  LinearWeight v_proj;                                // [Hkv, D]
  LinearWeight o_proj;                                // [D, Hq] (MLA: [D, H v])
  LatentAttentionWeights mla;                         // DeepSeek only
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // f32, empty without attention_bias
  std::vector<float> q_norm, k_norm;                  // [head_dim] (OLMoE: [Hq], [Hkv]) f32, empty without qk_norm
  NormWeights post_attention_norm;
  // An MoE layer's router and experts; both empty in a dense layer.
  LinearWeight router;                 // [E, D] block_sparse_moe.gate (Qwen3: mlp.gate)
  std::vector<float> router_correction_bias;  // [E] f32 (GLM-4.5); empty without one
  std::vector<ExpertWeights> experts;  // [E]
  // The shared expert ([Is, D] / [D, Is]) and Qwen2-MoE's gate row [D] f32;
  // empty (w1.data null, gate empty) without one (the gate: ungated).
  ExpertWeights shared_expert;
  std::vector<float> shared_expert_gate;
  // A dense layer's MLP ([Id, D] / [D, Id]); w1.data null in an MoE layer.
  ExpertWeights dense_mlp;
};

// Immutable after load; any thread may read it.
struct ModelWeights {
  ModelConfig config;
  TensorView embed_tokens;  // [V, D]
  std::vector<LayerWeights> layers;
  NormWeights final_norm;
  LinearWeight lm_head;                        // [V, D] (embed_tokens when tied)
  std::vector<float> lm_head_bias;             // [V] f32 or empty
  std::shared_ptr<const TensorSource> source;  // keeps the viewed bytes alive
  int64_t total_bytes = 0;                     // bytes of every tensor used
  int64_t expert_bytes = 0;                    // bytes of all expert FFN weights
};

// Binds every tensor the config implies; a missing tensor, a wrong shape or a
// non-float dtype is an error naming the tensor and the source.
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const ModelConfig& config,
                                                               std::shared_ptr<const TensorSource> source);

}  // namespace tandem
