// The int8_dot path (linear_int8_dot.h): x quantization, the block decoders
// into the tile layout of linear_isa.h, the AVX2 tile and the slice loop
// both ISAs share. Baseline code (AVX2 + FMA + F16C).
#include "common/kernels/linear_int8_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/kernels/linear_amx_gemm.h"
#include "common/kernels/linear_isa.h"
#include "common/quant/block_formats.h"
#include "common/quant/k_quants.h"
#include "common/quant/nonlinear_quants.h"

namespace tandem {
namespace {

constexpr int64_t kF = isa::kInt8TileFeatures;
constexpr int64_t kXBlock = 16;  // x rows per pass over a decoded W tile (their prepared rows stay in L2)

int64_t RoundUp64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// One row (x or W) in the tile layout: levels [k], scales [k/16], offsets [k/16].
struct RowLayout {
  int64_t scales_at, offsets_at, stride;
  explicit RowLayout(int64_t k)
      : scales_at(RoundUp64(k)),
        offsets_at(RoundUp64(k) + RoundUp64(k / 4)),
        stride(RoundUp64(k) + 2 * RoundUp64(k / 4)) {}
};

struct DecodedRow {
  uint8_t* levels;
  float* scales;
  float* offsets;
};

inline void SetGroup(const DecodedRow& out, int64_t group, float scale, float offset) {
  out.scales[group] = scale;
  out.offsets[group] = offset;
}

// F16C: exact, as GgmlF16ToF32, without the call.
inline float Half(uint16_t h) { return _cvtsh_ss(h); }

// The decoders read each field in place (offsetof into the block): copying
// a block into a local struct first makes the wide loads that follow miss
// store forwarding, which cost more than the rest of the decode.
inline float HalfAt(const uint8_t* block, size_t offset) {
  uint16_t h;
  std::memcpy(&h, block + offset, sizeof(h));
  return Half(h);
}
// Decode is DRAM-bound at one row: a software prefetch this far ahead keeps
// more lines in flight than the hardware prefetcher alone (as the bf16
// stream kernel's, linear_avx512.cc).
constexpr int64_t kPrefetchBytes = 1024;
inline void PrefetchAhead(const uint8_t* block, size_t bytes) {
  for (size_t at = 0; at < bytes; at += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block) + kPrefetchBytes + at, _MM_HINT_T0);
}
inline __m256i Load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// ---- Decoders: one W row of `k` values (whole blocks) into the layout ----
// `to_unsigned`: levels must be >= 0 (vpdpbusd); a signed type adds 128 to
// its levels and subtracts 128 * scale in the offsets. Levels of every other
// type are already in [0, 64) and serve both kernels.

void DecodeQ8_0(const uint8_t* row, int64_t k, bool to_unsigned, const DecodedRow& out) {
  const uint8_t flip = to_unsigned ? 0x80 : 0;
  for (int64_t b = 0; b < k / kQ8_0BlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ8_0);
    PrefetchAhead(block, sizeof(BlockQ8_0));
    const float d = HalfAt(block, offsetof(BlockQ8_0, d));
    const __m256i q = Load32(block + offsetof(BlockQ8_0, qs));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.levels + 32 * b),
                        _mm256_xor_si256(q, _mm256_set1_epi8(static_cast<char>(flip))));
    const float offset = to_unsigned ? -128.0f * d : 0.0f;
    SetGroup(out, 2 * b, d, offset);
    SetGroup(out, 2 * b + 1, d, offset);
  }
}

// 16 bytes of nibbles: low nibbles are values 0..15, high 16..31.
inline void SplitNibbles(const uint8_t* qs, uint8_t* levels) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(levels), _mm_and_si128(q, mask));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(levels + 16), _mm_and_si128(_mm_srli_epi16(q, 4), mask));
}

// Bit i of a 32-bit field as 16 (0x10) in byte i.
inline __m256i BitsAsSixteen(uint32_t bits) {
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

void DecodeQ4_0(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kQ4_0BlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ4_0);
    PrefetchAhead(block, sizeof(BlockQ4_0));
    const float d = HalfAt(block, offsetof(BlockQ4_0, d));
    SplitNibbles(block + offsetof(BlockQ4_0, qs), out.levels + 32 * b);
    SetGroup(out, 2 * b, d, -8.0f * d);
    SetGroup(out, 2 * b + 1, d, -8.0f * d);
  }
}

void DecodeQ4_1(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kQ4_1BlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ4_1);
    PrefetchAhead(block, sizeof(BlockQ4_1));
    const float d = HalfAt(block, offsetof(BlockQ4_1, d));
    const float m = HalfAt(block, offsetof(BlockQ4_1, m));
    SplitNibbles(block + offsetof(BlockQ4_1, qs), out.levels + 32 * b);
    SetGroup(out, 2 * b, d, m);
    SetGroup(out, 2 * b + 1, d, m);
  }
}

// A 5-bit block's levels (Q5_0, Q5_1): its nibbles plus bit v of its
// little-endian qh as 16 for value v.
template <class Block>
void StoreFifthBitLevels(const uint8_t* block, uint8_t* levels) {
  uint32_t qh;
  std::memcpy(&qh, block + offsetof(Block, qh), sizeof(qh));
  SplitNibbles(block + offsetof(Block, qs), levels);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(levels));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels), _mm256_or_si256(v, BitsAsSixteen(qh)));
}

void DecodeQ5_0(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kQ5_0BlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ5_0);
    PrefetchAhead(block, sizeof(BlockQ5_0));
    const float d = HalfAt(block, offsetof(BlockQ5_0, d));
    StoreFifthBitLevels<BlockQ5_0>(block, out.levels + 32 * b);
    SetGroup(out, 2 * b, d, -16.0f * d);
    SetGroup(out, 2 * b + 1, d, -16.0f * d);
  }
}

