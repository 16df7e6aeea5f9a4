#include "cpu_worker/local_expert_executor.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

LocalExpertExecutor::LocalExpertExecutor(std::vector<std::vector<ExpertFfnWeights>> experts, ThreadPool* pool,
                                         LinearOptions options, int split_ways)
    : experts_(std::move(experts)), pool_(pool), split_ways_(split_ways), ffn_(pool, options) {
  // The coarsest down_proj block of all, as ExpertSplitBlockOf gives the
  // workers' stores, so the partials are cut where the workers cut them.
  for (const std::vector<ExpertFfnWeights>& layer : experts_)
    for (const ExpertFfnWeights& e : layer) split_block_ = std::max(split_block_, DTypeBlockSize(e.w2.dtype));
}

absl::Status LocalExpertExecutor::RunSplit(const ExpertFfnWeights& weights, const float* input, int64_t rows,
                                           float* output) {
  // A quantized down_proj is cut on its blocks, as the workers' stores cut it.
  TANDEM_ASSIGN_OR_RETURN(std::vector<IntermediateRange> ranges,
                          SplitIntermediate(weights.w1.n, split_ways_, split_block_));
  const int64_t hidden = weights.w1.k;
  const int64_t intermediate = weights.w1.n;
  if (weights.w2.n != hidden || weights.w2.k != intermediate || weights.w3.n != intermediate || weights.w3.k != hidden)
    return absl::InvalidArgumentError(absl::StrCat("expert matrices are gate [", weights.w1.n, ", ", weights.w1.k,
                                                   "], up [", weights.w3.n, ", ", weights.w3.k, "], down [",
                                                   weights.w2.n, ", ", weights.w2.k, "]"));
  const DType w2_dtype = weights.w2.dtype;
  size_t max_part_bytes = 0;  // one stored w2 row of the largest part
  for (const IntermediateRange& range : ranges)
    max_part_bytes = std::max(max_part_bytes, static_cast<size_t>(DTypeRowBytes(w2_dtype, range.size())));
  try {
    if (w2_part_.size() < static_cast<size_t>(hidden) * max_part_bytes)
      w2_part_.resize(static_cast<size_t>(hidden) * max_part_bytes);
    if (partial_.size() < static_cast<size_t>(rows * hidden)) partial_.resize(static_cast<size_t>(rows * hidden));
    if (sum_.size() < static_cast<size_t>(rows * hidden)) sum_.resize(static_cast<size_t>(rows * hidden));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("no memory for split_ways ", split_ways_, " scratch"));
  }
  for (size_t w = 0; w < ranges.size(); ++w) {
    const IntermediateRange range = ranges[w];
    const int64_t part = range.size();
    // The slice a split worker stores (cpu_worker/expert_store.h): W1/W3 rows
    // are contiguous in place; W2's columns (whole blocks) are gathered row
    // by row.
    const char* w2 = static_cast<const char*>(weights.w2.data);
    const int64_t part_bytes = DTypeRowBytes(w2_dtype, part), skip = DTypeRowBytes(w2_dtype, range.begin);
    const int64_t w2_row = weights.w2.row_bytes();
    auto copy_rows = [&](int64_t d, int) {
      std::memcpy(w2_part_.data() + d * part_bytes, w2 + d * w2_row + skip, static_cast<size_t>(part_bytes));
    };
    if (pool_ != nullptr) {
      pool_->ParallelFor(hidden, copy_rows);
    } else {
      for (int64_t d = 0; d < hidden; ++d) copy_rows(d, 0);
    }
    ExpertFfnWeights slice;
    slice.w1 = LinearWeight{static_cast<const char*>(weights.w1.data) + range.begin * weights.w1.row_bytes(),
                            weights.w1.dtype, part, hidden, weights.w1.order};
    slice.w3 = LinearWeight{static_cast<const char*>(weights.w3.data) + range.begin * weights.w3.row_bytes(),
                            weights.w3.dtype, part, hidden, weights.w3.order};
    slice.w2 = LinearWeight{w2_part_.data(), w2_dtype, hidden, part, weights.w2.order};
    // Worker order, as the coordinator sums: out = p_0; out += p_1; ...
    // Summed in scratch, not in `output`: every partial reads `input`, which
    // may be the same buffer.
    if (w == 0) {
      TANDEM_RETURN_IF_ERROR(ffn_.Run(slice, input, rows, sum_.data()));
    } else {
      TANDEM_RETURN_IF_ERROR(ffn_.Run(slice, input, rows, partial_.data()));
      for (size_t i = 0; i < static_cast<size_t>(rows * hidden); ++i) sum_[i] += partial_[i];
    }
  }
  std::memcpy(output, sum_.data(), static_cast<size_t>(rows * hidden) * sizeof(float));
  return absl::OkStatus();
}

absl::Status LocalExpertExecutor::RunExperts(int layer, std::span<const ExpertWork> work) {
  if (layer < 0 || layer >= num_layers())
    return absl::InvalidArgumentError(
        absl::StrCat("LocalExpertExecutor: layer ", layer, " out of range [0, ", num_layers(), ")"));
  const std::vector<ExpertFfnWeights>& layer_experts = experts_[static_cast<size_t>(layer)];
  const int num_experts = static_cast<int>(layer_experts.size());
  // Validate every entry before computing any, so a bad request writes nothing.
  for (const ExpertWork& entry : work) {
    if (entry.expert < 0 || entry.expert >= num_experts)
      return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ", entry.expert,
                                                     " out of range [0, ", num_experts, ")"));
    if (entry.num_rows < 0)
      return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ", entry.expert,
                                                     " has negative rows ", entry.num_rows));
    if (entry.num_rows > 0 && (entry.input == nullptr || entry.output == nullptr))
      return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ", entry.expert,
                                                     " has null input or output for ", entry.num_rows, " rows"));
    if (split_ways_ != 1) {
      const ExpertFfnWeights& w = layer_experts[static_cast<size_t>(entry.expert)];
      absl::StatusOr<std::vector<IntermediateRange>> ranges = SplitIntermediate(w.w1.n, split_ways_, split_block_);
      if (!ranges.ok())
        return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ", entry.expert,
                                                       ": split_ways ", split_ways_, ": ", ranges.status().message()));
    }
  }

  if (split_ways_ != 1) {
    return recorder_.RunAndRecord(layer, work, [&](const ExpertWork& entry) {
      return RunSplit(layer_experts[static_cast<size_t>(entry.expert)], entry.input, entry.num_rows, entry.output);
    });
  }
  return recorder_.RunBatchAndRecord(layer, work, [&](std::span<const ExpertWork> entries) {
    calls_.clear();
    for (const ExpertWork& entry : entries)
      calls_.push_back({.weights = &layer_experts[static_cast<size_t>(entry.expert)],
                        .x = entry.input,
                        .rows = entry.num_rows,
                        .y = entry.output,
                        .expert = entry.expert});
    return ffn_.Run(calls_);
  });
}

}  // namespace tandem
