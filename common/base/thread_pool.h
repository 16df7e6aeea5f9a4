// A fixed pool of compute threads that run one parallel loop at a time.
//
// Work in ParallelFor is split with an atomic counter (dynamic scheduling).
// Between loops the workers spin for a while before sleeping: a decode step
// runs dozens of parallel loops microseconds apart, and waking a sleeping
// thread (a futex, and on a VM an idle vCPU's halt) costs tens of µs each.
// The pool has `num_threads` workers *including* the calling thread,
// so ParallelFor never oversubscribes the cores it was given. The caller
// waits only for workers that joined the loop: once every task is taken,
// a worker that has not woken yet (descheduled by another process, or
// asleep past its spin) is left out of this loop instead of waited for.
//
// Owns its threads (joined in the destructor). ParallelFor may be called from
// one thread at a time (the owner); calls are serialised by a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

struct ThreadPoolOptions {
  int num_threads = 1;          // total workers including the calling thread, >= 1
  std::string name = "tandem";  // threads are named "<name>-w<i>"
  std::vector<int> cpus;        // if non-empty, worker i is pinned to cpus[i % size]
};

// What the owner spent in ParallelFor waiting for the other threads to
// finish after running out of tasks itself (late wake-ups, imbalance).
struct ThreadPoolStats {
  int64_t parallel_fors = 0;  // calls that used more than one thread
  double caller_wait_us = 0;
};

class ThreadPool {
 public:
  // ResourceExhausted naming the count when the threads cannot be started
  // (the constructor throws std::system_error then, having joined the
  // threads it did start): use this where the count comes from a user.
  static absl::StatusOr<std::unique_ptr<ThreadPool>> Create(ThreadPoolOptions options);
  explicit ThreadPool(ThreadPoolOptions options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn(task, thread) for task in [0, num_tasks); thread in [0, num_threads).
  // Returns when every task has finished.
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t task, int thread)>& fn)
      ABSL_LOCKS_EXCLUDED(mutex_);

  // Since construction or ResetStats; the owner's thread only.
  ThreadPoolStats stats() const { return stats_; }
  void ResetStats() { stats_ = ThreadPoolStats{}; }

 private:
  void WorkerLoop(int thread) ABSL_LOCKS_EXCLUDED(mutex_);
  void RunTasks(int thread);

  const int num_threads_;
  std::vector<std::thread> threads_;
  // One ParallelFor at a time: it guards no member (nothing for the
  // thread-safety analysis to check), it serialises the callers of the
  // per-loop state below. A std::mutex, not absl::Mutex, because every
  // ParallelFor takes it: Debian's abseil is built with its deadlock
  // detector on, which makes each absl::Mutex::Lock ~55 ns instead of ~5.
  std::mutex call_mutex_;

  // The sleep/wake path only; the loop's fast path takes no lock. A worker
  // whose spin ran out sleeps on start_cv_ under mutex_, counted in
  // sleepers_; the owner takes mutex_ to wake workers only when sleepers_
  // says one may sleep, and to wait for the last worker (done_cv_), flagged
  // in caller_waiting_. Each side writes its own atomic, then reads the
  // other's (all sequentially consistent), so at least one sees the other
  // and no wake-up is lost.
  absl::Mutex mutex_;
  absl::CondVar start_cv_;
  absl::CondVar done_cv_;
  std::atomic<uint64_t> generation_{0};      // bumped per ParallelFor
  std::atomic<int> active_workers_{0};       // workers inside a loop (joined, not yet left)
  std::atomic<bool> closed_{false};          // every task of this generation is taken: no more joins
  std::atomic<bool> stop_{false};            // set under mutex_
  std::atomic<int> sleepers_{0};             // workers past their spin, about to sleep or asleep
  std::atomic<bool> caller_waiting_{false};  // the owner sleeps on done_cv_

  // The loop's arguments. Not ABSL_GUARDED_BY: written by the owner (under
  // call_mutex_) before generation_ is bumped, then read without a lock by
  // that generation's workers (the bump, seen by their acquire load, orders
  // the writes first).
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  ThreadPoolStats stats_;  // written by the owner inside ParallelFor only
};

// Number of cores this process may run on (sched_getaffinity), at least 1.
int AvailableCores();

}  // namespace tandem