void DecodeQ5_1(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kQ5_1BlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ5_1);
    PrefetchAhead(block, sizeof(BlockQ5_1));
    const float d = HalfAt(block, offsetof(BlockQ5_1, d));
    const float m = HalfAt(block, offsetof(BlockQ5_1, m));
    StoreFifthBitLevels<BlockQ5_1>(block, out.levels + 32 * b);
    SetGroup(out, 2 * b, d, m);
    SetGroup(out, 2 * b + 1, d, m);
  }
}

// IQ4's 32 values of one sub-block: 16 bytes of nibbles (as Q4_0's) looked
// up in kIq4NlValues, the signed levels (+128 for vpdpbusd).
inline void StoreIq4Levels(const uint8_t* qs, bool to_unsigned, uint8_t* levels) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues));
  const __m128i flip = _mm_set1_epi8(static_cast<char>(to_unsigned ? 0x80 : 0));
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, mask));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), mask));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(levels), _mm_xor_si128(lo, flip));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(levels + 16), _mm_xor_si128(hi, flip));
}

void DecodeIQ4_NL(const uint8_t* row, int64_t k, bool to_unsigned, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kIQ4_NLBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockIQ4_NL);
    PrefetchAhead(block, sizeof(BlockIQ4_NL));
    const float d = HalfAt(block, offsetof(BlockIQ4_NL, d));
    StoreIq4Levels(block + offsetof(BlockIQ4_NL, qs), to_unsigned, out.levels + 32 * b);
    const float offset = to_unsigned ? -128.0f * d : 0.0f;
    SetGroup(out, 2 * b, d, offset);
    SetGroup(out, 2 * b + 1, d, offset);
  }
}

// 16 group values from 8 8-bit ones (each sub-block of 32 is two groups of
// 16), times `scale`, stored at out[0..15].
inline void StoreGroups(__m128i bytes8, bool is_signed, float scale, float* out) {
  const __m128i dup = _mm_shuffle_epi8(bytes8, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
  const __m256i lo = is_signed ? _mm256_cvtepi8_epi32(dup) : _mm256_cvtepu8_epi32(dup);
  const __m256i hi =
      is_signed ? _mm256_cvtepi8_epi32(_mm_srli_si128(dup, 8)) : _mm256_cvtepu8_epi32(_mm_srli_si128(dup, 8));
  const __m256 s = _mm256_set1_ps(scale);
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), s));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), s));
}

// The 8 6-bit scales (bytes 0..7) and mins (8..15) of a Q4_K/Q5_K block's
// scales[12], all at once (as UnpackKScaleMin one at a time).
inline __m128i UnpackKScalesMins(const uint8_t* scales) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, scales, 12);
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_low = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_low;
  u[0] &= kLow6;
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
}

// Q4_K and Q5_K: chunks of 64 values, 32 low nibbles then 32 high ones,
// each half with its own 6-bit scale and min. `qh` null for Q4_K.
void DecodeKChunks(const uint8_t* scales, const uint8_t* qs, const uint8_t* qh, float d, float dmin,
                   const DecodedRow& out, int64_t base) {
  const __m128i scales_mins = UnpackKScalesMins(scales);
  StoreGroups(scales_mins, false, d, out.scales + base / 16);
  StoreGroups(_mm_srli_si128(scales_mins, 8), false, -dmin, out.offsets + base / 16);
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (int chunk = 0; chunk < kKBlockSize / 64; ++chunk) {
    const __m256i q = Load32(qs + 32 * chunk);
    __m256i lo = _mm256_and_si256(q, mask), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
    if (qh != nullptr) {
      const __m256i h = Load32(qh);
      const __m256i low_bit = _mm256_set1_epi8(static_cast<char>(1u << (2 * chunk)));
      const __m256i high_bit = _mm256_set1_epi8(static_cast<char>(2u << (2 * chunk)));
      const __m256i sixteen = _mm256_set1_epi8(16);
      lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, low_bit), low_bit), sixteen));
      hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, high_bit), high_bit), sixteen));
    }
    uint8_t* levels = out.levels + base + 64 * chunk;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels), lo);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels + 32), hi);
  }
}

void DecodeQ4_K(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ4_K);
    PrefetchAhead(block, sizeof(BlockQ4_K));
    DecodeKChunks(block + offsetof(BlockQ4_K, scales), block + offsetof(BlockQ4_K, qs), nullptr,
                  HalfAt(block, offsetof(BlockQ4_K, d)), HalfAt(block, offsetof(BlockQ4_K, dmin)), out,
                  b * kKBlockSize);
  }
}

void DecodeQ5_K(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ5_K);
    PrefetchAhead(block, sizeof(BlockQ5_K));
    DecodeKChunks(block + offsetof(BlockQ5_K, scales), block + offsetof(BlockQ5_K, qs), block + offsetof(BlockQ5_K, qh),
                  HalfAt(block, offsetof(BlockQ5_K, d)), HalfAt(block, offsetof(BlockQ5_K, dmin)), out,
                  b * kKBlockSize);
  }
}

// Block b's group g has the int8 scale scales[g] (times d); its offset is
// -32 times its scale. Both orders of Q6_K keep these fields in place.
void StoreQ6KScales(const uint8_t* block, int64_t b, const DecodedRow& out) {
  const float d = HalfAt(block, offsetof(BlockQ6_K, d));
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(BlockQ6_K, scales)));
  float* group_scales = out.scales + b * kKBlockSize / 16;
  float* group_offsets = out.offsets + b * kKBlockSize / 16;
  const __m256 d8 = _mm256_set1_ps(d), minus32 = _mm256_set1_ps(-32.0f);
  const __m256 s0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), d8);
  const __m256 s1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), d8);
  _mm256_storeu_ps(group_scales, s0);
  _mm256_storeu_ps(group_scales + 8, s1);
  _mm256_storeu_ps(group_offsets, _mm256_mul_ps(s0, minus32));
  _mm256_storeu_ps(group_offsets + 8, _mm256_mul_ps(s1, minus32));
}

