#include "tests/reference_model_testlib.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/dtype.h"
#include "common/base/tensor_view.h"
#include "common/model/safetensors.h"

namespace tandem {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Hugging Face tensor names, spelled out here rather than taken from
// common/tensor_names so that a wrong name there cannot hide in both.
std::string LayerName(int layer, const char* rest) { return absl::StrCat("model.layers.", layer, ".", rest); }
std::string ExpertName(int layer, int expert, const char* matrix) {
  return absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.", expert, ".", matrix, ".weight");
}
// Qwen2/3-MoE and OLMoE: mlp.experts.e.{gate,down,up}_proj.
std::string MlpExpertName(int layer, int expert, const char* matrix) {
  return absl::StrCat("model.layers.", layer, ".mlp.experts.", expert, ".", matrix, ".weight");
}

// Reads a stored tensor of the expected shape into doubles: [N, K] as an
// N x K matrix, [N] as one row of N.
absl::StatusOr<RefTensor> ReadTensor(const TensorSource& source, const std::string& name,
                                     const std::vector<int64_t>& shape) {
  absl::StatusOr<TensorView> view = source.Get(name);
  if (!view.ok()) return view.status();
  if (view->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat("reference: tensor ", name, " has shape ", ShapeString(view->shape),
                                                   ", expected ", ShapeString(shape)));
  }
  const int64_t rows = shape.size() == 2 ? shape[0] : 1;
  const int64_t cols = shape.back();
  RefTensor t(rows, cols);
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = LoadAsF32(view->data, view->dtype, i);
  return t;
}

absl::StatusOr<std::vector<double>> ReadVector(const TensorSource& source, const std::string& name, int64_t n) {
  absl::StatusOr<RefTensor> t = ReadTensor(source, name, {n});
  if (!t.ok()) return t.status();
  return std::move(t->data);
}

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

// Indices of `values` by descending value; ties keep the lower index first
// (torch.max / torch.topk on CPU report the first of equal maxima).
std::vector<int32_t> DescendingOrder(std::span<const double> values) {
  std::vector<int32_t> order(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return values[a] > values[b]; });
  return order;
}

}  // namespace

RefTensor RefTensor::FromF32(const float* values, int64_t r, int64_t c) {
  RefTensor t(r, c);
  for (size_t i = 0; i < t.data.size(); ++i) t.data[i] = values[i];
  return t;
}

const RefTensor& ReferenceForward::Get(std::string_view name, int layer) const {
  static const RefTensor kEmpty;
  auto it = intermediates.find({std::string(name), layer});
  return it == intermediates.end() ? kEmpty : it->second;
}

// ---------------------------------------------------------------- weights

