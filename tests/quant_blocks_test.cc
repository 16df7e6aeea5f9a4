// Bit layouts: hand-built blocks, packed here straight from the format
// descriptions (GGUF spec / ggml-common.h), must decode to the values the
// format defines; and quantizing such values gives back the same bits.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/quant/ggml_type.h"
#include "common/quant/quantize.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

// f16 bit patterns of a few exact values.
constexpr uint16_t kHalfOne = 0x3c00;       // 1.0
constexpr uint16_t kHalfHalf = 0x3800;      // 0.5
constexpr uint16_t kHalfQuarter = 0x3400;   // 0.25
constexpr uint16_t kHalfMinusTwo = 0xc000;  // -2.0

void PutU16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = static_cast<uint8_t>(v);
  b[at + 1] = static_cast<uint8_t>(v >> 8);
}

std::vector<float> Decode(GgmlType type, const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / GgmlBlockBytes(type) * GgmlBlockSize(type));
  const absl::Status s = DequantizeRow(type, bytes, absl::MakeSpan(out));
  EXPECT_OK(s);
  return out;
}

std::vector<uint8_t> Encode(GgmlType type, const std::vector<float>& values) {
  std::vector<uint8_t> out(*GgmlRowBytes(type, static_cast<int64_t>(values.size())));
  const absl::Status s = QuantizeRow(type, values, absl::MakeSpan(out));
  EXPECT_OK(s);
  return out;
}

// Q8_0: f16 d, then 32 int8.
TEST(BlockLayoutTest, Q8_0) {
  std::vector<uint8_t> b(34);
  PutU16(b, 0, kHalfHalf);
  for (int i = 0; i < 32; ++i) b[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(4 * i - 64));
  const std::vector<float> y = Decode(GgmlType::kQ8_0, b);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * (4 * i - 64)) << i;

  // Amax 127 * 0.5 makes d exactly 0.5, and every value is on the grid.
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = 0.5f * (i == 5 ? 127 : (i * 7) % 255 - 127);
  const std::vector<uint8_t> q = Encode(GgmlType::kQ8_0, x);
  EXPECT_EQ(Decode(GgmlType::kQ8_0, q), x);
  EXPECT_EQ(q[0] | (q[1] << 8), kHalfHalf);
}

// Q4_0: f16 d, then 16 bytes; value j < 16 is the low nibble of byte j, value
// j + 16 its high nibble; value = d * (nibble - 8).
TEST(BlockLayoutTest, Q4_0) {
  std::vector<uint8_t> b(18);
  PutU16(b, 0, kHalfHalf);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  const std::vector<float> y = Decode(GgmlType::kQ4_0, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * (j - 8)) << j;
    EXPECT_EQ(y[16 + j], 0.5f * (7 - j)) << j;
  }
  // Quantizing: the value of largest magnitude maps to level 0 (-8 d), here
  // -4 -> d = 0.5, so these values come back exactly, bits included.
  EXPECT_EQ(Encode(GgmlType::kQ4_0, y), b);
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles as Q4_0; value = d * nibble + m.
TEST(BlockLayoutTest, Q4_1) {
  std::vector<uint8_t> b(20);
  PutU16(b, 0, kHalfQuarter);
  PutU16(b, 2, kHalfMinusTwo);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(((j * 3) % 16) | (j << 4));
  const std::vector<float> y = Decode(GgmlType::kQ4_1, b);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * ((j * 3) % 16) - 2.0f) << j;
    EXPECT_EQ(y[16 + j], 0.25f * j - 2.0f) << j;
  }
  // min -2 and max 1.75 give d = 0.25 exactly: the same bits come back.
  EXPECT_EQ(Encode(GgmlType::kQ4_1, y), b);
}