// Q6_K: halves of 128 values; value l of each 32 takes 4 bits from ql and 2
// from qh; group g (16 values) of a half has the int8 scale sc[g].
void DecodeQ6_K(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  const __m256i mask4 = _mm256_set1_epi8(0x0f), mask2 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ6_K);
    PrefetchAhead(block, sizeof(BlockQ6_K));
    const uint8_t* ql = block + offsetof(BlockQ6_K, ql);
    for (int half = 0; half < kKBlockSize / 128; ++half) {
      const __m256i ql0 = Load32(ql + 64 * half);
      const __m256i ql1 = Load32(ql + 64 * half + 32);
      const __m256i qh = Load32(block + offsetof(BlockQ6_K, qh) + 32 * half);
      const __m256i v0 =
          _mm256_or_si256(_mm256_and_si256(ql0, mask4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), mask2));
      const __m256i v1 =
          _mm256_or_si256(_mm256_and_si256(ql1, mask4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), mask2));
      const __m256i v2 =
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), mask4), _mm256_and_si256(qh, mask2));
      const __m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), mask4),
                                         _mm256_and_si256(_mm256_srli_epi16(qh, 2), mask2));
      uint8_t* levels = out.levels + b * kKBlockSize + 128 * half;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels), v0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels + 32), v1);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels + 64), v2);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(levels + 96), v3);
    }
    StoreQ6KScales(block, b, out);
  }
}

// Q3_K and Q2_K: value 128h + 32j + l takes bits 2j, 2j+1 of qs[32h + l];
// Q3_K's third bit (bit 4h + j of hmask[l]) adds 4 (the level is q + 4,
// in [0, 8), and the offset -4 times the scale). Groups of 16 values.
void DecodeQ3_K(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ3_K);
    PrefetchAhead(block, sizeof(BlockQ3_K));
    const __m256i hmask = Load32(block + offsetof(BlockQ3_K, hmask));
    for (int half = 0; half < 2; ++half) {
      const __m256i qs = Load32(block + offsetof(BlockQ3_K, qs) + 32 * half);
      for (int j = 0; j < 4; ++j) {
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), three);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hmask, 4 * half + j), one);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.levels + b * kKBlockSize + 128 * half + 32 * j),
                            _mm256_or_si256(low, _mm256_slli_epi16(high, 2)));
      }
    }
    const float d = HalfAt(block, offsetof(BlockQ3_K, d));
    int8_t scales[kKBlockSize / 16];
    UnpackQ3KScales(block + offsetof(BlockQ3_K, scales), scales);
    for (int g = 0; g < kKBlockSize / 16; ++g) {
      const float scale = d * static_cast<float>(scales[g]);
      SetGroup(out, b * kKBlockSize / 16 + g, scale, -4.0f * scale);
    }
  }
}

void DecodeQ2_K(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  const __m256i three = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ2_K);
    PrefetchAhead(block, sizeof(BlockQ2_K));
    for (int half = 0; half < 2; ++half) {
      const __m256i qs = Load32(block + offsetof(BlockQ2_K, qs) + 32 * half);
      for (int j = 0; j < 4; ++j) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.levels + b * kKBlockSize + 128 * half + 32 * j),
                            _mm256_and_si256(_mm256_srli_epi16(qs, 2 * j), three));
      }
    }
    const float d = HalfAt(block, offsetof(BlockQ2_K, d)), dmin = HalfAt(block, offsetof(BlockQ2_K, dmin));
    const uint8_t* scales = block + offsetof(BlockQ2_K, scales);
    for (int g = 0; g < kKBlockSize / 16; ++g) {
      SetGroup(out, b * kKBlockSize / 16 + g, d * static_cast<float>(scales[g] & 0x0f),
               -dmin * static_cast<float>(scales[g] >> 4));
    }
  }
}

// IQ4_XS: eight sub-blocks of 32 as IQ4_NL's, each with its 6-bit scale.
void DecodeIQ4_XS(const uint8_t* row, int64_t k, bool to_unsigned, const DecodedRow& out) {
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockIQ4_XS);
    PrefetchAhead(block, sizeof(BlockIQ4_XS));
    const float d = HalfAt(block, offsetof(BlockIQ4_XS, d));
    uint16_t scales_h;
    std::memcpy(&scales_h, block + offsetof(BlockIQ4_XS, scales_h), sizeof(scales_h));
    const uint8_t* scales_l = block + offsetof(BlockIQ4_XS, scales_l);
    for (int j = 0; j < kKBlockSize / 32; ++j) {
      StoreIq4Levels(block + offsetof(BlockIQ4_XS, qs) + 16 * j, to_unsigned, out.levels + b * kKBlockSize + 32 * j);
      const float scale = d * static_cast<float>(UnpackIQ4XSScale(scales_h, scales_l, j) - 32);
      const float offset = to_unsigned ? -128.0f * scale : 0.0f;
      SetGroup(out, b * kKBlockSize / 16 + 2 * j, scale, offset);
      SetGroup(out, b * kKBlockSize / 16 + 2 * j + 1, scale, offset);
    }
  }
}

