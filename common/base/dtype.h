// Element types of weights as stored in safetensors, and scalar conversions.
// Activations are always f32; weights stay in their stored type.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

enum class DType : uint8_t { kF32, kF16, kBF16 };

size_t DTypeSize(DType dtype);
// Safetensors spelling: "F32", "F16", "BF16".
std::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(std::string_view name);

inline float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float F16ToF32(uint16_t v) { return _cvtsh_ss(v); }
inline uint16_t F32ToF16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

// Reads element `i` of a buffer of `dtype` as f32.
inline float LoadAsF32(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

}  // namespace tandem
