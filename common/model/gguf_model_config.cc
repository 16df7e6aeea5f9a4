#include "common/model/gguf_model_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_names.h"
#include "common/quant/ggml_type.h"

namespace tandem {
namespace {

constexpr char kTandemShortMscaleKey[] = "tandem.rope.short_mscale";
constexpr char kTandemLongMscaleKey[] = "tandem.rope.long_mscale";
constexpr char kTandemShortFactorKey[] = "tandem.rope.short_factor";
constexpr char kTandemLongFactorKey[] = "tandem.rope.long_factor";
constexpr char kTandemRouterJitterKey[] = "tandem.router_jitter_noise";
constexpr char kTandemYarnAttentionFactorKey[] = "tandem.rope.yarn_attention_factor";
// PhiMoEConfig's default and Phi-3.5-MoE's value.
constexpr double kDefaultRouterJitter = 0.01;

// GGUF keeps hyperparameters as f32; config.json had short decimals
// ("1e-05"). The shortest decimal that rounds to the same f32 is that
// decimal, so parsing it back gives the double Hugging Face computes with.
double FromF32(double stored) {
  const float f = static_cast<float>(stored);
  if (!std::isfinite(f)) return stored;
  char text[64];
  const auto result = std::to_chars(text, text + sizeof(text) - 1, f);
  *result.ptr = '\0';
  return std::strtod(text, nullptr);
}

class Reader {
 public:
  Reader(const GgufMetadata& metadata, std::string arch) : m_(metadata), arch_(std::move(arch)) {}

  absl::StatusOr<int64_t> Int(std::string_view suffix) const { return m_.GetInteger(GgufKey(arch_, suffix)); }
  absl::StatusOr<int64_t> IntOr(std::string_view suffix, int64_t fallback) const {
    return m_.Contains(GgufKey(arch_, suffix)) ? Int(suffix) : fallback;
  }
  absl::StatusOr<bool> BoolOr(std::string_view suffix, bool fallback) const {
    return m_.Contains(GgufKey(arch_, suffix)) ? m_.GetBool(GgufKey(arch_, suffix)) : fallback;
  }
  absl::StatusOr<double> FloatOr(const std::string& key, double fallback) const {
    if (!m_.Contains(key)) return fallback;
    return Float(key);
  }
  // An f32 value as its shortest decimal (FromF32), an f64 one as it is.
  absl::StatusOr<double> Float(const std::string& key) const {
    TANDEM_ASSIGN_OR_RETURN(double v, m_.GetFloat(key));
    return m_.Find(key)->type() == GgufValueType::kFloat32 ? FromF32(v) : v;
  }
  absl::StatusOr<double> ArchFloat(std::string_view suffix) const { return Float(GgufKey(arch_, suffix)); }
  absl::StatusOr<double> ArchFloatOr(std::string_view suffix, double fallback) const {
    return FloatOr(GgufKey(arch_, suffix), fallback);
  }
  // A float64 array of the same length as `values`, replacing them.
  absl::Status DoublesIfPresent(const std::string& key, std::vector<double>* values) const {
    if (!m_.Contains(key)) return absl::OkStatus();
    TANDEM_ASSIGN_OR_RETURN(const GgufArray* array, m_.GetArray(key, GgufValueType::kFloat64));
    const std::vector<double>& v = *array->As<double>();
    if (v.size() != values->size()) {
      return absl::InvalidArgumentError(absl::StrCat(m_.source(), ": key ", key, " has ", v.size(), " values, the ",
                                                     "rope factor tensors ", values->size()));
    }
    *values = v;
    return absl::OkStatus();
  }
  const std::string& source() const { return m_.source(); }
  const std::string& arch() const { return arch_; }
  absl::Status Positive(std::string_view suffix, int64_t value) const {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(m_.source(), ": key ", GgufKey(arch_, suffix), " must be positive, got ", value));
  }