absl::StatusOr<std::unique_ptr<ReferenceModel>> ReferenceModel::Create(const ModelWeights& weights) {
  const ModelConfig& c = weights.config;
  if (weights.source == nullptr) return absl::InvalidArgumentError("reference: the weights have no tensor source");
  const TensorSource& src = *weights.source;
  auto model = std::unique_ptr<ReferenceModel>(new ReferenceModel(c));
  const int64_t d = c.hidden_size, v = c.vocab_size, e = c.num_local_experts, inter = c.intermediate_size;
  const bool layer_norm = c.architecture == Architecture::kPhiMoE;
  const bool qwen3 = c.architecture == Architecture::kQwen3Moe;
  const bool qwen2 = c.architecture == Architecture::kQwen2Moe;
  const bool olmoe = c.architecture == Architecture::kOlmoe;
  const bool glm = c.architecture == Architecture::kGlm4Moe;
  const bool deepseek = c.architecture == Architecture::kDeepseekV2 || c.architecture == Architecture::kDeepseekV3;
  const bool mlp_names = qwen3 || qwen2 || olmoe || glm || deepseek;

  // Assigns `expr` (a StatusOr) to `lhs` or returns its error.
#define REF_ASSIGN(lhs, expr)                   \
  do {                                          \
    auto ref_tmp = (expr);                      \
    if (!ref_tmp.ok()) return ref_tmp.status(); \
    lhs = std::move(*ref_tmp);                  \
  } while (0)

  auto read_norm = [&](const std::string& prefix, RefNorm& norm) -> absl::Status {
    REF_ASSIGN(norm.weight, ReadVector(src, prefix + ".weight", d));
    if (layer_norm) REF_ASSIGN(norm.bias, ReadVector(src, prefix + ".bias", d));
    return absl::OkStatus();
  };

  REF_ASSIGN(model->embed_tokens_, ReadTensor(src, "model.embed_tokens.weight", {v, d}));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    RefLayer layer;
    if (absl::Status s = read_norm(LayerName(l, "input_layernorm"), layer.input_norm); !s.ok()) return s;
    if (deepseek) {  // modeling_deepseek.py DeepseekV2Attention
      const int64_t heads = c.num_attention_heads, rank = c.kv_lora_rank;
      const int64_t qhd = c.qk_nope_head_dim + c.qk_rope_head_dim;
      if (c.q_lora_rank > 0) {
        REF_ASSIGN(layer.q_a_proj, ReadTensor(src, LayerName(l, "self_attn.q_a_proj.weight"), {c.q_lora_rank, d}));
        REF_ASSIGN(layer.q_a_norm, ReadVector(src, LayerName(l, "self_attn.q_a_layernorm.weight"), c.q_lora_rank));
        REF_ASSIGN(layer.q_b_proj,
                   ReadTensor(src, LayerName(l, "self_attn.q_b_proj.weight"), {heads * qhd, c.q_lora_rank}));
      } else {
        REF_ASSIGN(layer.q_proj, ReadTensor(src, LayerName(l, "self_attn.q_proj.weight"), {heads * qhd, d}));
      }
      REF_ASSIGN(layer.kv_a_proj,
                 ReadTensor(src, LayerName(l, "self_attn.kv_a_proj_with_mqa.weight"), {rank + c.qk_rope_head_dim, d}));
      REF_ASSIGN(layer.kv_a_norm, ReadVector(src, LayerName(l, "self_attn.kv_a_layernorm.weight"), rank));
      REF_ASSIGN(layer.kv_b_proj, ReadTensor(src, LayerName(l, "self_attn.kv_b_proj.weight"),
                                             {heads * (c.qk_nope_head_dim + c.v_head_dim), rank}));
      REF_ASSIGN(layer.o_proj, ReadTensor(src, LayerName(l, "self_attn.o_proj.weight"), {d, heads * c.v_head_dim}));
    } else {
      REF_ASSIGN(layer.q_proj, ReadTensor(src, LayerName(l, "self_attn.q_proj.weight"), {c.q_dim(), d}));
      REF_ASSIGN(layer.k_proj, ReadTensor(src, LayerName(l, "self_attn.k_proj.weight"), {c.kv_dim(), d}));
      REF_ASSIGN(layer.v_proj, ReadTensor(src, LayerName(l, "self_attn.v_proj.weight"), {c.kv_dim(), d}));
      REF_ASSIGN(layer.o_proj, ReadTensor(src, LayerName(l, "self_attn.o_proj.weight"), {d, c.q_dim()}));
    }
    if (c.attention_bias) {
      REF_ASSIGN(layer.q_bias, ReadVector(src, LayerName(l, "self_attn.q_proj.bias"), c.q_dim()));
      REF_ASSIGN(layer.k_bias, ReadVector(src, LayerName(l, "self_attn.k_proj.bias"), c.kv_dim()));
      REF_ASSIGN(layer.v_bias, ReadVector(src, LayerName(l, "self_attn.v_proj.bias"), c.kv_dim()));
      // modeling_qwen2_moe.py, modeling_glm4_moe.py: o_proj has no bias.
      if (!qwen2 && !glm) REF_ASSIGN(layer.o_bias, ReadVector(src, LayerName(l, "self_attn.o_proj.bias"), d));
    }
    if (qwen3 || (glm && c.use_qk_norm)) {  // Glm4MoeAttention: per head when use_qk_norm
      REF_ASSIGN(layer.q_norm, ReadVector(src, LayerName(l, "self_attn.q_norm.weight"), c.head_dim));
      REF_ASSIGN(layer.k_norm, ReadVector(src, LayerName(l, "self_attn.k_norm.weight"), c.head_dim));
    }
    if (olmoe) {  // modeling_olmoe.py: RMSNorm over the whole projection
      REF_ASSIGN(layer.q_norm, ReadVector(src, LayerName(l, "self_attn.q_norm.weight"), c.q_dim()));
      REF_ASSIGN(layer.k_norm, ReadVector(src, LayerName(l, "self_attn.k_norm.weight"), c.kv_dim()));
    }
    if (absl::Status s = read_norm(LayerName(l, "post_attention_layernorm"), layer.post_attention_norm); !s.ok()) {
      return s;
    }
    // modeling_qwen2_moe.py / modeling_qwen3_moe.py: a layer is a plain MLP
    // when mlp_only_layers lists it or (l + 1) % decoder_sparse_step != 0
    // (the config reader turned both into dense_layers).
    if (std::find(c.dense_layers.begin(), c.dense_layers.end(), l) != c.dense_layers.end()) {
      const int64_t width = c.dense_intermediate_size;
      layer.dense = true;
      REF_ASSIGN(layer.dense_mlp.w1, ReadTensor(src, LayerName(l, "mlp.gate_proj.weight"), {width, d}));
      REF_ASSIGN(layer.dense_mlp.w2, ReadTensor(src, LayerName(l, "mlp.down_proj.weight"), {d, width}));
      REF_ASSIGN(layer.dense_mlp.w3, ReadTensor(src, LayerName(l, "mlp.up_proj.weight"), {width, d}));
      model->layers_.push_back(std::move(layer));
      continue;
    }
    REF_ASSIGN(layer.router,
               ReadTensor(src, LayerName(l, mlp_names ? "mlp.gate.weight" : "block_sparse_moe.gate.weight"), {e, d}));
    if (glm || c.architecture == Architecture::kDeepseekV3) {
      REF_ASSIGN(layer.router_bias, ReadVector(src, LayerName(l, "mlp.gate.e_score_correction_bias"), e));
    }
    for (int x = 0; x < e; ++x) {
      RefExpert expert;
      REF_ASSIGN(expert.w1, ReadTensor(src, mlp_names ? MlpExpertName(l, x, "gate_proj") : ExpertName(l, x, "w1"),
                                       {inter, d}));
      REF_ASSIGN(expert.w2, ReadTensor(src, mlp_names ? MlpExpertName(l, x, "down_proj") : ExpertName(l, x, "w2"),
                                       {d, inter}));
      REF_ASSIGN(expert.w3, ReadTensor(src, mlp_names ? MlpExpertName(l, x, "up_proj") : ExpertName(l, x, "w3"),
                                       {inter, d}));
      layer.experts.push_back(std::move(expert));
    }
    if (qwen2) {
      const int64_t shared = c.shared_expert_intermediate_size;
      REF_ASSIGN(layer.shared_expert_gate, ReadTensor(src, LayerName(l, "mlp.shared_expert_gate.weight"), {1, d}));
      REF_ASSIGN(layer.shared_expert.w1,
                 ReadTensor(src, LayerName(l, "mlp.shared_expert.gate_proj.weight"), {shared, d}));
      REF_ASSIGN(layer.shared_expert.w2,
                 ReadTensor(src, LayerName(l, "mlp.shared_expert.down_proj.weight"), {d, shared}));
      REF_ASSIGN(layer.shared_expert.w3, ReadTensor(src, LayerName(l, "mlp.shared_expert.up_proj.weight"), {shared, d}));
    }
    if ((glm || deepseek) && c.shared_expert_intermediate_size > 0) {
      // Glm4MoeMLP / DeepseekV2MLP(intermediate_size = moe_intermediate_size * n_shared_experts), ungated.
      const int64_t shared = c.shared_expert_intermediate_size;
      REF_ASSIGN(layer.shared_expert.w1,
                 ReadTensor(src, LayerName(l, "mlp.shared_experts.gate_proj.weight"), {shared, d}));
      REF_ASSIGN(layer.shared_expert.w2,
                 ReadTensor(src, LayerName(l, "mlp.shared_experts.down_proj.weight"), {d, shared}));
      REF_ASSIGN(layer.shared_expert.w3,
                 ReadTensor(src, LayerName(l, "mlp.shared_experts.up_proj.weight"), {shared, d}));
    }
    model->layers_.push_back(std::move(layer));
  }
  if (absl::Status s = read_norm("model.norm", model->final_norm_); !s.ok()) return s;
  if (c.tie_word_embeddings) {
    model->lm_head_ = model->embed_tokens_;
  } else {
    REF_ASSIGN(model->lm_head_, ReadTensor(src, "lm_head.weight", {v, d}));
  }
  if (c.lm_head_bias) REF_ASSIGN(model->lm_head_bias_, ReadVector(src, "lm_head.bias", v));
