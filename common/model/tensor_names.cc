#include "common/model/tensor_names.h"

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Mixtral and PhiMoE share Hugging Face's naming; PhiMoE adds ".bias" twins;
// Qwen2/3-MoE and OLMoE name the MoE block "mlp" and its experts' matrices by role.
std::string LayerPrefix(int layer) { return absl::StrCat("model.layers.", layer, "."); }

std::string MlpExpertName(WeightRole role, const std::string& layer_prefix, int expert) {
  const char* matrix = role == WeightRole::kExpertW1 ? "gate_proj" : role == WeightRole::kExpertW2 ? "down_proj" : "up_proj";
  return absl::StrCat(layer_prefix, "mlp.experts.", expert, ".", matrix, ".weight");
}

// MLA's projections in checkpoint order (modeling_deepseek.py's).
template <typename Add>
void AddLatentAttention(const ModelConfig& c, int l, Add& add) {
  if (c.q_lora_rank > 0) {
    add(WeightRole::kQAProj, l);
    add(WeightRole::kQANorm, l);
    add(WeightRole::kQBProj, l);
  } else {
    add(WeightRole::kQProj, l);
  }
  add(WeightRole::kKvAProj, l);
  add(WeightRole::kKvANorm, l);
  add(WeightRole::kKvBProj, l);
  add(WeightRole::kOProj, l);
}

}  // namespace

std::string WeightName(const ModelConfig& config, WeightRole role, int layer, int expert) {
  const std::string p = LayerPrefix(layer);
  const std::string e = absl::StrCat(p, "block_sparse_moe.experts.", expert, ".");
  if (config.mlp_expert_names()) {
    if (role == WeightRole::kRouter) return p + "mlp.gate.weight";
    if (role == WeightRole::kRouterCorrectionBias) return p + "mlp.gate.e_score_correction_bias";
    if (role == WeightRole::kExpertW1 || role == WeightRole::kExpertW2 || role == WeightRole::kExpertW3) {
      return MlpExpertName(role, p, expert);
    }
  }
  if (config.deepseek_moe_layout()) {  // DeepSeek's names: shared_experts
    if (role == WeightRole::kSharedW1) return p + "mlp.shared_experts.gate_proj.weight";
    if (role == WeightRole::kSharedW2) return p + "mlp.shared_experts.down_proj.weight";
    if (role == WeightRole::kSharedW3) return p + "mlp.shared_experts.up_proj.weight";
  }
  switch (role) {
    case WeightRole::kEmbedTokens: return "model.embed_tokens.weight";
    case WeightRole::kInputNorm: return p + "input_layernorm.weight";
    case WeightRole::kInputNormBias: return p + "input_layernorm.bias";
    case WeightRole::kQProj: return p + "self_attn.q_proj.weight";
    case WeightRole::kKProj: return p + "self_attn.k_proj.weight";
    case WeightRole::kVProj: return p + "self_attn.v_proj.weight";
    case WeightRole::kQBias: return p + "self_attn.q_proj.bias";
    case WeightRole::kKBias: return p + "self_attn.k_proj.bias";
    case WeightRole::kVBias: return p + "self_attn.v_proj.bias";
    case WeightRole::kOProj: return p + "self_attn.o_proj.weight";
    case WeightRole::kOBias: return p + "self_attn.o_proj.bias";
    case WeightRole::kQNorm: return p + "self_attn.q_norm.weight";
    case WeightRole::kKNorm: return p + "self_attn.k_norm.weight";
    case WeightRole::kPostAttentionNorm: return p + "post_attention_layernorm.weight";
    case WeightRole::kPostAttentionNormBias: return p + "post_attention_layernorm.bias";
    case WeightRole::kRouter: return p + "block_sparse_moe.gate.weight";
    case WeightRole::kRouterCorrectionBias: return p + "block_sparse_moe.gate.e_score_correction_bias";
    case WeightRole::kExpertW1: return e + "w1.weight";
    case WeightRole::kExpertW2: return e + "w2.weight";
    case WeightRole::kExpertW3: return e + "w3.weight";
    case WeightRole::kSharedExpertGate: return p + "mlp.shared_expert_gate.weight";
    case WeightRole::kSharedW1: return p + "mlp.shared_expert.gate_proj.weight";
    case WeightRole::kSharedW2: return p + "mlp.shared_expert.down_proj.weight";
    case WeightRole::kSharedW3: return p + "mlp.shared_expert.up_proj.weight";
    case WeightRole::kDenseW1: return p + "mlp.gate_proj.weight";
    case WeightRole::kDenseW2: return p + "mlp.down_proj.weight";
    case WeightRole::kDenseW3: return p + "mlp.up_proj.weight";
    case WeightRole::kFinalNorm: return "model.norm.weight";
    case WeightRole::kFinalNormBias: return "model.norm.bias";
    case WeightRole::kLmHead: return "lm_head.weight";
    case WeightRole::kLmHeadBias: return "lm_head.bias";
    case WeightRole::kQAProj: return p + "self_attn.q_a_proj.weight";
    case WeightRole::kQANorm: return p + "self_attn.q_a_layernorm.weight";
    case WeightRole::kQBProj: return p + "self_attn.q_b_proj.weight";
    case WeightRole::kKvAProj: return p + "self_attn.kv_a_proj_with_mqa.weight";
    case WeightRole::kKvANorm: return p + "self_attn.kv_a_layernorm.weight";
    case WeightRole::kKvBProj: return p + "self_attn.kv_b_proj.weight";
    case WeightRole::kKBProj: return p + "self_attn.k_b_proj.weight";
    case WeightRole::kVBProj: return p + "self_attn.v_b_proj.weight";
  }
  return "";
}

