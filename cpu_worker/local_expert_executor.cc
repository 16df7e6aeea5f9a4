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
    : experts_(std::move(experts)), pool_(pool), split_ways_(split_ways), ffn_(pool, options) {}

absl::Status LocalExpertExecutor::RunSplit(const ExpertFfnWeights& weights, const float* input, int64_t rows,
                                           float* output) {
  TANDEM_RETURN_IF_ERROR(RequireFloatDType(weights.w2.dtype, "an expert's down_proj", "split_ways"));
  TANDEM_ASSIGN_OR_RETURN(std::vector<IntermediateRange> ranges, SplitIntermediate(weights.w1.n, split_ways_));
  const int64_t hidden = weights.w1.k;
  const int64_t intermediate = weights.w1.n;
  if (weights.w2.n != hidden || weights.w2.k != intermediate || weights.w3.n != intermediate || weights.w3.k != hidden)
    return absl::InvalidArgumentError(absl::StrCat("expert matrices are gate [", weights.w1.n, ", ", weights.w1.k,
                                                   "], up [", weights.w3.n, ", ", weights.w3.k, "], down [",
                                                   weights.w2.n, ", ", weights.w2.k, "]"));
  const int64_t element = static_cast<int64_t>(DTypeSize(weights.w2.dtype));
  size_t max_part = 0;
  for (const IntermediateRange& range : ranges) max_part = std::max(max_part, static_cast<size_t>(range.size()));
  try {
    if (w2_part_.size() < static_cast<size_t>(hidden * element) * max_part)
      w2_part_.resize(static_cast<size_t>(hidden * element) * max_part);
    if (partial_.size() < static_cast<size_t>(rows * hidden)) partial_.resize(static_cast<size_t>(rows * hidden));
    if (sum_.size() < static_cast<size_t>(rows * hidden)) sum_.resize(static_cast<size_t>(rows * hidden));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat("no memory for split_ways ", split_ways_, " scratch"));
  }
  for (size_t w = 0; w < ranges.size(); ++w) {
    const IntermediateRange range = ranges[w];
    const int64_t part = range.size();
    // The slice a split worker stores (cpu_worker/expert_store.h): W1/W3 rows
    // are contiguous in place; W2's columns are gathered row by row.
    const char* w2 = static_cast<const char*>(weights.w2.data);
    auto copy_rows = [&](int64_t d, int) {
      std::memcpy(w2_part_.data() + d * part * element, w2 + (d * intermediate + range.begin) * element,
                  static_cast<size_t>(part * element));
    };
    if (pool_ != nullptr) {
      pool_->ParallelFor(hidden, copy_rows);
    } else {
      for (int64_t d = 0; d < hidden; ++d) copy_rows(d, 0);
    }
    const int64_t row_bytes = hidden * static_cast<int64_t>(DTypeSize(weights.w1.dtype));
    ExpertFfnWeights slice;
    slice.w1 = LinearWeight{static_cast<const char*>(weights.w1.data) + range.begin * row_bytes, weights.w1.dtype, part,
                            hidden};
    slice.w3 = LinearWeight{static_cast<const char*>(weights.w3.data) + range.begin * row_bytes, weights.w3.dtype, part,
                            hidden};
    slice.w2 = LinearWeight{w2_part_.data(), weights.w2.dtype, hidden, part};
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
      absl::StatusOr<std::vector<IntermediateRange>> ranges =
          SplitIntermediate(layer_experts[static_cast<size_t>(entry.expert)].w1.n, split_ways_);
      if (!ranges.ok())
        return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ", entry.expert,
                                                       ": split_ways ", split_ways_, ": ", ranges.status().message()));
    }
  }

  return recorder_.RunAndRecord(layer, work, [&](const ExpertWork& entry) {
    const ExpertFfnWeights& weights = layer_experts[static_cast<size_t>(entry.expert)];
    return split_ways_ == 1 ? ffn_.Run(weights, entry.input, entry.num_rows, entry.output)
                            : RunSplit(weights, entry.input, entry.num_rows, entry.output);
  });
}

}  // namespace tandem