// Group-major K-quant blocks (block_order.h): `steps[s]` holds step s's
// levels for 8 groups (lane l = dword l: values 16l + 4s .. 16l + 4s + 3);
// a 4 x 4 dword transpose per 128-bit half puts each group's 16 values in
// order at levels[16 l].
inline void StoreGroupMajorSteps(const __m256i (&steps)[4], uint8_t* levels) {
  const __m256i ab_lo = _mm256_unpacklo_epi32(steps[0], steps[1]), ab_hi = _mm256_unpackhi_epi32(steps[0], steps[1]);
  const __m256i cd_lo = _mm256_unpacklo_epi32(steps[2], steps[3]), cd_hi = _mm256_unpackhi_epi32(steps[2], steps[3]);
  // Groups (0, 4), (1, 5), (2, 6), (3, 7): one per 128-bit half.
  const __m256i groups[4] = {_mm256_unpacklo_epi64(ab_lo, cd_lo), _mm256_unpackhi_epi64(ab_lo, cd_lo),
                             _mm256_unpacklo_epi64(ab_hi, cd_hi), _mm256_unpackhi_epi64(ab_hi, cd_hi)};
  for (int g = 0; g < 4; ++g) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(levels + 16 * g), _mm256_castsi256_si128(groups[g]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(levels + 16 * (g + 4)), _mm256_extracti128_si256(groups[g], 1));
  }
}

void DecodeQ4_KGroupMajor(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ4_K);
    PrefetchAhead(block, sizeof(BlockQ4_K));
    const __m128i scales_mins = UnpackKScalesMins(block + offsetof(BlockQ4_K, scales));
    StoreGroups(scales_mins, false, HalfAt(block, offsetof(BlockQ4_K, d)), out.scales + b * kKBlockSize / 16);
    StoreGroups(_mm_srli_si128(scales_mins, 8), false, -HalfAt(block, offsetof(BlockQ4_K, dmin)),
                out.offsets + b * kKBlockSize / 16);
    const uint8_t* qs = block + offsetof(BlockQ4_K, qs);
    for (int eighth = 0; eighth < 2; ++eighth) {  // groups 8 * eighth .. 8 * eighth + 7
      const __m256i q0 = Load32(qs + 32 * eighth), q1 = Load32(qs + 64 + 32 * eighth);
      const __m256i steps[4] = {_mm256_and_si256(q0, mask), _mm256_and_si256(_mm256_srli_epi16(q0, 4), mask),
                                _mm256_and_si256(q1, mask), _mm256_and_si256(_mm256_srli_epi16(q1, 4), mask)};
      StoreGroupMajorSteps(steps, out.levels + b * kKBlockSize + 128 * eighth);
    }
  }
}

void DecodeQ6_KGroupMajor(const uint8_t* row, int64_t k, bool, const DecodedRow& out) {
  const __m256i mask4 = _mm256_set1_epi8(0x0f), mask2 = _mm256_set1_epi8(0x30);
  for (int64_t b = 0; b < k / kKBlockSize; ++b) {
    const uint8_t* block = row + b * sizeof(BlockQ6_K);
    PrefetchAhead(block, sizeof(BlockQ6_K));
    const uint8_t* ql = block + offsetof(BlockQ6_K, ql);
    for (int eighth = 0; eighth < 2; ++eighth) {
      const __m256i q0 = Load32(ql + 32 * eighth), q1 = Load32(ql + 64 + 32 * eighth);
      const __m256i qh = Load32(block + offsetof(BlockQ6_K, qh) + 32 * eighth);
      const __m256i steps[4] = {
          _mm256_or_si256(_mm256_and_si256(q0, mask4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), mask2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), mask4),
                          _mm256_and_si256(_mm256_slli_epi16(qh, 2), mask2)),
          _mm256_or_si256(_mm256_and_si256(q1, mask4), _mm256_and_si256(qh, mask2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), mask4),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), mask2))};
      StoreGroupMajorSteps(steps, out.levels + b * kKBlockSize + 128 * eighth);
    }
    StoreQ6KScales(block, b, out);
  }
}

using RowDecoder = void (*)(const uint8_t* row, int64_t k, bool to_unsigned, const DecodedRow& out);

RowDecoder DecoderOf(DType dtype, BlockOrder order) {
  if (order == BlockOrder::kGroupMajor) {
    switch (dtype) {
      case DType::kQ4_K: return DecodeQ4_KGroupMajor;
      case DType::kQ6_K: return DecodeQ6_KGroupMajor;
      default: return nullptr;
    }
  }
  switch (dtype) {
    case DType::kQ8_0: return DecodeQ8_0;
    case DType::kQ4_0: return DecodeQ4_0;
    case DType::kQ4_1: return DecodeQ4_1;
    case DType::kQ5_0: return DecodeQ5_0;
    case DType::kQ4_K: return DecodeQ4_K;
    case DType::kQ5_K: return DecodeQ5_K;
    case DType::kQ6_K: return DecodeQ6_K;
    case DType::kQ5_1: return DecodeQ5_1;
    case DType::kQ3_K: return DecodeQ3_K;
    case DType::kQ2_K: return DecodeQ2_K;
    case DType::kIQ4_NL: return DecodeIQ4_NL;
    case DType::kIQ4_XS: return DecodeIQ4_XS;
    default: return nullptr;
  }
}

// ---- x quantization ----

float MaxAbs(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
  for (int i = 8; i < 32; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

// 32 values of x into int8 q, the two 16-value groups' scales and offsets.
// One 32-value block with the scale of `amax` (its own, or its 256-value
// super-block's).
void QuantizeBlock(const float* x, float amax, int8_t* q, float* scales, float* offsets) {
  const float d = amax / 127.0f;
  const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  __m256i i32[4];
  for (int i = 0; i < 4; ++i)
    i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inv));  // nearest even
  // Sums of q over each 16 values, before packing.
  const __m256i s0 = _mm256_add_epi32(i32[0], i32[1]), s1 = _mm256_add_epi32(i32[2], i32[3]);
  const __m256i pair = _mm256_hadd_epi32(s0, s1);  // [s0 s0 s1 s1 | s0 s0 s1 s1] partials
  alignas(32) int32_t partial[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(partial), pair);
  const int32_t sum0 = partial[0] + partial[1] + partial[4] + partial[5];
  const int32_t sum1 = partial[2] + partial[3] + partial[6] + partial[7];
  const __m256i w16 = _mm256_packs_epi32(i32[0], i32[1]), w16b = _mm256_packs_epi32(i32[2], i32[3]);
  const __m256i w8 = _mm256_packs_epi16(w16, w16b);
  // packs interleave 128-bit lanes: dwords come out as 0 2 4 6 1 3 5 7.
  const __m256i ordered = _mm256_permutevar8x32_epi32(w8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), ordered);
  scales[0] = scales[1] = d;
  offsets[0] = d * static_cast<float>(sum0);
  offsets[1] = d * static_cast<float>(sum1);
}

