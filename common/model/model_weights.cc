#include "common/model/model_weights.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_tensor_source.h"
#include "common/model/tensor_names.h"
#include "common/quant/block_order.h"
#include "common/quant/quantize.h"

namespace tandem {
namespace {

class Binder {
 public:
  Binder(const ModelConfig& config, const TensorSource& source) : config_(config), source_(source) {}

  absl::StatusOr<TensorView> View(WeightRole role, int layer = -1, int expert = -1) {
    const std::string name = WeightName(config_, role, layer, expert);
    TANDEM_ASSIGN_OR_RETURN(TensorView view, source_.Get(name));
    const std::vector<int64_t> expected = WeightShape(config_, role);
    if (view.shape != expected) {
      return absl::InvalidArgumentError(absl::StrCat(source_.Describe(), ": tensor ", name, " has shape ",
                                                     ShapeString(view.shape), ", config.json implies ",
                                                     ShapeString(expected)));
    }
    bytes_ += static_cast<int64_t>(view.size_bytes);
    return view;
  }

  absl::StatusOr<LinearWeight> Linear(WeightRole role, int layer = -1, int expert = -1) {
    TANDEM_ASSIGN_OR_RETURN(TensorView view, View(role, layer, expert));
    return LinearWeight{view.data, view.dtype, view.dim(0), view.dim(1), view.order};
  }

  absl::StatusOr<std::vector<float>> Vector(WeightRole role, int layer = -1) {
    TANDEM_ASSIGN_OR_RETURN(TensorView view, View(role, layer));
    TANDEM_RETURN_IF_ERROR(RequireFloatDType(view.dtype, absl::StrCat(source_.Describe(), ": tensor ", view.name),
                                             "the loader's vectors (norms, biases)"));
    std::vector<float> out(static_cast<size_t>(view.num_elements()));
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = LoadAsF32(view.data, view.dtype, i);
      // A NaN or Inf norm or bias poisons every token: refused at load.
      if (!std::isfinite(out[i])) {
        return absl::InvalidArgumentError(absl::StrCat(source_.Describe(), ": tensor ", view.name, " element ", i,
                                                       " is ", out[i], ": weights must be finite"));
      }
    }
    return out;
  }

  absl::StatusOr<NormWeights> Norm(WeightRole weight, WeightRole bias, int layer = -1) {
    NormWeights norm;
    TANDEM_ASSIGN_OR_RETURN(norm.weight, Vector(weight, layer));
    if (config_.norm_kind() == NormKind::kLayerNorm) {
      TANDEM_ASSIGN_OR_RETURN(norm.bias, Vector(bias, layer));
    }
    return norm;
  }

  int64_t bytes() const { return bytes_; }

 private:
  const ModelConfig& config_;
  const TensorSource& source_;
  int64_t bytes_ = 0;
};

// k_b [H R, nope] from kv_b [H (nope + v), R]: row h R + r of k_b is
// column r of head h's key rows, so each head's absorbed query is one
// Linear. F32 stays F32 (the float64 tests compare exactly); anything else
// is widened once and kept as BF16: every decode step reads all of it
// (H R nope values per layer), and as F32 it took half of a DeepSeek-V2-Lite
// Q4_K_M decode step's attention time (13.9 -> 7.0 ms per token).
absl::Status DeriveKeyAbsorb(const ModelConfig& c, const std::string& source, LatentAttentionWeights& m) {
  const int64_t heads = c.num_attention_heads, rank = c.kv_lora_rank, nope = c.qk_nope_head_dim;
  const int64_t per_head = nope + c.v_head_dim;
  const DType to = m.kv_b_proj.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
  m.k_b_bytes.resize(static_cast<size_t>(heads * rank * nope) * DTypeSize(to));
  std::vector<float> row(static_cast<size_t>(rank));
  const int64_t row_bytes = m.kv_b_proj.row_bytes();
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < nope; ++i) {
      const uint8_t* src = static_cast<const uint8_t*>(m.kv_b_proj.data) + (h * per_head + i) * row_bytes;
      if (IsQuantized(m.kv_b_proj.dtype)) {
        const GgmlType type = GgmlFromDType(m.kv_b_proj.dtype);
        std::vector<uint8_t> blocks(src, src + row_bytes);  // in ggml's order for DequantizeRow
        if (m.kv_b_proj.order == BlockOrder::kGroupMajor)
          TANDEM_RETURN_IF_ERROR(ToGgmlOrder(type, absl::MakeSpan(blocks)));
        if (absl::Status s = DequantizeRow(type, blocks, absl::MakeSpan(row)); !s.ok()) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": kv_b_proj of ", c.architecture_name, ": ", s.message()));
        }
      } else {
        for (int64_t r = 0; r < rank; ++r)
          row[static_cast<size_t>(r)] = LoadAsF32(src, m.kv_b_proj.dtype, static_cast<size_t>(r));
      }
      for (int64_t r = 0; r < rank; ++r) {
        const size_t at = static_cast<size_t>((h * rank + r) * nope + i);
        if (to == DType::kF32) {
          reinterpret_cast<float*>(m.k_b_bytes.data())[at] = row[static_cast<size_t>(r)];
        } else {
          reinterpret_cast<uint16_t*>(m.k_b_bytes.data())[at] = F32ToBf16(row[static_cast<size_t>(r)]);
        }
      }
    }
  }
  m.k_b = LinearWeight{m.k_b_bytes.data(), to, heads * rank, nope};
  return absl::OkStatus();
}

