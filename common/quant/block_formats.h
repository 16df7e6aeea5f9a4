// The byte layouts of the ggml block formats tandem reads (and all but Q3_K,
// Q2_K, IQ4_NL and IQ4_XS writes), as
// ggml-common.h defines them (all little-endian; `d`/`m`/`dmin` are f16 bits).
// A block is read from a file by memcpy into one of these structs, never by
// casting a pointer into the mapping: block sizes such as 18 and 210 bytes
// leave most blocks of a row unaligned.
//
// Value of element i of a block, per format:
//   Q8_0  d * qs[i]
//   Q4_0  d * (nibble(i) - 8)         nibble(i): low nibble of qs[i] for i < 16,
//   Q4_1  d * nibble(i) + m                      high nibble of qs[i-16] after
//   Q5_0  d * (nibble(i) + 16*bit(i) - 16)       bit(i): bit i of qh (32 bits)
//   Q5_1  d * (nibble(i) + 16*bit(i)) + m
//   IQ4_NL d * kIq4NlValues[nibble(i)]    (a non-linear 16-level table)
//   Q4_K  eight sub-blocks of 32 with 6-bit scale s and min m each:
//         d*s * q - dmin*m, q a nibble (see k_quants.h for the packing)
//   Q5_K  as Q4_K with a fifth bit per value in qh
//   Q6_K  sixteen sub-blocks of 16 with an int8 scale s: d*s * (q - 32),
//         q six bits (four in ql, two in qh)
//   Q3_K  sixteen sub-blocks of 16 with a 6-bit scale s: d*(s - 32) * q,
//         q in [-4, 3]: two bits in qs, the third in hmask (clear: -4)
//   Q2_K  sixteen sub-blocks of 16 with a 4-bit scale s and min m (one
//         byte each): d*s * q - dmin*m, q two bits
//   IQ4_XS eight sub-blocks of 32 with a 6-bit scale s: d*(s - 32) *
//         kIq4NlValues[nibble(i)]
// (k_quants.h and nonlinear_quants.h give the packing.)
#pragma once

#include <cstdint>

namespace tandem {

inline constexpr int kQ4_0BlockSize = 32;
inline constexpr int kQ4_1BlockSize = 32;
inline constexpr int kQ5_0BlockSize = 32;
inline constexpr int kQ5_1BlockSize = 32;
inline constexpr int kIQ4_NLBlockSize = 32;
inline constexpr int kQ8_0BlockSize = 32;
inline constexpr int kKBlockSize = 256;  // every K-quant (ggml's QK_K)
inline constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K/Q5_K

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQ4_0BlockSize / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQ4_1BlockSize / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // fifth bits, a little-endian uint32
  uint8_t qs[kQ5_0BlockSize / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];  // fifth bits, a little-endian uint32
  uint8_t qs[kQ5_1BlockSize / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQ8_0BlockSize];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_K {
  uint16_t d;     // scale of the sub-block scales
  uint16_t dmin;  // scale of the sub-block mins
  uint8_t scales[kKScaleBytes];
  uint8_t qs[kKBlockSize / 2];
};
static_assert(sizeof(BlockQ4_K) == 144);

struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[kKScaleBytes];
  uint8_t qh[kKBlockSize / 8];
  uint8_t qs[kKBlockSize / 2];
};
static_assert(sizeof(BlockQ5_K) == 176);

struct BlockQ6_K {
  uint8_t ql[kKBlockSize / 2];  // low four bits
  uint8_t qh[kKBlockSize / 4];  // high two bits
  int8_t scales[kKBlockSize / 16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

struct BlockQ3_K {
  uint8_t hmask[kKBlockSize / 8];  // third bits: bit j of hmask[l] for value 32j + l
  uint8_t qs[kKBlockSize / 4];     // low two bits
  uint8_t scales[kKScaleBytes];    // sixteen 6-bit scales
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

struct BlockQ2_K {
  uint8_t scales[kKBlockSize / 16];  // scale (low nibble) and min (high nibble) per 16 values
  uint8_t qs[kKBlockSize / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// The 16 levels of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4NlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[kIQ4_NLBlockSize / 2];  // nibbles as Q4_0's
};
static_assert(sizeof(BlockIQ4_NL) == 18);

struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;                   // top two bits of sub-block j's scale at bits 2j, 2j+1
  uint8_t scales_l[kKBlockSize / 64];  // low four bits: sub-block j in nibble j % 2 of scales_l[j / 2]
  uint8_t qs[kKBlockSize / 2];         // sub-block j: qs[16j..16j+15] as Q4_0's nibbles
};
static_assert(sizeof(BlockIQ4_XS) == 136);

}  // namespace tandem