#undef REF_ASSIGN
  return model;
}

// ---------------------------------------------------------------- ops

RefTensor ReferenceModel::RmsNorm(const RefTensor& x, const std::vector<double>& weight, double eps) {
  RefTensor y(x.rows, x.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    double sum_sq = 0.0;
    for (int64_t i = 0; i < x.cols; ++i) sum_sq += x.at(t, i) * x.at(t, i);
    const double inv = 1.0 / std::sqrt(sum_sq / static_cast<double>(x.cols) + eps);
    for (int64_t i = 0; i < x.cols; ++i) y.at(t, i) = x.at(t, i) * inv * weight[static_cast<size_t>(i)];
  }
  return y;
}

RefTensor ReferenceModel::LayerNorm(const RefTensor& x, const std::vector<double>& weight,
                                    const std::vector<double>& bias, double eps) {
  RefTensor y(x.rows, x.cols);
  const double n = static_cast<double>(x.cols);
  for (int64_t t = 0; t < x.rows; ++t) {
    double mean = 0.0;
    for (int64_t i = 0; i < x.cols; ++i) mean += x.at(t, i);
    mean /= n;
    double var = 0.0;  // biased (divides by n), as nn.LayerNorm
    for (int64_t i = 0; i < x.cols; ++i) var += (x.at(t, i) - mean) * (x.at(t, i) - mean);
    var /= n;
    const double inv = 1.0 / std::sqrt(var + eps);
    for (int64_t i = 0; i < x.cols; ++i) {
      y.at(t, i) = (x.at(t, i) - mean) * inv * weight[static_cast<size_t>(i)] + bias[static_cast<size_t>(i)];
    }
  }
  return y;
}

RefTensor ReferenceModel::Norm(const ModelConfig& config, const RefNorm& norm, const RefTensor& x) {
  if (config.architecture == Architecture::kPhiMoE) return LayerNorm(x, norm.weight, norm.bias, config.rms_norm_eps);
  return RmsNorm(x, norm.weight, config.rms_norm_eps);
}

RefTensor ReferenceModel::Linear(const RefTensor& x, const RefTensor& w, const std::vector<double>& bias) {
  RefTensor y(x.rows, w.rows);
  for (int64_t t = 0; t < x.rows; ++t) {
    for (int64_t n = 0; n < w.rows; ++n) {
      double acc = bias.empty() ? 0.0 : bias[static_cast<size_t>(n)];
      for (int64_t k = 0; k < x.cols; ++k) acc += x.at(t, k) * w.at(n, k);
      y.at(t, n) = acc;
    }
  }
  return y;
}

bool ReferenceModel::UseLongRope(const ModelConfig& config, int64_t seq_len) {
  return config.rope_scaling.type == "longrope" && seq_len > config.rope_scaling.original_max_position_embeddings;
}

