// The fused int8_dot decode GEMV with AVX512-VNNI (linear_isa.h,
// Avx512VnniInt8Fused): W blocks are unpacked in registers and fed straight
// to vpdpbusd, so no decoded row is written to memory and read back (the
// tile path's round trip, which kept decode compute-bound). Compiled with
// AVX-512 F/BW/VL/DQ + VNNI flags; includes linear_isa.h and the plain block
// layouts of block_formats.h (structs and constants, no inline functions).
//
// One step is 64 values: a zmm of W levels (uint8) against a zmm of x levels
// (int8), 16 int32 lanes of 4 values each. A lane never spans two scale
// groups (16 or 32 values), so it is scaled by its W group scale times its
// x block scale in f32 and accumulated per (W row, x row).
//   - Q8_0, Q4_0 and Q5_0: a step is two blocks in x's plain order; their
//     constant shift (+128 to make Q8_0 unsigned, Q4_0's -8, Q5_0's -16) is vpdpbusd's start
//     value, -shift * the lane's sum of x levels, so each int32 lane is the
//     exact signed dot product; one conversion and FMA per step. Q4_1 and
//     Q5_1 (unshifted) add each block's min times x's prepared offsets.
//   - K-quants: x is group-major (lane l of every step of a block is in
//     group l), so a block's 4 steps sum in one int32 vector and take one
//     conversion and FMA per block; the mins (Q4_K, Q5_K) and Q6_K's -32
//     times the group scale come in as the 16 group offsets (dmin * min,
//     32 * scale: subtracted) times x's prepared offsets (its scale times
//     its sum of levels per group).
#include <immintrin.h>

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "common/kernels/linear_isa.h"
#include "common/quant/block_formats.h"

namespace tandem::isa {
namespace {

constexpr int64_t kStep = 64;  // values per vpdpbusd step

inline float HalfAt(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// A pass reads kW rows side by side, kW streams that each start cold: the
// hardware prefetcher learns a stream only after its first misses, and a
// software prefetch a fixed distance ahead in each row runs off the row's
// end into rows already read. So each step of adjacent rows (RowsBy)
// prefetches its share of the *next* pass's rows (contiguous after this
// pass's), one pass ahead in one sequential sweep, into L2 (a pass of K =
// 14336 Q6_K rows is 47 KB, L1's size). Measured against a prefetch ahead
// in each row and against the L1 hint, and as fast as the same blocks
// interleaved row by row at load.
//
// Passes over split streams (SplitStreams: each W row the next of its own
// contiguous part) are sequential, and the hardware prefetcher follows
// them, but not far enough ahead for a kernel that computes about as fast
// as DRAM streams: the first touch of each block stalled (a third of the
// Q4_K pass's samples in perf). Each step prefetches its own bytes
// kDecodePrefetchAheadBytes on in each stream into L1; the distance was
// chosen with the variants alternating call by call in one process
// (docs/BENCHMARKS.md, Decode GEMV).
enum class Prefetch { kNextPass, kAhead };

inline void PrefetchLines(const uint8_t* p, int64_t bytes) {
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + at, _MM_HINT_T1);
}

// One step's prefetches: its share of the next pass (kNextPass, `next` the
// next pass's first row), or each stream's bytes kDecodePrefetchAheadBytes
// on (kAhead; past a stream's end they fall in the next part or task, and
// never fault).
template <Prefetch kPrefetch, int kW>
inline void PrefetchStep(const uint8_t* const (&w)[kW], const uint8_t* next, int64_t at, int64_t bytes) {
  if constexpr (kPrefetch == Prefetch::kNextPass) {
    PrefetchLines(next + kW * at, kW * bytes);
  } else {
    for (int f = 0; f < kW; ++f)
      for (int64_t o = 0; o < bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w[f] + at + kDecodePrefetchAheadBytes + o), _MM_HINT_T0);
  }
}

// The 8 6-bit scales (bytes 0..7) and mins (8..15) of a Q4_K/Q5_K block's
// scales[12] (ggml's bit layout), for the blocks whose fields sit in the
// 128-bit lanes of `v` (bytes 12..15 of a lane ignored): one pass of
// in-lane shuffles, shifts and masks serves up to 4 W rows' blocks at once
// (a 4-row pass decoded them one xmm at a time, ~11 instructions per row
// and block, a quarter of the block's work). Dwords u0 u1 u2 of a field:
// scales 0-3 = u0 & 63, 4-7 = (u2 & 15) | (u0 >> 6) << 4; mins 0-3 = u1 &
// 63, 4-7 = (u2 >> 4) | (u1 >> 6) << 4, bytewise.
inline __m512i UnpackKScalesMins(__m512i v) {
  const __m512i low = _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_shuffle_epi32(v, _MM_PERM_CBCA), _mm512_set4_epi32(4, 0, 0, 0)),
      _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
  const __m512i high = _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_shuffle_epi32(v, _MM_PERM_BBAA), _mm512_set4_epi32(6, 0, 6, 0)),
      _mm512_set4_epi32(0x03030303, 0, 0x03030303, 0));
  return _mm512_or_si512(low, _mm512_slli_epi32(high, 4));
}

