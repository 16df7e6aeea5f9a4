// The fused int8_dot decode GEMV at AVX2 (linear_isa.h, Int8FusedArgs): W
// blocks unpacked in registers straight into vpmaddubsw + vpmaddwd, no
// decoded row in memory. Baseline code (AVX2 + FMA + F16C).
//
// One step is 32 values: a ymm of W levels against a ymm of x levels
// (int8), 8 int32 lanes of 4 values each, scaled per lane by the W group
// scale times the x block scale in f32. vpmaddubsw multiplies unsigned by
// signed bytes: the K-quants' levels are unsigned (their mins and Q6_K's
// -32 come in once per block through x's prepared offsets, as in the VNNI
// kernel); Q8_0's and Q4_0's (q - 8) are signed, so they multiply |W| by x
// with W's sign (|W| <= 128, |x| <= 127: no int16 pair saturates).
// IQ4_NL's and IQ4_XS's table levels are signed too.
// The 256-value types (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS) fold their sub-block scales into
// vpmaddwd, which then costs nothing extra, and their x has one scale per
// 256-value block (as llama.cpp's q8_K): a step is vpmaddubsw, vpmaddwd and
// vpaddd per (W row, x row), and the block's int32 sum takes one conversion
// and one FMA by `d` times x's scale (docs/BENCHMARKS.md, Other
// instruction sets). Q8_0, Q4_0 and Q5_0 scale every 32 values: their
// conversion and FMA by the product of the two scales run on 4 (W row,
// x row) pairs' sums at once (LaneUnit). One x row (decode) reads its W rows
// as split streams, each prefetched ahead.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "common/kernels/linear_isa.h"
#include "common/quant/block_formats.h"
#include "common/quant/k_quants.h"

namespace tandem::isa {
namespace {

constexpr int64_t kStep = 32;

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// Each step prefetches its share of the next pass's rows, one pass ahead in
// one sequential sweep (why: linear_avx512_vnni_fused.cc, PrefetchLines).
inline void PrefetchLines(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + at, _MM_HINT_T1);
}

inline __m256i Load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// The 8 6-bit scales (bytes 0..7) and mins (8..15) of a Q4_K/Q5_K block's
// scales[12] (ggml's bit layout), in vector registers: built in a stack
// array, the 16-byte load after four 4-byte stores missed store forwarding
// and cost more than the rest of the block. Dwords u0 u1 u2 of the field:
// scales 0-3 = u0 & 63, 4-7 = (u2 & 15) | (u0 >> 6) << 4; mins 0-3 = u1 & 63,
// 4-7 = (u2 >> 4) | (u1 >> 6) << 4, bytewise.
inline __m128i UnpackKScalesMins(const uint8_t* scales) {
  uint32_t u2;
  std::memcpy(&u2, scales + 8, sizeof(u2));
  const __m128i v =
      _mm_insert_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(scales)), static_cast<int>(u2), 2);
  const __m128i low =
      _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                    _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i high =
      _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0)), _mm_setr_epi32(0, 6, 0, 6)),
                    _mm_setr_epi32(0, 0x03030303, 0, 0x03030303));
  return _mm_or_si128(low, _mm_slli_epi32(high, 4));
}

// ---- Formats: one unit (a 32-value block, or a 256-value K-quant block) ----

struct Q8_0Format {
  static constexpr int64_t kValues = kQ8_0BlockSize, kBytes = sizeof(BlockQ8_0);
  static constexpr int64_t kScaleAt = offsetof(BlockQ8_0, d);
  static constexpr int64_t kMinAt = -1;  // no min
  static constexpr bool kIntScales = false;
  static __m256i Levels(const uint8_t* block) { return Load32(block + offsetof(BlockQ8_0, qs)); }
};

// A 32-value block's 16 bytes of nibbles as its levels 0..15: values 0..15
// are the low nibbles, 16..31 the high ones.
inline __m256i NibbleLevels(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

struct Q4_0Format {
  static constexpr int64_t kValues = kQ4_0BlockSize, kBytes = sizeof(BlockQ4_0);
  static constexpr int64_t kScaleAt = offsetof(BlockQ4_0, d);
  static constexpr int64_t kMinAt = -1;  // no min
  static constexpr bool kIntScales = false;
  static __m256i Levels(const uint8_t* block) {
    return _mm256_sub_epi8(NibbleLevels(block + offsetof(BlockQ4_0, qs)), _mm256_set1_epi8(8));
  }
};

// A 32-value block's nibbles plus bit v of its little-endian qh as 16 for
// value v (levels 0..31). The 32 bits become 32 bytes by one shuffle, an OR
// and a compare (byte v all ones where bit v is set).
inline __m256i FifthBitLevels(const uint8_t* qs, const uint8_t* qh_bytes) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, sizeof(qh));
  // Byte v gets qh's byte v / 8, then all bits but bit v % 8 set.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                          _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i set =
      _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
  return _mm256_or_si256(NibbleLevels(qs), _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
}