 private:
  const GgufMetadata& m_;
  std::string arch_;
};

// A 1-D F32 tensor of `n` values, as doubles (shortest-decimal, see FromF32).
absl::StatusOr<std::vector<double>> ReadF32Vector(const GgufCheckpoint& checkpoint, const char* name, int64_t n) {
  TANDEM_ASSIGN_OR_RETURN(GgufTensor t, checkpoint.Get(name));
  if (t.info->type != GgmlType::kF32 || t.info->dims.size() != 1 || t.info->dims[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(checkpoint.Describe(), ": tensor ", name, " must be f32 of ", n,
                                                   " values (head_dim / 2), is ", GgmlTypeName(t.info->type), " with ",
                                                   t.info->dims.size(), " dims"));
  }
  std::vector<double> out(static_cast<size_t>(n));
  for (size_t i = 0; i < out.size(); ++i) {
    float v;
    std::memcpy(&v, t.data.data() + i * sizeof(float), sizeof(float));
    out[i] = FromF32(v);
  }
  return out;
}

absl::Status ReadLongRope(const GgufCheckpoint& checkpoint, const Reader& r, ModelConfig& c) {
  if (checkpoint.Get(kGgufRopeFactorsLong).status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
  RopeScaling& s = c.rope_scaling;
  s.type = "longrope";
  TANDEM_ASSIGN_OR_RETURN(s.long_factor, ReadF32Vector(checkpoint, kGgufRopeFactorsLong, c.head_dim / 2));
  TANDEM_ASSIGN_OR_RETURN(s.short_factor, ReadF32Vector(checkpoint, kGgufRopeFactorsShort, c.head_dim / 2));
  // config.json's doubles, when tandem wrote the file (the tensors are f32).
  TANDEM_RETURN_IF_ERROR(r.DoublesIfPresent(kTandemLongFactorKey, &s.long_factor));
  TANDEM_RETURN_IF_ERROR(r.DoublesIfPresent(kTandemShortFactorKey, &s.short_factor));
  TANDEM_ASSIGN_OR_RETURN(s.original_max_position_embeddings, r.Int("rope.scaling.original_context_length"));
  // llama.cpp scales cos/sin by attn_factor at every length.
  TANDEM_ASSIGN_OR_RETURN(const double attn_factor, r.ArchFloatOr("rope.scaling.attn_factor", 1.0));
  TANDEM_ASSIGN_OR_RETURN(s.short_mscale, r.FloatOr(kTandemShortMscaleKey, attn_factor));
  TANDEM_ASSIGN_OR_RETURN(s.long_mscale, r.FloatOr(kTandemLongMscaleKey, attn_factor));
  return absl::OkStatus();
}

bool Has(const GgufCheckpoint& checkpoint, const std::string& name) { return checkpoint.Get(name).ok(); }

// {arch}.rope.scaling.*: "yarn" read as llama.cpp reads it (its attn_factor
// multiplies YaRN's own mscale); "none" and absent mean no scaling.
absl::Status ReadRopeScaling(const GgufMetadata& m, const Reader& r, const std::string& arch, ModelConfig& c) {
  const std::string type_key = GgufKey(arch, "rope.scaling.type");
  if (!m.Contains(type_key)) return absl::OkStatus();
  absl::StatusOr<std::string> stored_type = m.GetString(type_key);
  if (!stored_type.ok()) return stored_type.status();
  const std::string& type = *stored_type;
  if (type == "none") return absl::OkStatus();
  if (type != "yarn" || c.architecture == Architecture::kPhiMoE) {
    return absl::InvalidArgumentError(absl::StrCat(m.source(), ": key ", type_key, " is \"", type,
                                                   "\"; tandem reads \"yarn\" (and PhiMoE's longrope tensors)"));
  }
  RopeScaling& s = c.rope_scaling;
  s.type = "yarn";
  TANDEM_ASSIGN_OR_RETURN(s.factor, r.ArchFloat("rope.scaling.factor"));
  TANDEM_ASSIGN_OR_RETURN(s.original_max_position_embeddings,
                          r.IntOr("rope.scaling.original_context_length", c.max_position_embeddings));
  TANDEM_ASSIGN_OR_RETURN(s.beta_fast, r.ArchFloatOr("rope.scaling.yarn_beta_fast", 32.0));
  TANDEM_ASSIGN_OR_RETURN(s.beta_slow, r.ArchFloatOr("rope.scaling.yarn_beta_slow", 1.0));
  TANDEM_ASSIGN_OR_RETURN(const double attn_factor, r.ArchFloatOr("rope.scaling.attn_factor", 1.0));
  // deepseek2: llama.cpp leaves cos/sin unscaled (HF's mscale / mscale_all_dim,
  // 1 in every released model) and puts yarn_log_multiplier (0.1 x
  // mscale_all_dim) on the softmax scale.
  const double default_factor = c.deepseek() ? 1.0 : attn_factor * YarnMscale(s.factor);
  TANDEM_ASSIGN_OR_RETURN(s.attention_factor, r.FloatOr(kTandemYarnAttentionFactorKey, default_factor));
  if (c.deepseek()) {
    TANDEM_ASSIGN_OR_RETURN(const double log_multiplier, r.ArchFloatOr("rope.scaling.yarn_log_multiplier", 0.0));
    if (!(log_multiplier >= 0.0) || !std::isfinite(log_multiplier)) {
      return absl::InvalidArgumentError(absl::StrCat(m.source(), ": key ",
                                                     GgufKey(arch, "rope.scaling.yarn_log_multiplier"),
                                                     " must be finite and not negative, got ", log_multiplier));
    }
    s.mscale_all_dim = FromF32(log_multiplier / 0.1);
  }
  if (!(s.factor >= 1.0) || s.factor > 1024.0) {
    return absl::InvalidArgumentError(absl::StrCat(m.source(), ": key ", GgufKey(arch, "rope.scaling.factor"),
                                                   " must be in [1, 1024] for yarn, got ", s.factor));
  }
  StretchContextForYarn(c);  // as config.json's reading does
  return absl::OkStatus();
}

// Qwen's dense MLP layers: llama.cpp's converter writes one as ffn_gate, ffn_up
// and ffn_down with no router (ffn_gate_inp), feed_forward_length wide.
absl::Status ReadDenseLayers(const GgufCheckpoint& checkpoint, const Reader& r, ModelConfig& c) {
  if (c.num_hidden_layers < 1 || c.num_hidden_layers > kMaxLayers) return absl::OkStatus();  // Validate says why
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!Has(checkpoint, GgufTensorName(WeightRole::kRouter, l))) c.dense_layers.push_back(l);
  }
  if (!c.dense_layers.empty()) {
    TANDEM_ASSIGN_OR_RETURN(c.dense_intermediate_size, r.Int("feed_forward_length"));
    TANDEM_RETURN_IF_ERROR(r.Positive("feed_forward_length", c.dense_intermediate_size));
  }
  return absl::OkStatus();
}

