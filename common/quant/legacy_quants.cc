#include "common/quant/legacy_quants.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "common/quant/block_formats.h"
#include "common/quant/half.h"

namespace tandem {
namespace {

// C's (int8_t) conversion of a float, defined for every input: in range it
// truncates toward zero exactly as the cast does; out of range (only possible
// for non-finite blocks, which QuantizeRow refuses) it saturates, NaN to 0.
int TruncToInt8(float v) {
  if (!(v > -129.0f)) return v != v ? 0 : -128;
  if (!(v < 128.0f)) return 127;
  return static_cast<int>(v);
}

// The value of largest magnitude, keeping its sign; the first one on ties.
float SignedAbsMax(const float* x, int n) {
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

// The smallest and largest value, as ggml's affine quantizers scan them.
std::pair<float, float> MinMax(const float* x, int n) {
  float min = FLT_MAX;
  float max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  return {min, max};
}

}  // namespace

void QuantizeBlockQ8_0(const float* x, uint8_t* block) {
  BlockQ8_0 b;
  float amax = 0.0f;
  for (int j = 0; j < kQ8_0BlockSize; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d ? 1.0f / d : 0.0f;
  b.d = GgmlF32ToF16(d);
  for (int j = 0; j < kQ8_0BlockSize; ++j) {
    const float r = std::round(x[j] * id);
    b.qs[j] = static_cast<int8_t>(std::clamp(r == r ? r : 0.0f, -128.0f, 127.0f));
  }
  std::memcpy(block, &b, sizeof(b));
}

void QuantizeBlockQ4_0(const float* x, uint8_t* block) {
  BlockQ4_0 b;
  const float max = SignedAbsMax(x, kQ4_0BlockSize);
  const float d = max / -8;
  const float id = d ? 1.0f / d : 0.0f;
  b.d = GgmlF32ToF16(d);
  constexpr int kHalf = kQ4_0BlockSize / 2;
  for (int j = 0; j < kHalf; ++j) {
    const int lo = std::min(15, TruncToInt8(x[j] * id + 8.5f));
    const int hi = std::min(15, TruncToInt8(x[kHalf + j] * id + 8.5f));
    b.qs[j] = static_cast<uint8_t>((lo & 0x0f) | (hi << 4));
  }
  std::memcpy(block, &b, sizeof(b));
}

void QuantizeBlockQ4_1(const float* x, uint8_t* block) {
  BlockQ4_1 b;
  const auto [min, max] = MinMax(x, kQ4_1BlockSize);
  const float d = (max - min) / 15;
  const float id = d ? 1.0f / d : 0.0f;
  b.d = GgmlF32ToF16(d);
  b.m = GgmlF32ToF16(min);
  constexpr int kHalf = kQ4_1BlockSize / 2;
  for (int j = 0; j < kHalf; ++j) {
    const int lo = std::min(15, TruncToInt8((x[j] - min) * id + 0.5f));
    const int hi = std::min(15, TruncToInt8((x[kHalf + j] - min) * id + 0.5f));
    b.qs[j] = static_cast<uint8_t>((lo & 0x0f) | (hi << 4));
  }
  std::memcpy(block, &b, sizeof(b));
}

void QuantizeBlockQ5_0(const float* x, uint8_t* block) {
  BlockQ5_0 b;
  const float max = SignedAbsMax(x, kQ5_0BlockSize);
  const float d = max / -16;
  const float id = d ? 1.0f / d : 0.0f;
  b.d = GgmlF32ToF16(d);
  constexpr int kHalf = kQ5_0BlockSize / 2;
  uint32_t qh = 0;
  for (int j = 0; j < kHalf; ++j) {
    const int lo = std::min(31, TruncToInt8(x[j] * id + 16.5f));
    const int hi = std::min(31, TruncToInt8(x[kHalf + j] * id + 16.5f));
    b.qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + kHalf);
  }
  for (int k = 0; k < 4; ++k) b.qh[k] = static_cast<uint8_t>(qh >> (8 * k));
  std::memcpy(block, &b, sizeof(b));
}

void QuantizeBlockQ5_1(const float* x, uint8_t* block) {
  BlockQ5_1 b;
  const auto [min, max] = MinMax(x, kQ5_1BlockSize);
  const float d = (max - min) / 31;
  const float id = d ? 1.0f / d : 0.0f;
  b.d = GgmlF32ToF16(d);
  b.m = GgmlF32ToF16(min);
  constexpr int kHalf = kQ5_1BlockSize / 2;
  uint32_t qh = 0;
  for (int j = 0; j < kHalf; ++j) {
    // ggml converts to uint8_t without a clamp: (x - min) / d + 0.5 is in
    // [0.5, 31.5] for finite blocks.
    const int lo = std::clamp(TruncToInt8((x[j] - min) * id + 0.5f), 0, 31);
    const int hi = std::clamp(TruncToInt8((x[kHalf + j] - min) * id + 0.5f), 0, 31);
    b.qs[j] = static_cast<uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<uint32_t>((lo >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((hi >> 4) & 1) << (j + kHalf);
  }
  for (int k = 0; k < 4; ++k) b.qh[k] = static_cast<uint8_t>(qh >> (8 * k));
  std::memcpy(block, &b, sizeof(b));
}

void DequantizeBlockQ8_0(const uint8_t* block, float* y) {
  BlockQ8_0 b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  for (int j = 0; j < kQ8_0BlockSize; ++j) y[j] = b.qs[j] * d;
}

void DequantizeBlockQ4_0(const uint8_t* block, float* y) {
  BlockQ4_0 b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  constexpr int kHalf = kQ4_0BlockSize / 2;
  for (int j = 0; j < kHalf; ++j) {
    y[j] = ((b.qs[j] & 0x0f) - 8) * d;
    y[kHalf + j] = ((b.qs[j] >> 4) - 8) * d;
  }
}

void DequantizeBlockQ4_1(const uint8_t* block, float* y) {
  BlockQ4_1 b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  const float m = GgmlF16ToF32(b.m);
  constexpr int kHalf = kQ4_1BlockSize / 2;
  for (int j = 0; j < kHalf; ++j) {
    y[j] = (b.qs[j] & 0x0f) * d + m;
    y[kHalf + j] = (b.qs[j] >> 4) * d + m;
  }
}

void DequantizeBlockQ5_0(const uint8_t* block, float* y) {
  BlockQ5_0 b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  const uint32_t qh = b.qh[0] | (b.qh[1] << 8) | (b.qh[2] << 16) | (static_cast<uint32_t>(b.qh[3]) << 24);
  constexpr int kHalf = kQ5_0BlockSize / 2;
  for (int j = 0; j < kHalf; ++j) {
    const int lo = (b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
    const int hi = (b.qs[j] >> 4) | (((qh >> (j + kHalf)) & 1) << 4);
    y[j] = (lo - 16) * d;
    y[kHalf + j] = (hi - 16) * d;
  }
}

void DequantizeBlockQ5_1(const uint8_t* block, float* y) {
  BlockQ5_1 b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  const float m = GgmlF16ToF32(b.m);
  const uint32_t qh = b.qh[0] | (b.qh[1] << 8) | (b.qh[2] << 16) | (static_cast<uint32_t>(b.qh[3]) << 24);
  constexpr int kHalf = kQ5_1BlockSize / 2;
  for (int j = 0; j < kHalf; ++j) {
    const int lo = (b.qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
    const int hi = (b.qs[j] >> 4) | (((qh >> (j + kHalf)) & 1) << 4);
    y[j] = lo * d + m;
    y[kHalf + j] = hi * d + m;
  }
}

}  // namespace tandem
