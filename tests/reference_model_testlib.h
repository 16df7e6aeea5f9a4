// The oracle: a deliberately naive float64 implementation of the whole model
// with Hugging Face semantics (modeling_mixtral.py, modeling_phimoe.py, modeling_qwen3_moe.py,
// modeling_qwen2_moe.py, modeling_olmoe.py),
// written without calling any of the engine's code (cpu_ops, routing, linear,
// the loader's role mapping), so that a test comparing the two checks the
// engine against the equations rather than against itself. Slow is fine: no
// KV cache, every forward recomputes the whole sequence, plain loops.
//
// Weights are read by their Hugging Face names from the model's TensorSource
// (bf16 → double, exact), so a loader that bound the wrong tensor to a role
// (w1 vs w3, q vs k) would show up as a mismatch too.
//
// Legend: T tokens, D hidden, V vocab, E experts, K num_experts_per_tok,
// H query heads, Hkv kv heads, hd head_dim, I intermediate, L layers.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "coordinator/engine/engine.h"

namespace tandem {

// A row-major [rows, cols] matrix of doubles (a vector is one row).
struct RefTensor {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<double> data;

  RefTensor() = default;
  RefTensor(int64_t r, int64_t c) : rows(r), cols(c), data(static_cast<size_t>(r * c), 0.0) {}
  static RefTensor FromF32(const float* values, int64_t r, int64_t c);

  double* row(int64_t r) { return data.data() + r * cols; }
  const double* row(int64_t r) const { return data.data() + r * cols; }
  double& at(int64_t r, int64_t c) { return data[static_cast<size_t>(r * cols + c)]; }
  double at(int64_t r, int64_t c) const { return data[static_cast<size_t>(r * cols + c)]; }
};

// One token's routing: experts in the router's order and their weights.
struct RefRouting {
  std::vector<int32_t> experts;  // [K]
  std::vector<double> weights;   // [K]
  // Distance to the nearest discontinuity of the router at these logits (a
  // change of the chosen set, or for sparsemixer a logit crossing its band
  // edge), in logit units. Rounding smaller than this cannot change the
  // routing; tests use it to tell a routing flip from a real bug.
  double margin = 0.0;
};

struct RefExpert {
  RefTensor w1;  // gate_proj [I, D]
  RefTensor w2;  // down_proj [D, I]
  RefTensor w3;  // up_proj   [I, D]
};

struct RefNorm {
  std::vector<double> weight;  // [D]
  std::vector<double> bias;    // [D] LayerNorm only, empty for RMSNorm
};

struct RefLayer {
  RefNorm input_norm;
  RefTensor q_proj, k_proj, v_proj, o_proj;            // [Hq, D], [Hkv, D], [Hkv, D], [D, Hq]
  // DeepSeek's latent attention (q_proj without q_lora_rank; o_proj [D, H v]).
  RefTensor q_a_proj, q_b_proj, kv_a_proj, kv_b_proj;  // [Rq, D], [H qhd, Rq], [R + rope, D], [H (nope + v), R]
  std::vector<double> q_a_norm, kv_a_norm;             // [Rq], [R]
  std::vector<double> q_bias, k_bias, v_bias, o_bias;  // empty without attention_bias
  std::vector<double> q_norm, k_norm;                  // [head_dim] Qwen3's QK norm, [Hq] / [Hkv] OLMoE's
  RefNorm post_attention_norm;
  RefTensor router;                // [E, D]
  std::vector<double> router_bias;  // [E] GLM-4.5's e_score_correction_bias; empty otherwise
  std::vector<RefExpert> experts;  // [E]
  RefExpert shared_expert;         // Qwen2-MoE, GLM-4.5: [Is, D], [D, Is], [Is, D]; 0 rows without
  RefTensor shared_expert_gate;    // Qwen2-MoE: [1, D]; 0 rows otherwise
  // A dense layer (Qwen's mlp_only_layers / decoder_sparse_step): its MLP,
  // and no router, experts or shared expert.
  bool dense = false;
  RefExpert dense_mlp;  // [Id, D], [D, Id], [Id, D]
};

// Everything one reference forward computed. Intermediates are keyed by
// (name, layer) with the engine's DumpHook names and meanings:
//   "embedding" (-1)      [T, D]  embed_tokens[tokens]
//   "attention_out" (l)   [T, D]  the residual stream after attention: h + o_proj(attn(norm(h)))
//   "moe_input" (l)       [T, D]  post_attention_norm(h)
//   "router_logits" (l)   [T, E]  gate(moe_input)
//   "moe_out" (l)         [T, D]  Σ_k w_k · FFN_{e_k}(moe_input)
//   "shared_expert_out" (l) [T, D] σ(gate · moe_input) · FFN_shared(moe_input), Qwen2-MoE
//   "layer_out" (l)       [T, D]  attention_out + moe_out (+ shared_expert_out)
//   "logits" (-1)         [T, V]  lm_head(final_norm(h)) (+ bias)
struct ReferenceForward {
  RefTensor logits;  // [T, V]
  std::map<std::pair<std::string, int>, RefTensor> intermediates;
  std::vector<std::vector<RefRouting>> routing;  // [L][T]; empty for a dense layer
  bool long_rope = false;                        // whether this forward used longrope's long factors