// glm4moe and deepseek2, read as llama.cpp reads them (llama-hparams.cpp):
// the leading dense layers, the shared experts (expert_shared_count of the
// experts' width), the router's scale, renormalisation and groups (deepseek2:
// softmax, V2, unless expert_gating_func says sigmoid, V3); the
// multi-token-prediction layers at the end of block_count are not run.
absl::Status ReadDeepseekMoeLayout(const GgufCheckpoint& checkpoint, const Reader& r, const std::string& arch,
                                   ModelConfig& c) {
  const std::string& source = checkpoint.Describe();
  TANDEM_ASSIGN_OR_RETURN(const int64_t nextn, r.IntOr("nextn_predict_layers", 0));
  if (nextn < 0 || nextn >= c.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", GgufKey(arch, "nextn_predict_layers"), " is ",
                                                   nextn, ", not below block_count (", c.num_hidden_layers, ")"));
  }
  c.num_hidden_layers -= nextn;
  TANDEM_ASSIGN_OR_RETURN(const int64_t dense, r.IntOr("leading_dense_block_count", 0));
  if (dense < 0 || dense >= c.num_hidden_layers || dense > kMaxLayers) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", GgufKey(arch, "leading_dense_block_count"), " is ",
                                                   dense, ": must leave an MoE layer among the ", c.num_hidden_layers,
                                                   " layers"));
  }
  for (int64_t l = 0; l < dense; ++l) c.dense_layers.push_back(l);
  if (dense > 0) {
    TANDEM_ASSIGN_OR_RETURN(c.dense_intermediate_size, r.Int("feed_forward_length"));
    TANDEM_RETURN_IF_ERROR(r.Positive("feed_forward_length", c.dense_intermediate_size));
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t shared, r.IntOr("expert_shared_count", 0));
  if (shared < 0 || shared > kMaxExperts) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", GgufKey(arch, "expert_shared_count"), " is ",
                                                   shared, ", not in [0, ", kMaxExperts, "]"));
  }
  c.shared_expert_intermediate_size = shared * c.intermediate_size;
  const bool glm = c.architecture == Architecture::kGlm4Moe;
  // Old deepseek2 files (V2, V2-Lite) carry no scale: 1.
  TANDEM_ASSIGN_OR_RETURN(c.routed_scaling_factor,
                          glm ? r.ArchFloat("expert_weights_scale") : r.ArchFloatOr("expert_weights_scale", 1.0));
  TANDEM_ASSIGN_OR_RETURN(c.norm_topk_prob, r.BoolOr("expert_weights_norm", false));
  TANDEM_ASSIGN_OR_RETURN(const int64_t gating,
                          r.IntOr("expert_gating_func", glm ? kGgufExpertGatingSigmoid : kGgufExpertGatingSoftmax));
  if (glm ? gating != 0 && gating != kGgufExpertGatingSigmoid
          : gating != kGgufExpertGatingSoftmax && gating != kGgufExpertGatingSigmoid) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key ", GgufKey(arch, "expert_gating_func"), " is ", gating,
                     glm ? "; glm4moe routes by sigmoid (2)" : "; deepseek2 routes by softmax (1) or sigmoid (2)"));
  }
  if (!glm && gating == kGgufExpertGatingSigmoid) c.architecture = Architecture::kDeepseekV3;
  TANDEM_ASSIGN_OR_RETURN(c.n_group, r.IntOr("expert_group_count", 1));
  TANDEM_ASSIGN_OR_RETURN(c.topk_group, r.IntOr("expert_group_used_count", 1));
  if (glm) c.use_qk_norm = Has(checkpoint, GgufTensorName(WeightRole::kQNorm, 0));
  return absl::OkStatus();
}

