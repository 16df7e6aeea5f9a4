// ggml type ids, names and block geometry; row and tensor byte sizes; the
// f16/bf16 conversions the block formats rely on.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/quant/ggml_type.h"
#include "common/quant/half.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

struct Expected {
  uint32_t id;
  const char* name;
  int64_t block_size;
  int64_t block_bytes;
};

// From the GGUF spec's type table and ggml-common.h's block structs.
constexpr Expected kExpected[] = {
    {0, "f32", 1, 4},         {1, "f16", 1, 2},         {2, "q4_0", 32, 18},      {3, "q4_1", 32, 20},
    {6, "q5_0", 32, 22},      {7, "q5_1", 32, 24},      {8, "q8_0", 32, 34},      {9, "q8_1", 32, 36},
    {10, "q2_K", 256, 84},    {11, "q3_K", 256, 110},   {12, "q4_K", 256, 144},   {13, "q5_K", 256, 176},
    {14, "q6_K", 256, 210},   {15, "q8_K", 256, 292},   {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
    {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50},   {20, "iq4_nl", 32, 18},   {21, "iq3_s", 256, 110},
    {22, "iq2_s", 256, 82},   {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1},         {25, "i16", 1, 2},
    {26, "i32", 1, 4},        {27, "i64", 1, 8},        {28, "f64", 1, 8},        {29, "iq1_m", 256, 56},
    {30, "bf16", 1, 2},       {34, "tq1_0", 256, 54},   {35, "tq2_0", 256, 66},   {39, "mxfp4", 32, 17},
    {40, "nvfp4", 64, 36},    {41, "q1_0", 128, 18},    {42, "q2_0", 64, 18},
};

TEST(GgmlTypeTest, IdsNamesAndBlockGeometryMatchGgml) {
  ASSERT_EQ(AllGgmlTypes().size(), std::size(kExpected));
  for (const Expected& e : kExpected) {
    SCOPED_TRACE(e.name);
    absl::StatusOr<GgmlType> type = GgmlTypeFromId(e.id);
    ASSERT_OK(type);
    EXPECT_EQ(static_cast<uint32_t>(*type), e.id);
    EXPECT_EQ(GgmlTypeName(*type), e.name);
    EXPECT_EQ(GgmlBlockSize(*type), e.block_size);
    EXPECT_EQ(GgmlBlockBytes(*type), e.block_bytes);
    absl::StatusOr<GgmlType> by_name = GgmlTypeFromName(e.name);
    ASSERT_OK(by_name);
    EXPECT_EQ(*by_name, *type);
  }
  EXPECT_EQ(GgmlTypeName(GgmlType::kQ4_K), "q4_K");
  EXPECT_EQ(*GgmlTypeFromName("Q4_K"), GgmlType::kQ4_K);
  EXPECT_EQ(*GgmlTypeFromName("BF16"), GgmlType::kBF16);
}

TEST(GgmlTypeTest, RetiredAndUnknownIdsAreRefused) {
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 43u, 1000u, 0xffffffffu}) {
    absl::StatusOr<GgmlType> type = GgmlTypeFromId(id);
    ASSERT_FALSE(type.ok()) << id;
    EXPECT_EQ(type.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(type.status().message(), HasSubstr(absl::StrCat("unknown ggml tensor type id ", id)));
  }
  EXPECT_THAT(GgmlTypeFromName("q4_k_m").status().message(), HasSubstr("unknown ggml tensor type \"q4_k_m\""));
}

TEST(GgmlTypeTest, RowBytesAreWholeBlocks) {
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kF32, 4096), 16384u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kBF16, 4096), 8192u);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ8_0, 4096), 4096u / 32 * 34);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_0, 4096), 4096u / 32 * 18);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_K, 14336), 14336u / 256 * 144);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ6_K, 4096), 4096u / 256 * 210);
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ5_K, 0), 0u);
}

TEST(GgmlTypeTest, RowLengthNotAMultipleOfTheBlockIsRefused) {
  absl::StatusOr<uint64_t> bytes = GgmlRowBytes(GgmlType::kQ4_K, 4000);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bytes.status().message(), HasSubstr("row length 4000 is not a multiple of q4_K's block of 256"));
  EXPECT_FALSE(GgmlRowBytes(GgmlType::kQ8_0, 33).ok());
  EXPECT_THAT(GgmlRowBytes(GgmlType::kF16, -1).status().message(), HasSubstr("negative row length -1"));
}