// Q5_0: FifthBitLevels minus 16.
struct Q5_0Format {
  static constexpr int64_t kValues = kQ5_0BlockSize, kBytes = sizeof(BlockQ5_0);
  static constexpr int64_t kScaleAt = offsetof(BlockQ5_0, d);
  static constexpr int64_t kMinAt = -1;
  static constexpr bool kIntScales = false;
  static __m256i Levels(const uint8_t* block) {
    return _mm256_sub_epi8(FifthBitLevels(block + offsetof(BlockQ5_0, qs), block + offsetof(BlockQ5_0, qh)),
                           _mm256_set1_epi8(16));
  }
};

// Q4_1 and Q5_1: Q4_0's and Q5_0's levels without the shift (0..15, 0..31),
// and a min per block, which comes in through x's prepared offsets (its
// scale times its sum of levels per 16 values): y += m * x offsets.
// (llama.cpp's Q5_K_M files hold the rows that are not whole 256-value
// blocks in Q5_1.)
struct Q4_1Format {
  static constexpr int64_t kValues = kQ4_1BlockSize, kBytes = sizeof(BlockQ4_1);
  static constexpr int64_t kScaleAt = offsetof(BlockQ4_1, d);
  static constexpr int64_t kMinAt = offsetof(BlockQ4_1, m);
  static constexpr bool kIntScales = false;
  static __m256i Levels(const uint8_t* block) { return NibbleLevels(block + offsetof(BlockQ4_1, qs)); }
};

struct Q5_1Format {
  static constexpr int64_t kValues = kQ5_1BlockSize, kBytes = sizeof(BlockQ5_1);
  static constexpr int64_t kScaleAt = offsetof(BlockQ5_1, d);
  static constexpr int64_t kMinAt = offsetof(BlockQ5_1, m);
  static constexpr bool kIntScales = false;
  static __m256i Levels(const uint8_t* block) {
    return FifthBitLevels(block + offsetof(BlockQ5_1, qs), block + offsetof(BlockQ5_1, qh));
  }
};

// Q4_K and Q5_K: step j is sub-block j: the low (j even) or high nibbles of
// the 32 bytes of chunk j/2, plus bit j of qh as 16 for Q5_K.
template <bool kFifthBit>
struct KFormat {
  using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
  static constexpr int64_t kValues = kKBlockSize, kBytes = sizeof(Block);
  static constexpr int kSteps = kKBlockSize / kStep;
  static constexpr bool kIntScales = true;
  static constexpr bool kSigned = false, kOffsets = true;
  struct State {
    __m256i scales;  // the 8 6-bit sub-block scales (bytes 0..7 of each 128-bit lane)
    __m256 d;
    __m256 mins;  // -dmin * min of each sub-block
  };
  static State Begin(const uint8_t* block) {
    const __m128i sm = UnpackKScalesMins(block + offsetof(Block, scales));
    return {_mm256_broadcastsi128_si256(sm), _mm256_set1_ps(HalfAt(block + offsetof(Block, d))),
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8))),
                          _mm256_set1_ps(-HalfAt(block + offsetof(Block, dmin))))};
  }
  static __m256i Levels(const uint8_t* block, int step) {
    const __m256i q = Load32(block + offsetof(Block, qs) + 32 * (step / 2));
    __m256i levels = _mm256_and_si256((step & 1) ? _mm256_srli_epi16(q, 4) : q, _mm256_set1_epi8(0x0f));
    if constexpr (kFifthBit) {
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(1u << step));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(Load32(block + offsetof(Block, qh)), bit), bit);
      levels = _mm256_or_si256(levels, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return levels;
  }
  // Sub-block `step`'s scale in every int16 lane (byte `step`, zero-extended).
  static __m256i StepScales(const State& s, int step) {
    return _mm256_shuffle_epi8(s.scales, _mm256_set1_epi16(static_cast<int16_t>(0x8000 | step)));
  }
  static __m256 BlockScale(const State& s) { return s.d; }
  // Per 16-value group (two per sub-block).
  static void Offsets(const State& s, __m256 (&out)[2]) {
    out[0] = _mm256_permutevar8x32_ps(s.mins, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
    out[1] = _mm256_permutevar8x32_ps(s.mins, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
  }
};

// Signed 8-bit group scales (bytes 0..15 of each 128-bit lane of `scales`)
// as int16s: group `lo`'s in the low lane's, `hi`'s in the high lane's.
// pshufb cannot sign-extend: it puts each scale in its int16's high byte
// and an arithmetic shift brings it down.
inline __m256i SignedGroupScales(__m256i scales, int lo, int hi) {
  const auto l = static_cast<int16_t>(static_cast<uint16_t>(0x0080 | lo << 8));
  const auto h = static_cast<int16_t>(static_cast<uint16_t>(0x0080 | hi << 8));
  return _mm256_srai_epi16(
      _mm256_shuffle_epi8(scales, _mm256_setr_epi16(l, l, l, l, l, l, l, l, h, h, h, h, h, h, h, h)), 8);
}

// The formats with 16 group scales folded into vpmaddwd and an f32 offset
// per group through x's sums (Q6_K, Q3_K, Q2_K): their block state.
struct GroupScaledFormat {
  static constexpr int64_t kValues = kKBlockSize;
  static constexpr int kSteps = kKBlockSize / kStep;
  static constexpr bool kIntScales = true;
  static constexpr bool kSigned = false, kOffsets = true;
  struct State {
    __m256i scales;  // the 16 group scales (bytes) in each 128-bit lane
    __m256 d;
    __m256 offsets[2];  // groups 0..7, 8..15
  };
  // `scales` the group scales vpmaddwd takes; offset g = factor * values[g]
  // (signed or unsigned bytes).
  template <bool kSignedValues>
  static State Make(__m128i scales, float d, __m128i values, float factor) {
    const __m256 f = _mm256_set1_ps(factor);
    auto widen = [](__m128i v) { return kSignedValues ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v); };
    return {_mm256_broadcastsi128_si256(scales),
            _mm256_set1_ps(d),
            {_mm256_mul_ps(_mm256_cvtepi32_ps(widen(values)), f),
             _mm256_mul_ps(_mm256_cvtepi32_ps(widen(_mm_srli_si128(values, 8))), f)}};
  }
  static __m256 BlockScale(const State& s) { return s.d; }
  static void Offsets(const State& s, __m256 (&out)[2]) {
    out[0] = s.offsets[0];
    out[1] = s.offsets[1];
  }
};

