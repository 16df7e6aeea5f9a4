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
// The K-quants (Q4_K, Q5_K, Q6_K) fold their sub-block scales into
// vpmaddwd, which then costs nothing extra, and their x has one scale per
// 256-value block (as llama.cpp's q8_K): a step is vpmaddubsw, vpmaddwd and
// vpaddd per (W row, x row), and the block's int32 sum takes one conversion
// and one FMA by `d` times x's scale (docs/BENCHMARKS.md, Other
// instruction sets). Q8_0 and Q4_0 scale every 32 values: a
// conversion and an FMA by the product of the two scales per step.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "common/kernels/linear_isa.h"
#include "common/quant/block_formats.h"

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

// One W row at a time (decode's one x row) is one sequential stream; each
// step prefetches its own bytes kDecodePrefetchAheadBytes on into L1
// (linear_isa.h): faster on the small model's short rows, level elsewhere
// (the GEMV bench capped at AVX2, builds alternating; docs/BENCHMARKS.md,
// Decode GEMV).

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
  static constexpr int kSteps = 1;
  static constexpr bool kOffsets = false, kIntScales = false;
  struct State {
    __m256 scale;
  };
  static State Begin(const uint8_t* block) { return {_mm256_set1_ps(HalfAt(block + offsetof(BlockQ8_0, d)))}; }
  static __m256i Levels(const uint8_t* block, int) { return Load32(block + offsetof(BlockQ8_0, qs)); }
  static __m256 Scales(const State& s, int) { return s.scale; }
  static void Offsets(const State&, __m256 (&)[2]) {}
};

// A 32-value block's 16 bytes of nibbles as its levels 0..15: values 0..15
// are the low nibbles, 16..31 the high ones.
inline __m256i NibbleLevels(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0f));
}

struct Q4_0Format {
  static constexpr int64_t kValues = kQ4_0BlockSize, kBytes = sizeof(BlockQ4_0);
  static constexpr int kSteps = 1;
  static constexpr bool kOffsets = false, kIntScales = false;
  using State = Q8_0Format::State;
  static State Begin(const uint8_t* block) { return {_mm256_set1_ps(HalfAt(block + offsetof(BlockQ4_0, d)))}; }
  static __m256i Levels(const uint8_t* block, int) {
    return _mm256_sub_epi8(NibbleLevels(block + offsetof(BlockQ4_0, qs)), _mm256_set1_epi8(8));
  }
  static __m256 Scales(const State& s, int) { return s.scale; }
  static void Offsets(const State&, __m256 (&)[2]) {}
};

// Q5_0: Q4_0's nibbles plus bit v of the block's little-endian qh as 16 for
// value v; minus 16. The 32 bits become 32 bytes by one shuffle, an OR and a
// compare (byte v all ones where bit v is set).
struct Q5_0Format {
  static constexpr int64_t kValues = kQ5_0BlockSize, kBytes = sizeof(BlockQ5_0);
  static constexpr int kSteps = 1;
  static constexpr bool kOffsets = false, kIntScales = false;
  using State = Q8_0Format::State;
  static State Begin(const uint8_t* block) { return {_mm256_set1_ps(HalfAt(block + offsetof(BlockQ5_0, d)))}; }
  static __m256i Levels(const uint8_t* block, int) {
    const __m256i nibbles = NibbleLevels(block + offsetof(BlockQ5_0, qs));
    uint32_t qh;
    std::memcpy(&qh, block + offsetof(BlockQ5_0, qh), sizeof(qh));
    // Byte v gets qh's byte v / 8, then all bits but bit v % 8 set.
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                                               _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                                 0x0101010101010101, 0x0000000000000000));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)),
                                          _mm256_set1_epi64x(-1));
    const __m256i levels = _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
    return _mm256_sub_epi8(levels, _mm256_set1_epi8(16));
  }
  static __m256 Scales(const State& s, int) { return s.scale; }
  static void Offsets(const State&, __m256 (&)[2]) {}
};