  // The intermediate, or an empty tensor when there is none of that name.
  const RefTensor& Get(std::string_view name, int layer) const;
};

// A parameterised test's name for a tiny preset: its architecture.
inline std::string ArchTestName(const std::string& preset) {
  if (preset == "tiny-phimoe") return "PhiMoE";
  if (preset == "tiny-qwen3moe") return "Qwen3Moe";
  if (preset == "tiny-qwen2moe") return "Qwen2Moe";
  if (preset == "tiny-olmoe") return "Olmoe";
  if (preset == "tiny-qwen3moe-dense") return "Qwen3MoeDense";
  if (preset == "tiny-qwen2moe-dense") return "Qwen2MoeDense";
  if (preset == "tiny-glm4moe") return "Glm4Moe";
  if (preset == "tiny-deepseek-v2") return "DeepseekV2";
  if (preset == "tiny-deepseek-v3") return "DeepseekV3";
  return "Mixtral";
}

class ReferenceModel {
 public:
  // Copies every weight into double. Fails (naming the tensor) when the
  // model's source lacks a tensor the config implies or its shape is wrong.
  static absl::StatusOr<std::unique_ptr<ReferenceModel>> Create(const ModelWeights& weights);

  // ---- The operations, each alone (for op-by-op tests) ----

  // y = x / sqrt(mean(x²) + eps) · weight, per row.
  static RefTensor RmsNorm(const RefTensor& x, const std::vector<double>& weight, double eps);
  // Qwen3's q_norm / k_norm: x [T, heads · head_dim], each head's values RMS-normalised.
  static RefTensor HeadRmsNorm(const RefTensor& x, const std::vector<double>& weight, int64_t head_dim, double eps);
  // nn.LayerNorm: y = (x - mean) / sqrt(biased var + eps) · weight + bias, per row.
  static RefTensor LayerNorm(const RefTensor& x, const std::vector<double>& weight, const std::vector<double>& bias,
                             double eps);
  // The config's norm (RMSNorm for Mixtral, LayerNorm for PhiMoE).
  static RefTensor Norm(const ModelConfig& config, const RefNorm& norm, const RefTensor& x);

  // y = x · Wᵀ (+ bias)       x: [T, K], w: [N, K], y: [T, N]
  static RefTensor Linear(const RefTensor& x, const RefTensor& w, const std::vector<double>& bias = {});

  // Whether a forward whose positions reach seq_len - 1 uses longrope's long
  // factors (HF: seq_len = max(position_ids) + 1 > original_max).
  static bool UseLongRope(const ModelConfig& config, int64_t seq_len);
  // Rotates `heads` consecutive head_dim vectors of `x` for `position` in a
  // forward of `seq_len` positions: rotate_half over the first r values
  // (pairs i, i + r/2; r = head_dim, or GLM-4.5's head_dim x
  // partial_rotary_factor), inv_freq = 1 / theta^(2i/r) (/ longrope
  // factor), cos/sin · mscale.
  static void Rope(const ModelConfig& config, double* x, int64_t heads, int64_t position, int64_t seq_len);

  // Causal grouped-query attention of one sequence at positions 0..T-1:
  // query i sees keys j with i - W < j <= i (W = sliding_window, if any);
  // query head h reads kv head h / (H / Hkv); scores scaled by 1/sqrt(hd).
  // q: [T, H·hd], k/v: [T, Hkv·hd], out: [T, H·hd].
  static RefTensor Attention(const RefTensor& q, const RefTensor& k, const RefTensor& v, int64_t heads,
                             int64_t kv_heads, int64_t head_dim, std::optional<int64_t> sliding_window);