// deepseek2's latent attention: the ranks, and the head as key_length
// (nope + rope) with rope.dimension_count rotated and value_length for v.
// Newer converters write the latent's widths as key/value_length and the
// head's as key_length_mla / value_length_mla.
absl::Status ReadLatentAttention(const Reader& r, ModelConfig& c) {
  TANDEM_ASSIGN_OR_RETURN(c.q_lora_rank, r.IntOr("attention.q_lora_rank", 0));
  TANDEM_ASSIGN_OR_RETURN(c.kv_lora_rank, r.Int("attention.kv_lora_rank"));
  TANDEM_RETURN_IF_ERROR(r.Positive("attention.kv_lora_rank", c.kv_lora_rank));
  TANDEM_ASSIGN_OR_RETURN(const int64_t key, r.Int("attention.key_length"));
  TANDEM_ASSIGN_OR_RETURN(const int64_t value, r.Int("attention.value_length"));
  TANDEM_ASSIGN_OR_RETURN(c.head_dim, r.IntOr("attention.key_length_mla", key));
  TANDEM_ASSIGN_OR_RETURN(c.v_head_dim, r.IntOr("attention.value_length_mla", value));
  TANDEM_ASSIGN_OR_RETURN(c.qk_rope_head_dim, r.Int("rope.dimension_count"));
  c.qk_nope_head_dim = c.head_dim - c.qk_rope_head_dim;
  if (c.qk_nope_head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(r.source(), ": key ", GgufKey(r.arch(), "rope.dimension_count"),
                                                   " (", c.qk_rope_head_dim,
                                                   ") must be less than the head's key length (", c.head_dim, ")"));
  }
  c.num_key_value_heads = c.num_attention_heads;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufCheckpoint& checkpoint) {
  const GgufMetadata& m = checkpoint.metadata();
  const std::string source = checkpoint.Describe();
  TANDEM_ASSIGN_OR_RETURN(const std::string arch, m.GetString(kGgufArchitectureKey));
  ModelConfig c;
  TANDEM_ASSIGN_OR_RETURN(c.architecture, ArchitectureFromGguf(arch, source));
  const bool phimoe = c.architecture == Architecture::kPhiMoE;
  const bool qwen = c.architecture == Architecture::kQwen3Moe || c.architecture == Architecture::kQwen2Moe;
  const bool glm = c.architecture == Architecture::kGlm4Moe;
  const bool deepseek = c.deepseek();
  c.torch_dtype = "bfloat16";
  const Reader r(m, arch);

  TANDEM_ASSIGN_OR_RETURN(c.hidden_size, r.Int("embedding_length"));
  TANDEM_ASSIGN_OR_RETURN(c.num_hidden_layers, r.Int("block_count"));
  // Qwen: the experts' width apart from the (unused) dense MLP's.
  TANDEM_ASSIGN_OR_RETURN(c.intermediate_size,
                          r.Int(qwen || glm || deepseek ? "expert_feed_forward_length" : "feed_forward_length"));
  // llama.cpp renormalises the top-k weights of llama (Mixtral) and
  // qwen3moe, not of qwen2moe or olmoe (its build_moe_ffn norm_w).
  c.norm_topk_prob = c.architecture == Architecture::kMixtral || c.architecture == Architecture::kQwen3Moe;
  if (qwen) TANDEM_RETURN_IF_ERROR(ReadDenseLayers(checkpoint, r, c));
  if (glm || deepseek) TANDEM_RETURN_IF_ERROR(ReadDeepseekMoeLayout(checkpoint, r, arch, c));
  // deepseek2 is V2 or V3 by its router (ReadDeepseekMoeLayout).
  c.architecture_name = std::string(ArchitectureClassName(c.architecture));
  c.model_type = std::string(ArchitectureModelType(c.architecture));
  if (c.architecture == Architecture::kQwen2Moe) {
    TANDEM_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size, r.Int("expert_shared_feed_forward_length"));
    TANDEM_RETURN_IF_ERROR(r.Positive("expert_shared_feed_forward_length", c.shared_expert_intermediate_size));
  }
  TANDEM_ASSIGN_OR_RETURN(c.max_position_embeddings, r.Int("context_length"));
  TANDEM_ASSIGN_OR_RETURN(c.num_attention_heads, r.Int("attention.head_count"));
  TANDEM_RETURN_IF_ERROR(r.Positive("attention.head_count", c.num_attention_heads));
  TANDEM_RETURN_IF_ERROR(r.Positive("embedding_length", c.hidden_size));
  TANDEM_ASSIGN_OR_RETURN(c.num_key_value_heads, r.IntOr("attention.head_count_kv", c.num_attention_heads));
  if (deepseek) TANDEM_RETURN_IF_ERROR(ReadLatentAttention(r, c));
  TANDEM_ASSIGN_OR_RETURN(c.head_dim, r.IntOr("attention.key_length", c.hidden_size / c.num_attention_heads));
  if (deepseek) c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
  TANDEM_ASSIGN_OR_RETURN(const int64_t value_length, r.IntOr("attention.value_length", c.head_dim));
  TANDEM_ASSIGN_OR_RETURN(const int64_t rope_dims, r.IntOr("rope.dimension_count", c.head_dim));
  // glm4moe rotates the first rope.dimension_count values of a head.
  if (!deepseek && (value_length != c.head_dim || (rope_dims != c.head_dim && !glm))) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", GgufKey(arch, "attention.value_length"), " (",
                                                   value_length, ") and ", GgufKey(arch, "rope.dimension_count"), " (",
                                                   rope_dims, ") must equal the head size ", c.head_dim,
                                                   ": tandem rotates and attends over whole heads"));
  }
  if (glm) {
    if (rope_dims <= 0 || rope_dims > c.head_dim || rope_dims % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": key ", GgufKey(arch, "rope.dimension_count"), " is ",
                                                     rope_dims, ": must be even and in [2, head size ", c.head_dim,
                                                     "]"));
    }
    c.rotary_dim = rope_dims;
  }
  TANDEM_ASSIGN_OR_RETURN(c.num_local_experts, r.Int("expert_count"));
  TANDEM_ASSIGN_OR_RETURN(c.num_experts_per_tok, r.Int("expert_used_count"));
  if ((glm || deepseek) &&
      (c.n_group < 1 || c.num_local_experts % c.n_group != 0 || c.topk_group < 1 || c.topk_group > c.n_group)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": keys ", GgufKey(arch, "expert_group_count"), " (",
                                                   c.n_group, ") and ", GgufKey(arch, "expert_group_used_count"), " (",
                                                   c.topk_group, ") must split the ", c.num_local_experts,
                                                   " experts into equal groups and keep 1 to all of them"));
  }
  TANDEM_ASSIGN_OR_RETURN(c.rope_theta, r.ArchFloatOr("rope.freq_base", 10000.0));
  TANDEM_ASSIGN_OR_RETURN(c.rms_norm_eps, r.ArchFloat("attention.layer_norm_rms_epsilon"));
  TANDEM_ASSIGN_OR_RETURN(const int64_t window, r.IntOr("attention.sliding_window", 0));
  if (window > 0) c.sliding_window = window;

  // What the tensors say.
  TANDEM_ASSIGN_OR_RETURN(GgufTensor embed, checkpoint.Get(GgufTensorName(WeightRole::kEmbedTokens)));
  if (embed.info->dims.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tensor token_embd.weight has ", embed.info->dims.size(),
                                                   " dims, expected 2 ({hidden, vocab})"));
  }
  c.vocab_size = embed.info->dims[1];
  TANDEM_ASSIGN_OR_RETURN(const int64_t vocab_key, r.IntOr("vocab_size", c.vocab_size));
  if (vocab_key != c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": key ", GgufKey(arch, "vocab_size"), " is ", vocab_key,
                                                   " but token_embd.weight has ", c.vocab_size, " rows"));
  }
  c.tie_word_embeddings = !Has(checkpoint, GgufTensorName(WeightRole::kLmHead));
  c.attention_bias = Has(checkpoint, GgufTensorName(WeightRole::kQBias, 0));
  c.lm_head_bias = Has(checkpoint, GgufTensorName(WeightRole::kLmHeadBias));
  TANDEM_RETURN_IF_ERROR(ReadRopeScaling(m, r, arch, c));
  if (phimoe) {
    TANDEM_RETURN_IF_ERROR(ReadLongRope(checkpoint, r, c));
    TANDEM_ASSIGN_OR_RETURN(c.router_jitter_noise, r.FloatOr(kTandemRouterJitterKey, kDefaultRouterJitter));
  }

  if (m.Contains("tokenizer.ggml.bos_token_id")) {
    TANDEM_ASSIGN_OR_RETURN(const int64_t bos, m.GetInteger("tokenizer.ggml.bos_token_id"));
    c.bos_token_id = static_cast<int32_t>(bos);
  }
  if (m.Contains("tokenizer.ggml.eos_token_id")) {
    TANDEM_ASSIGN_OR_RETURN(const int64_t eos, m.GetInteger("tokenizer.ggml.eos_token_id"));
    c.eos_token_ids = {static_cast<int32_t>(eos)};
  } else {
    c.eos_token_ids = {2};
  }
  TANDEM_RETURN_IF_ERROR(c.Validate(source));
  return c;
}