// Q6_K: step s is quarter s % 4 of 128-value half s / 4 (see the VNNI
// kernel); lanes 0..3 are group 2s, 4..7 group 2s + 1. Its signed 8-bit
// group scales fold into vpmaddwd as KFormat's do (pshufb cannot
// sign-extend: it puts each scale in its int16's high byte and an
// arithmetic shift brings it down), and x has one scale per block as for
// Q4_K (|pair| <= 2 * 63 * 127, times 2 * 128 per step, 8 steps: < 2^26).
struct Q6KFormat : GroupScaledFormat {
  static constexpr int64_t kBytes = sizeof(BlockQ6_K);
  static State Begin(const uint8_t* block) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(BlockQ6_K, scales)));
    const float d = HalfAt(block + offsetof(BlockQ6_K, d));
    return Make<true>(sc, d, sc, -32.0f * d);
  }
  static __m256i Levels(const uint8_t* block, int step) {
    const int half = step / 4, quarter = step % 4;
    const __m256i ql = Load32(block + offsetof(BlockQ6_K, ql) + 64 * half + 32 * (quarter & 1));
    const __m256i qh = Load32(block + offsetof(BlockQ6_K, qh) + 32 * half);
    const __m256i low = _mm256_and_si256(quarter < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0x0f));
    __m256i high;
    switch (quarter) {  // qh bits 2q, 2q+1 to bits 4-5
      case 0: high = _mm256_slli_epi16(qh, 4); break;
      case 1: high = _mm256_slli_epi16(qh, 2); break;
      case 2: high = qh; break;
      default: high = _mm256_srli_epi16(qh, 2); break;
    }
    return _mm256_or_si256(low, _mm256_and_si256(high, _mm256_set1_epi8(0x30)));
  }
  static __m256i StepScales(const State& s, int step) { return SignedGroupScales(s.scales, 2 * step, 2 * step + 1); }
};

