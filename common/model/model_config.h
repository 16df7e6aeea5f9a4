// The model's blueprint, read from a Hugging Face config.json.
//
// Three architectures, each with its own norm and router (ARCHITECTURE.md):
//   MixtralForCausalLM  — RMSNorm, router = softmax over the top-k logits, no biases.
//   PhiMoEForCausalLM   — nn.LayerNorm (mean-subtracting, with bias), sparsemixer
//                         router (top-2, jitter band, weights not renormalised),
//                         biases on q/k/v/o and lm_head, longrope RoPE scaling.
//   Qwen3MoeForCausalLM — RMSNorm, and RMSNorm over each head of q and k
//                         before RoPE (QK norm); many small experts; router =
//                         softmax over all experts, top-k, renormalised over
//                         the k when norm_topk_prob; head_dim given apart.
//   Qwen2MoeForCausalLM — Qwen3's router without QK norm; biases on q, k, v
//                         (not o); a shared expert every token runs, scaled
//                         by sigmoid(shared_expert_gate · x).
//   OlmoeForCausalLM    — RMSNorm over the whole q and k projections (QK norm
//                         over H·hd and Hkv·hd values), Qwen3's router.
//   Glm4MoeForCausalLM  — GLM-4.5: biases on q, k, v; optional per-head QK
//                         norm (use_qk_norm); RoPE over the first
//                         partial_rotary_factor of each head; router =
//                         sigmoid scores, chosen by score + e_score_correction_bias
//                         within the best topk_group of n_group groups,
//                         weighted by the chosen scores (renormalised when
//                         norm_topk_prob) times routed_scaling_factor; an
//                         ungated shared expert; the first first_k_dense_replace
//                         layers dense. Its multi-token-prediction layers
//                         (num_nextn_predict_layers) are not run, as in HF.
//   DeepseekV2ForCausalLM / DeepseekV3ForCausalLM — multi-head latent
//                         attention (MLA): q through a low-rank q_a/q_b pair
//                         (q_lora_rank; V2-Lite: one q_proj), keys and values
//                         from one compressed latent (kv_lora_rank) and one
//                         rope key shared by every head, each head split into
//                         a nope and an interleaved-RoPE part; YaRN with
//                         mscale_all_dim on the softmax scale. GLM-4.5's
//                         shared experts and leading dense layers. V2's
//                         router: softmax, top-k within the best topk_group
//                         of n_group groups (a group scored by its best;
//                         "greedy": one group), weights renormalised when
//                         norm_topk_prob, else times routed_scaling_factor.
//                         V3's: GLM-4.5's sigmoid noaux_tc.
// Qwen2/3-MoE may make some layers dense (mlp_only_layers, decoder_sparse_step):
// their feed-forward is one SwiGLU MLP, no router and no experts.
// Extra keys are ignored, as Hugging Face does; missing or inconsistent
// fields are InvalidArgument naming the file and the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// Sizes beyond these are refused (InvalidArgument naming the field) before
// anything is allocated from them: no released model comes near any, so a
// config.json claiming more is corrupt or hostile (2^31 - 1 layers once made
// every process abort with std::bad_alloc).
inline constexpr int64_t kMaxLayers = 1024;
inline constexpr int64_t kMaxHiddenSize = 65536;
inline constexpr int64_t kMaxIntermediateSize = int64_t{1} << 20;
inline constexpr int64_t kMaxVocabSize = int64_t{1} << 22;
inline constexpr int64_t kMaxAttentionHeads = 1024;
inline constexpr int64_t kMaxExperts = 1024;
inline constexpr int64_t kMaxExpertsPerModel = int64_t{1} << 16;  // layers x experts (Mixtral: 256)
inline constexpr int64_t kMaxPositionEmbeddings = int64_t{1} << 24;
inline constexpr int64_t kMaxConfigFileBytes = int64_t{16} << 20;

enum class Architecture { kMixtral, kPhiMoE, kQwen3Moe, kQwen2Moe, kOlmoe, kGlm4Moe, kDeepseekV2, kDeepseekV3 };
enum class NormKind { kRmsNorm, kLayerNorm };
// kSigmoidGroupedTopK: DeepSeek-V3's noaux_tc, which GLM-4.5 uses;
// kSoftmaxGroupedTopK: DeepSeek-V2's greedy / group_limited_greedy (above).
enum class RouterKind { kSoftmaxTopK, kSparseMixer, kSigmoidGroupedTopK, kSoftmaxGroupedTopK };

