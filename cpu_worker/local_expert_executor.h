// The in-process CPU expert executor: every expert of every layer is a set of
// weights in this process's memory, computed with ExpertFfn on one pool.
//
// Legend: D hidden size, R rows routed to one expert.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/expert_executor.h"
#include "common/thread_pool.h"
#include "cpu_worker/expert_ffn.h"

namespace tandem {

// Counters over RunExperts calls; time is wall time of the whole call.
struct LocalExpertExecutorStats {
  int64_t calls = 0;
  int64_t experts = 0;  // ExpertWork entries with at least one row
  int64_t rows = 0;     // sum of num_rows
  int64_t time_us = 0;
};

class LocalExpertExecutor final : public ExpertExecutor {
 public:
  // `experts` is indexed [layer][expert]; the weight memory it points to must
  // outlive the executor. `pool` may be null (single thread) and is not owned.
  LocalExpertExecutor(std::vector<std::vector<ExpertFfnWeights>> experts, ThreadPool* pool,
                      LinearOptions options = {});

  // InvalidArgument naming the layer/expert for an index out of range, a
  // negative row count or null input/output; otherwise ExpertFfn's status.
  // Entries are run one after the other, each parallel over the pool.
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override;

  LocalExpertExecutorStats stats() const;       // since construction or ResetStats
  LocalExpertExecutorStats last_call() const;   // the most recent RunExperts
  void ResetStats();

  int num_layers() const { return static_cast<int>(experts_.size()); }

 private:
  std::vector<std::vector<ExpertFfnWeights>> experts_;  // [layer][expert]
  ExpertFfn ffn_;  // owns the [R, I] scratch, reused across calls

  mutable std::mutex stats_mutex_;  // stats may be read by a metrics thread
  LocalExpertExecutorStats totals_;
  LocalExpertExecutorStats last_call_;
};

}  // namespace tandem
