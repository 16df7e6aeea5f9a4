// Element types of weights, and scalar conversions. Activations are always
// f32; weights stay in their stored type: a float type (F32, F16, BF16, as
// safetensors and GGUF store them) or one of ggml's block-quantized types
// (GGUF only), where each run of DTypeBlockSize values along a row is packed
// into DTypeBlockBytes bytes (layouts: common/quant/block_formats.h). A
// quantized matrix has no per-element size: size it with DTypeRowBytes.
// Code that computes only float weights checks RequireFloatDType first, so a
// quantized tensor is refused by name rather than misread.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

// The float types come first and keep their numbers (shared-memory headers
// and protos store them); the quantized ones follow, in no ggml order.
enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ5_1,
  kQ3_K,
  kQ2_K,
  kIQ4_NL,
  kIQ4_XS
};
inline constexpr size_t kNumDTypes = static_cast<size_t>(DType::kIQ4_XS) + 1;  // a new last type updates this

inline bool IsQuantized(DType dtype) { return dtype >= DType::kQ8_0; }
// Every quantized type, in enum order.
inline constexpr DType kQuantizedDTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1,   DType::kQ5_0,
                                             DType::kQ4_K, DType::kQ5_K, DType::kQ6_K,   DType::kQ5_1,
                                             DType::kQ3_K, DType::kQ2_K, DType::kIQ4_NL, DType::kIQ4_XS};
static_assert(std::size(kQuantizedDTypes) == kNumDTypes - static_cast<size_t>(DType::kQ8_0));

// The order of a block's level bits in memory: ggml's, as GGUF files store
// them, or group-major, the AVX512-VNNI decode GEMV's own (Q4_K and Q6_K
// only), into which a process whose kernels read that order converts the
// copies it owns at load (common/quant/block_order.h says how and why).
// Whoever reads a matrix's blocks reads its order with it.
enum class BlockOrder : uint8_t { kGgml, kGroupMajor };
inline bool HasGroupMajorOrder(DType dtype) { return dtype == DType::kQ4_K || dtype == DType::kQ6_K; }
// A scale (and offset) per 16 values rather than per 32: Q6_K, Q3_K, Q2_K.
inline bool ScalesPer16(DType dtype) { return dtype == DType::kQ6_K || dtype == DType::kQ3_K || dtype == DType::kQ2_K; }
// Levels that are signed 8-bit values beyond [0, 64) as the int8 kernels
// decode them (Q8_0's, the IQ4 tables'): vpmaddubsw takes their magnitude.
inline bool HasSignedLevels(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kIQ4_NL || dtype == DType::kIQ4_XS;
}
inline const char* BlockOrderName(BlockOrder order) { return order == BlockOrder::kGgml ? "ggml" : "group_major"; }
// Bytes of one element of a float type; 0 for a quantized type, which has
// none (use DTypeRowBytes).
size_t DTypeSize(DType dtype);
// Values per block (1 for float types) and bytes per block (DTypeSize for
// float types): Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL pack 32 values, the
// K-quants and IQ4_XS 256.
int64_t DTypeBlockSize(DType dtype);
int64_t DTypeBlockBytes(DType dtype);
// Bytes of a row of `row_length` values; the length must be a whole number
// of blocks (loaders check it, naming the tensor, before any view exists).
inline int64_t DTypeRowBytes(DType dtype, int64_t row_length) {
  return row_length / DTypeBlockSize(dtype) * DTypeBlockBytes(dtype);
}
// "F32", "F16", "BF16" (the safetensors spelling), "Q8_0", "Q4_K", ...
std::string_view DTypeName(DType dtype);
// Safetensors dtypes only: "F32", "F16", "BF16".
absl::StatusOr<DType> ParseDType(std::string_view name);
// OK for a float type; for a quantized one an InvalidArgument saying that
// `what` (a tensor name, or a kernel's weight) is of that type and `consumer`
// takes only F32, F16 and BF16 weights.
absl::Status RequireFloatDType(DType dtype, std::string_view what, std::string_view consumer);

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

// Reads element `i` of a buffer of float `dtype` as f32.
inline float LoadAsF32(const void* data, DType dtype, size_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF16: return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
    default: break;  // quantized: no single element to read (callers check first)
  }
  return 0.0f;
}

// Writes `v` as element `i` of a buffer of float `dtype` (rounded to
// nearest even). Quantized dtypes have no single element: nothing written.
inline void StoreAsDType(void* data, DType dtype, size_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = F32ToF16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = F32ToBf16(v); break;
    default: break;  // quantized: callers quantize whole blocks (common/quant)
  }
}

}  // namespace tandem
