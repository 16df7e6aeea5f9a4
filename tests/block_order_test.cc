// K-quant blocks in the VNNI GEMV's group-major order (block_order.h): the
// conversion is its own inverse pair, every value lands where the header
// says, and what cannot be converted is refused with the reason.
#include "common/quant/block_order.h"

#include <algorithm>
#include <cstddef>
#include <random>
#include <vector>

#include "common/quant/block_formats.h"
#include "common/quant/quantize.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> RandomBytes(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(count);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

TEST(BlockOrderTest, GroupMajorAndBackIsTheIdentity) {
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const std::vector<uint8_t> ggml = RandomBytes(7 * static_cast<size_t>(GgmlBlockBytes(type)), 3);
    std::vector<uint8_t> blocks = ggml;
    ASSERT_OK(ToGroupMajorOrder(type, absl::MakeSpan(blocks)));
    EXPECT_NE(blocks, ggml) << GgmlTypeName(type);
    ASSERT_OK(ToGgmlOrder(type, absl::MakeSpan(blocks)));
    EXPECT_EQ(blocks, ggml) << GgmlTypeName(type);
  }
}

// Value v = 16 l + 4 s + j: ggml's level (from the reference dequantizer's
// layout, k_quants.h) is found at the group-major position of the header.
TEST(BlockOrderTest, EveryLevelLandsAtItsGroupMajorPosition) {
  // Q4_K: qs[32 c + i] low nibble = value 64 c + i, high = 64 c + 32 + i.
  std::vector<uint8_t> q4 = RandomBytes(sizeof(BlockQ4_K), 5);
  const std::vector<uint8_t> q4_ggml = q4;
  ASSERT_OK(ToGroupMajorOrder(GgmlType::kQ4_K, absl::MakeSpan(q4)));
  const size_t qs = offsetof(BlockQ4_K, qs);
  for (int v = 0; v < kKBlockSize; ++v) {
    const int want = (q4_ggml[qs + 32 * (v / 64) + v % 32] >> (v % 64 >= 32 ? 4 : 0)) & 15;
    const int l = v / 16, s = v % 16 / 4, j = v % 4;
    const int got = (q4[qs + 64 * (s / 2) + 4 * l + j] >> (4 * (s % 2))) & 15;
    ASSERT_EQ(got, want) << "Q4_K value " << v;
  }
  // Scale fields, d and dmin do not move.
  EXPECT_TRUE(std::equal(q4.begin(), q4.begin() + qs, q4_ggml.begin()));

  // Q6_K: value 128 h + 32 q + i has ql[64 h + i + 32 (q % 2)] nibble q / 2
  // and bits 2q, 2q + 1 of qh[32 h + i].
  std::vector<uint8_t> q6 = RandomBytes(sizeof(BlockQ6_K), 7);
  const std::vector<uint8_t> q6_ggml = q6;
  ASSERT_OK(ToGroupMajorOrder(GgmlType::kQ6_K, absl::MakeSpan(q6)));
  const size_t ql = offsetof(BlockQ6_K, ql), qh = offsetof(BlockQ6_K, qh);
  for (int v = 0; v < kKBlockSize; ++v) {
    const int h = v / 128, q = v % 128 / 32, i = v % 32;
    const int want = ((q6_ggml[ql + 64 * h + i + 32 * (q % 2)] >> (4 * (q / 2))) & 15) |
                     (((q6_ggml[qh + 32 * h + i] >> (2 * q)) & 3) << 4);
    const int l = v / 16, s = v % 16 / 4, j = v % 4;
    const int got =
        ((q6[ql + 64 * (s / 2) + 4 * l + j] >> (4 * (s % 2))) & 15) | (((q6[qh + 4 * l + j] >> (2 * s)) & 3) << 4);
    ASSERT_EQ(got, want) << "Q6_K value " << v;
  }
  EXPECT_TRUE(
      std::equal(q6.begin() + offsetof(BlockQ6_K, scales), q6.end(), q6_ggml.begin() + offsetof(BlockQ6_K, scales)));
}

// A converted block dequantizes (through GroupMajorBlockToGgml) to the
// values of the original.
TEST(BlockOrderTest, OneBlockBackToGgmlDequantizesAsTheOriginal) {
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    std::vector<float> x(kKBlockSize);
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (float& v : x) v = dist(rng);
    std::vector<uint8_t> block(static_cast<size_t>(GgmlBlockBytes(type)));
    ASSERT_OK(QuantizeRow(type, x, absl::MakeSpan(block)));
    std::vector<uint8_t> group_major = block, back(block.size());
    ASSERT_OK(ToGroupMajorOrder(type, absl::MakeSpan(group_major)));
    GroupMajorBlockToGgml(type, group_major.data(), back.data());
    std::vector<float> want(kKBlockSize), got(kKBlockSize);
    ASSERT_OK(DequantizeRow(type, block, absl::MakeSpan(want)));
    ASSERT_OK(DequantizeRow(type, back, absl::MakeSpan(got)));
    EXPECT_EQ(got, want) << GgmlTypeName(type);
  }
}

TEST(BlockOrderTest, RefusesOtherTypesAndPartialBlocks) {
  std::vector<uint8_t> bytes(sizeof(BlockQ6_K) * 2);
  const absl::Status q8 = ToGroupMajorOrder(GgmlType::kQ8_0, absl::MakeSpan(bytes));
  EXPECT_EQ(q8.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(q8.message(), HasSubstr("q8_0"));
  const absl::Status partial = ToGgmlOrder(GgmlType::kQ4_K, absl::MakeSpan(bytes.data(), 145));
  EXPECT_EQ(partial.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(partial.message(), HasSubstr("145 bytes are not whole"));
  EXPECT_FALSE(HasGroupMajorOrder(GgmlType::kQ5_K));
  EXPECT_TRUE(HasGroupMajorOrder(GgmlType::kQ6_K));
}

}  // namespace
}  // namespace tandem