// Q3_K: step s is values 32s..32s+31: bits 2 (s % 4), 2 (s % 4) + 1 of
// qs[32 (s / 4) ..] and bit s of hmask as 4, levels 0..7 (the stored level
// plus 4); group scales (6 bits minus 32, signed) as Q6_K's, offsets -4 d
// times the scale. x as Q6_K's (|pair| <= 2 * 7 * 127).
struct Q3KFormat : GroupScaledFormat {
  static constexpr int64_t kBytes = sizeof(BlockQ3_K);
  static State Begin(const uint8_t* block) {
    // In registers: a 16-byte load of scales just stored a byte at a time
    // misses store forwarding and stalled a third of the pass.
    uint32_t words[4];
    UnpackQ3KScaleWords(block + offsetof(BlockQ3_K, scales), words);
    const __m128i sc = _mm_sub_epi8(_mm_setr_epi32(static_cast<int>(words[0]), static_cast<int>(words[1]),
                                                   static_cast<int>(words[2]), static_cast<int>(words[3])),
                                    _mm_set1_epi8(32));
    const float d = HalfAt(block + offsetof(BlockQ3_K, d));
    return Make<true>(sc, d, sc, -4.0f * d);
  }
  static __m256i Levels(const uint8_t* block, int step) {
    const __m256i qs = Load32(block + offsetof(BlockQ3_K, qs) + 32 * (step / 4));
    const __m256i low = _mm256_and_si256(_mm256_srli_epi16(qs, 2 * (step % 4)), _mm256_set1_epi8(3));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1u << step));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(Load32(block + offsetof(BlockQ3_K, hmask)), bit), bit);
    return _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(4)));
  }
  static __m256i StepScales(const State& s, int step) { return SignedGroupScales(s.scales, 2 * step, 2 * step + 1); }
};

// Q2_K: levels as Q3_K's low two bits (0..3); group scales the low nibbles
// of scales[16] (unsigned, zero-extended as KFormat's), offsets -dmin times
// the high nibbles.
struct Q2KFormat : GroupScaledFormat {
  static constexpr int64_t kBytes = sizeof(BlockQ2_K);
  static State Begin(const uint8_t* block) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(BlockQ2_K, scales)));
    const __m128i mins = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0f));
    return Make<false>(_mm_and_si128(packed, _mm_set1_epi8(0x0f)), HalfAt(block + offsetof(BlockQ2_K, d)), mins,
                       -HalfAt(block + offsetof(BlockQ2_K, dmin)));
  }
  static __m256i Levels(const uint8_t* block, int step) {
    const __m256i qs = Load32(block + offsetof(BlockQ2_K, qs) + 32 * (step / 4));
    return _mm256_and_si256(_mm256_srli_epi16(qs, 2 * (step % 4)), _mm256_set1_epi8(3));
  }
  // Group 2s's scale in the low lane's int16s, 2s + 1's in the high lane's (zero-extended).
  static __m256i StepScales(const State& s, int step) {
    const auto lo = static_cast<int16_t>(0x8000 | (2 * step)), hi = static_cast<int16_t>(0x8000 | (2 * step + 1));
    return _mm256_shuffle_epi8(s.scales,
                               _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi));
  }
};

// IQ4_XS: step s is sub-block s, its 16 bytes of nibbles looked up in
// kIq4NlValues (signed levels, |l| <= 127: products take |l| and x with
// l's sign, |pair| <= 2 * 127 * 127 < 2^15), its scale 6 bits minus 32 in
// both halves' int16s; no offsets.
struct IQ4XSFormat {
  static constexpr int64_t kValues = kKBlockSize, kBytes = sizeof(BlockIQ4_XS);
  static constexpr int kSteps = kKBlockSize / kStep;
  static constexpr bool kIntScales = true;
  static constexpr bool kSigned = true, kOffsets = false;
  struct State {
    __m256i scales;  // the 8 sub-block scales (bytes 0..7 of each 128-bit lane)
    __m256 d;
  };
  static State Begin(const uint8_t* block) {
    uint16_t scales_h;
    std::memcpy(&scales_h, block + offsetof(BlockIQ4_XS, scales_h), sizeof(scales_h));
    uint32_t scales_l;  // sub-block j's low nibble at bits 4j..4j+3
    std::memcpy(&scales_l, block + offsetof(BlockIQ4_XS, scales_l), sizeof(scales_l));
    uint64_t scales = 0;  // built in a register (a stack array would miss store forwarding)
    for (int j = 0; j < 8; ++j) {
      const uint32_t six_bits = ((scales_l >> (4 * j)) & 0x0f) | ((scales_h >> (2 * j)) & 3u) << 4;
      scales |= static_cast<uint64_t>((six_bits - 32) & 0xff) << (8 * j);
    }
    return {_mm256_broadcastsi128_si256(_mm_cvtsi64_si128(static_cast<int64_t>(scales))),
            _mm256_set1_ps(HalfAt(block + offsetof(BlockIQ4_XS, d)))};
  }
  static __m256i Levels(const uint8_t* block, int step) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
    return _mm256_shuffle_epi8(table, NibbleLevels(block + offsetof(BlockIQ4_XS, qs) + 16 * step));
  }
  static __m256i StepScales(const State& s, int step) { return SignedGroupScales(s.scales, step, step); }
  static __m256 BlockScale(const State& s) { return s.d; }
  static void Offsets(const State&, __m256 (&out)[2]) { out[0] = out[1] = _mm256_setzero_ps(); }
};