// RoPE scaling (config.json's rope_scaling). PhiMoE's "longrope": per-
// frequency extension factors, chosen by whether the sequence is longer
// than original_max_position_embeddings, and cos/sin scaled by the matching
// mscale. "yarn" (Qwen3 and the other RMSNorm models): each frequency
// blended between itself and itself / factor by a ramp over the pairs
// between beta_fast and beta_slow rotations in the original context, and
// cos/sin scaled by attention_factor (0.1 ln(factor) + 1 unless given).
struct RopeScaling {
  std::string type;                  // "" (none), "longrope" or "yarn"
  std::vector<double> short_factor;  // [head_dim / 2]
  std::vector<double> long_factor;   // [head_dim / 2]
  double short_mscale = 1.0;
  double long_mscale = 1.0;
  int64_t original_max_position_embeddings = 0;
  double factor = 1.0;  // yarn
  double beta_fast = 32.0, beta_slow = 1.0;
  double attention_factor = 1.0;
  // DeepSeek's mscale_all_dim: the softmax scale is multiplied by
  // YarnMscale(factor, mscale_all_dim)^2; 0: not given (no change).
  double mscale_all_dim = 0.0;
  bool truncate = true;
};

struct ModelConfig {
  Architecture architecture = Architecture::kMixtral;
  std::string architecture_name;  // as in config.json, e.g. "MixtralForCausalLM"
  std::string model_type;         // "mixtral" / "phimoe" / "qwen3_moe" / "qwen2_moe" / "olmoe" / "glm4_moe"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // D
  int64_t intermediate_size = 0;    // I, per routed expert (Qwen2/3: moe_intermediate_size)
  // The shared expert every token runs (Is wide; Qwen2-MoE gates it by
  // sigmoid(shared_expert_gate · x), GLM-4.5 does not: n_shared_experts x
  // moe_intermediate_size); 0: none. Dense work, run by the backend, never
  // routed or planned.
  int64_t shared_expert_intermediate_size = 0;
  int64_t num_hidden_layers = 0;    // L
  // Layers whose feed-forward is one dense SwiGLU MLP (mlp.gate_proj, up_proj,
  // down_proj; dense_intermediate_size wide) instead of routed experts:
  // dense work on the backend, like attention; sorted, unique. Every other
  // layer is an MoE layer.
  std::vector<int64_t> dense_layers;
  int64_t dense_intermediate_size = 0;  // Qwen's intermediate_size; 0 when not given
  int64_t num_attention_heads = 0;  // H
  int64_t num_key_value_heads = 0;  // Hkv (GQA groups)
  int64_t head_dim = 0;             // hidden_size / H unless given
  // Values of each head RoPE rotates, from the front (GLM-4.5: head_dim x
  // partial_rotary_factor); 0: the whole head.
  int64_t rotary_dim = 0;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;  // also the LayerNorm eps for PhiMoE
  std::optional<int64_t> sliding_window;
  int64_t num_local_experts = 0;    // E
  int64_t num_experts_per_tok = 0;  // K (num_experts_per_token in our glossary)
  bool attention_bias = false;  // biases on q, k, v, and on o except for Qwen2-MoE (qkv only)
  bool lm_head_bias = false;
  bool tie_word_embeddings = false;
  double router_jitter_noise = 0.0;  // PhiMoE sparsemixer's jitter_eps
  // Softmax top-k routers: the k weights renormalised to sum to 1 (Mixtral
  // always; Qwen3's norm_topk_prob), or the full softmax's values kept.
  bool norm_topk_prob = true;
  // The sigmoid router's groups (n_group, topk_group) and the factor on
  // its weights (routed_scaling_factor).
  int64_t n_group = 1;
  int64_t topk_group = 1;
  double routed_scaling_factor = 1.0;
  // GLM-4.5's use_qk_norm: per-head RMSNorm of q and k before RoPE.
  bool use_qk_norm = false;
  // DeepSeek's multi-head latent attention (kv_lora_rank > 0): head_dim is
  // qk_nope_head_dim + qk_rope_head_dim (q and k), v_head_dim the values';
  // q_lora_rank 0: q from one q_proj (V2-Lite). num_key_value_heads equals
  // the heads (every head has its own k and v, from the shared latent).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int32_t bos_token_id = 1;
  std::vector<int32_t> eos_token_ids;  // config may give one id or a list
  std::string torch_dtype;
  RopeScaling rope_scaling;

