#include "cpu_worker/store_expert_executor.h"

#include <chrono>

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

  const auto start = std::chrono::steady_clock::now();
  StoreExpertExecutorStats call;
  call.calls = 1;
  for (const ExpertWork& entry : work) {
    if (entry.num_rows == 0) continue;  // an expert with no rows changes nothing
    absl::Status status = ffn_.Run(*store_->Find(layer, entry.expert), entry.input, entry.num_rows, entry.output);
    if (!status.ok())
      return absl::Status(status.code(),
                          absl::StrCat("layer ", layer, " expert ", entry.expert, ": ", status.message()));
    ++call.experts;
    call.rows += entry.num_rows;
  }
  call.time_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();

  std::lock_guard<std::mutex> lock(stats_mutex_);
  last_call_ = call;
  totals_.calls += call.calls;
  totals_.experts += call.experts;
  totals_.rows += call.rows;
  totals_.time_us += call.time_us;
  return absl::OkStatus();
}

StoreExpertExecutorStats StoreExpertExecutor::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return totals_;
}

StoreExpertExecutorStats StoreExpertExecutor::last_call() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return last_call_;
}

void StoreExpertExecutor::ResetStats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  totals_ = {};
  last_call_ = {};
}

}  // namespace tandem
