#include "coordinator/engine/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/kernels/activation.h"
#include "common/kernels/attention_block.h"
#include "common/model/gguf_tensor_source.h"
#include "common/model/routing.h"
#include "common/quant/quantize.h"

namespace tandem {

CpuBackend::CpuBackend(const ModelWeights* weights, ThreadPool* pool)
    : weights_(weights), config_(weights->config), pool_(pool), rope_(weights->config) {
  scores_.resize(static_cast<size_t>(pool ? pool->num_threads() : 1));
}

absl::Status CpuBackend::Embed(std::span<const int32_t> tokens, float* hidden) {
  const int64_t d = config_.hidden_size;
  const TensorView& table = weights_->embed_tokens;  // [V, D]
  for (size_t t = 0; t < tokens.size(); ++t) {
    const int32_t id = tokens[t];
    if (id < 0 || id >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " at position ", t,
                                                     " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
    if (IsQuantized(table.dtype)) {
      // A GGUF table kept in its blocks (as llama.cpp does): one row's blocks
      // decoded per token, so the table costs its file size, not 2-4x that.
      const size_t row_bytes = static_cast<size_t>(DTypeRowBytes(table.dtype, d));
      const uint8_t* row = static_cast<const uint8_t*>(table.data) + static_cast<size_t>(id) * row_bytes;
      const absl::Status decoded =
          DequantizeRow(GgmlFromDType(table.dtype), {row, row_bytes},
                        absl::MakeSpan(hidden + static_cast<int64_t>(t) * d, static_cast<size_t>(d)));
      if (!decoded.ok()) return absl::InternalError(absl::StrCat(table.name, ": ", decoded.message()));
      continue;
    }
    const size_t base = static_cast<size_t>(id) * static_cast<size_t>(d);
    for (int64_t i = 0; i < d; ++i)
      hidden[static_cast<int64_t>(t) * d + i] = LoadAsF32(table.data, table.dtype, base + static_cast<size_t>(i));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Attention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows, float* hidden) {
  if (config_.mla()) return LatentAttention(layer, slices, num_rows, hidden);
  return RunAttention(layer, slices, num_rows, {}, hidden);
}

absl::Status CpuBackend::AttentionForOutputRows(int layer, std::span<const SequenceSlice> slices, int64_t num_rows,
                                                std::span<const int64_t> output_rows, float* hidden) {
  for (size_t i = 0; i < output_rows.size(); ++i) {
    if (output_rows[i] < 0 || output_rows[i] >= num_rows || (i > 0 && output_rows[i] <= output_rows[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("attention's output row ", i, " (", output_rows[i],
                                                     ") is not ascending within the batch's ", num_rows, " rows"));
    }
  }
  if (config_.mla()) return LatentAttention(layer, slices, num_rows, hidden);
  if (static_cast<int64_t>(output_rows.size()) == num_rows) output_rows = {};  // every row: in place
  return RunAttention(layer, slices, num_rows, output_rows, hidden);
}

absl::Status CpuBackend::RunAttention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows,
                                      std::span<const int64_t> output_rows, float* hidden) {
  const LayerWeights& lw = weights_->layers[static_cast<size_t>(layer)];
  TANDEM_RETURN_IF_ERROR(GrowAttentionBuffers(num_rows));
  TANDEM_RETURN_IF_ERROR(ProjectQkv(lw, num_rows, output_rows, hidden));
  RopeAndCache(layer, slices, output_rows);
  TANDEM_RETURN_IF_ERROR(PlanAttention(layer, slices, output_rows));
  const auto num_tasks = static_cast<int64_t>(tasks_.size());
  if (pool_) {
    pool_->ParallelFor(num_tasks, [&](int64_t t, int thread) { AttendTask(tasks_[static_cast<size_t>(t)], thread); });
  } else {
    for (int64_t t = 0; t < num_tasks; ++t) AttendTask(tasks_[static_cast<size_t>(t)], 0);
  }
  return ProjectOutput(lw, num_rows, output_rows, hidden);
}

absl::Status CpuBackend::GrowAttentionBuffers(int64_t num_rows) {
  const int64_t d = config_.hidden_size, q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  TANDEM_RETURN_IF_ERROR(normed_.Grow(num_rows * d, "attention's normed input"));
  TANDEM_RETURN_IF_ERROR(q_.Grow(num_rows * q_dim, "the queries"));
  TANDEM_RETURN_IF_ERROR(k_.Grow(num_rows * kv_dim, "the new keys"));
  TANDEM_RETURN_IF_ERROR(v_.Grow(num_rows * kv_dim, "the new values"));
  TANDEM_RETURN_IF_ERROR(attn_.Grow(num_rows * q_dim, "the attention output"));
  return o_.Grow(num_rows * d, "the output projection");
}

namespace {
const float* BiasOrNull(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }
}  // namespace

// [T, D] → q [T or output rows, Hq], k/v [T, Hkv].
absl::Status CpuBackend::ProjectQkv(const LayerWeights& lw, int64_t num_rows, std::span<const int64_t> output_rows,
                                    const float* hidden) {
  const int64_t d = config_.hidden_size, q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  const int64_t q_rows = output_rows.empty() ? num_rows : static_cast<int64_t>(output_rows.size());
  ApplyNorm(config_, lw.input_norm, hidden, num_rows, normed_.data());
  const auto start = std::chrono::steady_clock::now();
  const LinearProduct q = {.w = &lw.q_proj, .bias = BiasOrNull(lw.q_bias), .y = q_.data()};
  const LinearProduct k = {.w = &lw.k_proj, .bias = BiasOrNull(lw.k_bias), .y = k_.data()};
  const LinearProduct v = {.w = &lw.v_proj, .bias = BiasOrNull(lw.v_bias), .y = v_.data()};
  if (output_rows.empty()) {
    // One dispatch for q, k and v: k and v are a quarter of q each (GQA), too
    // few tasks on their own to keep every thread busy to the end.
    const LinearProduct qkv[] = {q, k, v};
    TANDEM_RETURN_IF_ERROR(LinearShared(normed_.data(), num_rows, qkv, pool_));
  } else {
    // Every row's keys and values go to the cache; queries only for the
    // output rows, packed (normed_ is not read after this).
    const LinearProduct kv[] = {k, v};
    TANDEM_RETURN_IF_ERROR(LinearShared(normed_.data(), num_rows, kv, pool_));
    PackRows(normed_.data(), d, output_rows);
    TANDEM_RETURN_IF_ERROR(Linear(normed_.data(), q_rows, lw.q_proj, q.bias, q_.data(), pool_));
  }
  if (config_.qk_norm_per_head()) {
    // Qwen3: each head of q and k RMS-normalised over head_dim (in place).
    const int64_t hd = config_.head_dim;
    RmsNorm(q_.data(), q_rows * config_.num_attention_heads, hd, lw.q_norm.data(), config_.rms_norm_eps, q_.data());
    RmsNorm(k_.data(), num_rows * config_.num_key_value_heads, hd, lw.k_norm.data(), config_.rms_norm_eps, k_.data());
  } else if (config_.qk_norm()) {
    // OLMoE: each row's whole q (and k) RMS-normalised.
    RmsNorm(q_.data(), q_rows, q_dim, lw.q_norm.data(), config_.rms_norm_eps, q_.data());
    RmsNorm(k_.data(), num_rows, kv_dim, lw.k_norm.data(), config_.rms_norm_eps, k_.data());
  }
  projection_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  // q and o (ProjectOutput) on the query rows, k and v on every row.
  projection_flops_ += 2.0 * static_cast<double>(d) * static_cast<double>(q_rows * 2 * q_dim + num_rows * 2 * kv_dim);
  return absl::OkStatus();
}

// RoPE on q and k, then the new keys/values join each sequence's cache.
void CpuBackend::RopeAndCache(int layer, std::span<const SequenceSlice> slices, std::span<const int64_t> output_rows) {
  const int64_t q_dim = config_.q_dim(), kv_dim = config_.kv_dim();
  size_t next_output = 0;  // output_rows ascend through the slices, which lie in row order
  for (const SequenceSlice& s : slices) {
    const bool long_factors = rope_.UseLongFactors(s.start_position + s.num_tokens - 1);
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      const int64_t row = s.row_offset + i, position = s.start_position + i;
      if (output_rows.empty()) {
        rope_.Apply(q_.data() + row * q_dim, config_.num_attention_heads, position, long_factors);
      } else if (next_output < output_rows.size() && output_rows[next_output] == row) {
        rope_.Apply(q_.data() + static_cast<int64_t>(next_output++) * q_dim, config_.num_attention_heads, position,
                    long_factors);
      }
      rope_.Apply(k_.data() + row * kv_dim, config_.num_key_value_heads, position, long_factors);
      std::copy_n(k_.data() + row * kv_dim, kv_dim, s.kv->KeyRow(layer, position));
      std::copy_n(v_.data() + row * kv_dim, kv_dim, s.kv->ValueRow(layer, position));
    }
  }
}

// Each row attends to its own sequence's keys up to its position (causal),
// within the sliding window when the config sets one. Tasks are (block of
// up to kAttentionRows consecutive rows of one sequence, query head): a
// block reads each key and value once for all its rows (prefill), and
// decode's single rows still spread over the threads by head. Scratch per
// thread: about kAttentionRows x keys floats, linear in the sequence length.
absl::Status CpuBackend::PlanAttention(int layer, std::span<const SequenceSlice> slices,
                                       std::span<const int64_t> output_rows) {
  // Every cached position's key and value row is looked up once per layer
  // into kv_rows_ (the slice's keys from `keys_at`, then its values), with
  // one block-table lookup per block of positions: the lookup (block
  // table, an out-of-line pool call, a division) cost more than the dot
  // product it fed when every head repeated it for every key
  // (mixtral-8x7b:2 decode at ~560 keys: attention 3.9-4.2 -> 3.5 ms/token).
  blocks_.clear();
  kv_rows_.clear();
  int64_t max_keys = 0;
  size_t next_output = 0;
  for (const SequenceSlice& s : slices) {
    const size_t keys_at = kv_rows_.size();
    const int64_t end = s.start_position + s.num_tokens;
    s.kv->AppendKeyRows(layer, end, kv_rows_);
    s.kv->AppendValueRows(layer, end, kv_rows_);
    PlanQueryBlocks(s, keys_at, output_rows, &next_output);
    max_keys = std::max(max_keys, end);
  }
  for (auto& scratch : scores_)
    TANDEM_RETURN_IF_ERROR(scratch.Grow(AttentionBlockScratchFloats(max_keys, config_.head_dim), "attention scores"));
  // A task attends one query head of a block, or, for a block of one row
  // (decode), the `group` query heads that share a kv head, as `group` rows
  // hd apart, so each key and value row is loaded once for all of them
  // rather than once per head (mixtral-8x7b:2 decode at ~560 keys,
  // alternating: 1.1-1.5 -> 0.84-0.91 ms per token). The kernel lays a few
  // rows' keys in vector lanes and a prefill block's queries
  // (attention_block.h); either way a row's result is the same bits.
  const int64_t heads = config_.num_attention_heads, group = heads / config_.num_key_value_heads;
  const bool by_kv_head = group > 1 && group <= kAttentionRows;
  tasks_.clear();
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const int64_t step = by_kv_head && blocks_[i].count == 1 ? group : 1;
    for (int64_t h = 0; h < heads; h += step)
      tasks_.push_back({static_cast<int32_t>(i), static_cast<int32_t>(h), static_cast<int32_t>(step)});
  }
  return absl::OkStatus();
}

// Blocks of up to kAttentionRows consecutive query rows of `s`: all its
// rows, or the run of output rows from *next_output that fall in it.
void CpuBackend::PlanQueryBlocks(const SequenceSlice& s, size_t keys_at, std::span<const int64_t> output_rows,
                                 size_t* next_output) {
  if (output_rows.empty()) {
    for (int64_t i = 0; i < s.num_tokens; i += kAttentionRows)
      blocks_.push_back({&s, i, std::min(kAttentionRows, s.num_tokens - i), keys_at, false, s.row_offset + i});
    return;
  }
  const int64_t end = s.row_offset + s.num_tokens;
  size_t i = *next_output;
  while (i < output_rows.size() && output_rows[i] < end) {
    const size_t first = i++;
    while (i < output_rows.size() && output_rows[i] < end && output_rows[i] == output_rows[i - 1] + 1 &&
           static_cast<int64_t>(i - first) < kAttentionRows)
      ++i;
    blocks_.push_back({&s, output_rows[first] - s.row_offset, static_cast<int64_t>(i - first), keys_at, false,
                       static_cast<int64_t>(first)});
  }
  *next_output = i;
}

void CpuBackend::AttendTask(const AttentionTask& task, int thread) {
  const AttentionRowBlock& b = blocks_[static_cast<size_t>(task.block)];
  const int64_t hd = config_.head_dim, q_dim = config_.q_dim();
  const int64_t group = config_.num_attention_heads / config_.num_key_value_heads;
  int64_t first[kAttentionRows], count[kAttentionRows];
  for (int64_t r = 0; r < b.count; ++r) {
    const int64_t position = b.slice->start_position + b.begin + r;
    first[r] = config_.sliding_window ? std::max<int64_t>(0, position - *config_.sliding_window + 1) : 0;
    count[r] = position - first[r] + 1;
  }
  // A block's rows are q_dim apart; a group's heads (one row) hd apart.
  const int64_t rows = b.count * task.heads, stride = task.heads > 1 ? hd : q_dim;
  for (int64_t r = b.count; r < rows; ++r) first[r] = first[0], count[r] = count[0];
  const float* const* keys = kv_rows_.data() + b.keys_at;
  const int64_t row0 = b.q_row;
  AttendBlock({.q = q_.data() + row0 * q_dim + task.head * hd,
               .q_stride = stride,
               .rows = rows,
               .head_dim = hd,
               .first_key = first,
               .num_keys = count,
               .keys = keys,
               .values = keys + b.slice->start_position + b.slice->num_tokens,
               .kv_offset = (task.head / group) * hd,
               .scale = 1.0f / std::sqrt(static_cast<float>(hd)),
               .out = attn_.data() + row0 * q_dim + task.head * hd,
               .out_stride = stride},
              scores_[static_cast<size_t>(thread)].data());
}

absl::Status CpuBackend::ProjectOutput(const LayerWeights& lw, int64_t num_rows, std::span<const int64_t> output_rows,
                                       float* hidden) {
  const int64_t d = config_.hidden_size;
  const int64_t rows = output_rows.empty() ? num_rows : static_cast<int64_t>(output_rows.size());
  const auto start = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(Linear(attn_.data(), rows, lw.o_proj, BiasOrNull(lw.o_bias), o_.data(), pool_));
  projection_us_ += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (output_rows.empty()) {
    AddInPlace(hidden, o_.data(), rows * d);
  } else {
    for (int64_t i = 0; i < rows; ++i)
      AddInPlace(hidden + output_rows[static_cast<size_t>(i)] * d, o_.data() + i * d, d);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Router(int layer, int64_t num_rows, const float* hidden, float* moe_input,
                                float* router_logits, int32_t* experts, float* weights) {
  const LayerWeights& lw = weights_->layers[static_cast<size_t>(layer)];
  ApplyNorm(config_, lw.post_attention_norm, hidden, num_rows, moe_input);
  // The router's input stays f32 (ARCHITECTURE.md, "Precision"): no kernel
  // that rounds x to bf16, whatever the plan says.
  TANDEM_RETURN_IF_ERROR(
      Linear(moe_input, num_rows, lw.router, nullptr, router_logits, pool_, LinearOptions{.f32_activations = true}));
  Route(config_, lw.router_correction_bias.empty() ? nullptr : lw.router_correction_bias.data(), router_logits,
        num_rows, experts, weights);
  return absl::OkStatus();
}

absl::Status CpuBackend::SwiGluMlp(const ExpertWeights& mlp, int64_t width, int64_t num_rows, const float* x) {
  TANDEM_RETURN_IF_ERROR(mlp_gate_.Grow(num_rows * width, "the MLP's gate activations"));
  TANDEM_RETURN_IF_ERROR(mlp_up_.Grow(num_rows * width, "the MLP's up activations"));
  TANDEM_RETURN_IF_ERROR(mlp_out_.Grow(num_rows * config_.hidden_size, "the MLP's output"));
  // gate and up read the same x: one dispatch.
  const LinearProduct gate_up[] = {{.w = &mlp.w1, .y = mlp_gate_.data()}, {.w = &mlp.w3, .y = mlp_up_.data()}};
  TANDEM_RETURN_IF_ERROR(LinearShared(x, num_rows, gate_up, pool_));
  auto silu_rows = [&](int64_t t, int) { SiluMul(mlp_gate_.data() + t * width, mlp_up_.data() + t * width, width); };
  if (pool_ != nullptr) {
    pool_->ParallelFor(num_rows, silu_rows);
  } else {
    for (int64_t t = 0; t < num_rows; ++t) silu_rows(t, 0);
  }
  return Linear(mlp_gate_.data(), num_rows, mlp.w2, nullptr, mlp_out_.data(), pool_);
}

absl::Status CpuBackend::SharedExpert(int layer, int64_t num_rows, const float* moe_input, float* hidden, float* term) {
  const LayerWeights& lw = weights_->layers[static_cast<size_t>(layer)];
  if (lw.shared_expert.w1.data == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " has no shared expert"));
  const int64_t d = config_.hidden_size;
  TANDEM_RETURN_IF_ERROR(SwiGluMlp(lw.shared_expert, config_.shared_expert_intermediate_size, num_rows, moe_input));
  if (!config_.shared_expert_gated()) {  // GLM-4.5: added as it is
    if (term != nullptr) std::copy_n(mlp_out_.data(), num_rows * d, term);
    AddInPlace(hidden, mlp_out_.data(), num_rows * d);
    return absl::OkStatus();
  }
  for (int64_t t = 0; t < num_rows; ++t) {
    // The gate is one f32 dot product per row (x stays f32, as the router's).
    const float* x = moe_input + t * d;
    double logit = 0.0;
    for (int64_t i = 0; i < d; ++i) logit += static_cast<double>(x[i]) * lw.shared_expert_gate[static_cast<size_t>(i)];
    const float scale = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
    float* s = mlp_out_.data() + t * d;
    for (int64_t i = 0; i < d; ++i) s[i] *= scale;
    if (term != nullptr) std::copy_n(s, d, term + t * d);
  }
  AddInPlace(hidden, mlp_out_.data(), num_rows * d);
  return absl::OkStatus();
}

absl::Status CpuBackend::DenseMlp(int layer, int64_t num_rows, float* hidden, float* moe_input) {
  const LayerWeights& lw = weights_->layers[static_cast<size_t>(layer)];
  if (lw.dense_mlp.w1.data == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("layer ", layer, " is an MoE layer, not a dense one"));
  ApplyNorm(config_, lw.post_attention_norm, hidden, num_rows, moe_input);
  TANDEM_RETURN_IF_ERROR(SwiGluMlp(lw.dense_mlp, config_.dense_intermediate_size, num_rows, moe_input));
  AddInPlace(hidden, mlp_out_.data(), num_rows * config_.hidden_size);
  return absl::OkStatus();
}

absl::Status CpuBackend::Combine(int64_t num_rows, const float* weights, const float* expert_out, float* hidden) {
  const int64_t d = config_.hidden_size, k = config_.num_experts_per_tok;
  for (int64_t t = 0; t < num_rows; ++t) {
    float* h = hidden + t * d;
    for (int64_t s = 0; s < k; ++s) {
      const float w = weights[t * k + s];
      const float* out = expert_out + (t * k + s) * d;
      for (int64_t i = 0; i < d; ++i) h[i] += w * out[i];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Logits(std::span<const int64_t> rows, const float* hidden, float* logits) {
  const int64_t d = config_.hidden_size, n = static_cast<int64_t>(rows.size());
  TANDEM_RETURN_IF_ERROR(normed_.Grow(n * d, "the final norm's output"));
  for (int64_t i = 0; i < n; ++i) {
    ApplyNorm(config_, weights_->final_norm, hidden + rows[static_cast<size_t>(i)] * d, 1, normed_.data() + i * d);
  }
  const float* bias = weights_->lm_head_bias.empty() ? nullptr : weights_->lm_head_bias.data();
  return Linear(normed_.data(), n, weights_->lm_head, bias, logits, pool_);
}

}  // namespace tandem