// ---- The AVX2 tile: vpmaddubsw on |W| and x with W's sign, vpmaddwd to int32 ----

// The 2 group scales of 32 values, each over its 4 int32 lanes.
inline __m256 GroupScales(const float* p) { return _mm256_set_m128(_mm_set1_ps(p[1]), _mm_set1_ps(p[0])); }

template <int kRows>
void Avx2Tile(const isa::Int8DotTile& t, int64_t r0) {
  __m256 acc[kF][kRows];
  for (int f = 0; f < kF; ++f)
    for (int r = 0; r < kRows; ++r) acc[f][r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < t.k; i += 32) {
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* xrow = reinterpret_cast<const uint8_t*>(t.x_levels) + (r0 + r) * t.x_stride;
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xrow + i));
      const __m256 xs = GroupScales(
          reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(t.x_scales) + (r0 + r) * t.x_stride) +
          i / 16);
      for (int f = 0; f < kF; ++f) {
        const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t.w_levels[f] + i));
        const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv));
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        acc[f][r] = _mm256_fmadd_ps(_mm256_mul_ps(dot, GroupScales(t.w_scales[f] + i / 16)), xs, acc[f][r]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const float* xo =
        reinterpret_cast<const float*>(reinterpret_cast<const uint8_t*>(t.x_offsets) + (r0 + r) * t.x_stride);
    for (int f = 0; f < kF; ++f) {
      __m256 o = _mm256_setzero_ps();
      int64_t g = 0;
      for (; g + 8 <= t.k / 16; g += 8)
        o = _mm256_fmadd_ps(_mm256_loadu_ps(t.w_offsets[f] + g), _mm256_loadu_ps(xo + g), o);
      o = _mm256_add_ps(o, acc[f][r]);
      __m128 s = _mm_add_ps(_mm256_castps256_ps128(o), _mm256_extractf128_ps(o, 1));
      s = _mm_add_ps(s, _mm_movehl_ps(s, s));
      s = _mm_add_ss(s, _mm_movehdup_ps(s));
      float sum = _mm_cvtss_f32(s);
      for (; g < t.k / 16; ++g) sum += t.w_offsets[f][g] * xo[g];
      t.out[(r0 + r) * kF + f] = sum;
    }
  }
}

void Avx2Dot(const isa::Int8DotTile& t) {
  int64_t r = 0;
  for (; r + 2 <= t.rows; r += 2) Avx2Tile<2>(t, r);
  if (r < t.rows) Avx2Tile<1>(t, r);
}

// Decodes W rows [j0, j0 + count) into `slots` scratch rows and points
// levels/scales/offsets[0, slots) at them (slots past count repeat the last
// row): the int8_dot tile's 4 rows and the GEMM's panel of 8.
void DecodeRows(const LinearWeight& w, RowDecoder decode, bool to_unsigned, int64_t j0, int64_t count, int64_t slots,
                uint8_t* scratch, const uint8_t** levels, const float** scales, const float** offsets) {
  const RowLayout layout(w.k);
  for (int64_t f = 0; f < slots; ++f) {
    uint8_t* base = scratch + std::min(f, count - 1) * layout.stride;
    const DecodedRow row{base, reinterpret_cast<float*>(base + layout.scales_at),
                         reinterpret_cast<float*>(base + layout.offsets_at)};
    if (f < count) decode(static_cast<const uint8_t*>(w.data) + (j0 + f) * w.row_bytes(), w.k, to_unsigned, row);
    levels[f] = row.levels;
    scales[f] = row.scales;
    offsets[f] = row.offsets;
  }
}

void DecodeTile(const LinearWeight& w, RowDecoder decode, bool to_unsigned, int64_t j0, int64_t count, uint8_t* scratch,
                isa::Int8DotTile* tile) {
  DecodeRows(w, decode, to_unsigned, j0, count, kF, scratch, tile->w_levels, tile->w_scales, tile->w_offsets);
}

template <void (*kDot)(const isa::Int8DotTile&), bool kUnsigned>
absl::Status Int8DotSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  const RowDecoder decode = DecoderOf(w.dtype, w.order);
  if (decode == nullptr || a.prepared == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("int8_dot kernel: no block decoder or prepared input for ",
                                                   std::string(DTypeName(w.dtype)), " weights"));
  }
  const RowLayout layout(w.k);
  uint8_t* decoded = static_cast<uint8_t*>(scratch);
  float* out = reinterpret_cast<float*>(decoded + kF * layout.stride);
  const uint8_t* x = static_cast<const uint8_t*>(a.prepared);
  isa::Int8DotTile tile;
  tile.k = w.k;
  tile.x_stride = layout.stride;
  tile.out = out;
  for (int64_t xb = 0; xb < a.m; xb += kXBlock) {
    tile.rows = std::min(kXBlock, a.m - xb);
    tile.x_levels = reinterpret_cast<const int8_t*>(x + xb * layout.stride);
    tile.x_scales = reinterpret_cast<const float*>(x + xb * layout.stride + layout.scales_at);
    tile.x_offsets = reinterpret_cast<const float*>(x + xb * layout.stride + layout.offsets_at);
    for (int64_t j0 = a.n_begin; j0 < a.n_end; j0 += kF) {
      const int64_t count = std::min(kF, a.n_end - j0);
      DecodeTile(w, decode, kUnsigned, j0, count, decoded, &tile);
      kDot(tile);
      for (int64_t r = 0; r < tile.rows; ++r)
        for (int64_t f = 0; f < count; ++f)
          a.y[(xb + r) * a.ldy + j0 + f] = out[r * kF + f] + (a.bias != nullptr ? a.bias[j0 + f] : 0.0f);
    }
  }
  return absl::OkStatus();
}

