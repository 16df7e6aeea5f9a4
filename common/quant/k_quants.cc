#include "common/quant/k_quants.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/quant/block_formats.h"
#include "common/quant/half.h"
#include "common/quant/scale_search.h"

namespace tandem {
namespace {

constexpr int kSubBlocks32 = kKBlockSize / 32;  // Q4_K/Q5_K sub-blocks
constexpr int kSubBlocks16 = kKBlockSize / 16;  // Q6_K sub-blocks
constexpr float kGroupMaxEps = 1e-15f;

void PackKScaleMin(int j, uint8_t scale, uint8_t min, uint8_t* scales) {
  if (j < 4) {
    scales[j] = scale;
    scales[j + 4] = min;
  } else {
    scales[j + 4] = static_cast<uint8_t>((scale & 0x0f) | ((min & 0x0f) << 4));
    scales[j - 4] |= static_cast<uint8_t>((scale >> 4) << 6);
    scales[j] |= static_cast<uint8_t>((min >> 4) << 6);
  }
}

// Shared by Q4_K and Q5_K: levels L[256] in [0, max_level], with the block's
// d, dmin and packed scales filled in.
struct AffineSuperBlock {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t levels[kKBlockSize];
};

AffineSuperBlock QuantizeAffineSuperBlock(const float* x, const AffineSearch& search) {
  AffineSuperBlock out{};
  float scales[kSubBlocks32];
  float mins[kSubBlocks32];
  float max_scale = 0;  // scales are positive: the min is subtracted
  float max_min = 0;
  float weights[32];
  for (int j = 0; j < kSubBlocks32; ++j) {
    const float* xs = x + 32 * j;
    // Weigh values by magnitude on top of the sub-block's rms, so that large
    // weights, which matter most to a matmul, are fitted best.
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    const AffineFit fit =
        FitAffineLevels(absl::MakeConstSpan(xs, 32), weights, search, absl::MakeSpan(out.levels + 32 * j, 32));
    scales[j] = fit.scale;
    mins[j] = fit.min;
    if (fit.scale > max_scale) max_scale = fit.scale;
    if (fit.min > max_min) max_min = fit.min;
  }

  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kSubBlocks32; ++j) {
    // ggml stores the rounded value in a uint8_t before clamping; keep that.
    const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
    PackKScaleMin(j, ls, lm, out.scales);
  }
  out.d = GgmlF32ToF16(max_scale / 63.f);
  out.dmin = GgmlF32ToF16(max_min / 63.f);

  // Re-quantize against the scales as stored, so rounding of the 6-bit scales
  // is compensated by the levels.
  for (int j = 0; j < kSubBlocks32; ++j) {
    uint8_t sc, m;
    UnpackKScaleMin(out.scales, j, &sc, &m);
    const float d = GgmlF16ToF32(out.d) * sc;
    if (!d) continue;
    const float dm = GgmlF16ToF32(out.dmin) * m;
    for (int ii = 0; ii < 32; ++ii) {
      const int l = NearestInt((x[32 * j + ii] + dm) / d);
      out.levels[32 * j + ii] = static_cast<uint8_t>(std::clamp(l, 0, search.max_level));
    }
  }
  return out;
}

}  // namespace

