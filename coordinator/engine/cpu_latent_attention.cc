// DeepSeek's multi-head latent attention on the CPU backend, in the absorbed
// form for every row (decode and prefill):
//
//   c_t     = kv_a_norm(kv_a_proj(x_t)[:R])            the latent      [R]
//   kpe_t   = RoPE(kv_a_proj(x_t)[R:])                 one rope key    [rope]
//   q_h     = q_b(q_a_norm(q_a(x_t))) or q_proj(x_t), head h: [nope | rope]
//   score   = q_nope_h . (W_UK_h c_s) + q_pe_h . kpe_s
//           = (W_UK_h^T q_nope_h) . c_s + q_pe_h . kpe_s
//   o_h     = W_UV_h Σ_s p_s c_s                                        [v]
//
// so the cache holds [c_t | kpe_t] per position and layer (R + rope floats,
// not 2 H head_dim), every head attends the same rows (one kv head of
// R + rope, the values its first R), and W_UK_h / W_UV_h are applied once
// per row rather than once per cached position: the form for decode.
//
// A slice of expanded_latent_min_rows_ new rows or more (prefill) attends in
// the expanded form instead: kv_b_proj turns each of its cached latents into
// every head's nope key and value once ([k_nope | kpe] keys of qhd and v
// values per head), and each head attends those as ordinary attention,
// straight into attn_. Per row and cached position that is qhd + v
// multiply-adds per head against the absorbed form's 2R + rope.
//
// Buffers: q_ [T, H qhd]; k_ [T, R + rope] (the latent and rope key);
// q_nope_ [H][T][nope]; q_latent_ [H][T][R + rope]; latent_out_ [H][T][R]
// (first the absorbed queries, then the attention's output);
// v_heads_ [H][T][v]; attn_ [T, H v] for o_proj.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/parallel_status.h"
#include "common/base/status_macros.h"
#include "common/kernels/attention_block.h"
#include "coordinator/engine/cpu_backend.h"

namespace tandem {

absl::Status CpuBackend::LatentAttention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows,
                                         float* hidden) {
  const LayerWeights& lw = weights_->layers[static_cast<size_t>(layer)];
  TANDEM_RETURN_IF_ERROR(GrowLatentBuffers(num_rows));
  TANDEM_RETURN_IF_ERROR(ProjectLatentQkv(lw, num_rows, hidden));
  RopeAndCacheLatent(layer, slices, num_rows);
  TANDEM_RETURN_IF_ERROR(PlanLatentAttention(lw, layer, slices));
  if (any_absorbed_) TANDEM_RETURN_IF_ERROR(AbsorbQueries(lw, num_rows));
  const auto num_tasks = static_cast<int64_t>(tasks_.size());
  auto attend = [&](int64_t t, int thread) {
    const AttentionTask& task = tasks_[static_cast<size_t>(t)];
    if (blocks_[static_cast<size_t>(task.block)].expanded) {
      AttendExpandedTask(task, thread);
    } else {
      AttendLatentTask(task, num_rows, thread);
    }
  };
  if (pool_) {
    pool_->ParallelFor(num_tasks, attend);
  } else {
    for (int64_t t = 0; t < num_tasks; ++t) attend(t, 0);
  }
  return ProjectLatentOutput(lw, num_rows, hidden);
}