// Q4_K and Q5_K: step j is sub-block j: the low (j even) or high nibbles of
// the 32 bytes of chunk j/2, plus bit j of qh as 16 for Q5_K.
template <bool kFifthBit>
struct KFormat {
  using Block = std::conditional_t<kFifthBit, BlockQ5_K, BlockQ4_K>;
  static constexpr int64_t kValues = kKBlockSize, kBytes = sizeof(Block);
  static constexpr int kSteps = kKBlockSize / kStep;
  static constexpr bool kOffsets = true, kIntScales = true;
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

// Q6_K: step s is quarter s % 4 of 128-value half s / 4 (see the VNNI
// kernel); lanes 0..3 are group 2s, 4..7 group 2s + 1. Its signed 8-bit
// group scales fold into vpmaddwd as KFormat's do (pshufb cannot
// sign-extend: it puts each scale in its int16's high byte and an
// arithmetic shift brings it down), and x has one scale per block as for
// Q4_K (|pair| <= 2 * 63 * 127, times 2 * 128 per step, 8 steps: < 2^26).
struct Q6KFormat {
  static constexpr int64_t kValues = kKBlockSize, kBytes = sizeof(BlockQ6_K);
  static constexpr int kSteps = kKBlockSize / kStep;
  static constexpr bool kOffsets = true, kIntScales = true;
  struct State {
    __m256i scales;  // the 16 group scales in each 128-bit lane
    __m256 d;
    __m256 offsets[2];  // -32 * d * scale of groups 0..7, 8..15
  };
  static State Begin(const uint8_t* block) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + offsetof(BlockQ6_K, scales)));
    const float d = HalfAt(block + offsetof(BlockQ6_K, d));
    const __m256 minus32d = _mm256_set1_ps(-32.0f * d);
    return {_mm256_broadcastsi128_si256(sc),
            _mm256_set1_ps(d),
            {_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc)), minus32d),
             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8))), minus32d)}};
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
  // Group 2s's scale in the low lane's int16s, group 2s + 1's in the high lane's.
  static __m256i StepScales(const State& s, int step) {
    const auto lo = static_cast<int16_t>(static_cast<uint16_t>(0x0080 | (2 * step) << 8));
    const auto hi = static_cast<int16_t>(static_cast<uint16_t>(0x0080 | (2 * step + 1) << 8));
    return _mm256_srai_epi16(_mm256_shuffle_epi8(s.scales, _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi,
                                                                             hi, hi, hi, hi, hi, hi)),
                             8);
  }
  static __m256 BlockScale(const State& s) { return s.d; }
  static void Offsets(const State& s, __m256 (&out)[2]) {
    out[0] = s.offsets[0];
    out[1] = s.offsets[1];
  }
};

// ---- The driver: kW W rows against kRows x rows ----

inline float Sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The f32 sums of kW W rows by kRows x rows, one ymm each. Formats that
// scale every step keep them in registers; the K-quants touch them once a
// block, so they wait in memory and leave the 16 registers to the block's
// int32 sums: all 8 x rows' in one sweep of the steps, not two sweeps of 4
// beside 8 register accumulators (faster on one Q4_K expert at 8 rows,
// more so with the running sums of IntScaledSteps; docs/BENCHMARKS.md,
// Other instruction sets).
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
        sums[f][r] = _mm256_add_epi32(sums[f][r], _mm256_madd_epi16(_mm256_maddubs_epi16(wv[f], xv), scales[f]));
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