// 128-bit lane f of v (f a constant once the caller's loop is unrolled).
inline __m128i Lane(__m512i v, int f) {
  switch (f) {
    case 0: return _mm512_castsi512_si128(v);
    case 1: return _mm512_extracti32x4_epi32(v, 1);
    case 2: return _mm512_extracti32x4_epi32(v, 2);
    default: return _mm512_extracti32x4_epi32(v, 3);
  }
}

// ---- Formats: how one unit (64 values of a 32-value type, one 256-value
// K-quant block) gives its steps' levels and lane scales ----

// Q8_0 and Q4_0: a unit is two blocks; a row whose K is an odd number of
// blocks ends in a half unit (upper lanes zero, the second block unread).
// kScaleAt: where a block's f16 scale sits (UnitScales reads it).
struct Q8_0Format {
  static constexpr int64_t kValues = 64, kBlockBytes = sizeof(BlockQ8_0), kBytes = 2 * kBlockBytes;
  static constexpr int64_t kScaleAt = offsetof(BlockQ8_0, d);
  static constexpr int64_t kMinAt = -1;  // no min
  static constexpr int kShift = 128;  // levels stored +128 for vpdpbusd's unsigned side
  static constexpr bool kGroupMajor = false;
  static constexpr bool kFifthBit = false;
  static __m512i Levels(const uint8_t* unit, bool half) {
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + offsetof(BlockQ8_0, qs)));
    const __m256i hi =
        half ? _mm256_set1_epi8(static_cast<char>(0x80))
             : _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + sizeof(BlockQ8_0) + offsetof(BlockQ8_0, qs)));
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1),
                            _mm512_set1_epi8(static_cast<char>(0x80)));
  }
};

// Two 32-value blocks' nibbles (a block's 16 bytes hold values 0..15 in
// low nibbles, 16..31 in high ones) as a step's 64 levels: each block's bytes
// go to two 128-bit lanes, the second shifted. `second` null: zeros.
inline __m512i NibbleLevels(const uint8_t* first, const uint8_t* second) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first));
  const __m128i b = second == nullptr ? _mm_setzero_si128() : _mm_loadu_si128(reinterpret_cast<const __m128i*>(second));
  const __m512i ab = _mm512_castsi256_si512(_mm256_set_m128i(b, a));
  const __m512i spread = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), ab);
  const __m512i shifted = _mm512_srlv_epi16(spread, _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0,
                                                                      0, 0x0004000400040004, 0x0004000400040004));
  return _mm512_and_si512(shifted, _mm512_set1_epi8(0x0f));
}

struct Q4_0Format {
  static constexpr int64_t kValues = 64, kBlockBytes = sizeof(BlockQ4_0), kBytes = 2 * kBlockBytes;
  static constexpr int64_t kScaleAt = offsetof(BlockQ4_0, d);
  static constexpr int64_t kMinAt = -1;  // no min
  static constexpr int kShift = 8;
  static constexpr bool kGroupMajor = false;
  static constexpr bool kFifthBit = false;
  static __m512i Levels(const uint8_t* unit, bool half) {
    constexpr int64_t qs = offsetof(BlockQ4_0, qs);
    return NibbleLevels(unit + qs, half ? nullptr : unit + sizeof(BlockQ4_0) + qs);
  }
};

// Two blocks of a 5-bit type (Q5_0, Q5_1): the nibbles plus bit v of each
// block's little-endian qh as 16 for value v (levels 0..31); the two
// blocks' qh make one 64-bit mask of the step's bytes.
template <class Block>
inline __m512i FifthBitLevels(const uint8_t* unit, bool half) {
  constexpr int64_t qs = offsetof(Block, qs);
  const __m512i nibbles = NibbleLevels(unit + qs, half ? nullptr : unit + sizeof(Block) + qs);
  uint32_t qh_a, qh_b = 0;
  std::memcpy(&qh_a, unit + offsetof(Block, qh), sizeof(qh_a));
  if (!half) std::memcpy(&qh_b, unit + sizeof(Block) + offsetof(Block, qh), sizeof(qh_b));
  const __mmask64 fifth = _cvtu64_mask64(uint64_t{qh_a} | uint64_t{qh_b} << 32);
  return _mm512_or_si512(nibbles, _mm512_maskz_mov_epi8(fifth, _mm512_set1_epi8(0x10)));
}

