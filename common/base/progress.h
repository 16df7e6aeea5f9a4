// Progress of one long step (loading weights, dequantizing, filling the
// expert store), counted in bytes: logs "<what>: 1.20 of 4.80 GB (25%),
// 0.90 GB/s, ETA 4 s" at most once per log interval, a last line when the
// step ends, and publishes itself so health endpoints can say how far the
// load is (CurrentProgress). The same small class for every loader.
//
// Thread-safe: Add may be called from any number of threads at once. The
// reporter must outlive the threads that Add to it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/clock.h"

namespace tandem {

struct ProgressSnapshot {
  bool active = false;  // false: no long step is running (the other fields are empty)
  std::string what;     // "generating synthetic weights", "dequantizing GGUF tensors", ...
  int64_t done_bytes = 0;
  int64_t total_bytes = 0;
  double elapsed_s = 0;
  double bytes_per_s = 0;
  double eta_s = -1;  // -1: not known yet

  double fraction() const { return total_bytes > 0 ? static_cast<double>(done_bytes) / total_bytes : 0.0; }
  // "1.20 of 4.80 GB (25%), 0.90 GB/s, ETA 4 s".
  std::string ToString() const;
};

class ProgressReporter {
 public:
  // Starts the clock and publishes the step. `total_bytes` >= 0.
  ProgressReporter(std::string what, int64_t total_bytes);
  // Logs the final line (bytes done, seconds, GB/s) and unpublishes.
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // `bytes` more are done; logs when the interval has passed since the
  // last line. Any thread.
  void Add(int64_t bytes);
  ProgressSnapshot Snapshot() const;

 private:
  const std::string what_;
  const int64_t total_bytes_;
  const SteadyClock::time_point start_;
  std::atomic<int64_t> done_{0};
  std::atomic<int64_t> next_log_ns_;  // since start_: the earliest time of the next line
  absl::Mutex log_mu_;                // one line at a time (it guards no member)
};

// The process's newest progress step still running, for /health; inactive
// when none is. Any thread.
ProgressSnapshot CurrentProgress();

// How often reporters log (2 s unless set; the programs' --progress_interval
// flag). Set it before loading starts; any thread.
void SetProgressLogInterval(absl::Duration interval);
absl::Duration ProgressLogInterval();

}  // namespace tandem