template <class Format, int kRows, int kW, class Acc>
inline void Unit(const uint8_t* const (&w)[kW], const uint8_t* next, const XRows<kRows>& x, int64_t i, int64_t at,
                 Acc& acc) {
  if constexpr (kRows > 1 || kW > 1) {
    PrefetchLines(next + kW * at, kW * Format::kBytes);
  } else {
    for (int64_t o = 0; o < Format::kBytes; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(w[0] + at + kDecodePrefetchAheadBytes + o), _MM_HINT_T0);
  }
  typename Format::State state[kW];
  for (int f = 0; f < kW; ++f) state[f] = Format::Begin(w[f] + at);
  if constexpr (Format::kOffsets) {
    for (int f = 0; f < kW; ++f) {
      __m256 offsets[2];
      Format::Offsets(state[f], offsets);
      for (int r = 0; r < kRows; ++r) {
        const __m256 sum = _mm256_fmadd_ps(offsets[0], _mm256_loadu_ps(x.offsets(r) + i / 16), acc.Get(f, r));
        acc.Set(f, r, _mm256_fmadd_ps(offsets[1], _mm256_loadu_ps(x.offsets(r) + i / 16 + 8), sum));
      }
    }
  }
  if constexpr (Format::kIntScales) {
    IntScaledSteps<Format, kRows, kW>(w, x, i, at, state, acc);
  } else {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int s = 0; s < Format::kSteps; ++s) {
      const int64_t v = i + kStep * s;
      __m256i wv[kW];
      __m256 ws[kW];
      for (int f = 0; f < kW; ++f) {
        wv[f] = Format::Levels(w[f] + at, s);
        ws[f] = Format::Scales(state[f], s);
      }
      for (int r = 0; r < kRows; ++r) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.levels(r) + v));
        const __m256 xs = _mm256_broadcast_ss(x.scales(r) + v / 16);
        for (int f = 0; f < kW; ++f) {
          const __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[f], wv[f]), _mm256_sign_epi8(xv, wv[f]));
          const __m256i dot = _mm256_madd_epi16(pairs, ones);
          acc.Set(f, r, _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(ws[f], xs), acc.Get(f, r)));
        }
      }
    }
  }
}

template <class Format, int kRows, int kW>
void Pass(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0, int64_t j0) {
  const int64_t row_bytes = w.row_bytes();
  const uint8_t* rows[kW];
  for (int f = 0; f < kW; ++f)  // a tail pass repeats the last row (its sums are dropped)
    rows[f] = static_cast<const uint8_t*>(w.data) + (j0 + std::min<int64_t>(f, a.n_end - 1 - j0)) * row_bytes;
  const uint8_t* next = static_cast<const uint8_t*>(w.data) + (j0 + kW) * row_bytes;  // the next pass's rows
  const XRows<kRows> x{static_cast<const uint8_t*>(px.base) + r0 * px.stride, px.stride, px.scales_at,
                       px.offsets_at};
  std::conditional_t<Format::kIntScales, MemorySums<kW, kRows>, RegisterSums<kW, kRows>> acc;
  for (int f = 0; f < kW; ++f)
    for (int r = 0; r < kRows; ++r) acc.Set(f, r, _mm256_setzero_ps());
  for (int64_t u = 0; u < w.k / Format::kValues; ++u)
    Unit<Format, kRows, kW>(rows, next, x, u * Format::kValues, u * Format::kBytes, acc);
  for (int f = 0; f < kW && j0 + f < a.n_end; ++f) {
    const float bias = a.bias != nullptr ? a.bias[j0 + f] : 0.0f;
    for (int r = 0; r < kRows; ++r) a.y[(r0 + r) * a.ldy + j0 + f] = Sum(acc.Get(f, r)) + bias;
  }
}

template <class Format, int kRows, int kW>
void RowsBy(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  for (int64_t j0 = a.n_begin; j0 < a.n_end; j0 += kW) Pass<Format, kRows, kW>(w, a, px, r0, j0);
}

template <class Format, int kRows>
void Rows(const LinearWeight& w, const LinearSliceArgs& a, const Int8PreparedX& px, int64_t r0) {
  // One x row at K <= kInt8OneRowMaxK reads one W row at a time, one
  // sequential stream, prefetched kDecodePrefetchAheadBytes ahead (Unit)
  // (why, and the K bound: linear_isa.h, kInt8OneRowMaxK; the VNNI pass
  // reads split streams instead, linear_avx512_vnni_fused.cc, SplitStreams).
  if constexpr (kRows == 1) {
    if (w.k <= kInt8OneRowMaxK) return RowsBy<Format, 1, 1>(w, a, px, r0);
  }
  // 16 ymm registers: the kW x kRows f32 sums (per-32 formats) or int32
  // sums (K-quants) come first.
  constexpr int kW = kRows <= 2 ? 2 : 1;
  RowsBy<Format, kRows, kW>(w, a, px, r0);
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
    case DType::kQ4_K: Run<KFormat<false>>(w, a, x); return true;
    case DType::kQ5_K: Run<KFormat<true>>(w, a, x); return true;
    case DType::kQ6_K: Run<Q6KFormat>(w, a, x); return true;
    default: return false;
  }
}

}  // namespace tandem::isa