// IQ4_NL: Q4_0's nibbles looked up in kIq4NlValues (signed levels, as Q8_0's).
struct IQ4NLFormat {
  static constexpr int64_t kValues = kIQ4_NLBlockSize, kBytes = sizeof(BlockIQ4_NL);
  static constexpr int64_t kScaleAt = offsetof(BlockIQ4_NL, d);
  static constexpr int64_t kMinAt = -1;
  static constexpr bool kIntScales = false;
  static __m256i Levels(const uint8_t* block) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4NlValues)));
    return _mm256_shuffle_epi8(table, NibbleLevels(block + offsetof(BlockIQ4_NL, qs)));
  }
};

// ---- The driver: kW W rows against kRows x rows ----

inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The K-quant pass's f32 sums of kW W rows by kRows x rows, one ymm each.
// They are touched once a block, so past 2 (W row, x row) pairs they wait
// in memory and leave the 16 registers to the block's int32 sums: all 8 x
// rows' in one sweep of the steps, not two sweeps of 4 beside 8 register
// accumulators (faster on one Q4_K expert at 8 rows, more so with the
// running sums of IntScaledSteps; docs/BENCHMARKS.md, Other instruction
// sets). Up to 2 pairs they stay in registers (Pass).
template <int kW, int kRows>
struct RegisterSums {
  __m256 v[kW][kRows];
  __m256 Get(int f, int r) const { return v[f][r]; }
  void Set(int f, int r, __m256 x) { v[f][r] = x; }
};
template <int kW, int kRows>
struct MemorySums {
  alignas(32) float v[kW][kRows][8];
  __m256 Get(int f, int r) const { return _mm256_load_ps(v[f][r]); }
  void Set(int f, int r, __m256 x) { _mm256_store_ps(v[f][r], x); }
};

// The W rows of one pass (`rows`; a negative one repeats rows[0], its sums
// dropped by the caller) and their prefetch rule. kAhead: each W row is the
// next of its own sequential stream and prefetches its own bytes
// kDecodePrefetchAheadBytes ahead; else the rows are adjacent and each step
// prefetches its share of the next pass's rows.
template <int kW, bool kAhead>
struct PassWeights {
  const uint8_t* rows[kW];
  const uint8_t* next;  // the next pass's first row (prefetches never fault)
  PassWeights(const LinearWeight& w, const int64_t (&j)[kW]) {
    const int64_t row_bytes = w.row_bytes();
    const uint8_t* const data = static_cast<const uint8_t*>(w.data);
    for (int f = 0; f < kW; ++f) rows[f] = data + (j[f] >= 0 ? j[f] : j[0]) * row_bytes;
    next = data + (j[0] + kW) * row_bytes;
  }
  // Before the unit of `bytes` at byte `at` of each row.
  void Prefetch(int64_t at, int64_t bytes) const {
    if constexpr (kAhead) {
      for (int f = 0; f < kW; ++f)
        for (int64_t o = 0; o < bytes; o += 64)
          _mm_prefetch(reinterpret_cast<const char*>(rows[f] + at + kDecodePrefetchAheadBytes + o), _MM_HINT_T0);
    } else {
      PrefetchLines(next + kW * at, kW * bytes);
    }
  }
};

// The x rows of one pass: the first row and the stride, so a pass of 8
// rows keeps two general registers, not 24 row pointers.
template <int kRows>
struct XRows {
  const uint8_t* base;
  int64_t stride, scales_at, offsets_at;
  const int8_t* levels(int r) const { return reinterpret_cast<const int8_t*>(base + r * stride); }
  const float* scales(int r) const { return reinterpret_cast<const float*>(base + r * stride + scales_at); }
  const float* offsets(int r) const { return reinterpret_cast<const float*>(base + r * stride + offsets_at); }
};