void ReferenceModel::Rope(const ModelConfig& config, double* x, int64_t heads, int64_t position, int64_t seq_len) {
  // hd: the rotated width (Glm4Moe: head_dim * partial_rotary_factor); heads are head_dim apart.
  const int64_t hd = config.rope_dim(), half = hd / 2, stride = config.head_dim;
  const bool longrope = config.rope_scaling.type == "longrope";
  const bool use_long = UseLongRope(config, seq_len);
  const double mscale =
      !longrope ? 1.0 : (use_long ? config.rope_scaling.long_mscale : config.rope_scaling.short_mscale);
  const bool yarn = config.rope_scaling.type == "yarn";
  // YaRN, line by line as modeling_rope_utils.py _compute_yarn_parameters.
  double yarn_low = 0, yarn_high = 1;
  if (yarn) {
    const RopeScaling& s = config.rope_scaling;
    auto correction_dim = [&](double rotations) {
      return (static_cast<double>(hd) *
              std::log(static_cast<double>(s.original_max_position_embeddings) / (rotations * 2 * M_PI))) /
             (2 * std::log(config.rope_theta));
    };
    yarn_low = correction_dim(s.beta_fast), yarn_high = correction_dim(s.beta_slow);
    if (s.truncate) yarn_low = std::floor(yarn_low), yarn_high = std::ceil(yarn_high);
    yarn_low = std::max(yarn_low, 0.0), yarn_high = std::min(yarn_high, static_cast<double>(hd - 1));
    if (yarn_low == yarn_high) yarn_high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    // HF: inv_freq = 1 / (ext_factor * base^(2i / hd)); ext_factor = 1 without longrope.
    double ext = 1.0;
    if (longrope) {
      ext = use_long ? config.rope_scaling.long_factor[static_cast<size_t>(i)]
                     : config.rope_scaling.short_factor[static_cast<size_t>(i)];
    }
    const double pos_freq = std::pow(config.rope_theta, static_cast<double>(2 * i) / static_cast<double>(hd));
    double inv_freq = 1.0 / (ext * pos_freq);
    double yarn_mscale = 1.0;
    if (yarn) {
      const double linear = (static_cast<double>(i) - yarn_low) / (yarn_high - yarn_low);
      const double extrapolation_factor = 1.0 - std::min(1.0, std::max(0.0, linear));
      const double interpolation = 1.0 / (config.rope_scaling.factor * pos_freq), extrapolation = 1.0 / pos_freq;
      inv_freq = interpolation * (1.0 - extrapolation_factor) + extrapolation * extrapolation_factor;
      yarn_mscale = config.rope_scaling.attention_factor;
    }
    const double angle = static_cast<double>(position) * inv_freq;
    const double cos_v = std::cos(angle) * mscale * yarn_mscale, sin_v = std::sin(angle) * mscale * yarn_mscale;
    for (int64_t h = 0; h < heads; ++h) {
      double* v = x + h * stride;
      // x · cos + rotate_half(x) · sin, rotate_half(x) = [-x2, x1].
      const double a = v[i], b = v[i + half];
      v[i] = a * cos_v - b * sin_v;
      v[i + half] = b * cos_v + a * sin_v;
    }
  }
}

void ReferenceModel::RopeDeepseek(const ModelConfig& config, double* x, int64_t heads, int64_t stride, int64_t position,
                                  int64_t seq_len) {
  const int64_t d = config.qk_rope_head_dim;
  std::vector<double> v(static_cast<size_t>(d));
  for (int64_t h = 0; h < heads; ++h) {
    double* head = x + h * stride;
    // q.view(b, h, s, d // 2, 2).transpose(4, 3).reshape(b, h, s, d): evens, then odds.
    for (int64_t i = 0; i < d / 2; ++i) {
      v[static_cast<size_t>(i)] = head[2 * i];
      v[static_cast<size_t>(d / 2 + i)] = head[2 * i + 1];
    }
    Rope(config, v.data(), 1, position, seq_len);  // q * cos + rotate_half(q) * sin over the rope part
    std::copy(v.begin(), v.end(), head);
  }
}

RefTensor ReferenceModel::LatentAttention(const RefLayer& lw, const RefTensor& x) const {
  const ModelConfig& c = config_;
  const int64_t t_len = x.rows, heads = c.num_attention_heads, nope = c.qk_nope_head_dim;
  const int64_t rope = c.qk_rope_head_dim, v_dim = c.v_head_dim, rank = c.kv_lora_rank, qhd = nope + rope;
  // q = q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x)))
  RefTensor q = c.q_lora_rank > 0 ? Linear(RmsNorm(Linear(x, lw.q_a_proj), lw.q_a_norm, c.rms_norm_eps), lw.q_b_proj)
                                  : Linear(x, lw.q_proj);  // [T, H qhd]
  // compressed_kv, k_pe = split(kv_a_proj_with_mqa(x), [R, rope])
  const RefTensor compressed = Linear(x, lw.kv_a_proj);  // [T, R + rope]
  RefTensor latent(t_len, rank), k_pe(t_len, rope);
  for (int64_t t = 0; t < t_len; ++t) {
    std::copy_n(compressed.row(t), rank, latent.row(t));
    std::copy_n(compressed.row(t) + rank, rope, k_pe.row(t));
  }
  // kv = kv_b_proj(kv_a_layernorm(compressed_kv)).view(T, H, nope + v)
  const RefTensor kv = Linear(RmsNorm(latent, lw.kv_a_norm, c.rms_norm_eps), lw.kv_b_proj);
  for (int64_t t = 0; t < t_len; ++t) {
    RopeDeepseek(c, q.row(t) + nope, heads, qhd, t, t_len);
    RopeDeepseek(c, k_pe.row(t), 1, rope, t, t_len);
  }
  // query_states = [q_nope, q_pe]; key_states = [k_nope, k_pe] (k_pe shared by the heads)
  RefTensor keys(t_len, heads * qhd), values(t_len, heads * v_dim);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      std::copy_n(kv.row(t) + h * (nope + v_dim), nope, keys.row(t) + h * qhd);
      std::copy_n(k_pe.row(t), rope, keys.row(t) + h * qhd + nope);
      std::copy_n(kv.row(t) + h * (nope + v_dim) + nope, v_dim, values.row(t) + h * v_dim);
    }
  }
  // softmax_scale = q_head_dim^-0.5, x mscale^2 with mscale = yarn_get_mscale(factor, mscale_all_dim)
  double scale = 1.0 / std::sqrt(static_cast<double>(qhd));
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.mscale_all_dim > 0.0 && c.rope_scaling.factor > 1.0) {
    const double m = 0.1 * c.rope_scaling.mscale_all_dim * std::log(c.rope_scaling.factor) + 1.0;
    scale *= m * m;
  }
  RefTensor out(t_len, heads * v_dim);
  std::vector<double> scores(static_cast<size_t>(t_len));
  for (int64_t i = 0; i < t_len; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      double max_score = -kInf;
      for (int64_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < qhd; ++e) dot += q.at(i, h * qhd + e) * keys.at(j, h * qhd + e);
        scores[static_cast<size_t>(j)] = dot * scale;
        max_score = std::max(max_score, dot * scale);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= i; ++j)
        sum += scores[static_cast<size_t>(j)] = std::exp(scores[static_cast<size_t>(j)] - max_score);
      for (int64_t j = 0; j <= i; ++j) {
        const double p = scores[static_cast<size_t>(j)] / sum;
        for (int64_t e = 0; e < v_dim; ++e) out.at(i, h * v_dim + e) += p * values.at(j, h * v_dim + e);
      }
    }
  }
  return out;
}