// Q5_0: Q4_0's nibbles (the same byte order) plus a fifth bit per value,
// bit v of the block's little-endian qh for value v, as 16: levels 0..31,
// shift 16. The two blocks' qh make one 64-bit mask of the step's bytes.
// (llama.cpp's Q4_K_M and Q5_K_M files hold the rows that are not whole
// 256-value blocks in Q5_0: Qwen1.5-MoE's 1408-wide down_proj.)
struct Q5_0Format {
  static constexpr int64_t kValues = 64, kBlockBytes = sizeof(BlockQ5_0), kBytes = 2 * kBlockBytes;
  static constexpr int64_t kScaleAt = offsetof(BlockQ5_0, d);
  static constexpr int64_t kMinAt = -1;  // no min
  static constexpr int kShift = 16;
  static constexpr bool kGroupMajor = false;
  static constexpr bool kFifthBit = false;  // (Q5_K's register pressure; the mask costs none)
  static __m512i Levels(const uint8_t* unit, bool half) { return FifthBitLevels<BlockQ5_0>(unit, half); }
};

// Q4_1 and Q5_1: Q4_0's and Q5_0's levels unshifted (0..15, 0..31) and a
// min per block, which comes in through x's prepared offsets (its scale
// times its sum of levels per 16 values): y += m * x offsets. (llama.cpp's
// Q5_K_M files hold the rows that are not whole 256-value blocks in Q5_1.)
struct Q4_1Format {
  static constexpr int64_t kValues = 64, kBlockBytes = sizeof(BlockQ4_1), kBytes = 2 * kBlockBytes;
  static constexpr int64_t kScaleAt = offsetof(BlockQ4_1, d);
  static constexpr int64_t kMinAt = offsetof(BlockQ4_1, m);
  static constexpr int kShift = 0;
  static constexpr bool kGroupMajor = false;
  static constexpr bool kFifthBit = false;
  static __m512i Levels(const uint8_t* unit, bool half) {
    constexpr int64_t qs = offsetof(BlockQ4_1, qs);
    return NibbleLevels(unit + qs, half ? nullptr : unit + sizeof(BlockQ4_1) + qs);
  }
};

struct Q5_1Format {
  static constexpr int64_t kValues = 64, kBlockBytes = sizeof(BlockQ5_1), kBytes = 2 * kBlockBytes;
  static constexpr int64_t kScaleAt = offsetof(BlockQ5_1, d);
  static constexpr int64_t kMinAt = offsetof(BlockQ5_1, m);
  static constexpr int kShift = 0;
  static constexpr bool kGroupMajor = false;
  static constexpr bool kFifthBit = false;
  static __m512i Levels(const uint8_t* unit, bool half) { return FifthBitLevels<BlockQ5_1>(unit, half); }
};

// The f16 scales of a unit's two blocks in kW <= 4 W rows, converted in
// one instruction: row f's block b at lane 4 (f / 2) + 2 b + f % 2, so that
// x's two block scales as stored ([s0 s0 s1 s1], one per 16 values)
// broadcast to both 128-bit halves line up with them. Packed in general
// registers, off the vector pipes: two conversions, two broadcasts and a
// blend per W row were half of a Q8_0 pass's vector instructions, and a
// Q8_0 decode pass that computes barely faster than DRAM streams shows
// every instruction.
// (`kField`: the f16 field read, the scale; the min's for Q4_1 and Q5_1.)
template <class Format, int kW, int64_t kField = Format::kScaleAt>
inline __m256 UnitScales(const uint8_t* const (&w)[kW], int64_t at, bool half) {
  static_assert(kW <= 4);
  uint64_t packed[2] = {0, 0};
  for (int f = 0; f < kW; ++f) {
    for (int b = 0; b < (half ? 1 : 2); ++b) {
      uint16_t h;
      std::memcpy(&h, w[f] + at + b * Format::kBlockBytes + kField, sizeof(h));
      packed[f / 2] |= uint64_t{h} << (16 * (2 * b + f % 2));
    }
  }
  return _mm256_cvtph_ps(_mm_set_epi64x(static_cast<int64_t>(packed[1]), static_cast<int64_t>(packed[0])));
}

