// What both CPU expert executors (in-process and store-backed) count over
// their RunExperts calls, and the loop that runs one call's experts and
// records it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/base/expert_executor.h"

namespace tandem {

// Counters over RunExperts calls; time is wall time of the whole call.
struct ExpertCallStats {
  int64_t calls = 0;
  int64_t experts = 0;  // ExpertWork entries with at least one row
  int64_t rows = 0;     // sum of num_rows
  int64_t time_us = 0;
};

// Totals and the last call. Record comes from the executor's caller thread;
// totals/last_call may be read by a metrics thread at the same time.
class ExpertCallRecorder {
 public:
  // Runs `run_one` on every entry with rows, in order, stopping at the first
  // error (prefixed with the layer and expert), and records the call.
  absl::Status RunAndRecord(int layer, std::span<const ExpertWork> work,
                            const std::function<absl::Status(const ExpertWork&)>& run_one);

  // Runs every entry of `work` in one `run_all` (a batch over the pool; it
  // skips entries without rows), its error prefixed with the layer, and
  // records the call as RunAndRecord does.
  absl::Status RunBatchAndRecord(int layer, std::span<const ExpertWork> work,
                                 const std::function<absl::Status(std::span<const ExpertWork>)>& run_all);

  ExpertCallStats totals() const ABSL_LOCKS_EXCLUDED(mutex_);
  ExpertCallStats last_call() const ABSL_LOCKS_EXCLUDED(mutex_);
  void Reset() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  mutable absl::Mutex mutex_;
  ExpertCallStats totals_ ABSL_GUARDED_BY(mutex_);
  ExpertCallStats last_call_ ABSL_GUARDED_BY(mutex_);

  void Record(const ExpertCallStats& call) ABSL_LOCKS_EXCLUDED(mutex_);
};

}  // namespace tandem