// ---- Prefill: the slice dequantized to bf16 rows for the bf16 dot-product GEMM ----

int64_t Bf16RowsBytes(int64_t k, int64_t features) { return RoundUp64(features * k * 2); }

isa::Int8PreparedX PreparedX(int64_t k, const void* prepared) {
  const RowLayout layout(k);
  return isa::Int8PreparedX{prepared, layout.stride, layout.scales_at, layout.offsets_at};
}

}  // namespace

int64_t Int8DotPreparedBytes(int64_t m, int64_t k) { return m * RowLayout(k).stride; }
int64_t Int8DotPrepareBlocks(int64_t m) { return m; }

// x rows [row_begin, row_end) into the layout, one int8 scale per
// `x_block` values (a multiple of 32; the last run of a row may be short).
void PrepareRows(const float* x, int64_t ldx, int64_t k, int64_t row_begin, int64_t row_end, int64_t x_block,
                 void* prepared) {
  const RowLayout layout(k);
  for (int64_t r = row_begin; r < row_end; ++r) {
    uint8_t* row = static_cast<uint8_t*>(prepared) + r * layout.stride;
    int8_t* q = reinterpret_cast<int8_t*>(row);
    float* scales = reinterpret_cast<float*>(row + layout.scales_at);
    float* offsets = reinterpret_cast<float*>(row + layout.offsets_at);
    const float* xr = x + r * ldx;
    for (int64_t s = 0; s < k; s += x_block) {
      const int64_t end = std::min(k, s + x_block);
      float amax = 0.0f;
      for (int64_t b = s; b < end; b += 32) amax = std::max(amax, MaxAbs(xr + b));
      for (int64_t b = s; b < end; b += 32) QuantizeBlock(xr + b, amax, q + b, scales + b / 16, offsets + b / 16);
    }
  }
}

void Int8DotPrepare(const float* x, int64_t ldx, int64_t, int64_t k, int64_t block_begin, int64_t block_end,
                    void* prepared) {
  PrepareRows(x, ldx, k, block_begin, block_end, 32, prepared);
}

void Int8DotPrepareSuperBlocks(const float* x, int64_t ldx, int64_t, int64_t k, int64_t block_begin,
                               int64_t block_end, void* prepared) {
  PrepareRows(x, ldx, k, block_begin, block_end, 256, prepared);
}

void Int8DotPrepareGroupMajor(const float* x, int64_t ldx, int64_t m, int64_t k, int64_t block_begin, int64_t block_end,
                              void* prepared) {
  Int8DotPrepare(x, ldx, m, k, block_begin, block_end, prepared);
  const RowLayout layout(k);
  constexpr int64_t kBlock = 256, kGroups = kBlock / 16, kSteps = 4;
  for (int64_t r = block_begin; r < block_end; ++r) {
    uint8_t* levels = static_cast<uint8_t*>(prepared) + r * layout.stride;
    for (int64_t b = 0; b + kBlock <= k; b += kBlock) {
      // A 16 x 4 transpose of 4-value quads: quad s of group l to lane l of step s.
      uint32_t plain[kGroups * kSteps], group_major[kGroups * kSteps];
      std::memcpy(plain, levels + b, sizeof(plain));
      for (int64_t s = 0; s < kSteps; ++s)
        for (int64_t l = 0; l < kGroups; ++l) group_major[kGroups * s + l] = plain[kSteps * l + s];
      std::memcpy(levels + b, group_major, sizeof(group_major));
    }
  }
}

bool Int8GemmPackParams(const Int8DecodedRows& rows, int panel_rows, int64_t group16, float* params) {
  bool any_offset = false;
  for (int c = 0; c < panel_rows; ++c) {
    params[c] = rows.scales[c][group16];
    params[panel_rows + c] = rows.offsets[c][group16];
    any_offset |= rows.offsets[c][group16] != 0.0f;
  }
  return any_offset;
}