// Row f's lanes of UnitScales: its first block's in lanes 0..7, its
// second's in 8..15 (the two 32-value halves of a step).
inline __m512i UnitScaleLanes(int f) {
  const int first = 4 * (f / 2) + f % 2;
  return _mm512_mask_blend_epi32(0xff00, _mm512_set1_epi32(first), _mm512_set1_epi32(first + 2));
}

// K-quants read x group-major (linear_isa.h): lane l of step s holds
// values 16l + 4s .. 16l + 4s + 3 of the 256-value block, so every lane of
// every step of a block belongs to one 16-value group, the lane's. The int32
// lanes of a block's 4 steps then share their scales and are summed by
// vpdpbusd itself: one conversion and one FMA per block instead of per step.
// Decode gives the 4 steps' levels in that order, each group's scale and
// offset. `Dwords(base, s)`: lane l's source dword for step s is
// base[l] + s.
inline __m512i Dwords(const int (&base)[16], int s) {
  return _mm512_add_epi32(
      _mm512_setr_epi32(base[0], base[1], base[2], base[3], base[4], base[5], base[6], base[7], base[8], base[9],
                        base[10], base[11], base[12], base[13], base[14], base[15]),
      _mm512_set1_epi32(s));
}

// Q4_K and Q5_K: group l is half l % 2 of sub-block l / 2, whose levels are
// the low (sub-block even) or high nibbles of 64-value chunk l / 4's 32
// bytes; Q5_K adds bit l / 2 of the value's qh byte as 16. Q4_K blocks in
// group-major order (block_order.h) hold step s's levels as they are used:
// the low (s even) or high nibbles of qs' 64-byte half s / 2.
template <bool kWithFifthBit, BlockOrder kOrder = BlockOrder::kGgml>
struct KFormat {
  static constexpr bool kFifthBit = kWithFifthBit;
  using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
  static constexpr int64_t kBytes = sizeof(Block);
  static constexpr bool kGroupMajor = true;
  // The scale fields of kW blocks (one per W row), unpacked in one pass.
  template <int kW>
  static void DecodeScales(const uint8_t* const (&blocks)[kW], __m512 (&scales)[kW], __m512 (&offsets)[kW]) {
    static_assert(kW <= 4 && offsetof(Block, dmin) == offsetof(Block, d) + 2);
    // 16 bytes from each field (its 12 and the first 4 of qs, ignored), and
    // each block's d and dmin (adjacent halves) as one dword: one
    // conversion for all kW rows' pairs rather than two scalar ones a row
    // (measured faster in cache, the same bits).
    __m512i v = _mm512_setzero_si512();
    int32_t pairs[4] = {0, 0, 0, 0};
    for (int f = 0; f < kW; ++f) {
      const __m128i field = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[f] + offsetof(Block, scales)));
      v = _mm512_mask_broadcast_i32x4(v, static_cast<__mmask16>(0xf << (4 * f)), field);
      std::memcpy(&pairs[f], blocks[f] + offsetof(Block, d), sizeof(pairs[f]));
    }
    const __m512i unpacked = UnpackKScalesMins(v);
    // d0 dmin0 d1 dmin1 ... (_mm_setr_epi32, not _mm_insert_epi32: clang
    // wants the insert's lane as a literal even in an unrolled loop).
    const __m512 d_dmin =
        _mm512_zextps256_ps512(_mm256_cvtph_ps(_mm_setr_epi32(pairs[0], pairs[1], pairs[2], pairs[3])));
    for (int f = 0; f < kW; ++f) {
      // (maskz forms: GCC 12 warns about the undefined source of the plain
      // ones here, its bug 105593.)
      const __m512 sm = _mm512_maskz_cvtepi32_ps(
          0xffff, _mm512_maskz_cvtepu8_epi32(0xffff, Lane(unpacked, f)));
      // Lanes 0..7: d * scale of each sub-block; 8..15: dmin * min.
      const __m512 scaled = _mm512_mul_ps(
          sm, _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set1_epi32(2 * f),  // row f's d, then its dmin
                                                     _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)),
                                    d_dmin));
      scales[f] = _mm512_maskz_permutexvar_ps(0xffff, _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                              scaled);
      offsets[f] = _mm512_maskz_permutexvar_ps(
          0xffff, _mm512_setr_epi32(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15), scaled);
    }
  }
  static void DecodeLevels(const uint8_t* block, __m512i (&levels)[4]) {
    if constexpr (kOrder == BlockOrder::kGroupMajor) {
      static_assert(!kFifthBit, "Q5_K has no group-major order");
      const __m512i low4 = _mm512_set1_epi8(0x0f);
      for (int half = 0; half < 2; ++half) {
        const __m512i q = _mm512_loadu_si512(block + offsetof(Block, qs) + 64 * half);
        levels[2 * half] = _mm512_and_si512(q, low4);
        levels[2 * half + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), low4);
      }
      return;
    }
    static constexpr int kQs[16] = {0, 4, 0, 4, 8, 12, 8, 12, 16, 20, 16, 20, 24, 28, 24, 28};
    const __m512i nibble = _mm512_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4, 0, 0, 4, 4);
    const __m512i q0 = _mm512_loadu_si512(block + offsetof(Block, qs));
    const __m512i q1 = _mm512_loadu_si512(block + offsetof(Block, qs) + 64);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    for (int s = 0; s < 4; ++s)
      levels[s] = _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutex2var_epi32(q0, Dwords(kQs, s), q1), nibble), low4);
    if constexpr (kFifthBit) {
      static constexpr int kQh[16] = {0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4};
      const __m512i bit = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
      const __m512i qh =
          _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + offsetof(Block, qh))));
      for (int s = 0; s < 4; ++s) {
        const __m512i h =
            _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(Dwords(kQh, s), qh), bit), _mm512_set1_epi8(1));
        levels[s] = _mm512_or_si512(levels[s], _mm512_slli_epi32(h, 4));
      }
    }
  }
};

