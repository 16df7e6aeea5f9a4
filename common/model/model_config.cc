#include "common/model/model_config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

using nlohmann::json;

absl::Status FieldError(const std::string& source, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field \"", field, "\" ", what));
}

// Typed getters: absent → default (or error when required); wrong type → error.
class Fields {
 public:
  Fields(const json& object, const std::string& source) : object_(object), source_(source) {}

  absl::StatusOr<int64_t> Int(const std::string& name, std::optional<int64_t> fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) {
      if (fallback) return *fallback;
      return FieldError(source_, name, "is missing");
    }
    if (!it->is_number_integer())
      return FieldError(source_, name, absl::StrCat("must be an integer, got ", it->dump()));
    return it->get<int64_t>();
  }

  absl::StatusOr<double> Number(const std::string& name, double fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return fallback;
    if (!it->is_number()) return FieldError(source_, name, absl::StrCat("must be a number, got ", it->dump()));
    return it->get<double>();
  }

  absl::StatusOr<bool> Bool(const std::string& name, bool fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) return FieldError(source_, name, absl::StrCat("must be true or false, got ", it->dump()));
    return it->get<bool>();
  }

  absl::StatusOr<std::string> String(const std::string& name, std::string fallback) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return fallback;
    if (!it->is_string()) return FieldError(source_, name, absl::StrCat("must be a string, got ", it->dump()));
    return it->get<std::string>();
  }

  absl::StatusOr<std::vector<double>> Numbers(const std::string& name) const {
    auto it = object_.find(name);
    if (it == object_.end() || it->is_null()) return FieldError(source_, name, "is missing");
    if (!it->is_array()) return FieldError(source_, name, "must be a list of numbers");
    std::vector<double> out;
    for (const json& v : *it) {
      if (!v.is_number()) return FieldError(source_, name, absl::StrCat("must hold only numbers, got ", v.dump()));
      out.push_back(v.get<double>());
    }
    return out;
  }

 private:
  const json& object_;
  const std::string& source_;
};

absl::Status ParseYarn(const json& scaling, const std::string& source, int64_t max_position_embeddings,
                       RopeScaling& s) {
  Fields f(scaling, source);
  TANDEM_ASSIGN_OR_RETURN(s.factor, f.Number("factor", 0.0));
  if (!(s.factor >= 1.0) || s.factor > 1024.0) {
    return FieldError(source, "factor", absl::StrCat("must be in [1, 1024] for yarn, got ", s.factor));
  }
  TANDEM_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                          f.Int("original_max_position_embeddings", max_position_embeddings));
  TANDEM_ASSIGN_OR_RETURN(s.beta_fast, f.Number("beta_fast", 32.0));
  TANDEM_ASSIGN_OR_RETURN(s.beta_slow, f.Number("beta_slow", 1.0));
  TANDEM_ASSIGN_OR_RETURN(s.truncate, f.Bool("truncate", true));
  if (!(s.beta_fast > 0) || !(s.beta_slow > 0)) return FieldError(source, "beta_fast/beta_slow", "must be positive");
  TANDEM_ASSIGN_OR_RETURN(const double mscale, f.Number("mscale", 0.0));
  TANDEM_ASSIGN_OR_RETURN(const double mscale_all_dim, f.Number("mscale_all_dim", 0.0));
  if (mscale_all_dim < 0.0 || !std::isfinite(mscale_all_dim))
    return FieldError(source, "mscale_all_dim", absl::StrCat("must be finite and not negative, got ", mscale_all_dim));
  s.mscale_all_dim = mscale_all_dim;
  if (scaling.contains("attention_factor") && !scaling["attention_factor"].is_null()) {
    TANDEM_ASSIGN_OR_RETURN(s.attention_factor, f.Number("attention_factor", 1.0));
  } else if (mscale != 0.0 && mscale_all_dim != 0.0) {
    s.attention_factor = YarnMscale(s.factor, mscale) / YarnMscale(s.factor, mscale_all_dim);
  } else {
    s.attention_factor = YarnMscale(s.factor, 1.0);
  }
  if (!(s.attention_factor > 0)) return FieldError(source, "attention_factor", "must be positive");
  return absl::OkStatus();
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const json& root, Architecture arch, int64_t max_position_embeddings,
                                             const std::string& source) {
  RopeScaling scaling;
  auto it = root.find("rope_scaling");
  if (it == root.end() || it->is_null()) return scaling;
  if (!it->is_object()) return FieldError(source, "rope_scaling", "must be an object or null");
  const std::string field_source = absl::StrCat(source, " rope_scaling");
  Fields f(*it, field_source);
  TANDEM_ASSIGN_OR_RETURN(std::string type, f.String("rope_type", ""));
  if (type.empty()) {
    TANDEM_ASSIGN_OR_RETURN(type, f.String("type", ""));
  }
  const bool phimoe = arch == Architecture::kPhiMoE;
  if (type == "yarn" && !phimoe) {
    scaling.type = type;
    TANDEM_RETURN_IF_ERROR(ParseYarn(*it, field_source, max_position_embeddings, scaling));
    return scaling;
  }
  if (type != "longrope" || !phimoe) {
    return FieldError(source, "rope_scaling",
                      absl::StrCat("type \"", type,
                                   "\" is not supported for this architecture (tandem reads \"longrope\" for "
                                   "PhiMoEForCausalLM and \"yarn\" for the others)"));
  }
  scaling.type = type;
  TANDEM_ASSIGN_OR_RETURN(scaling.short_factor, f.Numbers("short_factor"));
  TANDEM_ASSIGN_OR_RETURN(scaling.long_factor, f.Numbers("long_factor"));
  if (!it->contains("short_mscale") || !it->contains("long_mscale")) {
    return FieldError(field_source, "short_mscale/long_mscale", "are required for longrope");
  }
  TANDEM_ASSIGN_OR_RETURN(scaling.short_mscale, f.Number("short_mscale", 1.0));
  TANDEM_ASSIGN_OR_RETURN(scaling.long_mscale, f.Number("long_mscale", 1.0));
  TANDEM_ASSIGN_OR_RETURN(scaling.original_max_position_embeddings,
                          f.Int("original_max_position_embeddings", std::nullopt));
  return scaling;
}

