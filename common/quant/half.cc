#include "common/quant/half.h"

#include <cstdint>
#include <cstring>

namespace tandem {
namespace {

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t ToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// Drops the low `shift` bits of `value`, rounding to nearest, ties to even.
uint32_t ShiftRightRoundEven(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rest = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

}  // namespace

float GgmlF16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in f32.
    const float magnitude = static_cast<float>(mantissa) * 0x1.0p-24f;
    return FromBits(sign | ToBits(magnitude));
  }
  if (exponent == 0x1f) return FromBits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  return FromBits(sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13));
}

uint16_t GgmlF32ToF16(float f) {
  const uint32_t bits = ToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a half subnormal, in units of 2^-24. Values up to 2^-25
    // (half a unit, a tie that goes to even) round to zero.
    if (magnitude <= 0x33000000u) return sign;
    const uint32_t exponent = magnitude >> 23;  // 102..112
    const uint32_t mantissa = (magnitude & 0x7fffffu) | 0x800000u;
    return sign | static_cast<uint16_t>(ShiftRightRoundEven(mantissa, static_cast<int>(126 - exponent)));
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits; a carry out of
  // the mantissa correctly bumps the exponent.
  const uint32_t rebased = magnitude - ((127u - 15u) << 23);
  return sign | static_cast<uint16_t>(ShiftRightRoundEven(rebased, 13));
}

}  // namespace tandem