  // Mixtral: softmax over all E logits, top-K (ties: lower index), renormalised.
  static RefRouting SoftmaxTopK(std::span<const double> logits, int64_t k, bool normalize = true);
  // PhiMoE's sparsemixer at inference, line by line as modeling_phimoe.py
  // (top-2, jitter band, weights not renormalised).
  static RefRouting SparseMixer(std::span<const double> logits, double jitter_eps);
  // GLM-4.5 / DeepSeek-V3's noaux_tc, line by line as modeling_glm4_moe.py
  // Glm4MoeTopkRouter: sigmoid scores; choice = score + bias; group score =
  // sum of a group's top-2 choice values; choice 0 outside the topk_group
  // best groups; top-K by choice (ties: lower index); weights = the chosen
  // scores (/ (sum + 1e-20) when normalising) x routed_scaling_factor. The
  // margin is in score units, a lower bound in logits (the sigmoid's slope
  // is at most 1/4).
  static RefRouting SigmoidGroupedTopK(const ModelConfig& config, std::span<const double> logits,
                                       std::span<const double> correction_bias);
  // DeepSeek-V2's MoEGate, line by line: softmax scores; with n_group > 1
  // ("group_limited_greedy") the experts outside the topk_group groups of
  // highest best score are scored 0; top-K; weights = the chosen scores,
  // / (sum + 1e-20) when norm_topk_prob, else x routed_scaling_factor.
  static RefRouting SoftmaxGroupedTopK(const ModelConfig& config, std::span<const double> logits);
  // DeepSeek's rope part of `heads` vectors `stride` apart: HF's
  // apply_rotary_pos_emb in modeling_deepseek.py, which de-interleaves
  // (view(d/2, 2).transpose) and then rotates halves; the result stays in
  // that de-interleaved order (q and k alike, so q.k is unchanged).
  static void RopeDeepseek(const ModelConfig& config, double* x, int64_t heads, int64_t stride, int64_t position,
                           int64_t seq_len);
  // The config's router; `correction_bias` is the layer's [E] bias for the
  // sigmoid router (empty for the others).
  static RefRouting Route(const ModelConfig& config, std::span<const double> logits,
                          std::span<const double> correction_bias = {});

  // w2 · (silu(w1 · x) ⊙ (w3 · x)) per row.     x: [R, D], out: [R, D]
  static RefTensor ExpertFfn(const RefTensor& x, const RefExpert& expert);

  // ---- The whole model ----

  // All-position logits and every intermediate of one forward over `tokens`
  // from position 0, recomputed from scratch. InvalidArgument for an empty
  // sequence, a token outside the vocabulary or a sequence past the context.
  absl::StatusOr<ReferenceForward> Forward(const std::vector<int32_t>& tokens) const;
  // One layer's self-attention output (before o_proj's residual add) in
  // DeepSeek's latent form, as modeling_deepseek.py computes it: keys and
  // values expanded from the latent through kv_b_proj (the unabsorbed form).
  RefTensor LatentAttention(const RefLayer& lw, const RefTensor& x) const;

  // `n` greedy tokens (argmax, ties: lower id) after `prompt`, each step a
  // full Forward over prompt + tokens so far. EOS does not stop it: callers
  // compare against a generator run with ignore_eos.
  absl::StatusOr<std::vector<int32_t>> GreedyGenerate(const std::vector<int32_t>& prompt, int n) const;

  const ModelConfig& config() const { return config_; }
  const RefLayer& layer(int l) const { return layers_[static_cast<size_t>(l)]; }
  const RefTensor& embed_tokens() const { return embed_tokens_; }
  const RefNorm& final_norm() const { return final_norm_; }
  const RefTensor& lm_head() const { return lm_head_; }
  const std::vector<double>& lm_head_bias() const { return lm_head_bias_; }

 private:
  explicit ReferenceModel(const ModelConfig& config) : config_(config) {}

  ModelConfig config_;
  RefTensor embed_tokens_;  // [V, D]
  std::vector<RefLayer> layers_;
  RefNorm final_norm_;
  RefTensor lm_head_;                 // [V, D]
  std::vector<double> lm_head_bias_;  // [V] or empty
};

// Collects an engine's DumpHook calls as doubles, keyed by (name, layer) like
// ReferenceForward::intermediates. A later call under the same key replaces
// the earlier one. The recorder must outlive the engine's use of Hook().
class DumpRecorder {
 public:
  DumpHook Hook();
  const RefTensor& Get(std::string_view name, int layer) const;  // empty when never dumped
  void Clear() { tensors_.clear(); }
  const std::map<std::pair<std::string, int>, RefTensor>& tensors() const { return tensors_; }

 private:
  std::map<std::pair<std::string, int>, RefTensor> tensors_;
};

// Normalised mean squared error Σ(a - b)² / Σ b², b the reference. Sizes must match.
double Nmse(std::span<const float> actual, std::span<const double> reference);
double Nmse(std::span<const double> actual, std::span<const double> reference);

}  // namespace tandem
