// The 256-value "K" super-block formats (Q4_K, Q5_K, Q6_K; Q3_K and Q2_K
// decoded only): one block per call, `x`/`y` 256 floats, `block` the format's bytes (block_formats.h).
// The quantizers follow ggml's reference quantizers (quantize_row_q*_K_ref,
// what llama-quantize uses without an importance matrix) step for step:
//   Q4_K/Q5_K  per 32-value sub-block an affine fit (scale_search.h,
//              weights |x| + rms of the sub-block); the eight scales and
//              mins are quantized to 6 bits against the block's largest
//              (d = max_scale/63, dmin = max_min/63); each value is then
//              re-quantized with its sub-block's stored scale and min.
//   Q6_K       per 16-value sub-block a symmetric fit; the sixteen scales
//              quantized to int8 against the largest (d = -max_scale/128);
//              values re-quantized with the stored scales, levels [-32, 31].
//
// Packing (ggml's): Q4_K/Q5_K scales[12] hold eight 6-bit scales and mins:
// for sub-block j < 4 the scale is scales[j] & 63 and the min
// scales[j+4] & 63; for j >= 4 the low four bits sit in the nibbles of
// scales[j+4] (scale low, min high) and the top two bits in bits 6-7 of
// scales[j-4] (scale) and scales[j] (min). Each 64-value half-chunk c uses
// qs[32c .. 32c+31]: low nibbles for values 64c..64c+31, high nibbles for
// 64c+32..64c+63; Q5_K's fifth bit of those is bit 2c resp. 2c+1 of qh[l].
// Q6_K: each 128-value half h uses ql[64h .. 64h+63] and qh[32h .. 32h+31];
// for l < 32 the values 128h + l + 32k (k = 0..3) take ql[64h+l] low,
// ql[64h+l+32] low, ql[64h+l] high, ql[64h+l+32] high nibble and bits 2k,
// 2k+1 of qh[32h+l]; value i uses scale scales[i / 16].
// Q3_K and Q2_K: value i = 128h + 32j + l (h = 0, 1; j = 0..3; l < 32) has
// its low two bits at bits 2j, 2j+1 of qs[32h + l]; Q3_K's third bit is bit
// i / 32 of hmask[l] (clear: the level is 4 lower). Q3_K's sixteen 6-bit
// scales: scale j has its low nibble in scales[j % 8] (low nibble for j < 8,
// high for j >= 8) and its top two bits at bits 2 (j / 4), 2 (j / 4) + 1 of
// scales[8 + j % 4]; the scale is that minus 32. Q2_K's scales[j]: the
// scale in the low nibble, the min in the high.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem {

void QuantizeBlockQ4_K(const float* x, uint8_t* block);
void QuantizeBlockQ5_K(const float* x, uint8_t* block);
void QuantizeBlockQ6_K(const float* x, uint8_t* block);

void DequantizeBlockQ4_K(const uint8_t* block, float* y);
void DequantizeBlockQ5_K(const uint8_t* block, float* y);
void DequantizeBlockQ6_K(const uint8_t* block, float* y);
void DequantizeBlockQ3_K(const uint8_t* block, float* y);
void DequantizeBlockQ2_K(const uint8_t* block, float* y);

// The 6-bit scale and min of sub-block `j` (0..7) of a Q4_K/Q5_K scales[12].
void UnpackKScaleMin(const uint8_t* scales, int j, uint8_t* scale, uint8_t* min);
// The sixteen 6-bit scales of a Q3_K scales[12] (before their -32), four
// bytes to a word, in four 32-bit steps (ggml's unpacking; inline for the
// kernels, which keep the words in registers).
inline void UnpackQ3KScaleWords(const uint8_t* packed, uint32_t (&words)[4]) {
  constexpr uint32_t kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, packed, sizeof(u));
  words[0] = (u[0] & kLow4) | ((u[2] & kLow2) << 4);
  words[1] = (u[1] & kLow4) | (((u[2] >> 2) & kLow2) << 4);
  words[2] = ((u[0] >> 4) & kLow4) | (((u[2] >> 4) & kLow2) << 4);
  words[3] = ((u[1] >> 4) & kLow4) | (((u[2] >> 6) & kLow2) << 4);
}

// The same, each minus 32 (in [-32, 31]).
inline void UnpackQ3KScales(const uint8_t* packed, int8_t* scales) {
  uint32_t words[4];
  UnpackQ3KScaleWords(packed, words);
  uint8_t bytes[16];
  std::memcpy(bytes, words, sizeof(words));
  for (int g = 0; g < 16; ++g) scales[g] = static_cast<int8_t>(bytes[g] - 32);
}

}  // namespace tandem