absl::Status CpuBackend::GrowLatentBuffers(int64_t num_rows) {
  const int64_t heads = config_.num_attention_heads, rank = config_.kv_lora_rank;
  const int64_t row = rank + config_.qk_rope_head_dim;
  TANDEM_RETURN_IF_ERROR(normed_.Grow(num_rows * config_.hidden_size, "attention's normed input"));
  TANDEM_RETURN_IF_ERROR(q_.Grow(num_rows * config_.q_dim(), "the queries"));
  TANDEM_RETURN_IF_ERROR(q_lora_.Grow(num_rows * config_.q_lora_rank, "the low-rank queries"));
  TANDEM_RETURN_IF_ERROR(k_.Grow(num_rows * row, "the new latents and rope keys"));
  TANDEM_RETURN_IF_ERROR(q_nope_.Grow(heads * num_rows * config_.qk_nope_head_dim, "the queries' nope parts"));
  TANDEM_RETURN_IF_ERROR(q_latent_.Grow(heads * num_rows * row, "the absorbed queries"));
  TANDEM_RETURN_IF_ERROR(latent_out_.Grow(heads * num_rows * rank, "the attention's latent output"));
  TANDEM_RETURN_IF_ERROR(v_heads_.Grow(heads * num_rows * config_.v_head_dim, "the heads' values"));
  TANDEM_RETURN_IF_ERROR(attn_.Grow(num_rows * config_.attention_out_dim(), "the attention output"));
  return o_.Grow(num_rows * config_.hidden_size, "the output projection");
}

// x -> q [T, H qhd] (through the low-rank pair when q_lora_rank is set) and
// [latent | rope key] [T, R + rope], the latent RMS-normalised.
absl::Status CpuBackend::ProjectLatentQkv(const LayerWeights& lw, int64_t num_rows, const float* hidden) {
  const LatentAttentionWeights& m = lw.mla;
  const int64_t rank = config_.kv_lora_rank, row = rank + config_.qk_rope_head_dim;
  ApplyNorm(config_, lw.input_norm, hidden, num_rows, normed_.data());
  const auto start = std::chrono::steady_clock::now();
  if (config_.q_lora_rank > 0) {
    const LinearProduct a[] = {{.w = &m.q_a_proj, .y = q_lora_.data()}, {.w = &m.kv_a_proj, .y = k_.data()}};
    TANDEM_RETURN_IF_ERROR(LinearShared(normed_.data(), num_rows, a, pool_));
    RmsNorm(q_lora_.data(), num_rows, config_.q_lora_rank, m.q_a_norm.data(), config_.rms_norm_eps, q_lora_.data());
    TANDEM_RETURN_IF_ERROR(Linear(q_lora_.data(), num_rows, m.q_b_proj, nullptr, q_.data(), pool_));
  } else {
    const LinearProduct qkv[] = {{.w = &lw.q_proj, .y = q_.data()}, {.w = &m.kv_a_proj, .y = k_.data()}};
    TANDEM_RETURN_IF_ERROR(LinearShared(normed_.data(), num_rows, qkv, pool_));
  }
  for (int64_t t = 0; t < num_rows; ++t)
    RmsNorm(k_.data() + t * row, 1, rank, m.kv_a_norm.data(), config_.rms_norm_eps, k_.data() + t * row);
  projection_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  const double d = static_cast<double>(config_.hidden_size), rows = static_cast<double>(num_rows);
  const double q_flops = config_.q_lora_rank > 0
                             ? static_cast<double>(config_.q_lora_rank) * (d + static_cast<double>(config_.q_dim()))
                             : d * static_cast<double>(config_.q_dim());
  projection_flops_ += 2.0 * rows * (q_flops + d * static_cast<double>(row));
  return absl::OkStatus();
}

// RoPE on each head's q_pe and on the rope key (adjacent pairs); each
// position's [latent | rope key] joins its sequence's cache; each head's
// q_nope is gathered into q_nope_ and its rotated q_pe into q_latent_'s tail.
void CpuBackend::RopeAndCacheLatent(int layer, std::span<const SequenceSlice> slices, int64_t num_rows) {
  const int64_t heads = config_.num_attention_heads, qhd = config_.head_dim, nope = config_.qk_nope_head_dim;
  const int64_t rope = config_.qk_rope_head_dim, rank = config_.kv_lora_rank, row = rank + rope;
  for (const SequenceSlice& s : slices) {
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      const int64_t t = s.row_offset + i, position = s.start_position + i;
      float* q = q_.data() + t * heads * qhd;
      rope_.ApplyInterleaved(q + nope, heads, qhd, position);
      rope_.ApplyInterleaved(k_.data() + t * row + rank, 1, 0, position);
      std::copy_n(k_.data() + t * row, row, s.kv->KeyRow(layer, position));
      for (int64_t h = 0; h < heads; ++h) {
        std::copy_n(q + h * qhd, nope, q_nope_.data() + (h * num_rows + t) * nope);
        std::copy_n(q + h * qhd + nope, rope, q_latent_.data() + (h * num_rows + t) * row + rank);
      }
    }
  }
}

