#include "common/model/model_fingerprint.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/model/tensor_names.h"

namespace tandem {
namespace {

class Fnv1a64 {
 public:
  void Add(std::string_view text) {
    for (unsigned char c : text) {
      hash_ ^= c;
      hash_ *= 0x100000001b3ULL;
    }
    hash_ ^= 0xff;  // field separator: "ab"+"c" != "a"+"bc"
    hash_ *= 0x100000001b3ULL;
  }
  uint64_t value() const { return hash_; }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

std::string Double(double v) { return absl::StrFormat("%.17g", v); }

// Every config field that changes the forward pass, as "name=value".
uint64_t HashConfig(const ModelConfig& c) {
  Fnv1a64 h;
  h.Add(absl::StrCat("architecture=", c.architecture_name));
  h.Add(absl::StrCat("model_type=", c.model_type));
  h.Add(absl::StrCat("vocab_size=", c.vocab_size));
  h.Add(absl::StrCat("hidden_size=", c.hidden_size));
  h.Add(absl::StrCat("intermediate_size=", c.intermediate_size));
  h.Add(absl::StrCat("num_hidden_layers=", c.num_hidden_layers));
  h.Add(absl::StrCat("num_attention_heads=", c.num_attention_heads));
  h.Add(absl::StrCat("num_key_value_heads=", c.num_key_value_heads));
  h.Add(absl::StrCat("head_dim=", c.head_dim));
  h.Add(absl::StrCat("max_position_embeddings=", c.max_position_embeddings));
  h.Add(absl::StrCat("rope_theta=", Double(c.rope_theta)));
  h.Add(absl::StrCat("rms_norm_eps=", Double(c.rms_norm_eps)));
  h.Add(absl::StrCat("sliding_window=", c.sliding_window ? absl::StrCat(*c.sliding_window) : std::string("none")));
  h.Add(absl::StrCat("num_local_experts=", c.num_local_experts));
  h.Add(absl::StrCat("num_experts_per_tok=", c.num_experts_per_tok));
  h.Add(absl::StrCat("attention_bias=", c.attention_bias));
  h.Add(absl::StrCat("lm_head_bias=", c.lm_head_bias));
  h.Add(absl::StrCat("tie_word_embeddings=", c.tie_word_embeddings));
  h.Add(absl::StrCat("router_jitter_noise=", Double(c.router_jitter_noise)));
  // Added only where they differ from what every earlier model had, so
  // earlier fingerprints stay as they were.
  if (!c.norm_topk_prob) h.Add("norm_topk_prob=false");
  if (c.shared_expert()) h.Add(absl::StrCat("shared_expert_intermediate_size=", c.shared_expert_intermediate_size));
  if (!c.dense_layers.empty()) {
    h.Add(absl::StrCat("dense_layers=", absl::StrJoin(c.dense_layers, ","), ";", c.dense_intermediate_size));
  }
  if (c.router_kind() == RouterKind::kSigmoidGroupedTopK) {
    h.Add(absl::StrCat("sigmoid_router=", c.n_group, ",", c.topk_group, ",", Double(c.routed_scaling_factor)));
  }
  if (c.router_kind() == RouterKind::kSoftmaxGroupedTopK) {
    h.Add(absl::StrCat("softmax_grouped_router=", c.n_group, ",", c.topk_group, ",", Double(c.routed_scaling_factor)));
  }
  if (c.mla()) {
    h.Add(absl::StrCat("mla=", c.q_lora_rank, ",", c.kv_lora_rank, ",", c.qk_nope_head_dim, ",", c.qk_rope_head_dim,
                       ",", c.v_head_dim, ";", Double(c.rope_scaling.mscale_all_dim)));
  }
  if (c.rope_dim() != c.head_dim) h.Add(absl::StrCat("rotary_dim=", c.rope_dim()));
  if (c.use_qk_norm) h.Add("use_qk_norm=true");
  h.Add(absl::StrCat("bos_token_id=", c.bos_token_id));
  h.Add(absl::StrCat("eos_token_ids=", absl::StrJoin(c.eos_token_ids, ",")));
  const RopeScaling& r = c.rope_scaling;
  h.Add(absl::StrCat("rope_scaling.type=", r.type));
  std::vector<std::string> shorts, longs;
  for (double v : r.short_factor) shorts.push_back(Double(v));
  for (double v : r.long_factor) longs.push_back(Double(v));
  h.Add(absl::StrCat("rope_scaling.short_factor=", absl::StrJoin(shorts, ",")));
  h.Add(absl::StrCat("rope_scaling.long_factor=", absl::StrJoin(longs, ",")));
  h.Add(absl::StrCat("rope_scaling.short_mscale=", Double(r.short_mscale)));
  h.Add(absl::StrCat("rope_scaling.long_mscale=", Double(r.long_mscale)));
  h.Add(absl::StrCat("rope_scaling.original_max_position_embeddings=", r.original_max_position_embeddings));
  if (r.type == "yarn") {
    h.Add(absl::StrCat("rope_scaling.yarn=", Double(r.factor), ",", Double(r.beta_fast), ",", Double(r.beta_slow), ",",
                       Double(r.attention_factor), ",", r.truncate));
  }
  return h.value();
}

void AddTensor(Fnv1a64& h, const std::string& name, DType dtype, const std::vector<int64_t>& shape) {
  h.Add(absl::StrCat(name, "|", std::string(DTypeName(dtype)), "|", ShapeString(shape)));
}

ModelFingerprint Base(const ModelConfig& c) {
  ModelFingerprint f;
  f.architecture = c.architecture_name;
  f.config_hash = HashConfig(c);
  f.num_layers = static_cast<int32_t>(c.num_hidden_layers);
  f.num_experts = static_cast<int32_t>(c.num_local_experts);
  f.hidden_size = c.hidden_size;
  f.intermediate_size = c.intermediate_size;
  return f;
}

}  // namespace

std::string FingerprintString(const ModelFingerprint& f) {
  return absl::StrFormat("%s L=%d E=%d D=%d I=%d config=%016x tensors=%016x", f.architecture, f.num_layers,
                         f.num_experts, f.hidden_size, f.intermediate_size, f.config_hash, f.tensors_hash);
}

absl::StatusOr<ModelFingerprint> FingerprintModel(const ModelConfig& config, const TensorSource& source) {
  ModelFingerprint f = Base(config);
  Fnv1a64 h;
  for (const WeightSpec& spec : ExpectedWeights(config)) {
    TANDEM_ASSIGN_OR_RETURN(TensorView view, source.Get(spec.name));
    TANDEM_ASSIGN_OR_RETURN(const DType stored, source.StoredDType(spec.name));
    AddTensor(h, spec.name, stored, view.shape);
  }
  f.tensors_hash = h.value();
  return f;
}

ModelFingerprint FingerprintConfig(const ModelConfig& config, DType dtype) {
  ModelFingerprint f = Base(config);
  Fnv1a64 h;
  for (const WeightSpec& spec : ExpectedWeights(config)) AddTensor(h, spec.name, dtype, spec.shape);
  f.tensors_hash = h.value();
  return f;
}

}  // namespace tandem