RefTensor ReferenceModel::Attention(const RefTensor& q, const RefTensor& k, const RefTensor& v, int64_t heads,
                                    int64_t kv_heads, int64_t head_dim, std::optional<int64_t> sliding_window) {
  const int64_t t_len = q.rows, n_rep = heads / kv_heads;
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  RefTensor out(t_len, heads * head_dim);
  std::vector<double> scores(static_cast<size_t>(t_len));
  for (int64_t i = 0; i < t_len; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / n_rep;  // repeat_kv: head h is copy h % n_rep of kv head h / n_rep
      double max_score = -kInf;
      for (int64_t j = 0; j < t_len; ++j) {
        const bool visible = j <= i && (!sliding_window || j > i - *sliding_window);
        if (!visible) {
          scores[static_cast<size_t>(j)] = -kInf;
          continue;
        }
        double dot = 0.0;
        for (int64_t c = 0; c < head_dim; ++c) dot += q.at(i, h * head_dim + c) * k.at(j, kvh * head_dim + c);
        scores[static_cast<size_t>(j)] = dot * scale;
        max_score = std::max(max_score, dot * scale);
      }
      double sum = 0.0;
      for (double& s : scores) {
        s = std::exp(s - max_score);  // masked: exp(-inf) = 0
        sum += s;
      }
      for (int64_t j = 0; j < t_len; ++j) {
        const double p = scores[static_cast<size_t>(j)] / sum;
        if (p == 0.0) continue;
        for (int64_t c = 0; c < head_dim; ++c) out.at(i, h * head_dim + c) += p * v.at(j, kvh * head_dim + c);
      }
    }
  }
  return out;
}

RefTensor ReferenceModel::HeadRmsNorm(const RefTensor& x, const std::vector<double>& weight, int64_t head_dim,
                                      double eps) {
  // x viewed as [T · heads, head_dim]: RMSNorm each row.
  RefTensor rows(x.rows * (x.cols / head_dim), head_dim);
  rows.data = x.data;
  RefTensor normed = RmsNorm(rows, weight, eps);
  RefTensor out(x.rows, x.cols);
  out.data = std::move(normed.data);
  return out;
}

RefRouting ReferenceModel::SoftmaxTopK(std::span<const double> logits, int64_t k, bool normalize) {
  // routing_weights = softmax(router_logits); topk; /= sum  (modeling_mixtral.py)
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> probs(logits.size());
  double sum = 0.0;
  for (size_t e = 0; e < logits.size(); ++e) sum += probs[e] = std::exp(logits[e] - max_logit);
  for (double& p : probs) p /= sum;
  const std::vector<int32_t> order = DescendingOrder(logits);
  RefRouting r;
  double chosen_sum = 0.0;
  for (int64_t s = 0; s < k; ++s) {
    r.experts.push_back(order[static_cast<size_t>(s)]);
    r.weights.push_back(probs[static_cast<size_t>(order[static_cast<size_t>(s)])]);
    chosen_sum += r.weights.back();
  }
  // modeling_qwen3_moe.py: `if self.norm_topk_prob: routing_weights /= sum`.
  if (normalize) {
    for (double& w : r.weights) w /= chosen_sum;
  }
  // Only the chosen set matters (the weights are renormalised over it), so
  // the one discontinuity is the K-th logit meeting the (K+1)-th.
  r.margin = static_cast<size_t>(k) < logits.size() ? logits[static_cast<size_t>(order[static_cast<size_t>(k - 1)])] -
                                                          logits[static_cast<size_t>(order[static_cast<size_t>(k)])]
                                                    : kInf;
  return r;
}

