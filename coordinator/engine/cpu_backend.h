// The compute backend on the CPU: f32 activations, weights as stored (bf16),
// linear layers through common/kernels/linear. Used when there is no GPU, and
// as the reference the CUDA backend is tested against.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/scratch_memory.h"
#include "common/base/thread_pool.h"
#include "common/kernels/attention_block_types.h"
#include "common/model/model_weights.h"
#include "coordinator/engine/compute_backend.h"
#include "coordinator/engine/cpu_ops.h"

namespace tandem {

// Borrows the weights and the pool (both must outlive it). Engine thread only.
class CpuBackend final : public ComputeBackend {
 public:
  CpuBackend(const ModelWeights* weights, ThreadPool* pool);

  absl::Status Embed(std::span<const int32_t> tokens, float* hidden) override;
  absl::Status Attention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows, float* hidden) override;
  // Queries, attention and the output projection for `output_rows` only
  // (latent attention runs every row).
  absl::Status AttentionForOutputRows(int layer, std::span<const SequenceSlice> slices, int64_t num_rows,
                                      std::span<const int64_t> output_rows, float* hidden) override;
  absl::Status Router(int layer, int64_t num_rows, const float* hidden, float* moe_input, float* router_logits,
                      int32_t* experts, float* weights) override;
  absl::Status SharedExpert(int layer, int64_t num_rows, const float* moe_input, float* hidden, float* term) override;
  absl::Status DenseMlp(int layer, int64_t num_rows, float* hidden, float* moe_input) override;
  absl::Status Combine(int64_t num_rows, const float* weights, const float* expert_out, float* hidden) override;
  absl::Status Logits(std::span<const int64_t> rows, const float* hidden, float* logits) override;

  // Attention's four projections (Q, K, V, O) since construction: wall time
  // and flops, so benchmarks can tell GEMM speed from attention proper.
  double projection_us() const { return projection_us_; }
  double projection_flops() const { return projection_flops_; }
  // Latent attention (DeepSeek): slices of at least `rows` new rows attend in
  // the expanded form (cpu_latent_attention.cc); benchmarks compare the two
  // forms with it. Default kExpandedLatentMinRows.
  void set_expanded_latent_min_rows(int64_t rows) { expanded_latent_min_rows_ = rows; }
  static constexpr int64_t kExpandedLatentMinRows = 32;

 private:
  // Query rows of one sequence per attention block (prefill): 32, the
  // kernel's most.
  static constexpr int64_t kAttentionRows = kAttentionBlockMaxRows;
  // Rows [begin, begin + count) of one slice, its cached rows in kv_rows_
  // from keys_at (keys, then values).
  struct AttentionRowBlock {
    const SequenceSlice* slice;
    int64_t begin, count;
    size_t keys_at;
    bool expanded = false;  // latent attention: this slice's keys and values were expanded (prefill)
    int64_t q_row = 0;      // standard attention: the first row's row of q_ and attn_
  };
  struct AttentionTask {
    int32_t block, head, heads;  // query heads [head, head + heads)
  };

  // Attention's steps, in order. `output_rows` (ascending) are the rows that
  // get a query, an attention result and an output projection, packed in
  // that order at the top of q_ and attn_; empty: every row, in place.
  absl::Status RunAttention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows,
                            std::span<const int64_t> output_rows, float* hidden);
  absl::Status GrowAttentionBuffers(int64_t num_rows);
  absl::Status ProjectQkv(const LayerWeights& lw, int64_t num_rows, std::span<const int64_t> output_rows,
                          const float* hidden);
  void RopeAndCache(int layer, std::span<const SequenceSlice> slices, std::span<const int64_t> output_rows);
  absl::Status PlanAttention(int layer, std::span<const SequenceSlice> slices, std::span<const int64_t> output_rows);
  void PlanQueryBlocks(const SequenceSlice& s, size_t keys_at, std::span<const int64_t> output_rows,
                       size_t* next_output);
  void AttendTask(const AttentionTask& task, int thread);  // on pool threads
  absl::Status ProjectOutput(const LayerWeights& lw, int64_t num_rows, std::span<const int64_t> output_rows,
                             float* hidden);
  // DeepSeek's latent attention (cpu_latent_attention.cc), its steps in order.
  // A decode row's task attends this many heads (they share every cached row).
  static constexpr int64_t kLatentHeadsPerTask = 8;
  absl::Status LatentAttention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows, float* hidden);
  absl::Status GrowLatentBuffers(int64_t num_rows);
  absl::Status ProjectLatentQkv(const LayerWeights& lw, int64_t num_rows, const float* hidden);
  void RopeAndCacheLatent(int layer, std::span<const SequenceSlice> slices, int64_t num_rows);
  absl::Status AbsorbQueries(const LayerWeights& lw, int64_t num_rows);
  absl::Status PlanLatentAttention(const LayerWeights& lw, int layer, std::span<const SequenceSlice> slices);
  absl::Status ExpandLatentKeysAndValues(const LayerWeights& lw, const SequenceSlice& s, int64_t layer, int64_t at);
  void AttendExpandedTask(const AttentionTask& task, int thread);                  // on pool threads
  void AttendLatentTask(const AttentionTask& task, int64_t num_rows, int thread);  // on pool threads
  absl::Status ProjectLatentOutput(const LayerWeights& lw, int64_t num_rows, float* hidden);
  // mlp_out_ = down(silu(gate(x)) * up(x)) for the shared expert's or a
  // dense layer's MLP, `width` wide.
  absl::Status SwiGluMlp(const ExpertWeights& mlp, int64_t width, int64_t num_rows, const float* x);

  const ModelWeights* weights_;
  const ModelConfig& config_;
  ThreadPool* pool_;
  RotaryEmbedding rope_;
  // Run state, reused across steps.
  ScratchArray<float> normed_, q_, k_, v_, attn_, o_;
  ScratchArray<float> mlp_gate_, mlp_up_, mlp_out_;  // [T, Is or Id], [T, Is or Id], [T, D]
  // The latent attention's (cpu_latent_attention.cc says their shapes).
  ScratchArray<float> q_lora_, q_nope_, q_latent_, latent_out_, v_heads_;
  ScratchArray<float> latents_, kv_expanded_, keys_expanded_, values_expanded_;
  bool any_absorbed_ = false;  // this call's plan has a slice in the absorbed form
  // A slice of at least this many new rows attends in the expanded form:
  // every cached position's keys and values computed through kv_b_proj
  // once, then ordinary attention over qk_nope + qk_rope keys and v_head
  // values per head (fewer flops than the absorbed form's R + rope keys and
  // R values per head, once the rows amortise the expansion).
  int64_t expanded_latent_min_rows_ = kExpandedLatentMinRows;
  std::vector<ScratchArray<float>> scores_;  // per thread
  std::vector<const float*> kv_rows_;        // one layer's key, then value rows, per slice
  std::vector<AttentionRowBlock> blocks_;    // one layer's, PlanAttention's
  std::vector<AttentionTask> tasks_;
  double projection_us_ = 0, projection_flops_ = 0;
};

}  // namespace tandem
