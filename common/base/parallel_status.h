// Errors out of a parallel loop: FirstError keeps the first failure of the
// tasks of one ThreadPool::ParallelFor, and ParallelTasks runs fallible tasks
// on a pool and returns that first failure. Header-only.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"

namespace tandem {

// Keeps the first error of a parallel loop; later tasks see failed() and
// skip. Any thread.
class FirstError {
 public:
  void Record(absl::Status status) ABSL_LOCKS_EXCLUDED(mutex_) {
    absl::MutexLock lock(&mutex_);
    if (status_.ok()) status_ = std::move(status);
    failed_.store(true, std::memory_order_relaxed);
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  absl::Status status() ABSL_LOCKS_EXCLUDED(mutex_) {
    absl::MutexLock lock(&mutex_);
    return status_;
  }

 private:
  absl::Mutex mutex_;
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
  // Not guarded: a hint read without the lock so that tasks after a failure
  // skip their work; status_ is the answer.
  std::atomic<bool> failed_{false};
};

// Runs task(t) -> absl::Status for t in [0, tasks) on the pool (in order on
// the calling thread when pool is null, has one thread or there is one
// task); returns the first error. Tasks that start after a failure are
// skipped.
template <typename Task>
absl::Status ParallelTasks(ThreadPool* pool, int64_t tasks, const Task& task) {
  if (pool == nullptr || tasks == 1 || pool->num_threads() == 1) {
    for (int64_t t = 0; t < tasks; ++t) TANDEM_RETURN_IF_ERROR(task(t));
    return absl::OkStatus();
  }
  FirstError error;
  pool->ParallelFor(tasks, [&](int64_t t, int) {
    if (error.failed()) return;
    absl::Status status = task(t);
    if (!status.ok()) error.Record(std::move(status));
  });
  return error.status();
}

}  // namespace tandem