absl::StatusOr<std::vector<int32_t>> ParseEosIds(const json& root, const std::string& source) {
  auto it = root.find("eos_token_id");
  if (it == root.end() || it->is_null()) return std::vector<int32_t>{2};
  // Read as 64-bit and range-checked: a huge id must not wrap into the vocabulary.
  auto id = [&](const json& v) -> absl::StatusOr<int32_t> {
    if (!v.is_number_integer()) return FieldError(source, "eos_token_id", "must be an integer or a list of integers");
    if (v.is_number_unsigned() ? v.get<uint64_t>() > uint64_t{INT32_MAX}
                               : (v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)) {
      return FieldError(source, "eos_token_id", absl::StrCat(v.dump(), " is not a 32-bit token id"));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  };
  if (it->is_number_integer()) {
    TANDEM_ASSIGN_OR_RETURN(int32_t one, id(*it));
    return std::vector<int32_t>{one};
  }
  if (it->is_array()) {
    if (it->size() > 1024)
      return FieldError(source, "eos_token_id", absl::StrCat("lists ", it->size(), " ids (at most 1024)"));
    std::vector<int32_t> ids;
    for (const json& v : *it) {
      TANDEM_ASSIGN_OR_RETURN(int32_t one, id(v));
      ids.push_back(one);
    }
    return ids;
  }
  return FieldError(source, "eos_token_id", "must be an integer or a list of integers");
}

struct ArchitectureNames {
  Architecture architecture;
  std::string_view class_name, model_type;
};
constexpr ArchitectureNames kArchitectures[] = {
    {Architecture::kMixtral, "MixtralForCausalLM", "mixtral"},
    {Architecture::kPhiMoE, "PhiMoEForCausalLM", "phimoe"},
    {Architecture::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"},
    {Architecture::kQwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe"},
    {Architecture::kOlmoe, "OlmoeForCausalLM", "olmoe"},
    {Architecture::kGlm4Moe, "Glm4MoeForCausalLM", "glm4_moe"},
    {Architecture::kDeepseekV2, "DeepseekV2ForCausalLM", "deepseek_v2"},
    {Architecture::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3"},
};

// Qwen2/3-MoE's dense layers, as modeling_qwen2_moe.py picks them: layer l
// is dense when mlp_only_layers lists it or (l + 1) % decoder_sparse_step != 0;
// dense layers are intermediate_size wide.
absl::Status ReadQwenDenseLayers(const json& root, const std::string& source, ModelConfig& c) {
  Fields f(root, source);
  TANDEM_ASSIGN_OR_RETURN(const int64_t sparse_step, f.Int("decoder_sparse_step", 1));
  if (sparse_step < 1 || sparse_step > kMaxLayers) {
    return FieldError(source, "decoder_sparse_step",
                      absl::StrCat("must be in [1, ", kMaxLayers, "], got ", sparse_step));
  }
  // Validate refuses a layer count out of range; nothing is sized from it here.
  const int64_t layers = std::clamp<int64_t>(c.num_hidden_layers, 0, kMaxLayers);
  std::vector<bool> dense(static_cast<size_t>(layers), false);
  auto listed = root.find("mlp_only_layers");
  if (listed != root.end() && !listed->is_null()) {
    if (!listed->is_array()) return FieldError(source, "mlp_only_layers", "must be a list of layer indices");
    for (const json& v : *listed) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= layers) {
        return FieldError(source, "mlp_only_layers",
                          absl::StrCat("lists ", v.dump(), ", not a layer index in [0, ", layers, ")"));
      }
      dense[static_cast<size_t>(v.get<int64_t>())] = true;
    }
  }
  c.dense_layers.clear();
  for (int64_t l = 0; l < layers; ++l) {
    if (dense[static_cast<size_t>(l)] || (l + 1) % sparse_step != 0) c.dense_layers.push_back(l);
  }
  auto width = root.find("intermediate_size");
  if (width != root.end() && !width->is_null()) {
    TANDEM_ASSIGN_OR_RETURN(c.dense_intermediate_size, f.Int("intermediate_size", std::nullopt));
  } else if (!c.dense_layers.empty()) {
    return FieldError(source, "intermediate_size", "is missing: the dense MLP layers need their width");
  }
  return absl::OkStatus();
}

// Qwen2/3-MoE's own keys: norm_topk_prob as given (HF's default false), and
// the layouts tandem does not run refused by key.
absl::Status ReadQwenMoeFields(const json& root, const std::string& source, ModelConfig& c) {
  Fields f(root, source);
  TANDEM_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", false));
  TANDEM_RETURN_IF_ERROR(ReadQwenDenseLayers(root, source, c));
  TANDEM_ASSIGN_OR_RETURN(const bool sliding, f.Bool("use_sliding_window", false));
  if (sliding) return FieldError(source, "use_sliding_window", "is true: Qwen's sliding window is not supported");
  // Qwen configs carry sliding_window without using it.
  c.sliding_window.reset();
  if (c.architecture == Architecture::kQwen2Moe) {
    // Qwen2MoeConfig's default; every released config gives it.
    TANDEM_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size, f.Int("shared_expert_intermediate_size", 5632));
    if (c.shared_expert_intermediate_size <= 0) {
      return FieldError(source, "shared_expert_intermediate_size",
                        absl::StrCat("must be positive, got ", c.shared_expert_intermediate_size));
    }
    // q, k and v carry biases (o does not); a qkv_bias key may say otherwise.
    TANDEM_ASSIGN_OR_RETURN(c.attention_bias, f.Bool("qkv_bias", true));
  }
  return absl::OkStatus();
}

// OLMoE: clip_qkv clamps q, k and v, which tandem does not do.
absl::Status ReadOlmoeFields(const json& root, const std::string& source, ModelConfig& c) {
  Fields f(root, source);
  TANDEM_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", false));
  auto clip = root.find("clip_qkv");
  if (clip != root.end() && !clip->is_null()) {
    return FieldError(source, "clip_qkv", absl::StrCat("is ", clip->dump(), ": clamping q/k/v is not supported (null)"));
  }
  return absl::OkStatus();
}

// GLM-4.5's and DeepSeek's shared experts (one MLP n_shared_experts x
// moe_intermediate_size wide) and leading dense layers
// (first_k_dense_replace of them, intermediate_size wide).
absl::Status ReadSharedExpertsAndDenseLayers(const json& root, const std::string& source, ModelConfig& c) {
  Fields f(root, source);
  TANDEM_ASSIGN_OR_RETURN(const int64_t shared, f.Int("n_shared_experts", c.deepseek() ? 0 : 1));
  if (shared < 0 || shared > kMaxExperts) {
    return FieldError(source, "n_shared_experts", absl::StrCat("must be in [0, ", kMaxExperts, "], got ", shared));
  }
  c.shared_expert_intermediate_size = shared * c.intermediate_size;  // one MLP, n_shared_experts wide
  TANDEM_ASSIGN_OR_RETURN(const int64_t dense, f.Int("first_k_dense_replace", c.deepseek() ? 0 : 1));
  if (dense < 0 || dense > kMaxLayers) {
    return FieldError(source, "first_k_dense_replace", absl::StrCat("must be in [0, ", kMaxLayers, "], got ", dense));
  }
  c.dense_layers.clear();
  for (int64_t l = 0; l < std::min(dense, c.num_hidden_layers); ++l) c.dense_layers.push_back(l);
  if (dense > c.num_hidden_layers) {
    return FieldError(source, "first_k_dense_replace",
                      absl::StrCat("(", dense, ") exceeds num_hidden_layers (", c.num_hidden_layers, ")"));
  }
  if (!c.dense_layers.empty()) {
    TANDEM_ASSIGN_OR_RETURN(c.dense_intermediate_size, f.Int("intermediate_size", std::nullopt));
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t nextn, f.Int("num_nextn_predict_layers", 0));
  if (nextn < 0 || nextn > kMaxLayers) {
    return FieldError(source, "num_nextn_predict_layers",
                      absl::StrCat("must be in [0, ", kMaxLayers, "], got ", nextn));
  }
  return absl::OkStatus();
}

// GLM-4.5 (modeling_glm4_moe.py, Glm4MoeConfig's defaults): the sigmoid
// router's keys, the shared experts, the leading dense layers, the partial
// RoPE and the optional QK norm.
absl::Status ReadGlm4MoeFields(const json& root, const std::string& source, ModelConfig& c) {
  Fields f(root, source);
  TANDEM_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", true));
  TANDEM_ASSIGN_OR_RETURN(c.n_group, f.Int("n_group", 1));
  TANDEM_ASSIGN_OR_RETURN(c.topk_group, f.Int("topk_group", 1));
  TANDEM_ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Number("routed_scaling_factor", 1.0));
  TANDEM_ASSIGN_OR_RETURN(c.use_qk_norm, f.Bool("use_qk_norm", false));
  TANDEM_RETURN_IF_ERROR(ReadSharedExpertsAndDenseLayers(root, source, c));
  TANDEM_ASSIGN_OR_RETURN(const double partial, f.Number("partial_rotary_factor", 0.5));
  if (!(partial > 0.0) || partial > 1.0) {
    return FieldError(source, "partial_rotary_factor", absl::StrCat("must be in (0, 1], got ", partial));
  }
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);  // HF's int(head_dim * factor)
  return absl::OkStatus();
}