// A K-quant block's steps: vpmaddwd multiplies by the group scale (folded
// in, see the formats), x has one scale per 256 values
// (Int8DotPrepareSuperBlocks), so the block's steps sum in int32 and take
// one conversion and FMA by `d` times x's scale per block, as llama.cpp's
// q8_K activations. Up to 8 int32 sums (kW x kRows) stay in registers
// beside a step's levels, scales and x; the f32 sums are in memory
// (MemorySums).
template <class Format, int kRows, int kW, class Acc>
inline void IntScaledSteps(const uint8_t* const (&w)[kW], const XRows<kRows>& x, int64_t i, int64_t at,
                           const typename Format::State (&state)[kW], Acc& acc) {
  static_assert(kRows * kW <= 8);
  __m256i sums[kW][kRows];
  for (int f = 0; f < kW; ++f)
    for (int r = 0; r < kRows; ++r) sums[f][r] = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int s = 0; s < Format::kSteps; ++s) {
    const int64_t v = i + kStep * s;
    __m256i wv[kW], scales[kW];
    for (int f = 0; f < kW; ++f) {
      wv[f] = Format::Levels(w[f] + at, s);
      scales[f] = Format::StepScales(state[f], s);
    }
    for (int r = 0; r < kRows; ++r) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.levels(r) + v));
      for (int f = 0; f < kW; ++f) {
        const __m256i products = Format::kSigned
                                     ? _mm256_maddubs_epi16(_mm256_sign_epi8(wv[f], wv[f]), _mm256_sign_epi8(xv, wv[f]))
                                     : _mm256_maddubs_epi16(wv[f], xv);
        sums[f][r] = _mm256_add_epi32(sums[f][r], _mm256_madd_epi16(products, scales[f]));
        // An empty asm that "changes" the sum keeps it a running sum: GCC
        // otherwise reassociates the integer adds and keeps every step's
        // product of the 8 rows on the stack to sum at the block's end.
        __asm__("" : "+x"(sums[f][r]));
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const __m256 xs = _mm256_broadcast_ss(x.scales(r) + i / 16);  // the block's one x scale
    for (int f = 0; f < kW; ++f)
      acc.Set(f, r, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[f][r]), _mm256_mul_ps(Format::BlockScale(state[f]), xs),
                                    acc.Get(f, r)));
  }
}

// One K-quant block of kW W rows against kRows x rows.
template <class Format, int kRows, int kW, class Acc>
inline void Unit(const uint8_t* const (&w)[kW], const XRows<kRows>& x, int64_t i, int64_t at, Acc& acc) {
  typename Format::State state[kW];
  for (int f = 0; f < kW; ++f) state[f] = Format::Begin(w[f] + at);
  for (int f = 0; f < kW && Format::kOffsets; ++f) {
    __m256 offsets[2];
    Format::Offsets(state[f], offsets);
    for (int r = 0; r < kRows; ++r) {
      const __m256 sum = _mm256_fmadd_ps(offsets[0], _mm256_loadu_ps(x.offsets(r) + i / 16), acc.Get(f, r));
      acc.Set(f, r, _mm256_fmadd_ps(offsets[1], _mm256_loadu_ps(x.offsets(r) + i / 16 + 8), sum));
    }
  }
  IntScaledSteps<Format, kRows, kW>(w, x, i, at, state, acc);
}

// kW W rows (`rows`; a negative one repeats rows[0] and its sums are
// dropped) against kRows x rows from r0, all of K (kAhead: PassWeights).
// The f32 sums stay in registers for up to 2 (W row, x row) pairs: in
// memory each block's three FMAs on a sum wait on a store-forwarded load, a
// chain that bound one x row.
template <class Format, int kRows, int kW, bool kAhead>
void Pass(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0,
          const int64_t (&rows)[kW]) {
  const PassWeights<kW, kAhead> wr(w, rows);
  const XRows<kRows> x{static_cast<const uint8_t*>(px.base) + r0 * px.stride, px.stride, px.scales_at,
                       px.offsets_at};
  std::conditional_t<kRows * kW <= 2, RegisterSums<kW, kRows>, MemorySums<kW, kRows>> acc;
  for (int f = 0; f < kW; ++f)
    for (int r = 0; r < kRows; ++r) acc.Set(f, r, _mm256_setzero_ps());
  for (int64_t u = 0; u < w.k / Format::kValues; ++u) {
    wr.Prefetch(u * Format::kBytes, Format::kBytes);
    Unit<Format, kRows, kW>(wr.rows, x, u * Format::kValues, u * Format::kBytes, acc);
  }
  for (int f = 0; f < kW; ++f) {
    if (rows[f] < 0) continue;
    const float bias = a.bias != nullptr ? a.bias[rows[f]] : 0.0f;
    for (int r = 0; r < kRows; ++r) a.y[(r0 + r) * a.ldy + rows[f]] = Sum(acc.Get(f, r)) + bias;
  }
}

// ---- Formats scaled every 32 values (Q8_0, Q4_0, Q5_0, Q4_1, Q5_1): sums in lanes ----
// A block's int32 dot vector per (W row, x row) needs a conversion, a scale
// product and an FMA of its own: at one x row half of a block's port 0/1
// work. Two vphaddd fold 4 such vectors into one, lanes c0 c1 c2 c3 in each
// 128-bit half (the int32 sums are exact), so those three run once per block
// for 4 (W row, x row) pairs, on their 4 scale products side by side. Every
// pair's arithmetic is the same in whichever pass and lane it lands, so a
// row's result does not depend on the row count.
template <int kRows, int kW>
struct Pairs {
  static_assert(kW == 2 || kW == 4);
  static constexpr int kCount = kRows * kW, kGroups = (kCount + 3) / 4;
  // Pair p is x row p / kW against W row p % kW; the last group's spare
  // lanes repeat the last pair (their sums are dropped).
  static constexpr int Row(int p) { return (p < kCount ? p : kCount - 1) / kW; }
  static constexpr int W(int p) { return (p < kCount ? p : kCount - 1) % kW; }
};

