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

enum class Architecture { kMixtral, kPhiMoE, kQwen3Moe };
enum class NormKind { kRmsNorm, kLayerNorm };
enum class RouterKind { kSoftmaxTopK, kSparseMixer };

// PhiMoE's "longrope": per-frequency extension factors, chosen by whether the
// sequence is longer than original_max_position_embeddings, and cos/sin scaled
// by the matching mscale.
struct RopeScaling {
  std::string type;                  // "" (none) or "longrope"
  std::vector<double> short_factor;  // [head_dim / 2]
  std::vector<double> long_factor;   // [head_dim / 2]
  double short_mscale = 1.0;
  double long_mscale = 1.0;
  int64_t original_max_position_embeddings = 0;
};

struct ModelConfig {
  Architecture architecture = Architecture::kMixtral;
  std::string architecture_name;  // as in config.json, e.g. "MixtralForCausalLM"
  std::string model_type;         // "mixtral" / "phimoe" / "qwen3_moe"

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;          // D
  int64_t intermediate_size = 0;    // I, per expert (Qwen3: moe_intermediate_size)
  int64_t num_hidden_layers = 0;    // L
  int64_t num_attention_heads = 0;  // H
  int64_t num_key_value_heads = 0;  // Hkv (GQA groups)
  int64_t head_dim = 0;             // hidden_size / H unless given
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;  // also the LayerNorm eps for PhiMoE
  std::optional<int64_t> sliding_window;
  int64_t num_local_experts = 0;    // E
  int64_t num_experts_per_tok = 0;  // K (num_experts_per_token in our glossary)
  bool attention_bias = false;
  bool lm_head_bias = false;
  bool tie_word_embeddings = false;
  double router_jitter_noise = 0.0;  // PhiMoE sparsemixer's jitter_eps
  // Softmax top-k routers: the k weights renormalised to sum to 1 (Mixtral
  // always; Qwen3's norm_topk_prob), or the full softmax's values kept.
  bool norm_topk_prob = true;
  int32_t bos_token_id = 1;
  std::vector<int32_t> eos_token_ids;  // config may give one id or a list
  std::string torch_dtype;
  RopeScaling rope_scaling;

  NormKind norm_kind() const {
    return architecture == Architecture::kPhiMoE ? NormKind::kLayerNorm : NormKind::kRmsNorm;
  }
  RouterKind router_kind() const {
    return architecture == Architecture::kPhiMoE ? RouterKind::kSparseMixer : RouterKind::kSoftmaxTopK;
  }
  // Qwen3: RMSNorm over each head of q and k (q_norm, k_norm: [head_dim]), before RoPE.
  bool qk_norm() const { return architecture == Architecture::kQwen3Moe; }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  // Checks cross-field consistency; `source` names the file in messages.
  absl::Status Validate(const std::string& source = "config") const;
};

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& config_json);
// Writes the fields Hugging Face would write for this architecture.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace tandem
