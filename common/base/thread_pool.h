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
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

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
  void ParallelFor(int64_t num_tasks, const std::function<void(int64_t task, int thread)>& fn);

  // Since construction or ResetStats; the owner's thread only.
  ThreadPoolStats stats() const { return stats_; }
  void ResetStats() { stats_ = ThreadPoolStats{}; }

 private:
  void WorkerLoop(int thread);
  void RunTasks(int thread);

  const int num_threads_;
  std::vector<std::thread> threads_;
  // One ParallelFor at a time: it guards no member, it serialises the
  // callers of the per-loop state below.
  std::mutex call_mutex_;

  // Orders the loop's arguments and the sleeps and wake-ups. The atomics are
  // read without it (the workers spin on generation_ before sleeping).
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::atomic<uint64_t> generation_{0};  // bumped (under mutex_) per ParallelFor
  std::atomic<int> active_workers_{0};   // workers inside a loop (joined, not yet left)
  std::atomic<bool> closed_{false};      // every task of this generation is taken: no more joins
  std::atomic<bool> stop_{false};

  // The loop's arguments. Not ABSL_GUARDED_BY: written under mutex_ before
  // generation_ is bumped, then read without it by that generation's
  // workers (the bump's release, or the mutex, orders the writes first).
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t num_tasks_ = 0;
  std::atomic<int64_t> next_task_{0};
  ThreadPoolStats stats_;  // written by the owner inside ParallelFor only
};

// Number of cores this process may run on (sched_getaffinity), at least 1.
int AvailableCores();

}  // namespace tandem