template <class Format, int kRows, int kW>
inline void LaneUnit(const uint8_t* const (&w)[kW], const XRows<kRows>& x, int64_t i, int64_t at,
                     __m256 (&acc)[Pairs<kRows, kW>::kGroups]) {
  using P = Pairs<kRows, kW>;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i wv[kW], wabs[kW];
  int16_t half[kW];
  for (int f = 0; f < kW; ++f) {
    wv[f] = Format::Levels(w[f] + at);
    wabs[f] = _mm256_sign_epi8(wv[f], wv[f]);
    std::memcpy(&half[f], w[f] + at + Format::kScaleAt, sizeof(half[f]));
  }
  // Every group holds the W rows in the same lanes (4 % kW == 0).
  const __m128 ws =
      _mm_cvtph_ps(_mm_setr_epi16(half[P::W(0)], half[P::W(1)], half[P::W(2)], half[P::W(3)], 0, 0, 0, 0));
  __m128 mins = _mm_setzero_ps();
  if constexpr (Format::kMinAt >= 0) {
    int16_t m[kW];
    for (int f = 0; f < kW; ++f) std::memcpy(&m[f], w[f] + at + Format::kMinAt, sizeof(m[f]));
    mins = _mm_cvtph_ps(_mm_setr_epi16(m[P::W(0)], m[P::W(1)], m[P::W(2)], m[P::W(3)], 0, 0, 0, 0));
  }
#pragma GCC unroll 4
  for (int g = 0; g < P::kGroups; ++g) {
    __m256i dot[4];
    for (int q = 0; q < 4; ++q) {
      const int r = P::Row(4 * g + q), f = P::W(4 * g + q);
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.levels(r) + i));
      dot[q] = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[f], _mm256_sign_epi8(xv, wv[f])), ones);
    }
    const __m256i lanes = _mm256_hadd_epi32(_mm256_hadd_epi32(dot[0], dot[1]), _mm256_hadd_epi32(dot[2], dot[3]));
    // A group's x rows: one (kW = 4) or two (kW = 2: lanes 0-1, 2-3).
    __m128 xs = _mm_broadcast_ss(x.scales(P::Row(4 * g)) + i / 16);
    if constexpr (kW == 2) xs = _mm_blend_ps(xs, _mm_broadcast_ss(x.scales(P::Row(4 * g + 2)) + i / 16), 0b1100);
    const __m128 scales = _mm_mul_ps(ws, xs);
    acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set_m128(scales, scales), acc[g]);
    if constexpr (Format::kMinAt >= 0) {
      // Lane q (low half) is pair q: its W row's min times its x row's two
      // offsets of the block.
      auto block_offset = [&](int r) { return x.offsets(r)[i / 16] + x.offsets(r)[i / 16 + 1]; };
      __m128 xo = _mm_set1_ps(block_offset(P::Row(4 * g)));
      if constexpr (kW == 2) xo = _mm_blend_ps(xo, _mm_set1_ps(block_offset(P::Row(4 * g + 2))), 0b1100);
      acc[g] = _mm256_fmadd_ps(_mm256_zextps128_ps256(mins), _mm256_zextps128_ps256(xo), acc[g]);
    }
  }
}

// kW W rows (`rows`, a negative one repeats rows[0] and is dropped) against
// kRows x rows from r0, all of K (kAhead: PassWeights).
template <class Format, int kRows, int kW, bool kAhead>
void LanePass(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0,
              const int64_t (&rows)[kW]) {
  using P = Pairs<kRows, kW>;
  const PassWeights<kW, kAhead> wr(w, rows);
  const XRows<kRows> x{static_cast<const uint8_t*>(px.base) + r0 * px.stride, px.stride, px.scales_at, px.offsets_at};
  __m256 acc[P::kGroups];
  for (__m256& v : acc) v = _mm256_setzero_ps();
  for (int64_t u = 0; u < w.k / Format::kValues; ++u) {
    const int64_t at = u * Format::kBytes;
    wr.Prefetch(at, Format::kBytes);
    LaneUnit<Format, kRows, kW>(wr.rows, x, u * Format::kValues, at, acc);
  }
  alignas(32) float sums[P::kGroups][8];
  for (int g = 0; g < P::kGroups; ++g) _mm256_store_ps(sums[g], acc[g]);
  for (int p = 0; p < P::kCount; ++p) {
    const int64_t j = rows[P::W(p)];
    if (j < 0) continue;
    const float bias = a.bias != nullptr ? a.bias[j] : 0.0f;
    a.y[(r0 + P::Row(p)) * a.ldy + j] = sums[p / 4][p % 4] + sums[p / 4][p % 4 + 4] + bias;
  }
}

