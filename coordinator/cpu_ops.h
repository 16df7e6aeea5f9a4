// The element-wise and attention operations of the forward pass on the CPU,
// f32 throughout. Each is a free function so tests can compare it alone
// against the float64 reference.
//
// Legend: T rows (tokens), D hidden, hd head_dim, H query heads, Hkv kv heads.
#pragma once

#include <cstdint>
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
// (i, i + hd/2). PhiMoE's longrope divides each frequency by its factor and
// scales cos/sin by mscale; the long factors apply when the sequence reaches
// past original_max_position_embeddings.
class RotaryEmbedding {
 public:
  explicit RotaryEmbedding(const ModelConfig& config);
  // Whether a forward over positions up to `max_position` uses long factors.
  bool UseLongFactors(int64_t max_position) const;
  // Rotates `heads` vectors of head_dim floats laid out contiguously.
  void Apply(float* x, int64_t heads, int64_t position, bool long_factors) const;

 private:
  int64_t head_dim_;
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

// The same for `rows` query rows of one head at once (fewer than 4: blocks
// of 4 rows or more, prefill's or a decode row's GQA group, run the
// GEMM-shaped common/kernels/attention_block.h instead): row r is q + r * q_stride, attends keys
// [first_key[r], first_key[r] + num_keys[r]) and writes out + r *
// out_stride. Each key and value row is read once for the whole block
// instead of once per row (at 4096 tokens the per-row loop re-read 32 MB of
// K/V per query row from L3). Per row the arithmetic is AttendOneRow's, in
// the same order: the results are the same bits. `scores`: rows x
// max(num_keys) scratch.
template <typename KeyFn, typename ValueFn>
void AttendRowsOneHead(const float* q, int64_t q_stride, int64_t rows, int64_t head_dim, const int64_t* first_key,
                       const int64_t* num_keys, KeyFn key_row, ValueFn value_row, float* scores, float* out,
                       int64_t out_stride);

// out[t] += x[t] (residual add), and hidden += Σ_k w[t,k] · expert_out[t,k].
void AddInPlace(float* y, const float* x, int64_t n);

}  // namespace tandem

#include "coordinator/cpu_ops_inl.h"