// Q5_0: f16 d, 4 bytes qh (bit i = fifth bit of value i), 16 bytes of low
// nibbles as Q4_0; value = d * (q - 16).
TEST(BlockLayoutTest, Q5_0) {
  std::vector<int> q(32);
  for (int i = 0; i < 32; ++i) q[i] = (i * 13 + 5) % 32;
  q[3] = 0;  // the -16 end, so quantizing finds d = 0.5 again
  std::vector<uint8_t> b(22);
  PutU16(b, 0, kHalfHalf);
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>(q[i] >> 4) << i;
  for (int k = 0; k < 4; ++k) b[2 + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[6 + j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  const std::vector<float> y = Decode(GgmlType::kQ5_0, b);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * (q[i] - 16)) << i;
  EXPECT_EQ(Encode(GgmlType::kQ5_0, y), b);
}

// Q5_1: f16 d, f16 m, 4 bytes qh, 16 bytes of low nibbles; value = d * q + m.
TEST(BlockLayoutTest, Q5_1) {
  std::vector<int> q(32);
  for (int i = 0; i < 32; ++i) q[i] = (i * 11 + 7) % 32;
  q[4] = 0;
  q[9] = 31;  // both ends, so quantizing finds d and m again
  std::vector<uint8_t> b(24);
  PutU16(b, 0, kHalfHalf);
  PutU16(b, 2, kHalfMinusTwo);
  uint32_t qh = 0;
  for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>(q[i] >> 4) << i;
  for (int k = 0; k < 4; ++k) b[4 + k] = static_cast<uint8_t>(qh >> (8 * k));
  for (int j = 0; j < 16; ++j) b[8 + j] = static_cast<uint8_t>((q[j] & 15) | ((q[j + 16] & 15) << 4));
  const std::vector<float> y = Decode(GgmlType::kQ5_1, b);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 0.5f * q[i] - 2.0f) << i;
  EXPECT_EQ(Encode(GgmlType::kQ5_1, y), b);
}

// Q3_K (110 bytes: hmask[32], qs[64], scales[12], f16 d): value i = 128h +
// 32j + l has bits 2j, 2j+1 of qs[32h + l] and, as its third bit, bit 4h + j
// of hmask[l] (clear: minus 4); sub-block g's 6-bit scale s has its low
// nibble in scales[g % 8] (high nibble from g = 8) and its top two bits at
// 2 (g / 4) of scales[8 + g % 4]; value = d (s - 32) q.
TEST(BlockLayoutTest, Q3_K) {
  std::vector<uint8_t> b(110, 0);
  std::vector<int> q(256), sc(16);
  for (int g = 0; g < 16; ++g) sc[g] = (g * 23 + 3) % 64;
  for (int i = 0; i < 256; ++i) q[i] = (i * 5 + i / 7) % 8 - 4;
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, j = (i % 128) / 32, l = i % 32, u = q[i] + 4;
    b[32 + 32 * h + l] |= static_cast<uint8_t>((u & 3) << (2 * j));
    if (u & 4) b[l] |= static_cast<uint8_t>(1 << (4 * h + j));
  }
  for (int g = 0; g < 16; ++g) {
    b[96 + g % 8] |= static_cast<uint8_t>((sc[g] & 15) << (4 * (g / 8)));
    b[96 + 8 + g % 4] |= static_cast<uint8_t>((sc[g] >> 4) << (2 * (g / 4)));
  }
  PutU16(b, 108, kHalfQuarter);
  const std::vector<float> y = Decode(GgmlType::kQ3_K, b);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.25f * (sc[i / 16] - 32) * q[i]) << i;
}

// Q2_K (84 bytes: scales[16], qs[64], f16 d, f16 dmin): value i's two bits
// as Q3_K's low ones; scales[g] holds sub-block g's scale (low nibble) and
// min (high); value = d s q - dmin m.
TEST(BlockLayoutTest, Q2_K) {
  std::vector<uint8_t> b(84, 0);
  std::vector<int> q(256), sc(16), mn(16);
  for (int g = 0; g < 16; ++g) sc[g] = (g * 7 + 1) % 16, mn[g] = (g * 5 + 2) % 16;
  for (int i = 0; i < 256; ++i) q[i] = (i * 3 + i / 9) % 4;
  for (int g = 0; g < 16; ++g) b[g] = static_cast<uint8_t>(sc[g] | (mn[g] << 4));
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, j = (i % 128) / 32, l = i % 32;
    b[16 + 32 * h + l] |= static_cast<uint8_t>(q[i] << (2 * j));
  }
  PutU16(b, 80, kHalfHalf);
  PutU16(b, 82, kHalfQuarter);
  const std::vector<float> y = Decode(GgmlType::kQ2_K, b);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.5f * sc[i / 16] * q[i] - 0.25f * mn[i / 16]) << i;
}

