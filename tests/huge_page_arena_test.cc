// HugePageArena: where its bytes come from and that they are usable.
#include "common/platform/huge_page_arena.h"

#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr uintptr_t kHuge = HugePageArena::kHugePageBytes;

TEST(HugePageArena, SmallAllocationsShareAChunkOnHugePageBoundaries) {
  HugePageArena arena;
  uint8_t* a = arena.Allocate(100);
  uint8_t* b = arena.Allocate(1000);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % kHuge, 0u);  // a fresh chunk starts on a 2 MiB boundary
  EXPECT_EQ(b, a + 128);                                  // 100 bytes rounded up to 64-byte alignment
  EXPECT_EQ(arena.allocated_bytes(), 128u + 1024u);
  EXPECT_EQ(arena.mapped_bytes(), HugePageArena::kMinChunkBytes);
  std::memset(a, 1, 100);  // writable
  std::memset(b, 2, 1000);
  EXPECT_EQ(a[99], 1);
  EXPECT_EQ(b[999], 2);
}

TEST(HugePageArena, BigAllocationsGetChunksOfTheirOwnAndSmallOnesGoOn) {
  HugePageArena arena;
  uint8_t* small = arena.Allocate(64);
  const size_t big_bytes = HugePageArena::kMinChunkBytes + 1;
  uint8_t* big = arena.Allocate(big_bytes);
  uint8_t* next = arena.Allocate(64);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big) % kHuge, 0u);
  EXPECT_EQ(next, small + 64);  // the small chunk is still the current one
  EXPECT_EQ(arena.mapped_bytes(), HugePageArena::kMinChunkBytes + HugePageArena::kMinChunkBytes + kHuge);
  big[big_bytes - 1] = 7;
  EXPECT_EQ(big[big_bytes - 1], 7);
}

TEST(HugePageArena, FullChunkStartsAnother) {
  HugePageArena arena;
  const size_t almost = HugePageArena::kMinChunkBytes - 64;
  uint8_t* first = arena.Allocate(almost);
  uint8_t* second = arena.Allocate(128);  // does not fit in the 64 bytes left
  ASSERT_NE(second, nullptr);
  EXPECT_NE(second, first + almost);
  EXPECT_EQ(arena.mapped_bytes(), 2 * HugePageArena::kMinChunkBytes);
}

}  // namespace
}  // namespace tandem
