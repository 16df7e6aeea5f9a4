// The non-linear 4-bit formats (IQ4_NL, IQ4_XS), decoded only: each 4-bit
// index picks one of kIq4NlValues' 16 levels (block_formats.h), spaced more
// closely near zero than a uniform grid, times a scale. One block per call:
// IQ4_NL 32 values with an f16 scale; IQ4_XS 256 values in eight sub-blocks
// of 32, sub-block j scaled by d * (s_j - 32) with s_j six bits (the low four
// in nibble j % 2 of scales_l[j / 2], the top two at bits 2j, 2j+1 of
// scales_h). Nibbles as Q4_0's: qs[l] low for value l, high for value l + 16
// of each 32.
#pragma once

#include <cstdint>

namespace tandem {

void DequantizeBlockIQ4_NL(const uint8_t* block, float* y);
void DequantizeBlockIQ4_XS(const uint8_t* block, float* y);

// The 6-bit scale (before its -32) of sub-block `j` (0..7) of an IQ4_XS block.
int UnpackIQ4XSScale(uint16_t scales_h, const uint8_t* scales_l, int j);

}  // namespace tandem