std::vector<int64_t> WeightShape(const ModelConfig& c, WeightRole role) {
  const int64_t d = c.hidden_size;
  switch (role) {
    case WeightRole::kEmbedTokens:
    case WeightRole::kLmHead: return {c.vocab_size, d};
    case WeightRole::kLmHeadBias: return {c.vocab_size};
    case WeightRole::kInputNorm:
    case WeightRole::kInputNormBias:
    case WeightRole::kPostAttentionNorm:
    case WeightRole::kPostAttentionNormBias:
    case WeightRole::kFinalNorm:
    case WeightRole::kFinalNormBias:
    case WeightRole::kOBias: return {d};
    case WeightRole::kQNorm: return {c.qk_norm_per_head() ? c.head_dim : c.q_dim()};
    case WeightRole::kKNorm: return {c.qk_norm_per_head() ? c.head_dim : c.kv_dim()};
    case WeightRole::kQProj: return {c.q_dim(), d};
    case WeightRole::kKProj:
    case WeightRole::kVProj: return {c.kv_dim(), d};
    case WeightRole::kQBias: return {c.q_dim()};
    case WeightRole::kKBias:
    case WeightRole::kVBias: return {c.kv_dim()};
    case WeightRole::kOProj: return {d, c.attention_out_dim()};
    case WeightRole::kQAProj: return {c.q_lora_rank, d};
    case WeightRole::kQANorm: return {c.q_lora_rank};
    case WeightRole::kQBProj: return {c.q_dim(), c.q_lora_rank};
    case WeightRole::kKvAProj: return {c.kv_lora_rank + c.qk_rope_head_dim, d};
    case WeightRole::kKvANorm: return {c.kv_lora_rank};
    case WeightRole::kKvBProj: return {c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank};
    case WeightRole::kKBProj: return {c.num_attention_heads * c.kv_lora_rank, c.qk_nope_head_dim};
    case WeightRole::kVBProj: return {c.num_attention_heads * c.v_head_dim, c.kv_lora_rank};
    case WeightRole::kRouter: return {c.num_local_experts, d};
    case WeightRole::kRouterCorrectionBias: return {c.num_local_experts};
    case WeightRole::kExpertW1:
    case WeightRole::kExpertW3: return {c.intermediate_size, d};
    case WeightRole::kExpertW2: return {d, c.intermediate_size};
    case WeightRole::kSharedExpertGate: return {1, d};
    case WeightRole::kSharedW1:
    case WeightRole::kSharedW3: return {c.shared_expert_intermediate_size, d};
    case WeightRole::kSharedW2: return {d, c.shared_expert_intermediate_size};
    case WeightRole::kDenseW1:
    case WeightRole::kDenseW3: return {c.dense_intermediate_size, d};
    case WeightRole::kDenseW2: return {d, c.dense_intermediate_size};
  }
  return {};
}

std::vector<WeightSpec> ExpectedWeights(const ModelConfig& c) {
  const bool layer_norm = c.norm_kind() == NormKind::kLayerNorm;
  std::vector<WeightSpec> specs;
  auto add = [&](WeightRole role, int layer = -1, int expert = -1) {
    specs.push_back({WeightName(c, role, layer, expert), role, layer, expert, WeightShape(c, role)});
  };
  add(WeightRole::kEmbedTokens);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    add(WeightRole::kInputNorm, l);
    if (layer_norm) add(WeightRole::kInputNormBias, l);
    if (c.mla()) {
      AddLatentAttention(c, l, add);
    } else {
      add(WeightRole::kQProj, l);
      add(WeightRole::kKProj, l);
      add(WeightRole::kVProj, l);
      add(WeightRole::kOProj, l);
    }
    if (c.qk_norm()) {
      add(WeightRole::kQNorm, l);
      add(WeightRole::kKNorm, l);
    }
    if (c.attention_bias) {
      add(WeightRole::kQBias, l);
      add(WeightRole::kKBias, l);
      add(WeightRole::kVBias, l);
      if (c.o_proj_bias()) add(WeightRole::kOBias, l);
    }
    add(WeightRole::kPostAttentionNorm, l);
    if (layer_norm) add(WeightRole::kPostAttentionNormBias, l);
    if (c.dense_layer(l)) {
      add(WeightRole::kDenseW1, l);
      add(WeightRole::kDenseW2, l);
      add(WeightRole::kDenseW3, l);
      continue;
    }
    add(WeightRole::kRouter, l);
    if (c.router_correction_bias()) add(WeightRole::kRouterCorrectionBias, l);
    for (int e = 0; e < c.num_local_experts; ++e) {
      add(WeightRole::kExpertW1, l, e);
      add(WeightRole::kExpertW2, l, e);
      add(WeightRole::kExpertW3, l, e);
    }
    if (c.shared_expert()) {
      if (c.shared_expert_gated()) add(WeightRole::kSharedExpertGate, l);
      add(WeightRole::kSharedW1, l);
      add(WeightRole::kSharedW2, l);
      add(WeightRole::kSharedW3, l);
    }
  }
  add(WeightRole::kFinalNorm);
  if (layer_norm) add(WeightRole::kFinalNormBias);
  if (!c.tie_word_embeddings) add(WeightRole::kLmHead);
  if (c.lm_head_bias) add(WeightRole::kLmHeadBias);
  return specs;
}

}  // namespace tandem
