// What the machine probe reports about memory and caches: present on any
// Linux machine the tests run on, and within what the machine physically has.
#include "common/platform/hardware_probe.h"

#include <unistd.h>

#include <cstdint>

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

TEST(HardwareProbeTest, LastLevelCacheIsAtMostPhysicalMemory) {
  const int64_t llc = LastLevelCacheBytes();
  EXPECT_GE(llc, 0);
  EXPECT_LT(llc, PhysicalMemoryBytes());
}

}  // namespace
}  // namespace tandem