// IQ4_NL (f16 d, 16 bytes of nibbles as Q4_0's) and IQ4_XS (f16 d, u16
// scales_h, scales_l[4], qs[128]: sub-block j's 6-bit scale s has its low
// nibble in nibble j % 2 of scales_l[j / 2] and its top two bits at 2j of
// scales_h): value = d (s - 32) kIq4NlValues[nibble].
TEST(BlockLayoutTest, IQ4_NLAndIQ4_XS) {
  constexpr int kTable[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  std::vector<uint8_t> nl(18, 0);
  PutU16(nl, 0, kHalfHalf);
  for (int j = 0; j < 16; ++j) nl[2 + j] = static_cast<uint8_t>((j * 3) % 16 | (((j * 7 + 1) % 16) << 4));
  std::vector<float> y = Decode(GgmlType::kIQ4_NL, nl);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * kTable[(j * 3) % 16]) << j;
    EXPECT_EQ(y[16 + j], 0.5f * kTable[(j * 7 + 1) % 16]) << j;
  }
  std::vector<uint8_t> xs(136, 0);
  PutU16(xs, 0, kHalfQuarter);
  int sc[8];
  uint16_t scales_h = 0;
  for (int j = 0; j < 8; ++j) {
    sc[j] = (j * 19 + 5) % 64;
    xs[4 + j / 2] |= static_cast<uint8_t>((sc[j] & 15) << (4 * (j % 2)));
    scales_h |= static_cast<uint16_t>((sc[j] >> 4) << (2 * j));
  }
  PutU16(xs, 2, scales_h);
  for (int i = 0; i < 128; ++i) xs[8 + i] = static_cast<uint8_t>((i * 5) % 16 | (((i * 9 + 4) % 16) << 4));
  y = Decode(GgmlType::kIQ4_XS, xs);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32, l = i % 32, byte = 16 * j + l % 16;
    const int nibble = l < 16 ? (byte * 5) % 16 : (byte * 9 + 4) % 16;
    EXPECT_EQ(y[i], 0.25f * (sc[j] - 32) * kTable[nibble]) << i;
  }
}

// Q4_K/Q5_K scale bytes, from the format description: for j < 4, byte j =
// scale[j] low 6 bits | top 2 bits of scale[j+4] in bits 6-7; byte j+4 =
// min[j] | top 2 bits of min[j+4]; byte j+8 = low nibble of scale[j+4] |
// low nibble of min[j+4] << 4.
void PackScales(const int* sc, const int* mn, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

constexpr int kScales[8] = {1, 2, 3, 63, 17, 33, 50, 62};
constexpr int kMins[8] = {0, 5, 63, 15, 20, 40, 60, 49};

// Q4_K: f16 d, f16 dmin, 12 scale bytes, 128 bytes: 64-value chunk c has
// its first 32 values in the low nibbles and next 32 in the high nibbles of
// bytes 32c..32c+31. value = d*scale[sub] * q - dmin*min[sub], sub = i / 32.
TEST(BlockLayoutTest, Q4_K) {
  std::vector<uint8_t> b(144);
  PutU16(b, 0, kHalfHalf);
  PutU16(b, 2, kHalfQuarter);
  PackScales(kScales, kMins, b.data() + 4);
  std::vector<int> q(256);
  for (int i = 0; i < 256; ++i) q[i] = (i * 7 + i / 32) % 16;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) b[16 + 32 * c + l] = static_cast<uint8_t>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
  }
  const std::vector<float> y = Decode(GgmlType::kQ4_K, b);
  for (int i = 0; i < 256; ++i) {
    const int sub = i / 32;
    EXPECT_EQ(y[i], 0.5f * kScales[sub] * q[i] - 0.25f * kMins[sub]) << i;
  }
}

