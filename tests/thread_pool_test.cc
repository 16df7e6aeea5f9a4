// ThreadPool: every task runs exactly once, loop after loop (the caller does
// not wait for workers that never joined a loop, so a worker that wakes late
// must neither run a finished loop's tasks nor miss the next loop's), and
// the owner's wait statistics.
#include "common/base/thread_pool.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(ThreadPoolTest, EveryTaskRunsOnceInEveryLoop) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "pool-test"});
    std::vector<std::atomic<int>> counts(64);
    for (int loop = 0; loop < 3000; ++loop) {
      const int64_t tasks = 1 + loop % 64;
      for (auto& c : counts) c.store(0);
      pool.ParallelFor(tasks, [&](int64_t task, int thread) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, threads);
        counts[static_cast<size_t>(task)].fetch_add(1);
      });
      for (int64_t t = 0; t < 64; ++t) ASSERT_EQ(counts[static_cast<size_t>(t)].load(), t < tasks ? 1 : 0) << loop;
    }
  }
}

TEST(ThreadPoolTest, LoopsSeparatedBySleepsStillRunEverything) {
  // Gaps longer than the workers' spin: they sleep, and may wake after the
  // caller has taken every task.
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "pool-test"});
  for (int loop = 0; loop < 50; ++loop) {
    std::atomic<int> sum{0};
    pool.ParallelFor(8, [&](int64_t task, int) { sum.fetch_add(static_cast<int>(task)); });
    EXPECT_EQ(sum.load(), 28);
    std::this_thread::sleep_for(std::chrono::microseconds(200 + 50 * (loop % 7)));
  }
}

TEST(ThreadPoolTest, CountsLoopsAndWaits) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "pool-test"});
  pool.ParallelFor(1, [](int64_t, int) {});  // one task: runs on the caller, not counted
  EXPECT_EQ(pool.stats().parallel_fors, 0);
  pool.ParallelFor(16, [](int64_t, int) {});
  EXPECT_EQ(pool.stats().parallel_fors, 1);
  EXPECT_GE(pool.stats().caller_wait_us, 0);
  pool.ResetStats();
  EXPECT_EQ(pool.stats().parallel_fors, 0);
}

}  // namespace
}  // namespace tandem
