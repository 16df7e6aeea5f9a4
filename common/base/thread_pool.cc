#include "common/base/thread_pool.h"

#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// About 50-100 µs of pause instructions: long enough to bridge the gap
// between the parallel loops of one forward pass, short enough that an idle
// pool stops burning its cores almost at once.
constexpr int kSpinPauses = 4000;

}  // namespace

int AvailableCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int count = CPU_COUNT(&set);
  return count > 0 ? count : 1;
}

absl::StatusOr<std::unique_ptr<ThreadPool>> ThreadPool::Create(ThreadPoolOptions options) {
  const int asked = options.num_threads;
  try {
    return std::make_unique<ThreadPool>(std::move(options));
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start ", asked, " threads: ", e.what(), " (fewer threads, or raise ulimit -u)"));
  }
}

ThreadPool::ThreadPool(ThreadPoolOptions options) : num_threads_(options.num_threads < 1 ? 1 : options.num_threads) {
  // Thread 0 is the caller; threads 1..N-1 are owned here.
  for (int t = 1; t < num_threads_; ++t) {
    try {
      threads_.emplace_back([this, t] { WorkerLoop(t); });
    } catch (...) {
      // No thread may outlive a pool that was never built: stop and join
      // those already started, then let Create report it.
      {
        absl::MutexLock lock(&mutex_);
        stop_.store(true);
      }
      start_cv_.SignalAll();
      for (auto& thread : threads_) thread.join();
      throw;
    }
    std::string name = absl::StrCat(options.name, "-w", t).substr(0, 15);  // kernel limit
    pthread_setname_np(threads_.back().native_handle(), name.c_str());
    if (!options.cpus.empty()) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(options.cpus[t % options.cpus.size()], &set);
      pthread_setaffinity_np(threads_.back().native_handle(), sizeof(set), &set);
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mutex_);
    stop_.store(true);
  }
  start_cv_.SignalAll();
  for (auto& thread : threads_) thread.join();
}

void ThreadPool::RunTasks(int thread) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    (*fn_)(task, thread);
  }
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinPauses && generation_.load(std::memory_order_acquire) == seen &&
                    !stop_.load(std::memory_order_relaxed);
         ++i) {
      _mm_pause();
    }
    if (!stop_.load() && generation_.load() == seen) {
      // The spin ran out: sleep. Counted before the check: an owner that
      // bumps generation_ after it sees the count and wakes this worker
      // through mutex_; one that bumped before is seen by the check.
      absl::MutexLock lock(&mutex_);
      sleepers_.fetch_add(1);
      while (!stop_.load() && generation_.load() == seen) start_cv_.Wait(&mutex_);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load()) return;
    // Acquire: the loop's arguments, written before the bump, are visible.
    seen = generation_.load(std::memory_order_acquire);
    // Join, then check the loop is still open (both sequentially consistent,
    // as the caller's close-then-count): either the caller counts this
    // worker and waits for it, or the worker sees the loop closed and stays
    // out of it, touching nothing of a call that may have returned.
    active_workers_.fetch_add(1);
    if (generation_.load() == seen && !closed_.load()) RunTasks(thread);
    // The last one out wakes an owner that went to sleep waiting (it checks
    // active_workers_ under the lock after raising caller_waiting_).
    if (active_workers_.fetch_sub(1) == 1 && caller_waiting_.load()) {
      absl::MutexLock lock(&mutex_);
      done_cv_.Signal();
    }
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks, const std::function<void(int64_t, int)>& fn) {
  if (num_tasks <= 0) return;
  if (num_threads_ == 1 || num_tasks == 1) {
    for (int64_t i = 0; i < num_tasks; ++i) fn(i, 0);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  closed_.store(false);
  generation_.fetch_add(1);  // sequentially consistent: before sleepers_ is read
  if (sleepers_.load() != 0) {
    // A sleeper holds mutex_ from its count to its Wait: once we have had
    // the lock, it waits on start_cv_ (or saw the bump), and the signal
    // reaches it.
    { absl::MutexLock lock(&mutex_); }
    start_cv_.SignalAll();
  }
  RunTasks(0);
  // Every task is taken: close the loop, then wait for the workers that
  // joined it to finish theirs.
  closed_.store(true);
  const auto wait_start = std::chrono::steady_clock::now();
  for (int i = 0; i < kSpinPauses && active_workers_.load() != 0; ++i) _mm_pause();
  if (active_workers_.load() != 0) {
    absl::MutexLock lock(&mutex_);
    caller_waiting_.store(true);
    while (active_workers_.load() != 0) done_cv_.Wait(&mutex_);
    caller_waiting_.store(false);
  }
  ++stats_.parallel_fors;
  stats_.caller_wait_us +=
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - wait_start).count();
}

}  // namespace tandem