// Q5_K: as Q4_K plus qh[32] between scales and qs: the fifth bit of value
// 64c + l is bit 2c of qh[l], of value 64c + 32 + l bit 2c + 1.
TEST(BlockLayoutTest, Q5_K) {
  std::vector<uint8_t> b(176);
  PutU16(b, 0, kHalfOne);
  PutU16(b, 2, kHalfHalf);
  PackScales(kScales, kMins, b.data() + 4);
  std::vector<int> q(256);
  for (int i = 0; i < 256; ++i) q[i] = (i * 11 + i / 64) % 32;
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      b[48 + 32 * c + l] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
      b[16 + l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
  const std::vector<float> y = Decode(GgmlType::kQ5_K, b);
  for (int i = 0; i < 256; ++i) {
    const int sub = i / 32;
    EXPECT_EQ(y[i], 1.0f * kScales[sub] * q[i] - 0.5f * kMins[sub]) << i;
  }
}

// Q6_K: ql[128], qh[64], int8 scales[16], f16 d. In 128-value half h, for
// l < 32 the values 128h + l + 32k (k = 0..3) have low nibbles in ql[64h+l]
// (k=0 low, k=2 high) and ql[64h+32+l] (k=1 low, k=3 high), and high bit
// pairs at bits 2k..2k+1 of qh[32h+l]. value = d * scales[i/16] * (q - 32).
TEST(BlockLayoutTest, Q6_K) {
  std::vector<uint8_t> b(210);
  std::vector<int> q(256);
  for (int i = 0; i < 256; ++i) q[i] = (i * 29 + 3) % 64;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* v = q.data() + 128 * h + l;
      b[64 * h + l] = static_cast<uint8_t>((v[0] & 15) | ((v[64] & 15) << 4));
      b[64 * h + 32 + l] = static_cast<uint8_t>((v[32] & 15) | ((v[96] & 15) << 4));
      b[128 + 32 * h + l] =
          static_cast<uint8_t>((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
    }
  }
  int8_t scales[16];
  for (int s = 0; s < 16; ++s) scales[s] = static_cast<int8_t>(s % 2 ? -8 * s : 127 - s);
  std::memcpy(b.data() + 192, scales, 16);
  PutU16(b, 208, kHalfQuarter);
  const std::vector<float> y = Decode(GgmlType::kQ6_K, b);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(y[i], 0.25f * scales[i / 16] * (q[i] - 32)) << i;
}

TEST(BlockLayoutTest, PlainFloatsAreLittleEndianValues) {
  const std::vector<float> x = {1.0f, -2.5f, 65504.0f, 0.333984375f};
  std::vector<uint8_t> f32 = Encode(GgmlType::kF32, x);
  EXPECT_EQ(Decode(GgmlType::kF32, f32), x);
  std::vector<uint8_t> f16 = Encode(GgmlType::kF16, x);
  EXPECT_EQ(f16[0], 0x00);
  EXPECT_EQ(f16[1], 0x3c);
  EXPECT_EQ(Decode(GgmlType::kF16, f16), x);
  std::vector<uint8_t> bf16 = Encode(GgmlType::kBF16, {1.0f, -2.5f});
  EXPECT_EQ(bf16, (std::vector<uint8_t>{0x80, 0x3f, 0x20, 0xc0}));
}

TEST(BlockLayoutTest, AllZeroBlocksStayZero) {
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    SCOPED_TRACE(GgmlTypeName(type));
    const std::vector<float> zeros(256, 0.0f);
    const std::vector<float> y = Decode(type, Encode(type, zeros));
    for (float v : y) ASSERT_EQ(v, 0.0f);
  }
}

}  // namespace
}  // namespace tandem