// Q6_K: group l is quarter (l % 8) / 2 of 128-value half l / 8, second
// 16 values when l is odd; its 4 low bits are ql's low (quarters 0, 1) or
// high nibbles (2, 3), its 2 high bits qh's bits 2q, 2q + 1. Group scales
// are the int8 scales[l] times d, offsets 32 times those (subtracted). In
// group-major order (block_order.h) ql is laid out as group-major Q4_K's
// qs and qh's byte 4l + j holds the two high bits of lane l's value j of
// step s at bits 2s, 2s + 1: shifting them to bits 4-5 and one select
// with the low bits replace the permutes.
template <BlockOrder kOrder = BlockOrder::kGgml>
struct Q6KFormat {
  static constexpr int64_t kBytes = sizeof(BlockQ6_K);
  static constexpr bool kGroupMajor = true;
  static constexpr bool kFifthBit = false;
  template <int kW>
  static void DecodeScales(const uint8_t* const (&blocks)[kW], __m512 (&scales)[kW], __m512 (&offsets)[kW]) {
    for (int f = 0; f < kW; ++f) {
      const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks[f] + offsetof(BlockQ6_K, scales)));
      scales[f] = _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, _mm512_maskz_cvtepi8_epi32(0xffff, sc)),
                                _mm512_set1_ps(HalfAt(blocks[f] + offsetof(BlockQ6_K, d))));
      offsets[f] = _mm512_mul_ps(scales[f], _mm512_set1_ps(32.0f));
    }
  }
  static void DecodeLevels(const uint8_t* block, __m512i (&levels)[4]) {
    if constexpr (kOrder == BlockOrder::kGroupMajor) {
      const __m512i q0 = _mm512_loadu_si512(block + offsetof(BlockQ6_K, ql));
      const __m512i q1 = _mm512_loadu_si512(block + offsetof(BlockQ6_K, ql) + 64);
      const __m512i qh = _mm512_loadu_si512(block + offsetof(BlockQ6_K, qh));
      const __m512i low4 = _mm512_set1_epi8(0x0f), six = _mm512_set1_epi8(0x3f);
      // 16-bit shifts: a byte's bits 4-5 come from its own bits (the
      // neighbour's that cross in land in bits 0-3 or 6-7, masked away).
      const __m512i high[4] = {_mm512_slli_epi16(qh, 4), _mm512_slli_epi16(qh, 2), qh, _mm512_srli_epi16(qh, 2)};
      const __m512i low[4] = {q0, _mm512_srli_epi16(q0, 4), q1, _mm512_srli_epi16(q1, 4)};
      // (0xca: low4 ? low : high, bitwise), then six bits.
      for (int s = 0; s < 4; ++s)
        levels[s] = _mm512_and_si512(_mm512_ternarylogic_epi32(low4, low[s], high[s], 0xca), six);
      return;
    }
    static constexpr int kQl[16] = {0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28};
    static constexpr int kQh[16] = {0, 4, 0, 4, 0, 4, 0, 4, 8, 12, 8, 12, 8, 12, 8, 12};
    const __m512i nibble = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    // Rotating qh's dword left by 4 - 2q brings bits 2q, 2q + 1 of every byte to its bits 4, 5.
    const __m512i rotate = _mm512_setr_epi32(4, 4, 2, 2, 0, 0, 30, 30, 4, 4, 2, 2, 0, 0, 30, 30);
    const __m512i ql0 = _mm512_loadu_si512(block + offsetof(BlockQ6_K, ql));
    const __m512i ql1 = _mm512_loadu_si512(block + offsetof(BlockQ6_K, ql) + 64);
    const __m512i qh = _mm512_loadu_si512(block + offsetof(BlockQ6_K, qh));
    for (int s = 0; s < 4; ++s) {
      const __m512i low = _mm512_srlv_epi32(_mm512_permutex2var_epi32(ql0, Dwords(kQl, s), ql1), nibble);
      const __m512i high = _mm512_rolv_epi32(_mm512_permutexvar_epi32(Dwords(kQh, s), qh), rotate);
      // Bits 0-3 from `low`, 4-5 from `high` (0xca: mask ? low : high), then 6 bits.
      levels[s] =
          _mm512_and_si512(_mm512_ternarylogic_epi32(_mm512_set1_epi8(0x0f), low, high, 0xca), _mm512_set1_epi8(0x3f));
    }
  }
};