RefRouting ReferenceModel::SparseMixer(std::span<const double> scores, double jitter_eps) {
  const size_t n = scores.size();
  RefRouting r;
  r.margin = kInf;
  // One masked-softmax step of sparsemixer: `gates` are the scores the softmax
  // runs over (-inf where already excluded), `threshold` their max; the mask
  // compares the ORIGINAL scores against the threshold:
  //   factor = scores.abs().clamp(min=threshold)
  //   mask = ((threshold - scores) / factor) > 2 * jitter_eps
  //   masked_gates = gates.masked_fill(mask, -inf); softmax; gather(chosen)
  auto step = [&](const std::vector<double>& gates, int32_t chosen, double threshold) {
    std::vector<double> masked = gates;
    for (size_t e = 0; e < n; ++e) {
      const double factor = std::max(std::fabs(scores[e]), threshold);
      const double ratio = (threshold - scores[e]) / factor;
      if (ratio > 2.0 * jitter_eps) masked[e] = -kInf;
      // How far this score is from the band edge, in logit units: the edge is
      // where threshold - s = 2·eps·factor. (The chosen one sits at ratio 0.)
      if (static_cast<int32_t>(e) != chosen && gates[e] != -kInf && std::isfinite(ratio)) {
        r.margin = std::min(r.margin, std::fabs(ratio - 2.0 * jitter_eps) * factor);
      }
    }
    const double max_gate = threshold;  // the chosen one is never masked
    double sum = 0.0;
    for (double g : masked) sum += std::exp(g - max_gate);
    return std::exp(masked[static_cast<size_t>(chosen)] - max_gate) / sum;
  };

  // Top-1: argmax (first of equal maxima, as torch.max).
  std::vector<double> gates(scores.begin(), scores.end());
  const int32_t first = DescendingOrder(scores)[0];
  const double w1 = step(gates, first, scores[static_cast<size_t>(first)]);
  // Top-2: the scores with the first expert scattered to -inf.
  gates[static_cast<size_t>(first)] = -kInf;
  const int32_t second = DescendingOrder(gates)[0];
  const double w2 = step(gates, second, gates[static_cast<size_t>(second)]);
  r.experts = {first, second};
  r.weights = {w1, w2};
  // Which expert is first, and which second, are discontinuities too.
  const std::vector<int32_t> order = DescendingOrder(scores);
  r.margin = std::min(r.margin, scores[static_cast<size_t>(order[0])] - scores[static_cast<size_t>(order[1])]);
  if (n > 2)
    r.margin = std::min(r.margin, scores[static_cast<size_t>(order[1])] - scores[static_cast<size_t>(order[2])]);
  return r;
}

RefRouting ReferenceModel::SigmoidGroupedTopK(const ModelConfig& config, std::span<const double> logits,
                                              std::span<const double> correction_bias) {
  const size_t n = logits.size();
  const int64_t k = config.num_experts_per_tok, groups = config.n_group;
  const int64_t per_group = static_cast<int64_t>(n) / groups;
  std::vector<double> scores(n), choice(n);
  for (size_t e = 0; e < n; ++e) {
    scores[e] = 1.0 / (1.0 + std::exp(-logits[e]));  // router_logits.sigmoid()
    choice[e] = scores[e] + (correction_bias.empty() ? 0.0 : correction_bias[e]);
  }
  RefRouting r;
  r.margin = kInf;
  // group_scores = choice.view(-1, n_group, E / n_group).topk(2)[0].sum(-1)
  std::vector<double> group_scores(static_cast<size_t>(groups));
  for (int64_t g = 0; g < groups; ++g) {
    std::vector<double> members(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group);
    const std::vector<int32_t> top = DescendingOrder(members);
    group_scores[static_cast<size_t>(g)] = members[static_cast<size_t>(top[0])] + members[static_cast<size_t>(top[1])];
  }
  // group_idx = topk(group_scores, topk_group); the others' experts masked_fill(0.0).
  const std::vector<int32_t> group_order = DescendingOrder(group_scores);
  std::vector<bool> kept(static_cast<size_t>(groups), false);
  for (int64_t g = 0; g < config.topk_group; ++g) kept[static_cast<size_t>(group_order[static_cast<size_t>(g)])] = true;
  if (config.topk_group < groups) {
    // A group score moves by at most twice a choice value's change.
    const double gap = group_scores[static_cast<size_t>(group_order[static_cast<size_t>(config.topk_group - 1)])] -
                       group_scores[static_cast<size_t>(group_order[static_cast<size_t>(config.topk_group)])];
    r.margin = std::min(r.margin, gap / 2.0);
  }
  for (size_t e = 0; e < n; ++e) {
    if (!kept[e / static_cast<size_t>(per_group)]) choice[e] = 0.0;
  }
  const std::vector<int32_t> order = DescendingOrder(choice);
  double sum = 0.0;
  for (int64_t s = 0; s < k; ++s) {
    r.experts.push_back(order[static_cast<size_t>(s)]);
    r.weights.push_back(scores[static_cast<size_t>(order[static_cast<size_t>(s)])]);  // scores.gather(topk_indices)
    sum += r.weights.back();
  }
  if (static_cast<size_t>(k) < n) {
    r.margin = std::min(r.margin, choice[static_cast<size_t>(order[static_cast<size_t>(k - 1)])] -
                                      choice[static_cast<size_t>(order[static_cast<size_t>(k)])]);
  }
  for (double& w : r.weights) {
    if (config.norm_topk_prob) w /= sum + 1e-20;
    w *= config.routed_scaling_factor;
  }
  return r;
}

