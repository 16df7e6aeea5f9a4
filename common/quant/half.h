// Scalar conversions between f32 and the 16-bit floats of ggml files:
// IEEE half (f16, the scale of every block format) and bfloat16. Portable bit
// arithmetic, so the quant library needs no F16C and gives the same bits on
// every machine. Rounding is to nearest even, as ggml's and the hardware's
// conversions round; NaN stays a (quiet) NaN.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem {

float GgmlF16ToF32(uint16_t h);
uint16_t GgmlF32ToF16(float f);

inline float GgmlBf16ToF32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint16_t GgmlF32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet the NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace tandem
