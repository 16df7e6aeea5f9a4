// The one vocabulary for weights: every Hugging Face tensor name tandem reads
// or writes is built here, per architecture, together with its expected shape.
// Loading, synthetic model generation and logs all speak it.
//
// Legend: V vocab, D hidden, I intermediate, Is shared expert's, Id dense layers', E experts, Hq = H * head_dim,
// Hkv = num_key_value_heads * head_dim.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/model/model_config.h"

namespace tandem {

enum class WeightRole {
  kEmbedTokens,    // [V, D]
  kInputNorm,      // [D]
  kInputNormBias,  // [D]        LayerNorm only
  kQProj,
  kKProj,
  kVProj,  // [Hq, D], [Hkv, D], [Hkv, D]
  kQBias,
  kKBias,
  kVBias,                  // [Hq], [Hkv], [Hkv]   attention_bias only
  kOProj,                  // [D, Hq]
  kOBias,                  // [D]        attention_bias only
  kQNorm,                  // [head_dim] Qwen3 self_attn.q_norm; [Hq] OLMoE's
  kKNorm,                  // [head_dim] Qwen3; [Hkv] OLMoE's
  kPostAttentionNorm,      // [D]
  kPostAttentionNormBias,  // [D]        LayerNorm only
  kRouter,                 // [E, D]     block_sparse_moe.gate (Qwen3: mlp.gate)
  kRouterCorrectionBias,   // [E]        GLM-4.5 mlp.gate.e_score_correction_bias
  kExpertW1,               // [I, D]     gate_proj
  kExpertW2,               // [D, I]     down_proj
  kExpertW3,               // [I, D]     up_proj
  kSharedExpertGate,       // [1, D]     Qwen2-MoE mlp.shared_expert_gate
  kSharedW1,               // [Is, D]    mlp.shared_expert.gate_proj (GLM-4.5: shared_experts)
  kSharedW2,               // [D, Is]    mlp.shared_expert.down_proj
  kSharedW3,               // [Is, D]    mlp.shared_expert.up_proj
  kDenseW1,                // [Id, D]    a dense layer's mlp.gate_proj
  kDenseW2,                // [D, Id]    mlp.down_proj
  kDenseW3,                // [Id, D]    mlp.up_proj
  kFinalNorm,              // [D]
  kFinalNormBias,          // [D]        LayerNorm only
  kLmHead,                 // [V, D]
  kLmHeadBias,             // [V]        lm_head_bias only
  // Multi-head latent attention (DeepSeek; R kv_lora_rank, Rq q_lora_rank,
  // qhd = nope + rope, H heads). kQProj is [H qhd, D] without q_lora_rank.
  kQAProj,   // [Rq, D]              self_attn.q_a_proj
  kQANorm,   // [Rq]                 self_attn.q_a_layernorm
  kQBProj,   // [H qhd, Rq]          self_attn.q_b_proj
  kKvAProj,  // [R + rope, D]        self_attn.kv_a_proj_with_mqa
  kKvANorm,  // [R]                  self_attn.kv_a_layernorm
  kKvBProj,  // [H (nope + v), R]    self_attn.kv_b_proj
  // GGUF's split of kv_b (llama.cpp's converter writes these beside or
  // instead of it): each head's key part transposed, and its value part.
  kKBProj,  // [H R, nope]          blk.l.attn_k_b
  kVBProj,  // [H v, R]             blk.l.attn_v_b
};

struct WeightSpec {
  std::string name;
  WeightRole role;
  int layer = -1;   // -1 for model-level tensors
  int expert = -1;  // -1 unless an expert tensor
  std::vector<int64_t> shape;
};

// Hugging Face name of one tensor, e.g. "model.layers.3.block_sparse_moe.experts.5.w1.weight".
std::string WeightName(const ModelConfig& config, WeightRole role, int layer = -1, int expert = -1);
std::vector<int64_t> WeightShape(const ModelConfig& config, WeightRole role);
// Every tensor the architecture stores, in checkpoint order. lm_head is left out
// when tie_word_embeddings is set.
std::vector<WeightSpec> ExpectedWeights(const ModelConfig& config);

}  // namespace tandem