absl::Status BindLatentAttention(const ModelConfig& c, const TensorSource& source, Binder& bind, int l,
                                 LayerWeights& layer) {
  LatentAttentionWeights& m = layer.mla;
  if (c.q_lora_rank > 0) {
    TANDEM_ASSIGN_OR_RETURN(m.q_a_proj, bind.Linear(WeightRole::kQAProj, l));
    TANDEM_ASSIGN_OR_RETURN(m.q_a_norm, bind.Vector(WeightRole::kQANorm, l));
    TANDEM_ASSIGN_OR_RETURN(m.q_b_proj, bind.Linear(WeightRole::kQBProj, l));
  } else {
    TANDEM_ASSIGN_OR_RETURN(layer.q_proj, bind.Linear(WeightRole::kQProj, l));
  }
  TANDEM_ASSIGN_OR_RETURN(m.kv_a_proj, bind.Linear(WeightRole::kKvAProj, l));
  TANDEM_ASSIGN_OR_RETURN(m.kv_a_norm, bind.Vector(WeightRole::kKvANorm, l));
  TANDEM_ASSIGN_OR_RETURN(m.kv_b_proj, bind.Linear(WeightRole::kKvBProj, l));
  TANDEM_ASSIGN_OR_RETURN(layer.o_proj, bind.Linear(WeightRole::kOProj, l));
  return DeriveKeyAbsorb(c, source.Describe(), m);
}

}  // namespace

LinearWeight LatentAttentionWeights::KeyAbsorb(int64_t head) const {
  const int64_t rank = kv_b_proj.k;
  return LinearWeight{static_cast<const uint8_t*>(k_b.data) + head * rank * k_b.row_bytes(), k_b.dtype, rank, k_b.k};
}

