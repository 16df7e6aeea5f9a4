// ggml's tensor element types, numbered as GGUF files store them, with the
// block geometry that sizes every tensor. A quantized type packs `block_size`
// consecutive values of a row into `block_bytes` bytes, so a row of n values
// takes n / block_size * block_bytes bytes and n must be a multiple of
// block_size. The ids, names and sizes follow ggml's public ggml.h and
// ggml-common.h; ids ggml has retired (4, 5, 31-33, 36-38) are unknown here,
// as they are to ggml's own GGUF reader.
//
// This file only describes types; which ones tandem can decode or encode is
// quantize.h's business. Everything here is immutable: any thread may call it.
#pragma once

#include <cstdint>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tandem {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
  kNVFP4 = 40,
  kQ1_0 = 41,
  kQ2_0 = 42,
};

// Values per block of the K-quants (ggml's QK_K).
inline constexpr int64_t kSuperBlockSize = 256;

struct GgmlTypeInfo {
  GgmlType type;
  absl::string_view name;  // ggml's spelling: "f32", "q8_0", "q4_K", "bf16"
  int64_t block_size;      // values per block (1 for plain floats and ints)
  int64_t block_bytes;     // bytes per block
};

// The type GGUF numbers `id`; InvalidArgument naming the id when ggml defines none.
absl::StatusOr<GgmlType> GgmlTypeFromId(uint32_t id);
// The type spelled `name` as ggml spells it, case-insensitively ("Q4_K", "q4_k").
absl::StatusOr<GgmlType> GgmlTypeFromName(absl::string_view name);

const GgmlTypeInfo& GetGgmlTypeInfo(GgmlType type);
inline absl::string_view GgmlTypeName(GgmlType type) { return GetGgmlTypeInfo(type).name; }
inline int64_t GgmlBlockSize(GgmlType type) { return GetGgmlTypeInfo(type).block_size; }
inline int64_t GgmlBlockBytes(GgmlType type) { return GetGgmlTypeInfo(type).block_bytes; }
// Every type ggml defines, in id order.
absl::Span<const GgmlTypeInfo> AllGgmlTypes();

// Bytes of one row of `row_length` values. InvalidArgument when the length is
// negative or not a multiple of the type's block size (naming both).
absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t row_length);

// Bytes of a tensor of `dims` in ggml order (dims[0] is the row length, the
// innermost and contiguous dimension). InvalidArgument for a negative
// dimension, a row length that is not a multiple of the block size, or a
// product that does not fit in 63 bits (a hostile file must not wrap around
// to a plausible size).
absl::StatusOr<uint64_t> GgmlTensorBytes(GgmlType type, absl::Span<const int64_t> dims);

}  // namespace tandem