// ---- The driver: kW W rows against kRows x rows, all of K in registers ----

// (Not _mm512_reduce_add_ps: GCC 12 warns about the undefined vector inside it.)
inline float Sum(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
  return _mm_cvtss_f32(s4);
}

// The x rows of one pass, each section's start.
template <int kRows>
struct XRows {
  const int8_t* levels[kRows];
  const float* scales[kRows];
  const float* offsets[kRows];
};

// A 32-value type with a min per block (Q4_1, Q5_1).
template <class Format>
constexpr bool HasMin() {
  if constexpr (Format::kGroupMajor) {
    return false;
  } else {
    return Format::kMinAt >= 0;
  }
}

// One unit of a 32-value type (at value `i`, byte `at` of each W row) into
// the accumulators.
template <class Format, int kRows, int kW, Prefetch kPrefetch>
inline void Unit(const uint8_t* const (&w)[kW], const uint8_t* next, const XRows<kRows>& x, int64_t i, int64_t at,
                 bool half, __m512 (&acc)[kW][kRows], __m256 (&min_acc)[kRows]) {
  PrefetchStep<kPrefetch, kW>(w, next, at, Format::kBytes);
  const __m256 w_scales = UnitScales<Format, kW>(w, at, half);
  __m256 w_mins = _mm256_setzero_ps();
  if constexpr (Format::kMinAt >= 0) w_mins = UnitScales<Format, kW, Format::kMinAt>(w, at, half);
  __m512i wv[kW];
  for (int f = 0; f < kW; ++f) wv[f] = Format::Levels(w[f] + at, half);
  for (int r = 0; r < kRows; ++r) {
    const __m512i xv =
        half ? _mm512_maskz_loadu_epi8(0xffffffffULL, x.levels[r] + i) : _mm512_loadu_si512(x.levels[r] + i);
    // x's two 32-value block scales as stored (a half step reads only the first's).
    const float* xsp = x.scales[r] + i / 16;
    const __m128 xs = half ? _mm_maskz_loadu_ps(0x3, xsp) : _mm_loadu_ps(xsp);
    const __m512 scales = _mm512_zextps256_ps512(_mm256_mul_ps(w_scales, _mm256_set_m128(xs, xs)));
    __m512i start = _mm512_setzero_si512();
    if constexpr (Format::kShift != 0) {
      // -shift * (sum of the lane's 4 x levels); |x level| <= 127, so negating is exact.
      start = _mm512_dpbusd_epi32(start, _mm512_set1_epi8(static_cast<char>(Format::kShift)),
                                  _mm512_sub_epi8(_mm512_setzero_si512(), xv));
    }
    for (int f = 0; f < kW; ++f) {
      const __m512i dot = _mm512_dpbusd_epi32(start, wv[f], xv);
      acc[f][r] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(UnitScaleLanes(f), scales), acc[f][r]);
    }
    if constexpr (Format::kMinAt >= 0) {
      // Each block's min (UnitScales' lanes) times x's sum of offsets over
      // that block (s0 s0 s1 s1 | s0 s0 s1 s1): one FMA for all kW rows.
      const float* xop = x.offsets[r] + i / 16;
      const __m128 xo = half ? _mm_maskz_loadu_ps(0x3, xop) : _mm_loadu_ps(xop);
      const __m128 sums = _mm_hadd_ps(xo, xo);
      const __m128 per_lane = _mm_shuffle_ps(sums, sums, _MM_SHUFFLE(1, 1, 0, 0));
      min_acc[r] = _mm256_fmadd_ps(w_mins, _mm256_set_m128(per_lane, per_lane), min_acc[r]);
    }
  }
}