TEST(GgmlTypeTest, TensorBytesMultiplyRowsAndCatchOverflow) {
  const int64_t dims[] = {4096, 14336, 8};
  EXPECT_EQ(*GgmlTensorBytes(GgmlType::kQ4_K, dims), uint64_t{4096} / 256 * 144 * 14336 * 8);
  EXPECT_EQ(*GgmlTensorBytes(GgmlType::kF32, {}), 4u);  // a scalar
  const int64_t empty[] = {32, 0, 7};
  EXPECT_EQ(*GgmlTensorBytes(GgmlType::kQ8_0, empty), 0u);

  const int64_t huge[] = {int64_t{1} << 32, int64_t{1} << 32};
  absl::StatusOr<uint64_t> bytes = GgmlTensorBytes(GgmlType::kF32, huge);
  ASSERT_FALSE(bytes.ok());
  EXPECT_THAT(bytes.status().message(), HasSubstr("overflows"));

  // Product of elements past 2^63 while the byte count (ratio 18/32) is not.
  const int64_t elements_overflow[] = {int64_t{1} << 40, int64_t{1} << 23};
  EXPECT_FALSE(GgmlTensorBytes(GgmlType::kQ4_0, elements_overflow).ok());

  const int64_t negative[] = {32, -2};
  EXPECT_THAT(GgmlTensorBytes(GgmlType::kQ8_0, negative).status().message(), HasSubstr("negative dimension"));
  const int64_t ragged[] = {100, 2};
  EXPECT_THAT(GgmlTensorBytes(GgmlType::kQ8_0, ragged).status().message(),
              HasSubstr("shape [100, 2]: row length 100 is not a multiple of q8_0's block of 32"));
}

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

// The portable conversions against the CPU's F16C instructions.
TEST(HalfTest, EveryF16DecodesAsTheHardwareDoes) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float want = _cvtsh_ss(static_cast<uint16_t>(h));
    const float got = GgmlF16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(Bits(got), Bits(want)) << "half 0x" << std::hex << h;
    }
  }
}

TEST(HalfTest, F32ToF16RoundsToNearestEvenAsTheHardwareDoes) {
  auto check = [](float f) {
    const uint16_t want = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    ASSERT_EQ(GgmlF32ToF16(f), want) << "float bits 0x" << std::hex << Bits(f);
  };
  // Every half value, and the exact midpoints between neighbours (ties) and
  // one ulp either side of them.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const float lo = GgmlF16ToF32(static_cast<uint16_t>(h));
    const float hi = GgmlF16ToF32(static_cast<uint16_t>(h + 1));
    const float mid = lo + (hi - lo) / 2;
    for (float sign : {1.0f, -1.0f}) {
      check(sign * lo);
      check(sign * mid);
      check(sign * std::nextafter(mid, 0.0f));
      check(sign * std::nextafter(mid, 1e9f));
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const float f = FromBits(static_cast<uint32_t>(rng()));
    if (!std::isnan(f)) check(f);
  }
  for (float f : {65504.0f, 65519.0f, 65520.0f, 1e9f, std::numeric_limits<float>::infinity(), 0x1.0p-25f, 0x1.0p-24f,
                  0x1.8p-25f, 0x1.0p-26f, 0x1.ffcp-15f, 0.0f, -0.0f}) {
    check(f);
  }
  EXPECT_EQ(GgmlF32ToF16(std::nanf("")) & 0x7e00, 0x7e00);
}

TEST(HalfTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(GgmlF32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(GgmlF32ToBf16(FromBits(0x3f808000)), 0x3f80);  // tie to even (down)
  EXPECT_EQ(GgmlF32ToBf16(FromBits(0x3f818000)), 0x3f82);  // tie to even (up)
  EXPECT_EQ(GgmlF32ToBf16(FromBits(0x3f808001)), 0x3f81);
  EXPECT_TRUE(std::isnan(GgmlBf16ToF32(GgmlF32ToBf16(std::nanf("")))));
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = GgmlBf16ToF32(static_cast<uint16_t>(b));
    if (!std::isnan(f)) {
      ASSERT_EQ(GgmlF32ToBf16(f), b);
    }
  }
}

}  // namespace
}  // namespace tandem