namespace {

// The two GEMM flavours: how a panel is laid out, packed and multiplied.
struct Avx2Gemm {
  static constexpr int64_t kPanelRows = 8;
  static constexpr bool kUnsigned = false;  // vpmaddubsw takes |W| and x with W's sign
  static int64_t PanelBytes(const LinearWeight& w) { return Int8GemmPanelBytes(w.k); }
  static bool Pack(const LinearWeight& w, const Int8DecodedRows& rows, uint8_t* panel) {
    return Int8GemmPackPanel(rows, w.k, panel);
  }
  static void Multiply(const LinearWeight& w, const uint8_t* panel, bool offsets, const uint8_t* x, int64_t m,
                       const Int8RowLayoutView& layout, float* out) {
    Avx2Int8GemmPanel(panel, w.k, HasSignedLevels(w.dtype), offsets, !ScalesPer16(w.dtype), x, m, layout, out);
  }
  static bool GroupMajorX(const LinearWeight&) { return false; }
};

struct VnniGemm {
  static constexpr int64_t kPanelRows = kVnniGemmPanelRows;
  static constexpr bool kUnsigned = true;  // vpdpbusd's unsigned operand
  // Q6_K, Q3_K and Q2_K scale per 16 values; every other type per 32.
  static bool Pairs(const LinearWeight& w) { return !ScalesPer16(w.dtype); }
  static int64_t PanelBytes(const LinearWeight& w) { return VnniInt8GemmPanelBytes(w.k, Pairs(w)); }
  static bool Pack(const LinearWeight& w, const Int8DecodedRows& rows, uint8_t* panel) {
    return VnniInt8GemmPackPanel(rows, w.k, Pairs(w), panel);
  }
  static void Multiply(const LinearWeight& w, const uint8_t* panel, bool offsets, const uint8_t* x, int64_t m,
                       const Int8RowLayoutView& layout, float* out) {
    Avx512VnniInt8GemmPanel(panel, w.k, Pairs(w), offsets, x, m, layout, out);
  }
  // The VNNI entry prepares the K-quants' x group-major (for its fused pass).
  static bool GroupMajorX(const LinearWeight& w) {
    return w.dtype == DType::kQ4_K || w.dtype == DType::kQ5_K || w.dtype == DType::kQ6_K;
  }
};

// Group-major levels of a prepared row back to plain order (the inverse of
// Int8DotPrepareGroupMajor's transpose; whole 256-value blocks only, as there).
void PlainFromGroupMajor(const uint8_t* group_major, int64_t k, uint8_t* plain) {
  constexpr int64_t kBlock = 256, kGroups = kBlock / 16, kSteps = 4;
  int64_t b = 0;
  for (; b + kBlock <= k; b += kBlock) {
    uint32_t from[kGroups * kSteps], to[kGroups * kSteps];
    std::memcpy(from, group_major + b, sizeof(from));
    for (int64_t s = 0; s < kSteps; ++s)
      for (int64_t l = 0; l < kGroups; ++l) to[kSteps * l + s] = from[kGroups * s + l];
    std::memcpy(plain + b, to, sizeof(to));
  }
  std::memcpy(plain + b, group_major + b, static_cast<size_t>(k - b));
}

// Decoded rows, the slice's panels, the panel outputs of a block of x rows,
// and (group-major x) that block's rows in plain order.
template <typename Flavour>
int64_t GemmScratchBytes(const LinearWeight& w, int64_t features) {
  const int64_t panels = (features + Flavour::kPanelRows - 1) / Flavour::kPanelRows;
  const int64_t stride = RowLayout(w.k).stride;
  return Flavour::kPanelRows * stride + panels * RoundUp64(Flavour::PanelBytes(w)) +
         kInt8GemmRowBlock * Flavour::kPanelRows * static_cast<int64_t>(sizeof(float)) +
         (Flavour::GroupMajorX(w) ? kInt8GemmRowBlock * stride : 0);
}

// The slice's W rows decoded and packed into panels once; then blocks of
// kInt8GemmRowBlock x rows (in L2) against every panel in turn (each panel
// in L1 while the block's rows pass it), so W is read from L2/L3 once per
// block, not once per x row.
template <typename Flavour>
absl::Status Int8GemmSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  constexpr int64_t kRows = Flavour::kPanelRows;
  const RowDecoder decode = DecoderOf(w.dtype, w.order);
  if (decode == nullptr || a.prepared == nullptr || w.k % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("int8 GEMM: no block decoder or prepared input for ",
                                                   std::string(DTypeName(w.dtype)), " weights"));
  }
  const RowLayout layout(w.k);
  const int64_t panel_bytes = RoundUp64(Flavour::PanelBytes(w));
  const int64_t panels = (a.n_end - a.n_begin + kRows - 1) / kRows;
  uint8_t* decoded = static_cast<uint8_t*>(scratch);
  uint8_t* packed = decoded + kRows * layout.stride;
  float* out = reinterpret_cast<float*>(packed + panels * panel_bytes);
  uint8_t* plain_x = reinterpret_cast<uint8_t*>(out + kInt8GemmRowBlock * kRows);
  bool any_offset = false;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t j0 = a.n_begin + p * kRows, count = std::min(kRows, a.n_end - j0);
    Int8DecodedRows rows;
    DecodeRows(w, decode, Flavour::kUnsigned, j0, count, kRows, decoded, rows.levels, rows.scales, rows.offsets);
    any_offset |= Flavour::Pack(w, rows, packed + p * panel_bytes);
  }
  const Int8RowLayoutView x_layout{layout.stride, layout.scales_at, layout.offsets_at};
  for (int64_t r0 = 0; r0 < a.m; r0 += kInt8GemmRowBlock) {
    const int64_t rows = std::min(kInt8GemmRowBlock, a.m - r0);
    const uint8_t* x = static_cast<const uint8_t*>(a.prepared) + r0 * layout.stride;
    if (Flavour::GroupMajorX(w)) {
      for (int64_t r = 0; r < rows; ++r) {
        PlainFromGroupMajor(x + r * layout.stride, w.k, plain_x + r * layout.stride);
        std::memcpy(plain_x + r * layout.stride + layout.scales_at, x + r * layout.stride + layout.scales_at,
                    static_cast<size_t>(layout.stride - layout.scales_at));
      }
      x = plain_x;
    }
    for (int64_t p = 0; p < panels; ++p) {
      const int64_t j0 = a.n_begin + p * kRows, count = std::min(kRows, a.n_end - j0);
      Flavour::Multiply(w, packed + p * panel_bytes, any_offset, x, rows, x_layout, out);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < count; ++c)
          a.y[(r0 + r) * a.ldy + j0 + c] = out[r * kRows + c] + (a.bias != nullptr ? a.bias[j0 + c] : 0.0f);
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t Int8GemmScratchBytes(const LinearWeight& w, int64_t, int64_t features) {
  return GemmScratchBytes<Avx2Gemm>(w, features);
}
int64_t VnniInt8GemmScratchBytes(const LinearWeight& w, int64_t, int64_t features) {
  return GemmScratchBytes<VnniGemm>(w, features);
}

int64_t Int8DotScratchBytes(const LinearWeight& w, int64_t, int64_t) {
  return kF * RowLayout(w.k).stride + kXBlock * kF * static_cast<int64_t>(sizeof(float));
}

int64_t Avx2Int8DotScratchBytes(const LinearWeight& w, int64_t m, int64_t features) {
  const int64_t tile = Int8DotScratchBytes(w, m, features);
  return m >= kInt8GemmMinRows ? std::max(tile, Int8GemmScratchBytes(w, m, features)) : tile;
}
int64_t Avx512VnniInt8DotScratchBytes(const LinearWeight& w, int64_t m, int64_t features) {
  const int64_t tile = Int8DotScratchBytes(w, m, features);
  return m >= kInt8GemmMinRows ? std::max(tile, VnniInt8GemmScratchBytes(w, m, features)) : tile;
}

absl::Status Avx2Int8GemmSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  return Int8GemmSlice<Avx2Gemm>(w, a, scratch);
}
absl::Status Avx512VnniInt8GemmSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  return Int8GemmSlice<VnniGemm>(w, a, scratch);
}