// q_latent_[h][t][:R] = k_b_h q_nope[h][t]: each head's nope query folded
// into the latent space, a head per task.
absl::Status CpuBackend::AbsorbQueries(const LayerWeights& lw, int64_t num_rows) {
  const int64_t heads = config_.num_attention_heads, nope = config_.qk_nope_head_dim;
  const int64_t rank = config_.kv_lora_rank, row = rank + config_.qk_rope_head_dim;
  return ParallelTasks(pool_, heads, [&](int64_t h) -> absl::Status {
    float* absorbed = latent_out_.data() + h * num_rows * rank;  // free until the attention writes it
    TANDEM_RETURN_IF_ERROR(
        Linear(q_nope_.data() + h * num_rows * nope, num_rows, lw.mla.KeyAbsorb(h), nullptr, absorbed, nullptr));
    for (int64_t t = 0; t < num_rows; ++t)
      std::copy_n(absorbed + t * rank, rank, q_latent_.data() + (h * num_rows + t) * row);
    return absl::OkStatus();
  });
}

// As PlanAttention. An absorbed slice reads one cached row per position
// (keys and values alike) and, for a block of one row (decode), gives a
// task kLatentHeadsPerTask heads: every head reads the same rows, so a task
// of several heads loads each once for all of them, and the tasks still
// spread over the threads. An expanded slice first has its keys and values
// computed (ExpandLatentKeysAndValues), then one head per task.
absl::Status CpuBackend::PlanLatentAttention(const LayerWeights& lw, int layer, std::span<const SequenceSlice> slices) {
  const int64_t heads = config_.num_attention_heads, qhd = config_.head_dim;
  int64_t expanded_rows = 0, max_keys = 0;
  for (const SequenceSlice& s : slices) {
    if (s.num_tokens >= expanded_latent_min_rows_) expanded_rows += s.start_position + s.num_tokens;
  }
  TANDEM_RETURN_IF_ERROR(keys_expanded_.Grow(expanded_rows * heads * qhd, "the expanded keys"));
  TANDEM_RETURN_IF_ERROR(values_expanded_.Grow(expanded_rows * heads * qhd, "the expanded values"));
  blocks_.clear();
  kv_rows_.clear();
  any_absorbed_ = false;
  int64_t expanded_at = 0;
  for (const SequenceSlice& s : slices) {
    const size_t keys_at = kv_rows_.size();
    const int64_t end = s.start_position + s.num_tokens;
    const bool expanded = s.num_tokens >= expanded_latent_min_rows_;
    if (expanded) {
      TANDEM_RETURN_IF_ERROR(ExpandLatentKeysAndValues(lw, s, layer, expanded_at));
      for (int64_t j = 0; j < end; ++j) kv_rows_.push_back(keys_expanded_.data() + (expanded_at + j) * heads * qhd);
      for (int64_t j = 0; j < end; ++j) kv_rows_.push_back(values_expanded_.data() + (expanded_at + j) * heads * qhd);
      expanded_at += end;
    } else {
      s.kv->AppendKeyRows(layer, end, kv_rows_);
      any_absorbed_ = true;
    }
    for (int64_t i = 0; i < s.num_tokens; i += kAttentionRows)
      blocks_.push_back({&s, i, std::min(kAttentionRows, s.num_tokens - i), keys_at, expanded});
    max_keys = std::max(max_keys, end);
  }
  const int64_t row = std::max(config_.kv_lora_rank + config_.qk_rope_head_dim, qhd);
  for (auto& scratch : scores_)
    TANDEM_RETURN_IF_ERROR(scratch.Grow(AttentionBlockScratchFloats(max_keys, row), "attention scores"));
  tasks_.clear();
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t step = blocks_[i].count == 1 && !blocks_[i].expanded ? std::min(heads, kLatentHeadsPerTask) : 1;
    for (int64_t h = 0; h < heads; h += step) {
      tasks_.push_back(
          {static_cast<int32_t>(i), static_cast<int32_t>(h), static_cast<int32_t>(std::min(step, heads - h))});
    }
  }
  return absl::OkStatus();
}