RefRouting ReferenceModel::SoftmaxGroupedTopK(const ModelConfig& config, std::span<const double> logits) {
  const size_t n = logits.size();
  const int64_t k = config.num_experts_per_tok, groups = config.n_group;
  const int64_t per_group = static_cast<int64_t>(n) / groups;
  // scores = logits.softmax(dim=-1)
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> scores(n);
  double total = 0.0;
  for (size_t e = 0; e < n; ++e) total += scores[e] = std::exp(logits[e] - max_logit);
  for (double& s : scores) s /= total;
  RefRouting r;
  r.margin = kInf;
  std::vector<double> choice = scores;
  if (groups > 1) {
    // group_scores = scores.view(-1, n_group, E / n_group).max(dim=-1).values
    std::vector<double> group_scores(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g)
      group_scores[static_cast<size_t>(g)] =
          *std::max_element(scores.begin() + g * per_group, scores.begin() + (g + 1) * per_group);
    const std::vector<int32_t> group_order = DescendingOrder(group_scores);
    std::vector<bool> kept(static_cast<size_t>(groups), false);
    for (int64_t g = 0; g < config.topk_group; ++g)
      kept[static_cast<size_t>(group_order[static_cast<size_t>(g)])] = true;
    if (config.topk_group < groups) {
      // In logits (softmax is monotone): the best logits of the last kept and first dropped group.
      auto best_logit = [&](int32_t g) {
        return *std::max_element(logits.begin() + g * per_group, logits.begin() + (g + 1) * per_group);
      };
      r.margin = best_logit(group_order[static_cast<size_t>(config.topk_group - 1)]) -
                 best_logit(group_order[static_cast<size_t>(config.topk_group)]);
    }
    for (size_t e = 0; e < n; ++e) {
      if (!kept[e / static_cast<size_t>(per_group)]) choice[e] = 0.0;  // masked_fill(~score_mask, 0.0)
    }
  }
  const std::vector<int32_t> order = DescendingOrder(choice);
  double sum = 0.0;
  for (int64_t s = 0; s < k; ++s) {
    r.experts.push_back(order[static_cast<size_t>(s)]);
    r.weights.push_back(scores[static_cast<size_t>(order[static_cast<size_t>(s)])]);
    sum += r.weights.back();
  }
  const size_t next = order[static_cast<size_t>(std::min<int64_t>(k, static_cast<int64_t>(n) - 1))];
  if (static_cast<size_t>(k) < n && choice[next] > 0.0) {
    // The K-th and (K+1)-th of the kept experts, in logits; a masked (K+1)-th
    // only changes with the groups (above).
    r.margin = std::min(r.margin, logits[static_cast<size_t>(order[static_cast<size_t>(k - 1)])] - logits[next]);
  }
  for (double& w : r.weights) {
    if (k > 1 && config.norm_topk_prob) {
      w /= sum + 1e-20;
    } else {
      w *= config.routed_scaling_factor;
    }
  }
  return r;
}

RefRouting ReferenceModel::Route(const ModelConfig& config, std::span<const double> logits,
                                 std::span<const double> correction_bias) {
  if (config.architecture == Architecture::kPhiMoE) return SparseMixer(logits, config.router_jitter_noise);
  if (config.architecture == Architecture::kGlm4Moe || config.architecture == Architecture::kDeepseekV3) {
    return SigmoidGroupedTopK(config, logits, correction_bias);
  }
  if (config.architecture == Architecture::kDeepseekV2) return SoftmaxGroupedTopK(config, logits);
  return SoftmaxTopK(logits, config.num_experts_per_tok, config.norm_topk_prob);
}

RefTensor ReferenceModel::ExpertFfn(const RefTensor& x, const RefExpert& expert) {
  const RefTensor gate = Linear(x, expert.w1);  // [R, I]
  const RefTensor up = Linear(x, expert.w3);    // [R, I]
  RefTensor h(gate.rows, gate.cols);
  for (size_t i = 0; i < h.data.size(); ++i) h.data[i] = Silu(gate.data[i]) * up.data[i];
  return Linear(h, expert.w2);  // [R, D]
}

// ---------------------------------------------------------------- model