LinearWeight LatentAttentionWeights::ValueUp(int64_t head, int64_t nope, int64_t v) const {
  const int64_t row = head * (nope + v) + nope;
  return LinearWeight{static_cast<const uint8_t*>(kv_b_proj.data) + row * kv_b_proj.row_bytes(), kv_b_proj.dtype, v,
                      kv_b_proj.k, kv_b_proj.order};
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadModelWeights(const ModelConfig& config,
                                                               std::shared_ptr<const TensorSource> source) {
  auto w = std::make_unique<ModelWeights>();
  w->config = config;
  Binder bind(config, *source);
  TANDEM_ASSIGN_OR_RETURN(w->embed_tokens, bind.View(WeightRole::kEmbedTokens));
  w->layers.resize(static_cast<size_t>(config.num_hidden_layers));
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    LayerWeights& layer = w->layers[static_cast<size_t>(l)];
    TANDEM_ASSIGN_OR_RETURN(layer.input_norm, bind.Norm(WeightRole::kInputNorm, WeightRole::kInputNormBias, l));
    if (config.mla()) {
      TANDEM_RETURN_IF_ERROR(BindLatentAttention(config, *source, bind, l, layer));
    } else {
      TANDEM_ASSIGN_OR_RETURN(layer.q_proj, bind.Linear(WeightRole::kQProj, l));
      TANDEM_ASSIGN_OR_RETURN(layer.k_proj, bind.Linear(WeightRole::kKProj, l));
      TANDEM_ASSIGN_OR_RETURN(layer.v_proj, bind.Linear(WeightRole::kVProj, l));
      TANDEM_ASSIGN_OR_RETURN(layer.o_proj, bind.Linear(WeightRole::kOProj, l));
    }
    if (config.qk_norm()) {
      TANDEM_ASSIGN_OR_RETURN(layer.q_norm, bind.Vector(WeightRole::kQNorm, l));
      TANDEM_ASSIGN_OR_RETURN(layer.k_norm, bind.Vector(WeightRole::kKNorm, l));
    }
    if (config.attention_bias) {
      TANDEM_ASSIGN_OR_RETURN(layer.q_bias, bind.Vector(WeightRole::kQBias, l));
      TANDEM_ASSIGN_OR_RETURN(layer.k_bias, bind.Vector(WeightRole::kKBias, l));
      TANDEM_ASSIGN_OR_RETURN(layer.v_bias, bind.Vector(WeightRole::kVBias, l));
      if (config.o_proj_bias()) {
        TANDEM_ASSIGN_OR_RETURN(layer.o_bias, bind.Vector(WeightRole::kOBias, l));
      }
    }
    TANDEM_ASSIGN_OR_RETURN(layer.post_attention_norm,
                            bind.Norm(WeightRole::kPostAttentionNorm, WeightRole::kPostAttentionNormBias, l));
    if (config.dense_layer(l)) {
      TANDEM_ASSIGN_OR_RETURN(layer.dense_mlp.w1, bind.Linear(WeightRole::kDenseW1, l));
      TANDEM_ASSIGN_OR_RETURN(layer.dense_mlp.w2, bind.Linear(WeightRole::kDenseW2, l));
      TANDEM_ASSIGN_OR_RETURN(layer.dense_mlp.w3, bind.Linear(WeightRole::kDenseW3, l));
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(layer.router, bind.Linear(WeightRole::kRouter, l));
    if (config.router_correction_bias()) {
      TANDEM_ASSIGN_OR_RETURN(layer.router_correction_bias, bind.Vector(WeightRole::kRouterCorrectionBias, l));
    }
    const int64_t before_experts = bind.bytes();
    layer.experts.resize(static_cast<size_t>(config.num_local_experts));
    for (int e = 0; e < config.num_local_experts; ++e) {
      ExpertWeights& expert = layer.experts[static_cast<size_t>(e)];
      TANDEM_ASSIGN_OR_RETURN(expert.w1, bind.Linear(WeightRole::kExpertW1, l, e));
      TANDEM_ASSIGN_OR_RETURN(expert.w2, bind.Linear(WeightRole::kExpertW2, l, e));
      TANDEM_ASSIGN_OR_RETURN(expert.w3, bind.Linear(WeightRole::kExpertW3, l, e));
    }
    w->expert_bytes += bind.bytes() - before_experts;
    if (config.shared_expert()) {
      if (config.shared_expert_gated()) {
        TANDEM_ASSIGN_OR_RETURN(layer.shared_expert_gate, bind.Vector(WeightRole::kSharedExpertGate, l));
      }
      TANDEM_ASSIGN_OR_RETURN(layer.shared_expert.w1, bind.Linear(WeightRole::kSharedW1, l));
      TANDEM_ASSIGN_OR_RETURN(layer.shared_expert.w2, bind.Linear(WeightRole::kSharedW2, l));
      TANDEM_ASSIGN_OR_RETURN(layer.shared_expert.w3, bind.Linear(WeightRole::kSharedW3, l));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(w->final_norm, bind.Norm(WeightRole::kFinalNorm, WeightRole::kFinalNormBias));
  if (config.tie_word_embeddings) {
    w->lm_head = LinearWeight{w->embed_tokens.data, w->embed_tokens.dtype, config.vocab_size, config.hidden_size};
  } else {
    TANDEM_ASSIGN_OR_RETURN(w->lm_head, bind.Linear(WeightRole::kLmHead));
  }
  if (config.lm_head_bias) {
    TANDEM_ASSIGN_OR_RETURN(w->lm_head_bias, bind.Vector(WeightRole::kLmHeadBias));
  }
  w->total_bytes = bind.bytes();
  w->source = std::move(source);
  return w;
}

}  // namespace tandem