// Positions [0, end) of `s`: their cached latents through kv_b_proj into
// each head's nope key and value, laid as key rows [k_nope | kpe] (qhd per
// head) and value rows (v of each qhd per head), from row `at` of the
// expanded buffers (ParallelFor over positions for the copies).
absl::Status CpuBackend::ExpandLatentKeysAndValues(const LayerWeights& lw, const SequenceSlice& s, int64_t layer,
                                                   int64_t at) {
  const int64_t heads = config_.num_attention_heads, qhd = config_.head_dim, nope = config_.qk_nope_head_dim;
  const int64_t rank = config_.kv_lora_rank, rope = config_.qk_rope_head_dim, v = config_.v_head_dim;
  const int64_t end = s.start_position + s.num_tokens, per_head = nope + v;
  TANDEM_RETURN_IF_ERROR(latents_.Grow(end * rank, "the latents to expand"));
  TANDEM_RETURN_IF_ERROR(kv_expanded_.Grow(end * heads * per_head, "the expanded latents"));
  std::vector<const float*> cached;
  s.kv->AppendKeyRows(layer, end, cached);
  for (int64_t j = 0; j < end; ++j) std::copy_n(cached[static_cast<size_t>(j)], rank, latents_.data() + j * rank);
  TANDEM_RETURN_IF_ERROR(Linear(latents_.data(), end, lw.mla.kv_b_proj, nullptr, kv_expanded_.data(), pool_));
  constexpr int64_t kPositionsPerTask = 16;
  auto lay_out = [&](int64_t task, int) {
    for (int64_t j = task * kPositionsPerTask; j < std::min(end, (task + 1) * kPositionsPerTask); ++j) {
      const float* kv = kv_expanded_.data() + j * heads * per_head;
      float* key = keys_expanded_.data() + (at + j) * heads * qhd;
      float* value = values_expanded_.data() + (at + j) * heads * qhd;
      for (int64_t h = 0; h < heads; ++h) {
        std::copy_n(kv + h * per_head, nope, key + h * qhd);
        std::copy_n(cached[static_cast<size_t>(j)] + rank, rope, key + h * qhd + nope);
        std::copy_n(kv + h * per_head + nope, v, value + h * qhd);
      }
    }
  };
  const int64_t tasks = (end + kPositionsPerTask - 1) / kPositionsPerTask;
  if (pool_) {
    pool_->ParallelFor(tasks, lay_out);
  } else {
    for (int64_t t = 0; t < tasks; ++t) lay_out(t, 0);
  }
  return absl::OkStatus();
}

// One head of an expanded block: q [q_nope | q_pe] straight from q_ against
// the expanded keys, values into attn_'s head columns.
void CpuBackend::AttendExpandedTask(const AttentionTask& task, int thread) {
  const AttentionRowBlock& b = blocks_[static_cast<size_t>(task.block)];
  const int64_t heads = config_.num_attention_heads, qhd = config_.head_dim, v = config_.v_head_dim;
  int64_t first[kAttentionRows], count[kAttentionRows];
  for (int64_t r = 0; r < b.count; ++r) {
    first[r] = 0;
    count[r] = b.slice->start_position + b.begin + r + 1;
  }
  const float* const* keys = kv_rows_.data() + b.keys_at;
  const int64_t t0 = b.slice->row_offset + b.begin;
  AttendBlock({.q = q_.data() + t0 * heads * qhd + task.head * qhd,
               .q_stride = heads * qhd,
               .rows = b.count,
               .head_dim = qhd,
               .first_key = first,
               .num_keys = count,
               .keys = keys,
               .values = keys + b.slice->start_position + b.slice->num_tokens,
               .kv_offset = task.head * qhd,
               .value_dim = v,
               .scale = static_cast<float>(config_.attention_scale()),
               .out = attn_.data() + t0 * heads * v + task.head * v,
               .out_stride = heads * v},
              scores_[static_cast<size_t>(thread)].data());
}