// One K-quant block (at value `i`, byte `at` of each W row): per (W row, x
// row) 4 vpdpbusd into one int32 vector, then its groups' scales and offsets.
template <class Format, int kRows, int kW, Prefetch kPrefetch>
inline void Block(const uint8_t* const (&w)[kW], const uint8_t* next, const XRows<kRows>& x, int64_t i, int64_t at,
                  __m512 (&acc)[kW][kRows]) {
  PrefetchStep<kPrefetch, kW>(w, next, at, Format::kBytes);
  const uint8_t* blocks[kW];
  for (int f = 0; f < kW; ++f) blocks[f] = w[f] + at;
  __m512i levels[kW][4];
  __m512 scales[kW], offsets[kW];
  Format::template DecodeScales<kW>(blocks, scales, offsets);
  for (int f = 0; f < kW; ++f) Format::DecodeLevels(blocks[f], levels[f]);
  for (int r = 0; r < kRows; ++r) {
    const __m512 xs = _mm512_loadu_ps(x.scales[r] + i / 16);
    const __m512 xo = _mm512_loadu_ps(x.offsets[r] + i / 16);
    for (int f = 0; f < kW; ++f) {
      __m512i dot = _mm512_setzero_si512();
      for (int s = 0; s < 4; ++s)
        dot = _mm512_dpbusd_epi32(dot, levels[f][s], _mm512_loadu_si512(x.levels[r] + i + kStep * s));
      acc[f][r] = _mm512_fnmadd_ps(offsets[f], xo, acc[f][r]);  // the same bits as adding -offsets * xo
      acc[f][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(scales[f], xs), acc[f][r]);
    }
  }
}

// kW W rows (the slice's rows `rows[f]`; a negative one repeats rows[0]
// and its sums are dropped) against kRows x rows from r0, all of K.
// kPrefetch: kNextPass when the rows are adjacent and the next pass's kW
// rows follow them, kAhead when each is the next of its own stream.
template <class Format, int kRows, int kW, Prefetch kPrefetch>
void Pass(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0,
          const int64_t (&rows)[kW]) {
  const int64_t row_bytes = w.row_bytes();
  const uint8_t* const data = static_cast<const uint8_t*>(w.data);
  const uint8_t* wrows[kW];
  for (int f = 0; f < kW; ++f) wrows[f] = data + (rows[f] >= 0 ? rows[f] : rows[0]) * row_bytes;
  // Prefetches never fault, so past the slice or W's end they are only wasted.
  const uint8_t* next = kPrefetch == Prefetch::kNextPass ? data + (rows[0] + kW) * row_bytes : nullptr;
  XRows<kRows> x;
  for (int r = 0; r < kRows; ++r) {
    const uint8_t* base = static_cast<const uint8_t*>(px.base) + (r0 + r) * px.stride;
    x.levels[r] = reinterpret_cast<const int8_t*>(base);
    x.scales[r] = reinterpret_cast<const float*>(base + px.scales_at);
    x.offsets[r] = reinterpret_cast<const float*>(base + px.offsets_at);
  }
  __m512 acc[kW][kRows];
  for (int f = 0; f < kW; ++f)
    for (int r = 0; r < kRows; ++r) acc[f][r] = _mm512_setzero_ps();
  __m256 min_acc[kRows];  // Q4_1/Q5_1: the blocks' mins times x's offsets
  for (__m256& v : min_acc) v = _mm256_setzero_ps();
  if constexpr (Format::kGroupMajor) {
    for (int64_t b = 0; b < w.k / kKBlockSize; ++b)
      Block<Format, kRows, kW, kPrefetch>(wrows, next, x, b * kKBlockSize, b * Format::kBytes, acc);
  } else {
    const int64_t units = w.k / Format::kValues;
    for (int64_t u = 0; u < units; ++u)
      Unit<Format, kRows, kW, kPrefetch>(wrows, next, x, u * Format::kValues, u * Format::kBytes, false, acc, min_acc);
    if (w.k % Format::kValues != 0)
      Unit<Format, kRows, kW, kPrefetch>(wrows, next, x, units * Format::kValues, units * Format::kBytes, true, acc,
                                         min_acc);
  }
  alignas(32) float mins[kRows][8];
  if constexpr (HasMin<Format>())
    for (int r = 0; r < kRows; ++r) _mm256_store_ps(mins[r], min_acc[r]);
  for (int f = 0; f < kW; ++f) {
    if (rows[f] < 0) continue;
    const float bias = a.bias != nullptr ? a.bias[rows[f]] : 0.0f;
    const int lane = 4 * (f / 2) + f % 2;  // row f's first block's (UnitScales); its second's is lane + 2
    for (int r = 0; r < kRows; ++r) {
      float sum = Sum(acc[f][r]);
      if constexpr (HasMin<Format>()) sum += mins[r][lane] + mins[r][lane + 2];
      a.y[(r0 + r) * a.ldy + rows[f]] = sum + bias;
    }
  }
}