void UnpackKScaleMin(const uint8_t* scales, int j, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((scales[j + 4] & 0x0f) | ((scales[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

void QuantizeBlockQ4_K(const float* x, uint8_t* block) {
  const AffineSuperBlock s =
      QuantizeAffineSuperBlock(x, {.max_level = 15, .first_offset = -1.0f, .step_offset = 0.1f, .steps = 20});
  BlockQ4_K b;
  b.d = s.d;
  b.dmin = s.dmin;
  std::memcpy(b.scales, s.scales, sizeof(b.scales));
  for (int chunk = 0; chunk < kKBlockSize / 64; ++chunk) {
    const uint8_t* l = s.levels + 64 * chunk;
    for (int i = 0; i < 32; ++i) b.qs[32 * chunk + i] = static_cast<uint8_t>(l[i] | (l[i + 32] << 4));
  }
  std::memcpy(block, &b, sizeof(b));
}

void QuantizeBlockQ5_K(const float* x, uint8_t* block) {
  const AffineSuperBlock s =
      QuantizeAffineSuperBlock(x, {.max_level = 31, .first_offset = -0.5f, .step_offset = 0.1f, .steps = 15});
  BlockQ5_K b;
  b.d = s.d;
  b.dmin = s.dmin;
  std::memcpy(b.scales, s.scales, sizeof(b.scales));
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int chunk = 0; chunk < kKBlockSize / 64; ++chunk) {
    const uint8_t* l = s.levels + 64 * chunk;
    for (int i = 0; i < 32; ++i) {
      b.qs[32 * chunk + i] = static_cast<uint8_t>((l[i] & 0x0f) | ((l[i + 32] & 0x0f) << 4));
      b.qh[i] |= static_cast<uint8_t>(((l[i] >> 4) << (2 * chunk)) | ((l[i + 32] >> 4) << (2 * chunk + 1)));
    }
  }
  std::memcpy(block, &b, sizeof(b));
}

void QuantizeBlockQ6_K(const float* x, uint8_t* block) {
  constexpr int kMaxLevel = 32;
  BlockQ6_K b;
  int8_t levels[kKBlockSize];
  float scales[kSubBlocks16];
  float max_scale = 0;
  float max_abs_scale = 0;
  for (int j = 0; j < kSubBlocks16; ++j) {
    scales[j] = FitSymmetricLevels(absl::MakeConstSpan(x + 16 * j, 16), kMaxLevel, absl::MakeSpan(levels + 16 * j, 16));
    if (std::fabs(scales[j]) > max_abs_scale) {
      max_abs_scale = std::fabs(scales[j]);
      max_scale = scales[j];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {  // an all-zero block
    std::memset(block, 0, sizeof(BlockQ6_K));
    return;
  }

  // The largest scale maps to -128, so the int8 scales use their full range.
  const float iscale = -128.f / max_scale;
  b.d = GgmlF32ToF16(1 / iscale);
  for (int j = 0; j < kSubBlocks16; ++j) {
    b.scales[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[j])));
  }
  for (int j = 0; j < kSubBlocks16; ++j) {
    const float d = GgmlF16ToF32(b.d) * b.scales[j];
    if (!d) continue;
    for (int ii = 0; ii < 16; ++ii) {
      const int l = NearestInt(x[16 * j + ii] / d);
      levels[16 * j + ii] = static_cast<int8_t>(std::clamp(l, -32, 31) + kMaxLevel);
    }
  }

  for (int half = 0; half < kKBlockSize / 128; ++half) {
    const int8_t* l = levels + 128 * half;
    uint8_t* ql = b.ql + 64 * half;
    uint8_t* qh = b.qh + 32 * half;
    for (int i = 0; i < 32; ++i) {
      ql[i] = static_cast<uint8_t>((l[i] & 0x0f) | ((l[i + 64] & 0x0f) << 4));
      ql[i + 32] = static_cast<uint8_t>((l[i + 32] & 0x0f) | ((l[i + 96] & 0x0f) << 4));
      qh[i] = static_cast<uint8_t>((l[i] >> 4) | ((l[i + 32] >> 4) << 2) | ((l[i + 64] >> 4) << 4) |
                                   ((l[i + 96] >> 4) << 6));
    }
  }
  std::memcpy(block, &b, sizeof(b));
}

namespace {

// The scales and mins of a Q4_K/Q5_K block's 64-value chunk `chunk`: its
// two 32-value halves, y = d * q - m.
struct ChunkScales {
  float d1, m1, d2, m2;
};
ChunkScales ChunkScalesOf(const uint8_t* scales, int chunk, float d, float dmin) {
  uint8_t sc, m;
  ChunkScales out;
  UnpackKScaleMin(scales, 2 * chunk, &sc, &m);
  out.d1 = d * sc;
  out.m1 = dmin * m;
  UnpackKScaleMin(scales, 2 * chunk + 1, &sc, &m);
  out.d2 = d * sc;
  out.m2 = dmin * m;
  return out;
}

}  // namespace

void DequantizeBlockQ4_K(const uint8_t* block, float* y) {
  BlockQ4_K b;
  std::memcpy(&b, block, sizeof(b));
  for (int chunk = 0; chunk < kKBlockSize / 64; ++chunk) {
    const ChunkScales cs = ChunkScalesOf(b.scales, chunk, GgmlF16ToF32(b.d), GgmlF16ToF32(b.dmin));
    const float d1 = cs.d1, m1 = cs.m1, d2 = cs.d2, m2 = cs.m2;
    const uint8_t* q = b.qs + 32 * chunk;
    float* out = y + 64 * chunk;
    for (int l = 0; l < 32; ++l) out[l] = d1 * (q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) out[32 + l] = d2 * (q[l] >> 4) - m2;
  }
}

void DequantizeBlockQ5_K(const uint8_t* block, float* y) {
  BlockQ5_K b;
  std::memcpy(&b, block, sizeof(b));
  for (int chunk = 0; chunk < kKBlockSize / 64; ++chunk) {
    const ChunkScales cs = ChunkScalesOf(b.scales, chunk, GgmlF16ToF32(b.d), GgmlF16ToF32(b.dmin));
    const float d1 = cs.d1, m1 = cs.m1, d2 = cs.d2, m2 = cs.m2;
    const uint8_t* q = b.qs + 32 * chunk;
    const uint8_t low_bit = static_cast<uint8_t>(1u << (2 * chunk));
    const uint8_t high_bit = static_cast<uint8_t>(2u << (2 * chunk));
    float* out = y + 64 * chunk;
    for (int l = 0; l < 32; ++l) out[l] = d1 * ((q[l] & 0x0f) + (b.qh[l] & low_bit ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) out[32 + l] = d2 * ((q[l] >> 4) + (b.qh[l] & high_bit ? 16 : 0)) - m2;
  }
}

void DequantizeBlockQ6_K(const uint8_t* block, float* y) {
  BlockQ6_K b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  for (int half = 0; half < kKBlockSize / 128; ++half) {
    const uint8_t* ql = b.ql + 64 * half;
    const uint8_t* qh = b.qh + 32 * half;
    const int8_t* sc = b.scales + 8 * half;
    float* out = y + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      out[l] = d * sc[is + 0] * q1;
      out[l + 32] = d * sc[is + 2] * q2;
      out[l + 64] = d * sc[is + 4] * q3;
      out[l + 96] = d * sc[is + 6] * q4;
    }
  }
}

void DequantizeBlockQ3_K(const uint8_t* block, float* y) {
  BlockQ3_K b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  int8_t scales[kKBlockSize / 16];
  UnpackQ3KScales(b.scales, scales);
  for (int i = 0; i < kKBlockSize; ++i) {
    const int half = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
    const int low = (b.qs[32 * half + l] >> shift) & 3;
    const int q = low - ((b.hmask[l] >> (i / 32)) & 1 ? 0 : 4);
    const float dl = d * static_cast<float>(scales[i / 16]);
    y[i] = dl * static_cast<float>(q);
  }
}

void DequantizeBlockQ2_K(const uint8_t* block, float* y) {
  BlockQ2_K b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d), dmin = GgmlF16ToF32(b.dmin);
  for (int i = 0; i < kKBlockSize; ++i) {
    const int half = i / 128, shift = 2 * ((i % 128) / 32), l = i % 32;
    const int q = (b.qs[32 * half + l] >> shift) & 3;
    const uint8_t sc = b.scales[i / 16];
    const float dl = d * static_cast<float>(sc & 0x0f), ml = dmin * static_cast<float>(sc >> 4);
    y[i] = dl * static_cast<float>(q) - ml;
  }
}

}  // namespace tandem