namespace {
// The types whose fused pass is the AVX2 one at every level (x prepared as
// it reads it by both entries).
bool RunsAvx2FusedUnderVnni(DType dtype) {
  return dtype == DType::kQ3_K || dtype == DType::kQ2_K || dtype == DType::kIQ4_XS || dtype == DType::kIQ4_NL;
}
}  // namespace

absl::Status Avx2Int8DotSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  if (a.prepared != nullptr && a.m >= kInt8GemmMinRows && w.k % 32 == 0) return Avx2Int8GemmSlice(w, a, scratch);
  if (a.prepared != nullptr && isa::Avx2Int8Fused(w, a, PreparedX(w.k, a.prepared))) return absl::OkStatus();
  return Int8DotSlice<Avx2Dot, false>(w, a, scratch);
}

absl::Status Avx512VnniInt8DotSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  if (a.prepared != nullptr && a.m >= kInt8GemmMinRows && w.k % 32 == 0) return Avx512VnniInt8GemmSlice(w, a, scratch);
  if (a.prepared != nullptr && isa::Avx512VnniInt8Fused(w, a, PreparedX(w.k, a.prepared))) return absl::OkStatus();
  // The types without a VNNI pass (their x prepared as the AVX2 pass reads it).
  if (a.prepared != nullptr && RunsAvx2FusedUnderVnni(w.dtype) && isa::Avx2Int8Fused(w, a, PreparedX(w.k, a.prepared)))
    return absl::OkStatus();
  return Int8DotSlice<isa::Avx512VnniInt8Dot, true>(w, a, scratch);
}

absl::Status Avx2Int8TileSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  return Int8DotSlice<Avx2Dot, false>(w, a, scratch);
}

absl::Status Avx512VnniInt8TileSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  return Int8DotSlice<isa::Avx512VnniInt8Dot, true>(w, a, scratch);
}

}  // namespace tandem

namespace tandem {

int64_t QuantizedBf16DotScratchBytes(const LinearWeight& w, int64_t m, int64_t features) {
  return Bf16RowsBytes(w.k, features) + RowLayout(w.k).stride + isa::Bf16DotScratchBytes(m, features);
}

namespace {

// W rows [row0, row0 + rows) dequantized to bf16 rows `ldo` values apart:
// Q8_0 straight from its blocks, the other types decoded first into the
// one-row `decoded` buffer (RowLayout(w.k).stride bytes).
void DequantizeRowsToBf16(const LinearWeight& w, RowDecoder decode, int64_t row0, int64_t rows, uint16_t* out,
                          int64_t ldo, uint8_t* decoded) {
  const RowLayout layout(w.k);
  const DecodedRow row{decoded, reinterpret_cast<float*>(decoded + layout.scales_at),
                       reinterpret_cast<float*>(decoded + layout.offsets_at)};
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* stored = static_cast<const uint8_t*>(w.data) + (row0 + r) * w.row_bytes();
    if (w.dtype == DType::kQ8_0) {
      isa::Bf16FromQ8_0(stored, w.k, out + r * ldo);
    } else {
      decode(stored, w.k, false, row);
      isa::Bf16FromLevels(reinterpret_cast<const int8_t*>(row.levels), row.scales, row.offsets, w.k, out + r * ldo);
    }
  }
}

}  // namespace

absl::Status QuantizedBf16DotSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  const RowDecoder decode = DecoderOf(w.dtype, w.order);
  if (decode == nullptr || a.prepared == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("bf16_dot kernel: no block decoder or prepared input for ",
                                                   std::string(DTypeName(w.dtype)), " weights"));
  }
  const int64_t k = w.k, features = a.n_end - a.n_begin;
  auto* bf16 = static_cast<uint16_t*>(scratch);
  uint8_t* decoded = static_cast<uint8_t*>(scratch) + Bf16RowsBytes(k, features);
  DequantizeRowsToBf16(w, decode, a.n_begin, features, bf16, k, decoded);
  // The slice's rows as a bf16 matrix of their own: outputs and bias shift with it.
  const LinearWeight slice{bf16, DType::kBF16, features, k};
  LinearSliceArgs args = a;
  args.n_begin = 0;
  args.n_end = features;
  args.y = a.y + a.n_begin;
  args.bias = a.bias != nullptr ? a.bias + a.n_begin : nullptr;
  isa::Bf16DotBf16(slice, args, decoded + RowLayout(k).stride);
  return absl::OkStatus();
}

int64_t QuantizedAmxScratchBytes(const LinearWeight& w, int64_t, int64_t features) {
  return AmxGemmScratchBytes(w, features, RowLayout(w.k).stride);
}

absl::Status QuantizedAmxSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  const RowDecoder decode = DecoderOf(w.dtype, w.order);
  if (decode == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("amx kernel: no block decoder for ", std::string(DTypeName(w.dtype)), " weights"));
  }
  return AmxGemmSlice(w, a, scratch, [&](int64_t row0, int64_t rows, uint16_t* out, int64_t ldo, void* source) {
    DequantizeRowsToBf16(w, decode, row0, rows, out, ldo, static_cast<uint8_t*>(source));
  });
}

}  // namespace tandem