// The slice's W rows kW at a time, adjacent rows a pass, the next pass's
// rows prefetched (several x rows: Rows).
template <class Format, int kRows, int kW>
void RowsBy(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  for (int64_t j0 = a.n_begin; j0 < a.n_end; j0 += kW) {
    int64_t rows[kW];
    for (int f = 0; f < kW; ++f) rows[f] = j0 + f < a.n_end ? j0 + f : -1;
    Pass<Format, kRows, kW, Prefetch::kNextPass>(w, a, px, r0, rows);
  }
}

// The slice cut into kW contiguous parts, a pass taking the next row of
// each: kW sequential streams, each prefetched kDecodePrefetchAheadBytes
// ahead (Prefetch::kAhead), and each x load serves kW W rows. One W row at a time (one
// stream) re-reads x, 1.5 B a value with its group scales and offsets (21 KB
// at K = 14336), for every W row, and x loses its place in L1 to the
// stream (with x's K cut short, the same W stream read much faster).
// Adjacent W rows a pass share x but are short streams the prefetcher
// loses. Split streams read faster than either at every type and shape
// measured (docs/BENCHMARKS.md, Decode GEMV).
template <class Format, int kRows, int kW>
void SplitStreams(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  ForEachSplitStreamPass<kW>(a.n_begin, a.n_end, [&](const int64_t(&rows)[kW]) {
    Pass<Format, kRows, kW, Prefetch::kAhead>(w, a, px, r0, rows);
  });
}

template <class Format, int kRows>
void Rows(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  // Fewer x rows leave registers for more W rows (more loads in flight); a
  // K-quant block holds 4 level vectors per W row.
  constexpr int kW = Format::kGroupMajor ? (kRows == 1 ? 4 : 2) : (kRows <= 2 ? 4 : 2);
  // One x row (decode) always reads split streams. Q5_K's 4-row pass spills
  // its fifth bits' registers: at K <= kInt8OneRowMaxK, where x stays in L1
  // anyway, 2 streams compute faster than 4 (and than one row at a time).
  // Two x rows read split streams while both fit in L1 beside them (K <=
  // kInt8OneRowMaxK; past it, at K = 14336, they were slower than adjacent
  // rows); more rows are compute-bound, and adjacent rows with the next
  // pass prefetched are faster there. Each choice measured in one process
  // (docs/BENCHMARKS.md, Decode GEMV).
  if constexpr (kRows == 1) {
    if (Format::kFifthBit && w.k <= kInt8OneRowMaxK) return SplitStreams<Format, 1, 2>(w, a, px, r0);
    return SplitStreams<Format, 1, kW>(w, a, px, r0);
  } else {
    if constexpr (kRows == 2) {
      if (w.k <= kInt8OneRowMaxK) return SplitStreams<Format, 2, kW>(w, a, px, r0);
    }
    RowsBy<Format, kRows, kW>(w, a, px, r0);
  }
}

template <class Format>
void Run(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px) {
  for (int64_t r0 = 0; r0 < a.m; r0 += kInt8FusedRows) {
    switch (a.m - r0 < kInt8FusedRows ? a.m - r0 : kInt8FusedRows) {
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

bool Avx512VnniInt8Fused(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& x) {
  switch (w.dtype) {
    case DType::kQ8_0: Run<Q8_0Format>(w, a, x); return true;
    case DType::kQ4_0: Run<Q4_0Format>(w, a, x); return true;
    case DType::kQ5_0: Run<Q5_0Format>(w, a, x); return true;
    case DType::kQ4_1: Run<Q4_1Format>(w, a, x); return true;
    case DType::kQ5_1: Run<Q5_1Format>(w, a, x); return true;
    case DType::kQ4_K:
      if (w.order == BlockOrder::kGroupMajor)
        Run<KFormat<false, BlockOrder::kGroupMajor>>(w, a, x);
      else
        Run<KFormat<false>>(w, a, x);
      return true;
    case DType::kQ5_K: Run<KFormat<true>>(w, a, x); return true;
    case DType::kQ6_K:
      if (w.order == BlockOrder::kGroupMajor)
        Run<Q6KFormat<BlockOrder::kGroupMajor>>(w, a, x);
      else
        Run<Q6KFormat<>>(w, a, x);
      return true;
    default: return false;
  }
}

}  // namespace tandem::isa