// DeepSeek-V2/V3 (modeling_deepseek.py): the latent attention's ranks and
// head split, the router (scoring_func, topk_method), shared experts and
// leading dense layers. Layouts tandem does not run are refused by key.
absl::Status ReadDeepseekFields(const json& root, const std::string& source, ModelConfig& c) {
  Fields f(root, source);
  const bool v3 = c.architecture == Architecture::kDeepseekV3;
  TANDEM_ASSIGN_OR_RETURN(c.q_lora_rank, f.Int("q_lora_rank", 0));  // null: one q_proj
  TANDEM_ASSIGN_OR_RETURN(c.kv_lora_rank, f.Int("kv_lora_rank", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.qk_nope_head_dim, f.Int("qk_nope_head_dim", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.qk_rope_head_dim, f.Int("qk_rope_head_dim", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.v_head_dim, f.Int("v_head_dim", std::nullopt));
  c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  c.num_key_value_heads = c.num_attention_heads;
  TANDEM_ASSIGN_OR_RETURN(c.norm_topk_prob, f.Bool("norm_topk_prob", false));
  TANDEM_ASSIGN_OR_RETURN(c.routed_scaling_factor, f.Number("routed_scaling_factor", 1.0));
  TANDEM_ASSIGN_OR_RETURN(const std::string scoring, f.String("scoring_func", v3 ? "sigmoid" : "softmax"));
  if (scoring != (v3 ? "sigmoid" : "softmax")) {
    return FieldError(
        source, "scoring_func",
        absl::StrCat("is \"", scoring, "\"; ", c.architecture_name, " scores by ", v3 ? "\"sigmoid\"" : "\"softmax\""));
  }
  TANDEM_ASSIGN_OR_RETURN(const std::string method, f.String("topk_method", v3 ? "noaux_tc" : "greedy"));
  if (method != (v3 ? "noaux_tc" : "greedy") && (v3 || method != "group_limited_greedy")) {
    return FieldError(
        source, "topk_method",
        absl::StrCat("is \"", method, "\"; tandem runs ",
                     v3 ? "\"noaux_tc\"" : "\"greedy\" and \"group_limited_greedy\"", " for ", c.architecture_name));
  }
  TANDEM_ASSIGN_OR_RETURN(c.n_group, f.Int("n_group", 1));
  TANDEM_ASSIGN_OR_RETURN(c.topk_group, f.Int("topk_group", 1));
  if (method == "greedy") c.n_group = 1, c.topk_group = 1;  // greedy ignores the groups
  TANDEM_ASSIGN_OR_RETURN(const int64_t freq, f.Int("moe_layer_freq", 1));
  if (freq != 1) return FieldError(source, "moe_layer_freq", absl::StrCat("must be 1, got ", freq));
  return ReadSharedExpertsAndDenseLayers(root, source, c);
}

// The latent attention's widths (DeepSeek): positive, even rope part,
// bounded, and the head as its two parts.
absl::Status ValidateLatentAttention(const ModelConfig& c, const std::string& source) {
  if (!c.deepseek()) {
    if (c.mla()) return FieldError(source, "kv_lora_rank", "is set for an architecture without latent attention");
    return absl::OkStatus();
  }
  const std::pair<const char*, int64_t> widths[] = {{"kv_lora_rank", c.kv_lora_rank},
                                                    {"qk_nope_head_dim", c.qk_nope_head_dim},
                                                    {"qk_rope_head_dim", c.qk_rope_head_dim},
                                                    {"v_head_dim", c.v_head_dim}};
  for (const auto& [name, v] : widths) {
    if (v < 1 || v > 4096) return FieldError(source, name, absl::StrCat("must be in [1, 4096], got ", v));
  }
  if (c.q_lora_rank < 0 || c.q_lora_rank > kMaxHiddenSize) {
    return FieldError(source, "q_lora_rank",
                      absl::StrCat("must be null or in [1, ", kMaxHiddenSize, "], got ", c.q_lora_rank));
  }
  if (c.qk_rope_head_dim % 2 != 0)
    return FieldError(source, "qk_rope_head_dim", absl::StrCat("must be even, got ", c.qk_rope_head_dim));
  if (c.head_dim != c.qk_nope_head_dim + c.qk_rope_head_dim || c.num_key_value_heads != c.num_attention_heads) {
    return FieldError(source, "qk_nope_head_dim",
                      absl::StrCat("+ qk_rope_head_dim (", c.qk_nope_head_dim, " + ", c.qk_rope_head_dim,
                                   ") must be the head (", c.head_dim, "), one per attention head"));
  }
  return absl::OkStatus();
}

// The sigmoid router's groups and scale, and the rotary width.
absl::Status ValidateRouterGroups(const ModelConfig& c, const std::string& source) {
  const bool sigmoid = c.router_kind() == RouterKind::kSigmoidGroupedTopK;
  if (!sigmoid && c.router_kind() != RouterKind::kSoftmaxGroupedTopK) return absl::OkStatus();
  // The sigmoid router scores a group by its top 2, the softmax one by its best.
  const int64_t min_group = sigmoid ? 2 : 1;
  if (c.n_group < 1 || c.num_local_experts % c.n_group != 0 || c.num_local_experts / c.n_group < min_group) {
    return FieldError(source, "n_group",
                      absl::StrCat("(", c.n_group, ") must divide the ", c.num_local_experts,
                                   " routed experts into groups of at least ", min_group,
                                   sigmoid ? " (a group scores by its top 2)" : ""));
  }
  if (c.topk_group < 1 || c.topk_group > c.n_group) {
    return FieldError(source, "topk_group",
                      absl::StrCat("must be in [1, n_group = ", c.n_group, "], got ", c.topk_group));
  }
  if (c.num_experts_per_tok > c.topk_group * (c.num_local_experts / c.n_group)) {
    return FieldError(source, "num_experts_per_tok",
                      absl::StrCat("(", c.num_experts_per_tok, ") exceeds the experts of topk_group (", c.topk_group,
                                   ") groups of ", c.num_local_experts / c.n_group));
  }
  if (!(c.routed_scaling_factor > 0.0) || !std::isfinite(c.routed_scaling_factor)) {
    return FieldError(source, "routed_scaling_factor",
                      absl::StrCat("must be positive and finite, got ", c.routed_scaling_factor));
  }
  return absl::OkStatus();
}

}  // namespace

double YarnMscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

double ModelConfig::attention_scale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  if (rope_scaling.type == "yarn" && rope_scaling.mscale_all_dim > 0.0) {
    const double m = YarnMscale(rope_scaling.factor, rope_scaling.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

void StretchContextForYarn(ModelConfig& c) {
  if (c.rope_scaling.type != "yarn") return;
  const double stretched = static_cast<double>(c.rope_scaling.original_max_position_embeddings) * c.rope_scaling.factor;
  if (stretched <= static_cast<double>(kMaxPositionEmbeddings))
    c.max_position_embeddings = std::max(c.max_position_embeddings, static_cast<int64_t>(stretched));
}

namespace {
// Dense layers: valid, sorted, unique indices, at least one MoE layer left,
// and a width for them.
absl::Status ValidateDenseLayers(const ModelConfig& c, const std::string& source) {
  // The key that made them: GLM's leading count, Qwen's list.
  const char* key = c.deepseek_moe_layout() ? "first_k_dense_replace" : "mlp_only_layers";
  for (size_t i = 0; i < c.dense_layers.size(); ++i) {
    const int64_t l = c.dense_layers[i];
    if (l < 0 || l >= c.num_hidden_layers || (i > 0 && l <= c.dense_layers[i - 1])) {
      return FieldError(source, key,
                        absl::StrCat("layer ", l, " is out of range [0, ", c.num_hidden_layers, ") or repeated"));
    }
  }
  if (c.num_moe_layers() < 1) {
    return FieldError(source, key,
                      absl::StrCat("makes all ", c.num_hidden_layers, " layers dense: no MoE layer is left"));
  }
  if (c.dense_intermediate_size < 0 || c.dense_intermediate_size > kMaxIntermediateSize ||
      (!c.dense_layers.empty() && c.dense_intermediate_size == 0)) {
    return FieldError(source, "intermediate_size",
                      absl::StrCat("(the dense MLP layers' width) must be in [1, ", kMaxIntermediateSize, "], got ",
                                   c.dense_intermediate_size));
  }
  return absl::OkStatus();
}
}  // namespace

bool ModelConfig::dense_layer(int64_t layer) const {
  return std::binary_search(dense_layers.begin(), dense_layers.end(), layer);
}

int64_t ModelConfig::first_moe_layer() const {
  for (int64_t l = 0; l < num_hidden_layers; ++l) {
    if (!dense_layer(l)) return l;
  }
  return 0;
}

std::string_view ArchitectureClassName(Architecture architecture) {
  for (const ArchitectureNames& a : kArchitectures) {
    if (a.architecture == architecture) return a.class_name;
  }
  return "";
}

std::string_view ArchitectureModelType(Architecture architecture) {
  for (const ArchitectureNames& a : kArchitectures) {
    if (a.architecture == architecture) return a.model_type;
  }
  return "";
}

absl::Status ModelConfig::Validate(const std::string& source) const {
  auto positive = [&](const std::string& name, int64_t v) -> absl::Status {
    if (v <= 0) return FieldError(source, name, absl::StrCat("must be positive, got ", v));
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(positive("vocab_size", vocab_size));
  TANDEM_RETURN_IF_ERROR(positive("hidden_size", hidden_size));
  TANDEM_RETURN_IF_ERROR(positive("intermediate_size", intermediate_size));
  TANDEM_RETURN_IF_ERROR(positive("num_hidden_layers", num_hidden_layers));
  TANDEM_RETURN_IF_ERROR(positive("num_attention_heads", num_attention_heads));
  TANDEM_RETURN_IF_ERROR(positive("num_key_value_heads", num_key_value_heads));
  TANDEM_RETURN_IF_ERROR(positive("head_dim", head_dim));
  TANDEM_RETURN_IF_ERROR(positive("max_position_embeddings", max_position_embeddings));
  TANDEM_RETURN_IF_ERROR(positive("num_local_experts", num_local_experts));
  TANDEM_RETURN_IF_ERROR(positive("num_experts_per_tok", num_experts_per_tok));
  auto at_most = [&](const std::string& name, int64_t v, int64_t limit) -> absl::Status {
    if (v > limit) {
      return FieldError(source, name, absl::StrCat("is ", v, ", more than tandem accepts (", limit, ")"));
    }
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(at_most("vocab_size", vocab_size, kMaxVocabSize));
  TANDEM_RETURN_IF_ERROR(at_most("hidden_size", hidden_size, kMaxHiddenSize));
  TANDEM_RETURN_IF_ERROR(at_most("intermediate_size", intermediate_size, kMaxIntermediateSize));
  TANDEM_RETURN_IF_ERROR(
      at_most("shared_expert_intermediate_size", shared_expert_intermediate_size, kMaxIntermediateSize));
  if (shared_expert_intermediate_size < 0) {
    return FieldError(source, "shared_expert_intermediate_size",
                      absl::StrCat("must not be negative, got ", shared_expert_intermediate_size));
  }
  TANDEM_RETURN_IF_ERROR(at_most("num_hidden_layers", num_hidden_layers, kMaxLayers));
  TANDEM_RETURN_IF_ERROR(ValidateDenseLayers(*this, source));
  TANDEM_RETURN_IF_ERROR(at_most("num_attention_heads", num_attention_heads, kMaxAttentionHeads));
  TANDEM_RETURN_IF_ERROR(at_most("num_key_value_heads", num_key_value_heads, kMaxAttentionHeads));
  TANDEM_RETURN_IF_ERROR(at_most("max_position_embeddings", max_position_embeddings, kMaxPositionEmbeddings));
  TANDEM_RETURN_IF_ERROR(at_most("num_local_experts", num_local_experts, kMaxExperts));
  if (num_local_experts * num_hidden_layers > kMaxExpertsPerModel) {
    return FieldError(source, "num_local_experts",
                      absl::StrCat("(", num_local_experts, ") x num_hidden_layers (", num_hidden_layers,
                                   ") = ", num_local_experts * num_hidden_layers,
                                   " experts, more than tandem accepts (", kMaxExpertsPerModel, ")"));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    return FieldError(
        source, "num_key_value_heads",
        absl::StrCat("(", num_key_value_heads, ") must divide num_attention_heads (", num_attention_heads, ")"));
  }
  TANDEM_RETURN_IF_ERROR(ValidateLatentAttention(*this, source));
  if (head_dim % 2 != 0 || head_dim > 1024) {
    return FieldError(source, "head_dim", absl::StrCat("must be even and at most 1024, got ", head_dim));
  }
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return FieldError(source, "partial_rotary_factor",
                      absl::StrCat("gives ", rotary_dim,
                                   " rotated values per head: must be even and at most head_dim (", head_dim, ")"));
  }
  TANDEM_RETURN_IF_ERROR(ValidateRouterGroups(*this, source));
  if (num_experts_per_tok > num_local_experts) {
    return FieldError(source, "num_experts_per_tok",
                      absl::StrCat("(", num_experts_per_tok, ") exceeds num_local_experts (", num_local_experts, ")"));
  }
  if (router_kind() == RouterKind::kSparseMixer && num_experts_per_tok != 2) {
    return FieldError(source, "num_experts_per_tok",
                      absl::StrCat("must be 2 for PhiMoE's sparsemixer router, got ", num_experts_per_tok));
  }
  if (!(rope_theta > 0)) return FieldError(source, "rope_theta", "must be positive");
  if (!(rms_norm_eps > 0)) return FieldError(source, "rms_norm_eps", "must be positive");
  if (router_jitter_noise < 0) return FieldError(source, "router_jitter_noise", "must not be negative");
  if (sliding_window && *sliding_window <= 0) {
    return FieldError(source, "sliding_window", absl::StrCat("must be positive or null, got ", *sliding_window));
  }
  if (rope_scaling.original_max_position_embeddings > kMaxPositionEmbeddings) {
    return FieldError(source, "rope_scaling.original_max_position_embeddings",
                      absl::StrCat("is ", rope_scaling.original_max_position_embeddings, ", more than tandem accepts (",
                                   kMaxPositionEmbeddings, ")"));
  }
  if (bos_token_id < 0 || bos_token_id >= vocab_size) {
    return FieldError(source, "bos_token_id",
                      absl::StrCat(bos_token_id, " is outside the vocabulary [0, ", vocab_size, ")"));
  }
  for (int32_t id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return FieldError(source, "eos_token_id", absl::StrCat(id, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  if (rope_scaling.type == "yarn" && rope_scaling.original_max_position_embeddings <= 0) {
    return FieldError(source, "rope_scaling.original_max_position_embeddings", "must be positive");
  }
  if (rope_scaling.type == "longrope") {
    const size_t half = static_cast<size_t>(head_dim / 2);
    if (rope_scaling.short_factor.size() != half || rope_scaling.long_factor.size() != half) {
      return FieldError(source, "rope_scaling",
                        absl::StrCat("short_factor and long_factor need head_dim/2 = ", half, " entries, got ",
                                     rope_scaling.short_factor.size(), " and ", rope_scaling.long_factor.size()));
    }
    for (double v : rope_scaling.short_factor) {
      if (!(v > 0)) return FieldError(source, "rope_scaling.short_factor", "entries must be positive");
    }
    for (double v : rope_scaling.long_factor) {
      if (!(v > 0)) return FieldError(source, "rope_scaling.long_factor", "entries must be positive");
    }
    if (!(rope_scaling.short_mscale > 0) || !(rope_scaling.long_mscale > 0)) {
      return FieldError(source, "rope_scaling", "short_mscale and long_mscale must be positive");
    }
    if (rope_scaling.original_max_position_embeddings <= 0) {
      return FieldError(source, "rope_scaling.original_max_position_embeddings", "must be positive");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError(absl::StrCat(source, ": must hold a JSON object"));

  ModelConfig c;
  auto archs = root.find("architectures");
  if (archs == root.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return FieldError(source, "architectures", "is missing or not a list of names");
  }
  c.architecture_name = (*archs)[0].get<std::string>();
  const ArchitectureNames* names = nullptr;
  for (const ArchitectureNames& a : kArchitectures) {
    if (a.class_name == c.architecture_name) names = &a;
  }
  if (names == nullptr) {
    return FieldError(source, "architectures",
                      absl::StrCat("names \"", c.architecture_name,
                                   "\", which tandem does not support (MixtralForCausalLM, PhiMoEForCausalLM, "
                                   "Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, OlmoeForCausalLM, Glm4MoeForCausalLM, "
                                   "DeepseekV2ForCausalLM, DeepseekV3ForCausalLM)"));
  }
  c.architecture = names->architecture;
  const bool phimoe = c.architecture == Architecture::kPhiMoE;
  const bool qwen = c.architecture == Architecture::kQwen3Moe || c.architecture == Architecture::kQwen2Moe;
  const bool olmoe = c.architecture == Architecture::kOlmoe;
  const bool glm = c.architecture == Architecture::kGlm4Moe;
  const bool deepseek = c.deepseek();
  const std::string expected_type(names->model_type);

  Fields f(root, source);
  TANDEM_ASSIGN_OR_RETURN(c.model_type, f.String("model_type", expected_type));
  if (c.model_type != expected_type) {
    return FieldError(source, "model_type",
                      absl::StrCat("is \"", c.model_type, "\" but architectures says ", c.architecture_name));
  }
  TANDEM_ASSIGN_OR_RETURN(c.vocab_size, f.Int("vocab_size", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.hidden_size, f.Int("hidden_size", std::nullopt));
  // Qwen's experts are moe_intermediate_size wide (intermediate_size is
  // its dense MLP layers', read with them).
  TANDEM_ASSIGN_OR_RETURN(c.intermediate_size,
                          f.Int(qwen || glm || deepseek ? "moe_intermediate_size" : "intermediate_size", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.num_hidden_layers, f.Int("num_hidden_layers", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.num_attention_heads, f.Int("num_attention_heads", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.num_key_value_heads, f.Int("num_key_value_heads", c.num_attention_heads));
  if (c.num_attention_heads <= 0) return FieldError(source, "num_attention_heads", "must be positive");
  const bool head_dim_given = root.contains("head_dim") && !root["head_dim"].is_null();
  TANDEM_ASSIGN_OR_RETURN(c.head_dim, f.Int("head_dim", c.hidden_size / c.num_attention_heads));
  // DeepSeek's head is its nope and rope parts (ReadDeepseekFields), not hidden / heads.
  if (!head_dim_given && !deepseek && c.hidden_size % c.num_attention_heads != 0) {
    return FieldError(source, "hidden_size",
                      absl::StrCat("(", c.hidden_size, ") is not divisible by num_attention_heads (",
                                   c.num_attention_heads, ") and no head_dim is given"));
  }
  TANDEM_ASSIGN_OR_RETURN(c.max_position_embeddings, f.Int("max_position_embeddings", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.rope_theta, f.Number("rope_theta", glm || deepseek ? 10000.0 : 1e6));
  TANDEM_ASSIGN_OR_RETURN(c.rms_norm_eps, f.Number("rms_norm_eps", 1e-5));
  auto sw = root.find("sliding_window");
  if (sw != root.end() && !sw->is_null() && !qwen && !glm && !deepseek) {
    if (!sw->is_number_integer()) return FieldError(source, "sliding_window", "must be an integer or null");
    c.sliding_window = sw->get<int64_t>();
  }
  TANDEM_ASSIGN_OR_RETURN(c.num_local_experts, f.Int(qwen || olmoe     ? "num_experts"
                                                     : glm || deepseek ? "n_routed_experts"
                                                                       : "num_local_experts",
                                                     std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.num_experts_per_tok, f.Int("num_experts_per_tok", std::nullopt));
  TANDEM_ASSIGN_OR_RETURN(c.attention_bias, f.Bool("attention_bias", false));
  if (qwen) TANDEM_RETURN_IF_ERROR(ReadQwenMoeFields(root, source, c));
  if (olmoe) TANDEM_RETURN_IF_ERROR(ReadOlmoeFields(root, source, c));
  if (glm) TANDEM_RETURN_IF_ERROR(ReadGlm4MoeFields(root, source, c));
  if (deepseek) TANDEM_RETURN_IF_ERROR(ReadDeepseekFields(root, source, c));
  TANDEM_ASSIGN_OR_RETURN(c.lm_head_bias, f.Bool("lm_head_bias", false));
  TANDEM_ASSIGN_OR_RETURN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  TANDEM_ASSIGN_OR_RETURN(c.router_jitter_noise, f.Number("router_jitter_noise", phimoe ? 0.01 : 0.0));
  TANDEM_ASSIGN_OR_RETURN(int64_t bos, f.Int("bos_token_id", 1));
  if (bos < INT32_MIN || bos > INT32_MAX)
    return FieldError(source, "bos_token_id", absl::StrCat(bos, " is not a 32-bit token id"));
  c.bos_token_id = static_cast<int32_t>(bos);
  TANDEM_ASSIGN_OR_RETURN(c.eos_token_ids, ParseEosIds(root, source));
  TANDEM_ASSIGN_OR_RETURN(c.torch_dtype, f.String("torch_dtype", "bfloat16"));
  const bool biases_allowed = phimoe || olmoe || glm || c.architecture == Architecture::kQwen2Moe;
  // DeepSeek's attention_bias would put biases on its low-rank projections,
  // which no released model has and tandem does not load.
  if ((!biases_allowed && c.attention_bias) || (!phimoe && c.lm_head_bias)) {
    return FieldError(source, c.attention_bias && !biases_allowed ? "attention_bias" : "lm_head_bias",
                      absl::StrCat("is true, but ", c.architecture_name, " has no such biases"));
  }
  TANDEM_ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(root, c.architecture, c.max_position_embeddings, source));
  StretchContextForYarn(c);
  TANDEM_RETURN_IF_ERROR(c.Validate(source));
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::filesystem::path& config_json) {
  // A regular file of sane size: a fifo would block, a huge file exhaust memory.
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(config_json, ec);
  if (ec || !std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat(config_json.string(), ": cannot open model config (no such file)"));
  }
  if (!std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(config_json.string(), ": not a regular file"));
  }
  const uintmax_t bytes = std::filesystem::file_size(config_json, ec);
  if (!ec && bytes > static_cast<uintmax_t>(kMaxConfigFileBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(config_json.string(), ": ", bytes,
                                                   " bytes, more than a config.json "
                                                   "can be (",
                                                   kMaxConfigFileBytes, ")"));
  }
  std::ifstream in(config_json);
  if (!in) return absl::NotFoundError(absl::StrCat(config_json.string(), ": cannot open model config"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return ParseModelConfig(buffer.str(), config_json.string());
}

std::string ModelConfigToJson(const ModelConfig& c) {
  json root;
  root["architectures"] = {c.architecture_name};
  root["model_type"] = c.model_type;
  root["vocab_size"] = c.vocab_size;
  root["hidden_size"] = c.hidden_size;
  root["intermediate_size"] = c.intermediate_size;
  root["num_hidden_layers"] = c.num_hidden_layers;
  root["num_attention_heads"] = c.num_attention_heads;
  root["num_key_value_heads"] = c.num_key_value_heads;
  root["head_dim"] = c.head_dim;
  root["max_position_embeddings"] = c.max_position_embeddings;
  root["rope_theta"] = c.rope_theta;
  root["rms_norm_eps"] = c.rms_norm_eps;
  root["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  const bool qwen = c.architecture == Architecture::kQwen3Moe || c.architecture == Architecture::kQwen2Moe;
  if (qwen) {
    root["moe_intermediate_size"] = c.intermediate_size;
    if (c.dense_intermediate_size > 0) root["intermediate_size"] = c.dense_intermediate_size;
    root["num_experts"] = c.num_local_experts;
    root["norm_topk_prob"] = c.norm_topk_prob;
    root["decoder_sparse_step"] = 1;
    root["mlp_only_layers"] = c.dense_layers;
    root["use_sliding_window"] = false;
    if (c.architecture == Architecture::kQwen2Moe) {
      root["shared_expert_intermediate_size"] = c.shared_expert_intermediate_size;
      root["qkv_bias"] = c.attention_bias;
    } else {
      root["attention_bias"] = false;
    }
  } else if (c.architecture == Architecture::kGlm4Moe) {
    root["moe_intermediate_size"] = c.intermediate_size;
    if (c.dense_intermediate_size > 0) root["intermediate_size"] = c.dense_intermediate_size;
    root["n_routed_experts"] = c.num_local_experts;
    root["n_shared_experts"] = c.shared_expert_intermediate_size / c.intermediate_size;
    root["first_k_dense_replace"] = c.dense_layers.size();
    root["norm_topk_prob"] = c.norm_topk_prob;
    root["n_group"] = c.n_group;
    root["topk_group"] = c.topk_group;
    root["routed_scaling_factor"] = c.routed_scaling_factor;
    root["partial_rotary_factor"] = static_cast<double>(c.rope_dim()) / static_cast<double>(c.head_dim);
    root["use_qk_norm"] = c.use_qk_norm;
    root["attention_bias"] = c.attention_bias;
    root["num_nextn_predict_layers"] = 0;
  } else if (c.deepseek()) {
    const bool v3 = c.architecture == Architecture::kDeepseekV3;
    root["moe_intermediate_size"] = c.intermediate_size;
    if (c.dense_intermediate_size > 0) root["intermediate_size"] = c.dense_intermediate_size;
    root.erase("head_dim");
    root["n_routed_experts"] = c.num_local_experts;
    root["n_shared_experts"] = c.shared_expert_intermediate_size / c.intermediate_size;
    root["first_k_dense_replace"] = c.dense_layers.size();
    root["moe_layer_freq"] = 1;
    root["norm_topk_prob"] = c.norm_topk_prob;
    root["n_group"] = c.n_group;
    root["topk_group"] = c.topk_group;
    root["scoring_func"] = v3 ? "sigmoid" : "softmax";
    root["topk_method"] = v3 ? "noaux_tc" : c.n_group > 1 ? "group_limited_greedy" : "greedy";
    root["routed_scaling_factor"] = c.routed_scaling_factor;
    root["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
    root["kv_lora_rank"] = c.kv_lora_rank;
    root["qk_nope_head_dim"] = c.qk_nope_head_dim;
    root["qk_rope_head_dim"] = c.qk_rope_head_dim;
    root["v_head_dim"] = c.v_head_dim;
    root["attention_bias"] = false;
    root["num_nextn_predict_layers"] = 0;
  } else if (c.architecture == Architecture::kOlmoe) {
    root["num_experts"] = c.num_local_experts;
    root["norm_topk_prob"] = c.norm_topk_prob;
    root["attention_bias"] = c.attention_bias;
    root["clip_qkv"] = nullptr;
  } else {
    root["num_local_experts"] = c.num_local_experts;
  }
  root["num_experts_per_tok"] = c.num_experts_per_tok;
  root["tie_word_embeddings"] = c.tie_word_embeddings;
  root["bos_token_id"] = c.bos_token_id;
  root["eos_token_id"] = c.eos_token_ids.size() == 1 ? json(c.eos_token_ids[0]) : json(c.eos_token_ids);
  root["torch_dtype"] = c.torch_dtype;
  root["hidden_act"] = "silu";
  if (c.architecture == Architecture::kPhiMoE) {
    root["attention_bias"] = c.attention_bias;
    root["lm_head_bias"] = c.lm_head_bias;
    root["router_jitter_noise"] = c.router_jitter_noise;
    root["input_jitter_noise"] = c.router_jitter_noise;
  }
  if (c.rope_scaling.type.empty()) {
    root["rope_scaling"] = nullptr;
  } else if (c.rope_scaling.type == "yarn") {
    const RopeScaling& s = c.rope_scaling;
    root["rope_scaling"] = {{"rope_type", "yarn"},
                            {"factor", s.factor},
                            {"original_max_position_embeddings", s.original_max_position_embeddings},
                            {"beta_fast", s.beta_fast},
                            {"beta_slow", s.beta_slow},
                            {"attention_factor", s.attention_factor},
                            {"truncate", s.truncate}};
    if (s.mscale_all_dim > 0.0) root["rope_scaling"]["mscale_all_dim"] = s.mscale_all_dim;
  } else {
    root["rope_scaling"] = {{"type", c.rope_scaling.type},
                            {"short_factor", c.rope_scaling.short_factor},
                            {"long_factor", c.rope_scaling.long_factor},
                            {"short_mscale", c.rope_scaling.short_mscale},
                            {"long_mscale", c.rope_scaling.long_mscale},
                            {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  return root.dump(2) + "\n";
}

}  // namespace tandem