void CpuBackend::AttendLatentTask(const AttentionTask& task, int64_t num_rows, int thread) {
  const AttentionRowBlock& b = blocks_[static_cast<size_t>(task.block)];
  const int64_t rank = config_.kv_lora_rank, row = rank + config_.qk_rope_head_dim;
  int64_t first[kAttentionRows], count[kAttentionRows];
  for (int64_t r = 0; r < b.count; ++r) {
    first[r] = 0;
    count[r] = b.slice->start_position + b.begin + r + 1;
  }
  // A block's rows (one head) are a row apart in q_latent_; a task's heads
  // (one row) num_rows rows apart.
  const int64_t rows = b.count * task.heads;
  const int64_t q_stride = task.heads > 1 ? num_rows * row : row, out_stride = task.heads > 1 ? num_rows * rank : rank;
  for (int64_t r = b.count; r < rows; ++r) first[r] = first[0], count[r] = count[0];
  const float* const* keys = kv_rows_.data() + b.keys_at;
  const int64_t t0 = b.slice->row_offset + b.begin;
  AttendBlock({.q = q_latent_.data() + (task.head * num_rows + t0) * row,
               .q_stride = q_stride,
               .rows = rows,
               .head_dim = row,
               .first_key = first,
               .num_keys = count,
               .keys = keys,
               .values = keys,  // the latent, the first R values of each row
               .kv_offset = 0,
               .value_dim = rank,
               .scale = static_cast<float>(config_.attention_scale()),
               .out = latent_out_.data() + (task.head * num_rows + t0) * rank,
               .out_stride = out_stride},
              scores_[static_cast<size_t>(thread)].data());
}

// Each head's latent output through W_UV_h, the heads side by side, then
// o_proj into the residual.
absl::Status CpuBackend::ProjectLatentOutput(const LayerWeights& lw, int64_t num_rows, float* hidden) {
  const int64_t heads = config_.num_attention_heads, rank = config_.kv_lora_rank;
  const int64_t nope = config_.qk_nope_head_dim, v = config_.v_head_dim;
  // The absorbed blocks' rows (the expanded ones already wrote attn_).
  std::vector<std::pair<int64_t, int64_t>> absorbed;
  for (const AttentionRowBlock& b : blocks_) {
    if (!b.expanded) absorbed.emplace_back(b.slice->row_offset + b.begin, b.count);
  }
  if (!absorbed.empty()) {
    TANDEM_RETURN_IF_ERROR(ParallelTasks(pool_, heads, [&](int64_t h) -> absl::Status {
      float* out = v_heads_.data() + h * num_rows * v;
      TANDEM_RETURN_IF_ERROR(Linear(latent_out_.data() + h * num_rows * rank, num_rows, lw.mla.ValueUp(h, nope, v),
                                    nullptr, out, nullptr));
      for (const auto& [first, count] : absorbed) {
        for (int64_t t = first; t < first + count; ++t)
          std::copy_n(out + t * v, v, attn_.data() + t * heads * v + h * v);
      }
      return absl::OkStatus();
    }));
  }
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(Linear(attn_.data(), num_rows, lw.o_proj, nullptr, o_.data(), pool_));
  projection_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  projection_flops_ += 2.0 * static_cast<double>(num_rows) * static_cast<double>(config_.hidden_size) *
                       static_cast<double>(config_.attention_out_dim());
  AddInPlace(hidden, o_.data(), num_rows * config_.hidden_size);
  return absl::OkStatus();
}

}  // namespace tandem
