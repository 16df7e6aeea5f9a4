// What the machine probe reports about memory and caches: present on any
// Linux machine the tests run on, and within what the machine physically has.
#include "common/platform/hardware_probe.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/base/thread_pool.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

int64_t PhysicalMemoryBytes() { return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE); }

TEST(HardwareProbeTest, AvailableMemoryIsKnownAndAtMostPhysicalMemory) {
  const int64_t available = AvailableMemoryBytes();
  ASSERT_GT(available, 0) << "neither /proc/meminfo's MemAvailable nor sysconf's free pages were read";
  EXPECT_LE(available, PhysicalMemoryBytes());
  // Whole KiB from MemAvailable, whole pages from sysconf.
  EXPECT_EQ(available % 1024, 0);
}

// The read-only figure is the faster of its two patterns, each a real
// measurement (small arrays: this checks the bookkeeping, not the machine).
TEST(HardwareProbeTest, ReadBandwidthIsTheFasterOfOneAndFourStreamsPerThread) {
  ThreadPool pool({.num_threads = 2, .name = "probe_test"});
  const absl::StatusOr<MemoryBandwidth> bw = MeasureMemoryBandwidth(&pool, {.array_bytes = 8 << 20, .reps = 2});
  ASSERT_TRUE(bw.ok()) << bw.status();
  EXPECT_GT(bw->read_one_stream_gb_s, 0.0);
  EXPECT_GT(bw->read_four_streams_gb_s, 0.0);
  EXPECT_EQ(bw->read_gb_s, std::max(bw->read_one_stream_gb_s, bw->read_four_streams_gb_s));
  EXPECT_GT(bw->triad_gb_s, 0.0);
  EXPECT_EQ(bw->threads, 2);
}

// Arrays too small to hold one vector are refused, naming the size.
TEST(HardwareProbeTest, ReadBandwidthRefusesArraysSmallerThanAVector) {
  const absl::StatusOr<MemoryBandwidth> bw = MeasureMemoryBandwidth(nullptr, {.array_bytes = 16});
  ASSERT_FALSE(bw.ok());
  EXPECT_EQ(bw.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bw.status().message().find("16 bytes"), std::string::npos) << bw.status();
}

TEST(HardwareProbeTest, LastLevelCacheIsAtMostPhysicalMemory) {
  const int64_t llc = LastLevelCacheBytes();
  EXPECT_GE(llc, 0);
  EXPECT_LT(llc, PhysicalMemoryBytes());
}

}  // namespace
}  // namespace tandem
