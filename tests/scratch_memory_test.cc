// ScratchMemory / ScratchArray: growth, alignment, huge-page placement and
// a clear error when memory cannot be had.
#include "common/base/scratch_memory.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "common/base/huge_pages.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(ScratchMemory, StartsEmptyAndSmallReservationsAreCacheLineAligned) {
  ScratchMemory memory;
  EXPECT_EQ(memory.data(), nullptr);
  EXPECT_EQ(memory.capacity(), 0u);
  void* p = memory.Reserve(100);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Address(p) % 64, 0u);
  EXPECT_GE(memory.capacity(), 100u);
  std::memset(p, 7, 100);  // writable
}

TEST(ScratchMemory, ReservingWhatItHasKeepsTheMemoryAndItsContents) {
  ScratchMemory memory;
  auto* p = static_cast<uint8_t*>(memory.Reserve(4096));
  ASSERT_NE(p, nullptr);
  p[4095] = 42;
  EXPECT_EQ(memory.Reserve(10), p);
  EXPECT_EQ(memory.Reserve(4096), p);
  EXPECT_EQ(p[4095], 42);
}

TEST(ScratchMemory, GrowsByAtLeastHalfSoARisingSizeGrowsRarely) {
  ScratchMemory memory;
  ASSERT_NE(memory.Reserve(10000), nullptr);
  const size_t first = memory.capacity();
  ASSERT_NE(memory.Reserve(first + 1), nullptr);
  EXPECT_GE(memory.capacity(), first + first / 2);
}

TEST(ScratchMemory, LargeReservationsSitOnHugePageBoundaries) {
  ScratchMemory memory;
  void* p = memory.Reserve(3 << 20);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Address(p) % kHugePageBytes, 0u);
  EXPECT_EQ(memory.capacity() % kHugePageBytes, 0u);
  EXPECT_GE(memory.capacity(), size_t{3} << 20);
  static_cast<uint8_t*>(p)[(3 << 20) - 1] = 1;  // the whole range is mapped and writable
}

TEST(ScratchMemory, MovingHandsTheMemoryOver) {
  ScratchMemory a;
  void* p = a.Reserve(2 << 20);
  ASSERT_NE(p, nullptr);
  ScratchMemory b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(a.capacity(), 0u);
  ScratchMemory c;
  ASSERT_NE(c.Reserve(64), nullptr);
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(b.data(), nullptr);  // NOLINT(bugprone-use-after-move)
}

TEST(ScratchArray, GrowsToTheCountAskedForAndIndexesElements) {
  ScratchArray<float> a;
  ASSERT_TRUE(a.Grow(1000, "test floats").ok());
  EXPECT_GE(a.capacity(), 1000);
  for (int64_t i = 0; i < 1000; ++i) a[i] = static_cast<float>(i);
  EXPECT_EQ(a[999], 999.0f);
  EXPECT_EQ(a.data() + 999, &a[999]);
  const float* before = a.data();
  ASSERT_TRUE(a.Grow(10, "test floats").ok());  // smaller: nothing changes
  EXPECT_EQ(a.data(), before);
  EXPECT_EQ(a[500], 500.0f);
}

TEST(ScratchArray, ImpossibleGrowthIsAClearErrorAndKeepsTheOldMemory) {
  ScratchArray<double> a;
  ASSERT_TRUE(a.Grow(16, "test doubles").ok());
  a[3] = 1.5;
  const double* before = a.data();
  // 2^60 doubles (8 EiB) is past any address space: mmap fails.
  const absl::Status too_big = a.Grow(int64_t{1} << 60, "the test's huge array");
  EXPECT_EQ(too_big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(too_big.message()), testing::HasSubstr("the test's huge array"));
  EXPECT_EQ(a.data(), before);
  EXPECT_EQ(a[3], 1.5);
  // Counts whose byte size would overflow are refused before any arithmetic wraps.
  EXPECT_EQ(a.Grow(INT64_MAX, "an overflowing array").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Grow(-1, "a negative array").code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