// ---- The passes over a slice ----

template <class Format, int kRows, int kW, bool kAhead>
void AnyPass(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0,
             const int64_t (&rows)[kW]) {
  if constexpr (Format::kIntScales) {
    Pass<Format, kRows, kW, kAhead>(w, a, px, r0, rows);
  } else {
    LanePass<Format, kRows, kW, kAhead>(w, a, px, r0, rows);
  }
}

// The slice cut into kW contiguous parts, a pass taking the next row of
// each: kW sequential streams, each prefetched ahead.
template <class Format, int kRows, int kW>
void SplitStreams(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  ForEachSplitStreamPass<kW>(a.n_begin, a.n_end,
                             [&](const int64_t(&rows)[kW]) { AnyPass<Format, kRows, kW, true>(w, a, px, r0, rows); });
}

// Adjacent W rows kW a pass, the next pass's rows prefetched.
template <class Format, int kRows, int kW>
void RowsBy(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  for (int64_t j0 = a.n_begin; j0 < a.n_end; j0 += kW) {
    int64_t rows[kW];
    for (int f = 0; f < kW; ++f) rows[f] = j0 + f < a.n_end ? j0 + f : -1;
    AnyPass<Format, kRows, kW, false>(w, a, px, r0, rows);
  }
}

template <class Format, int kRows>
void Rows(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  if constexpr (!Format::kIntScales) {
    // One x row: 4 split streams, one lane group a block.
    if constexpr (kRows == 1) return SplitStreams<Format, 1, 4>(w, a, px, r0);
    RowsBy<Format, kRows, 2>(w, a, px, r0);
  } else {
    // One x row: 2 split streams, faster than one W row at a time (one
    // stream) at every K-quant and shape measured, and than 4 streams
    // within noise (docs/BENCHMARKS.md, Other instruction sets).
    if constexpr (kRows == 1) return SplitStreams<Format, 1, 2>(w, a, px, r0);
    // 16 ymm registers: the kW x kRows int32 sums come first.
    constexpr int kW = kRows <= 2 ? 2 : 1;
    RowsBy<Format, kRows, kW>(w, a, px, r0);
  }
}

template <class Format>
void Run(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px) {
  for (int64_t r0 = 0; r0 < a.m; r0 += kInt8FusedRows) {
    switch (std::min<int64_t>(kInt8FusedRows, a.m - r0)) {
      case 1: Rows<Format, 1>(w, a, px, r0); break;
      case 2: Rows<Format, 2>(w, a, px, r0); break;
      case 3: Rows<Format, 3>(w, a, px, r0); break;
      case 4: Rows<Format, 4>(w, a, px, r0); break;
      case 5: Rows<Format, 5>(w, a, px, r0); break;
      case 6: Rows<Format, 6>(w, a, px, r0); break;
      case 7: Rows<Format, 7>(w, a, px, r0); break;
      default: Rows<Format, 8>(w, a, px, r0); break;
    }
  }
}

}  // namespace

bool Avx2Int8Fused(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& x) {
  // Group-major blocks are laid out for the VNNI kernel; the tile path
  // decodes them (a W in that order meets this kernel only under an ISA cap).
  if (w.order != BlockOrder::kGgml) return false;
  switch (w.dtype) {
    case DType::kQ8_0: Run<Q8_0Format>(w, a, x); return true;
    case DType::kQ4_0: Run<Q4_0Format>(w, a, x); return true;
    case DType::kQ5_0: Run<Q5_0Format>(w, a, x); return true;
    case DType::kQ4_1: Run<Q4_1Format>(w, a, x); return true;
    case DType::kQ5_1: Run<Q5_1Format>(w, a, x); return true;
    case DType::kQ4_K: Run<KFormat<false>>(w, a, x); return true;
    case DType::kQ5_K: Run<KFormat<true>>(w, a, x); return true;
    case DType::kQ6_K: Run<Q6KFormat>(w, a, x); return true;
    case DType::kQ3_K: Run<Q3KFormat>(w, a, x); return true;
    case DType::kQ2_K: Run<Q2KFormat>(w, a, x); return true;
    case DType::kIQ4_XS: Run<IQ4XSFormat>(w, a, x); return true;
    case DType::kIQ4_NL: Run<IQ4NLFormat>(w, a, x); return true;
    default: return false;
  }
}

}  // namespace tandem::isa
