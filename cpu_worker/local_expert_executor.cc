#include "cpu_worker/local_expert_executor.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {

LocalExpertExecutor::LocalExpertExecutor(std::vector<std::vector<ExpertFfnWeights>> experts,
                                         ThreadPool* pool, LinearOptions options)
    : experts_(std::move(experts)), ffn_(pool, options) {}

absl::Status LocalExpertExecutor::RunExperts(int layer, std::span<const ExpertWork> work) {
  if (layer < 0 || layer >= num_layers())
    return absl::InvalidArgumentError(
        absl::StrCat("LocalExpertExecutor: layer ", layer, " out of range [0, ", num_layers(), ")"));
  const std::vector<ExpertFfnWeights>& layer_experts = experts_[static_cast<size_t>(layer)];
  const int num_experts = static_cast<int>(layer_experts.size());
  // Validate every entry before computing any, so a bad request writes nothing.
  for (const ExpertWork& entry : work) {
    if (entry.expert < 0 || entry.expert >= num_experts)
      return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ",
                                                     entry.expert, " out of range [0, ", num_experts, ")"));
    if (entry.num_rows < 0)
      return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ",
                                                     entry.expert, " has negative rows ", entry.num_rows));
    if (entry.num_rows > 0 && (entry.input == nullptr || entry.output == nullptr))
      return absl::InvalidArgumentError(absl::StrCat("LocalExpertExecutor: layer ", layer, " expert ",
                                                     entry.expert, " has null input or output for ",
                                                     entry.num_rows, " rows"));
  }

  const auto start = std::chrono::steady_clock::now();
  LocalExpertExecutorStats call;
  call.calls = 1;
  for (const ExpertWork& entry : work) {
    if (entry.num_rows == 0) continue;  // an expert with no rows changes nothing
    absl::Status status = ffn_.Run(layer_experts[static_cast<size_t>(entry.expert)], entry.input,
                                   entry.num_rows, entry.output);
    if (!status.ok())
      return absl::Status(status.code(), absl::StrCat("layer ", layer, " expert ", entry.expert, ": ",
                                                      status.message()));
    ++call.experts;
    call.rows += entry.num_rows;
  }
  call.time_us = std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - start)
                     .count();

  std::lock_guard<std::mutex> lock(stats_mutex_);
  last_call_ = call;
  totals_.calls += call.calls;
  totals_.experts += call.experts;
  totals_.rows += call.rows;
  totals_.time_us += call.time_us;
  return absl::OkStatus();
}

LocalExpertExecutorStats LocalExpertExecutor::stats() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return totals_;
}

LocalExpertExecutorStats LocalExpertExecutor::last_call() const {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  return last_call_;
}

void LocalExpertExecutor::ResetStats() {
  std::lock_guard<std::mutex> lock(stats_mutex_);
  totals_ = {};
  last_call_ = {};
}

}  // namespace tandem
