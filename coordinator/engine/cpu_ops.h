// The element-wise and attention operations of the forward pass on the CPU,
// f32 throughout. Each is a free function so tests can compare it alone
// against the float64 reference.
//
// Legend: T rows (tokens), D hidden, hd head_dim, H query heads, Hkv kv heads.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/base/thread_pool.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"

namespace tandem {

// y = x / sqrt(mean(x²) + eps) * weight          x, y: [T, D]
void RmsNorm(const float* x, int64_t rows, int64_t d, const float* weight, double eps, float* y);
// y = (x - mean) / sqrt(var + eps) * weight + bias   (nn.LayerNorm, biased var)
void LayerNorm(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, double eps, float* y);
// The config's norm (RMSNorm for Mixtral, LayerNorm for PhiMoE).
void ApplyNorm(const ModelConfig& config, const NormWeights& norm, const float* x, int64_t rows, float* y);

// Rotary position embedding, Hugging Face's rotate_half convention: pairs
// (i, i + r/2) over the first r = config.rope_dim() values of each head
// (the whole head but for GLM-4.5's partial RoPE; the rest pass through). PhiMoE's longrope divides each frequency by
// its factor and scales cos/sin by mscale; the long factors apply when the sequence reaches past
// original_max_position_embeddings.
class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const ModelConfig& config);
  // Whether a forward over positions up to `max_position` uses long factors.
  bool UseLongFactors(int64_t max_position) const;
  // Rotates `heads` vectors of head_dim floats laid out contiguously.
  void Apply(float* x, int64_t heads, int64_t position, bool long_factors) const;
  // DeepSeek's rope part: adjacent pairs (2i, 2i + 1) of the rope_dim values
  // at x + h * stride for each of `heads` heads (HF de-interleaves them and
  // rotates halves, which gives the same dot products; llama.cpp's NORM mode
  // is this).
  void ApplyInterleaved(float* x, int64_t heads, int64_t stride, int64_t position) const;

 private:
  int64_t head_dim_;
  int64_t rope_dim_;
  int64_t original_max_ = 0;  // 0: no longrope
  std::vector<double> inv_freq_short_, inv_freq_long_;
  double mscale_short_ = 1.0, mscale_long_ = 1.0;
};

// Scaled dot-product attention of one query row against cached keys/values.
// q: [H, hd]; keys/values: `num_keys` rows of [Hkv, hd] reached through
// key_row(j) / value_row(j); out: [H, hd]. Query head h reads kv head
// h / (H / Hkv) (grouped-query attention). `scores` is scratch of num_keys.
template <typename KeyFn, typename ValueFn>
void AttendOneRow(const float* q, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t first_key,
                  int64_t num_keys, KeyFn key_row, ValueFn value_row, float* scores, float* out);

// out[t] += x[t] (residual add), and hidden += Σ_k w[t,k] · expert_out[t,k].
void AddInPlace(float* y, const float* x, int64_t n);

// Moves rows[i] of data ([*, cols]) to row i, in place; rows ascend.
void PackRows(float* data, int64_t cols, std::span<const int64_t> rows);

}  // namespace tandem

#include "coordinator/engine/cpu_ops_inl.h"