absl::StatusOr<ReferenceForward> ReferenceModel::Forward(const std::vector<int32_t>& tokens) const {
  const ModelConfig& c = config_;
  const int64_t t_len = static_cast<int64_t>(tokens.size()), d = c.hidden_size;
  if (t_len == 0) return absl::InvalidArgumentError("reference: empty sequence");
  if (t_len > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("reference: ", t_len, " tokens exceed max_position_embeddings ", c.max_position_embeddings));
  }
  ReferenceForward out;
  out.long_rope = UseLongRope(c, t_len);
  auto record = [&](const char* name, int layer, const RefTensor& t) { out.intermediates[{name, layer}] = t; };

  RefTensor h(t_len, d);  // [T, D]
  for (int64_t t = 0; t < t_len; ++t) {
    const int32_t id = tokens[static_cast<size_t>(t)];
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("reference: token ", id, " at ", t, " outside the vocabulary"));
    }
    std::copy_n(embed_tokens_.row(id), d, h.row(t));
  }
  record("embedding", -1, h);

  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const RefLayer& lw = layers_[static_cast<size_t>(l)];
    // Attention block.
    const RefTensor x = Norm(c, lw.input_norm, h);
    if (c.kv_lora_rank > 0) {
      const RefTensor o = Linear(LatentAttention(lw, x), lw.o_proj);
      for (size_t i = 0; i < h.data.size(); ++i) h.data[i] += o.data[i];
      record("attention_out", l, h);
    } else {
      RefTensor q = Linear(x, lw.q_proj, lw.q_bias);  // [T, H·hd]
      RefTensor k = Linear(x, lw.k_proj, lw.k_bias);  // [T, Hkv·hd]
      const RefTensor v = Linear(x, lw.v_proj, lw.v_bias);
      if (c.architecture == Architecture::kQwen3Moe || (c.architecture == Architecture::kGlm4Moe && c.use_qk_norm)) {
        // Qwen3 (and GLM-4.5's use_qk_norm): q_norm / k_norm, an RMSNorm over each head's head_dim values.
        q = HeadRmsNorm(q, lw.q_norm, c.head_dim, c.rms_norm_eps);
        k = HeadRmsNorm(k, lw.k_norm, c.head_dim, c.rms_norm_eps);
      } else if (c.architecture == Architecture::kOlmoe) {
        // OLMoE: q_norm / k_norm over each row's whole projection.
        q = RmsNorm(q, lw.q_norm, c.rms_norm_eps);
        k = RmsNorm(k, lw.k_norm, c.rms_norm_eps);
      }
      for (int64_t t = 0; t < t_len; ++t) {
        // One forward, one choice of longrope factors: seq_len = max(position_ids) + 1.
        Rope(c, q.row(t), c.num_attention_heads, t, t_len);
        Rope(c, k.row(t), c.num_key_value_heads, t, t_len);
      }
      const RefTensor attn =
          Attention(q, k, v, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.sliding_window);
      const RefTensor o = Linear(attn, lw.o_proj, lw.o_bias);
      for (size_t i = 0; i < h.data.size(); ++i) h.data[i] += o.data[i];
      record("attention_out", l, h);
    }

    const RefTensor moe_input = Norm(c, lw.post_attention_norm, h);
    record("moe_input", l, moe_input);
    if (lw.dense) {
      // Qwen2MoeMLP: down(act(gate(x)) * up(x)), every token.
      const RefTensor mlp_out = ExpertFfn(moe_input, lw.dense_mlp);
      for (size_t i = 0; i < h.data.size(); ++i) h.data[i] += mlp_out.data[i];
      out.routing.emplace_back();
      record("layer_out", l, h);
      continue;
    }
    // MoE block.
    const RefTensor router_logits = Linear(moe_input, lw.router);  // [T, E]
    record("router_logits", l, router_logits);
    RefTensor moe_out(t_len, d);
    std::vector<RefRouting> routing;
    for (int64_t t = 0; t < t_len; ++t) {
      RefRouting r = Route(c, std::span<const double>(router_logits.row(t), static_cast<size_t>(c.num_local_experts)),
                           lw.router_bias);
      RefTensor row(1, d);
      std::copy_n(moe_input.row(t), d, row.row(0));
      for (size_t s = 0; s < r.experts.size(); ++s) {
        const RefTensor y = ExpertFfn(row, lw.experts[static_cast<size_t>(r.experts[s])]);
        for (int64_t i = 0; i < d; ++i) moe_out.at(t, i) += r.weights[s] * y.at(0, i);
      }
      routing.push_back(std::move(r));
    }
    out.routing.push_back(std::move(routing));
    record("moe_out", l, moe_out);
    for (size_t i = 0; i < h.data.size(); ++i) h.data[i] += moe_out.data[i];
    if (lw.shared_expert_gate.rows > 0) {
      // modeling_qwen2_moe.py: sigmoid(shared_expert_gate(x)) * shared_expert(x).
      const RefTensor gate = Linear(moe_input, lw.shared_expert_gate);  // [T, 1]
      RefTensor shared = ExpertFfn(moe_input, lw.shared_expert);       // [T, D]
      for (int64_t t = 0; t < t_len; ++t) {
        const double scale = 1.0 / (1.0 + std::exp(-gate.at(t, 0)));
        for (int64_t i = 0; i < d; ++i) shared.at(t, i) *= scale;
      }
      record("shared_expert_out", l, shared);
      for (size_t i = 0; i < h.data.size(); ++i) h.data[i] += shared.data[i];
    } else if (lw.shared_expert.w1.rows > 0) {
      // modeling_glm4_moe.py: routed + shared_experts(residuals), ungated.
      const RefTensor shared = ExpertFfn(moe_input, lw.shared_expert);
      record("shared_expert_out", l, shared);
      for (size_t i = 0; i < h.data.size(); ++i) h.data[i] += shared.data[i];
    }
    record("layer_out", l, h);
  }

  out.logits = Linear(Norm(c, final_norm_, h), lm_head_, lm_head_bias_);  // [T, V]
  record("logits", -1, out.logits);
  return out;
}

absl::StatusOr<std::vector<int32_t>> ReferenceModel::GreedyGenerate(const std::vector<int32_t>& prompt, int n) const {
  std::vector<int32_t> sequence = prompt, generated;
  for (int step = 0; step < n; ++step) {
    absl::StatusOr<ReferenceForward> f = Forward(sequence);
    if (!f.ok()) return f.status();
    const double* last = f->logits.row(f->logits.rows - 1);
    const int32_t next = static_cast<int32_t>(std::max_element(last, last + f->logits.cols) - last);  // first max
    generated.push_back(next);
    sequence.push_back(next);
  }
  return generated;
}

DumpHook DumpRecorder::Hook() {
  return [this](std::string_view name, int layer, const float* data, int64_t rows, int64_t cols) {
    tensors_[{std::string(name), layer}] = RefTensor::FromF32(data, rows, cols);
  };
}

const RefTensor& DumpRecorder::Get(std::string_view name, int layer) const {
  static const RefTensor kEmpty;
  auto it = tensors_.find({std::string(name), layer});
  return it == tensors_.end() ? kEmpty : it->second;
}

double Nmse(std::span<const double> actual, std::span<const double> reference) {
  if (actual.size() != reference.size()) return kInf;
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double diff = actual[i] - reference[i];
    err += diff * diff;
    norm += reference[i] * reference[i];
  }
  if (norm == 0.0) return err == 0.0 ? 0.0 : kInf;
  return err / norm;
}

double Nmse(std::span<const float> actual, std::span<const double> reference) {
  std::vector<double> a(actual.begin(), actual.end());
  return Nmse(std::span<const double>(a), reference);
}

}  // namespace tandem