  NormKind norm_kind() const {
    return architecture == Architecture::kPhiMoE ? NormKind::kLayerNorm : NormKind::kRmsNorm;
  }
  RouterKind router_kind() const {
    if (architecture == Architecture::kPhiMoE) return RouterKind::kSparseMixer;
    if (architecture == Architecture::kGlm4Moe || architecture == Architecture::kDeepseekV3)
      return RouterKind::kSigmoidGroupedTopK;
    if (architecture == Architecture::kDeepseekV2) return RouterKind::kSoftmaxGroupedTopK;
    return RouterKind::kSoftmaxTopK;
  }
  bool deepseek() const {
    return architecture == Architecture::kDeepseekV2 || architecture == Architecture::kDeepseekV3;
  }
  // Multi-head latent attention (DeepSeek-V2/V3).
  bool mla() const { return kv_lora_rank > 0; }
  // The sigmoid router's per-expert bias ([E] f32, mlp.gate.e_score_correction_bias),
  // added to the scores for choosing the experts only.
  bool router_correction_bias() const { return router_kind() == RouterKind::kSigmoidGroupedTopK; }
  // Qwen3: RMSNorm over each head of q and k (q_norm, k_norm: [head_dim]),
  // before RoPE. OLMoE: over the whole projections (q_norm [Hq], k_norm [Hkv]).
  // GLM-4.5 with use_qk_norm: as Qwen3.
  bool qk_norm() const {
    return architecture == Architecture::kQwen3Moe || architecture == Architecture::kOlmoe ||
           (architecture == Architecture::kGlm4Moe && use_qk_norm);
  }
  bool qk_norm_per_head() const { return qk_norm() && architecture != Architecture::kOlmoe; }
  bool o_proj_bias() const {
    return attention_bias && architecture != Architecture::kQwen2Moe && architecture != Architecture::kGlm4Moe;
  }
  // GLM-4.5 and DeepSeek: n_shared_experts x moe_intermediate_size, named
  // mlp.shared_experts, leading dense layers from first_k_dense_replace.
  bool deepseek_moe_layout() const { return architecture == Architecture::kGlm4Moe || deepseek(); }
  bool shared_expert() const { return shared_expert_intermediate_size > 0; }
  // Qwen2-MoE's shared expert is scaled by sigmoid(shared_expert_gate · x).
  bool shared_expert_gated() const { return shared_expert() && architecture == Architecture::kQwen2Moe; }
  // The values of each head RoPE rotates (rotary_dim, MLA's rope part, or
  // the whole head).
  int64_t rope_dim() const { return mla() ? qk_rope_head_dim : rotary_dim > 0 ? rotary_dim : head_dim; }
  bool dense_layer(int64_t layer) const;
  bool moe_layer(int64_t layer) const { return !dense_layer(layer); }
  int64_t num_moe_layers() const { return num_hidden_layers - static_cast<int64_t>(dense_layers.size()); }
  // The first MoE layer (Validate ensures there is one): where code that needs
  // any expert's weights looks.
  int64_t first_moe_layer() const;
  // Qwen2/3-MoE and OLMoE name the MoE block "mlp" and the expert matrices
  // by role (mlp.experts.e.gate_proj); Mixtral and PhiMoE "block_sparse_moe" and w1/w2/w3.
  bool mlp_expert_names() const {
    return architecture == Architecture::kQwen3Moe || architecture == Architecture::kQwen2Moe ||
           architecture == Architecture::kOlmoe || deepseek_moe_layout();
  }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  // The attention output o_proj reads: H x v_head_dim under MLA, else q_dim.
  int64_t attention_out_dim() const { return mla() ? num_attention_heads * v_head_dim : q_dim(); }
  // One position's row in each layer's KV cache: keys and values of every kv
  // head; under MLA the normalised latent then the rotated rope key
  // (kv_lora_rank + qk_rope_head_dim), and no value row (the values are
  // read back from the latent).
  int64_t cache_key_dim() const { return mla() ? kv_lora_rank + qk_rope_head_dim : kv_dim(); }
  int64_t cache_value_dim() const { return mla() ? 0 : kv_dim(); }
  // The softmax's scale on q.k: 1/sqrt(head_dim), times DeepSeek's
  // YarnMscale(factor, mscale_all_dim)^2 under its YaRN.
  double attention_scale() const;

  // Checks cross-field consistency; `source` names the file in messages.
  absl::Status Validate(const std::string& source = "config") const;
};

// YaRN's attention temperature (HF's get_mscale, llama.cpp's
// 1 + 0.1 ln(1 / freq_scale)): 0.1 · mscale · ln(factor) + 1, 1 below factor 1.
double YarnMscale(double factor, double mscale = 1.0);
// YaRN stretches the original context by its factor: that is the context a
// model with it serves (as vLLM and llama.cpp take it), whatever
// max_position_embeddings says (Qwen3's 40960 with factor 4 over 32768).
// Raises max_position_embeddings to it (within kMaxPositionEmbeddings).
void StretchContextForYarn(ModelConfig& config);

// Hugging Face's names of an architecture: "Qwen2MoeForCausalLM", "qwen2_moe".
std::string_view ArchitectureClassName(Architecture architecture);
std::string_view ArchitectureModelType(Architecture architecture);

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& config_json);
// Writes the fields Hugging Face would write for this architecture.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace tandem
