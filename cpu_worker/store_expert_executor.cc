#include "cpu_worker/store_expert_executor.h"

#include "absl/strings/str_cat.h"

namespace tandem {

StoreExpertExecutor::StoreExpertExecutor(const ExpertStore* store, ThreadPool* pool, LinearOptions options)
    : store_(store), ffn_(pool, options) {}

absl::Status StoreExpertExecutor::RunExperts(int layer, std::span<const ExpertWork> work) {
  const ExpertStoreInfo& info = store_->info();
  const std::string who = absl::StrCat("StoreExpertExecutor (", store_->region_name(), ")");
  if (layer < 0 || layer >= info.num_layers)
    return absl::InvalidArgumentError(absl::StrCat(who, ": layer ", layer, " out of range [0, ", info.num_layers, ")"));
  // Validate every entry before computing any, so a bad request writes nothing.
  for (const ExpertWork& entry : work) {
    if (entry.expert < 0 || entry.expert >= info.num_experts)
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": layer ", layer, " expert ", entry.expert, " out of range [0, ", info.num_experts, ")"));
    if (store_->Find(layer, entry.expert) == nullptr)
      return absl::InvalidArgumentError(absl::StrCat(who, ": worker ", info.worker_index, " of ", info.num_workers,
                                                     " holds no part of layer ", layer, " expert ", entry.expert, " (",
                                                     ExpertDivisionName(info.division), ")"));
    if (entry.num_rows < 0)
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": layer ", layer, " expert ", entry.expert, " has negative rows ", entry.num_rows));
    if (entry.num_rows > 0 && (entry.input == nullptr || entry.output == nullptr))
      return absl::InvalidArgumentError(absl::StrCat(who, ": layer ", layer, " expert ", entry.expert,
                                                     " has null input or output for ", entry.num_rows, " rows"));
  }

  return recorder_.RunBatchAndRecord(layer, work, [&](std::span<const ExpertWork> entries) {
    calls_.clear();
    for (const ExpertWork& entry : entries)
      calls_.push_back({.weights = store_->Find(layer, entry.expert),
                        .x = entry.input,
                        .rows = entry.num_rows,
                        .y = entry.output,
                        .expert = entry.expert});
    return ffn_.Run(calls_);
  });
}

}  // namespace tandem