absl::Status AddModelConfigToGguf(const ModelConfig& c, const std::string& model_name, GgufMetadata* m) {
  const std::string arch(GgufArchitecture(c.architecture));
  const bool phimoe = c.architecture == Architecture::kPhiMoE;
  auto u32 = [](int64_t v) { return GgufValue(static_cast<uint32_t>(v)); };
  auto f32 = [](double v) { return GgufValue(static_cast<float>(v)); };
  auto set = [&](std::string_view suffix, GgufValue v) { m->Set(GgufKey(arch, suffix), std::move(v)); };
  m->Set(kGgufArchitectureKey, arch);
  m->Set("general.type", "model");
  m->Set("general.name", model_name);
  set("block_count", u32(c.num_hidden_layers));
  set("context_length", u32(c.max_position_embeddings));
  set("embedding_length", u32(c.hidden_size));
  const bool glm = c.architecture == Architecture::kGlm4Moe;
  const bool layout = c.deepseek_moe_layout();  // GLM-4.5 or DeepSeek
  const bool qwen = c.architecture == Architecture::kQwen3Moe || c.architecture == Architecture::kQwen2Moe || layout;
  // Qwen: its dense MLP's width, as the converter writes intermediate_size.
  const int64_t dense_width = c.dense_intermediate_size > 0 ? c.dense_intermediate_size
                              : c.shared_expert()           ? c.shared_expert_intermediate_size
                                                            : c.intermediate_size;
  set("feed_forward_length", u32(qwen ? dense_width : c.intermediate_size));
  if (qwen) set("expert_feed_forward_length", u32(c.intermediate_size));
  if (c.shared_expert() && !layout) set("expert_shared_feed_forward_length", u32(c.shared_expert_intermediate_size));
  if (layout) {  // as the converter's Glm4MoeModel and DeepseekV2Model write them
    set("expert_shared_count", u32(c.shared_expert_intermediate_size / c.intermediate_size));
    set("leading_dense_block_count", u32(static_cast<int64_t>(c.dense_layers.size())));
    set("expert_gating_func",
        u32(c.router_kind() == RouterKind::kSigmoidGroupedTopK ? kGgufExpertGatingSigmoid : kGgufExpertGatingSoftmax));
    set("expert_weights_scale", f32(c.routed_scaling_factor));
    set("expert_weights_norm", GgufValue(c.norm_topk_prob));
    if (glm) set("nextn_predict_layers", u32(0));
    if (c.n_group > 1) {
      set("expert_group_count", u32(c.n_group));
      set("expert_group_used_count", u32(c.topk_group));
    }
  }
  set("attention.head_count", u32(c.num_attention_heads));
  set("attention.head_count_kv", u32(c.num_key_value_heads));
  set("rope.freq_base", f32(c.rope_theta));
  set("attention.layer_norm_rms_epsilon", f32(c.rms_norm_eps));
  set("expert_count", u32(c.num_local_experts));
  set("expert_used_count", u32(c.num_experts_per_tok));
  if (c.mla()) {
    if (c.q_lora_rank > 0) set("attention.q_lora_rank", u32(c.q_lora_rank));
    set("attention.kv_lora_rank", u32(c.kv_lora_rank));
    set("attention.key_length", u32(c.head_dim));
    set("attention.value_length", u32(c.v_head_dim));
  } else if (c.head_dim != c.hidden_size / c.num_attention_heads || qwen) {
    set("attention.key_length", u32(c.head_dim));
    set("attention.value_length", u32(c.head_dim));
  }
  set("rope.dimension_count", u32(c.rope_dim()));
  if (c.rope_scaling.type == "yarn") {
    const RopeScaling& s = c.rope_scaling;
    set("rope.scaling.type", GgufValue(std::string("yarn")));
    set("rope.scaling.factor", f32(s.factor));
    set("rope.scaling.original_context_length", u32(s.original_max_position_embeddings));
    if (s.beta_fast != 32.0) set("rope.scaling.yarn_beta_fast", f32(s.beta_fast));
    if (s.beta_slow != 1.0) set("rope.scaling.yarn_beta_slow", f32(s.beta_slow));
    if (s.mscale_all_dim > 0.0) set("rope.scaling.yarn_log_multiplier", f32(0.1 * s.mscale_all_dim));
    m->Set(kTandemYarnAttentionFactorKey, s.attention_factor);
  }
  if (!phimoe) {
    set("vocab_size", u32(c.vocab_size));
    // The llama architecture has no window in llama.cpp; kept for tandem.
    if (c.sliding_window) set("attention.sliding_window", u32(*c.sliding_window));
    return absl::OkStatus();
  }
  set("attention.sliding_window", u32(c.sliding_window.value_or(0)));
  if (c.rope_scaling.type == "longrope") {
    const RopeScaling& s = c.rope_scaling;
    set("rope.scaling.original_context_length", u32(s.original_max_position_embeddings));
    // The converter's factor (what llama.cpp scales by), and Hugging Face's.
    const double scale = static_cast<double>(c.max_position_embeddings) /
                         static_cast<double>(std::max<int64_t>(s.original_max_position_embeddings, 1));
    const double attn_factor =
        scale > 1.0
            ? std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(s.original_max_position_embeddings)))
            : 1.0;
    set("rope.scaling.attn_factor", f32(attn_factor));
    m->Set(kTandemShortMscaleKey, s.short_mscale);
    m->Set(kTandemLongMscaleKey, s.long_mscale);
    m->Set(kTandemShortFactorKey, GgufArray(s.short_factor));
    m->Set(kTandemLongFactorKey, GgufArray(s.long_factor));
  } else if (!c.rope_scaling.type.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("rope_scaling type \"", c.rope_scaling.type,
                                                   "\" has no GGUF form tandem writes (it writes longrope)"));
  }
  m->Set(kTandemRouterJitterKey, c.router_jitter_noise);
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<float>>> GgufConfigTensors(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  if (c.architecture != Architecture::kPhiMoE || c.rope_scaling.type != "longrope") return out;
  auto floats = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  out.emplace_back(kGgufRopeFactorsLong, floats(c.rope_scaling.long_factor));
  out.emplace_back(kGgufRopeFactorsShort, floats(c.rope_scaling.short_factor));
  return out;
}

}  // namespace tandem
