#include "common/quant/ggml_type.h"

#include <array>
#include <cstdint>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

using T = GgmlType;

// Geometry from ggml-common.h's block structs (sizes are what the
// static_asserts there pin down).
constexpr std::array<GgmlTypeInfo, 35> kTypes = {{
    {T::kF32, "f32", 1, 4},
    {T::kF16, "f16", 1, 2},
    {T::kQ4_0, "q4_0", 32, 2 + 16},
    {T::kQ4_1, "q4_1", 32, 2 + 2 + 16},
    {T::kQ5_0, "q5_0", 32, 2 + 4 + 16},
    {T::kQ5_1, "q5_1", 32, 2 + 2 + 4 + 16},
    {T::kQ8_0, "q8_0", 32, 2 + 32},
    {T::kQ8_1, "q8_1", 32, 2 + 2 + 32},
    {T::kQ2_K, "q2_K", 256, 16 + 64 + 2 + 2},
    {T::kQ3_K, "q3_K", 256, 32 + 64 + 12 + 2},
    {T::kQ4_K, "q4_K", 256, 2 + 2 + 12 + 128},
    {T::kQ5_K, "q5_K", 256, 2 + 2 + 12 + 32 + 128},
    {T::kQ6_K, "q6_K", 256, 128 + 64 + 16 + 2},
    {T::kQ8_K, "q8_K", 256, 4 + 256 + 2 * 16},
    {T::kIQ2_XXS, "iq2_xxs", 256, 2 + 2 * 32},
    {T::kIQ2_XS, "iq2_xs", 256, 2 + 2 * 32 + 8},
    {T::kIQ3_XXS, "iq3_xxs", 256, 2 + 96},
    {T::kIQ1_S, "iq1_s", 256, 2 + 32 + 2 * 8},
    {T::kIQ4_NL, "iq4_nl", 32, 2 + 16},
    {T::kIQ3_S, "iq3_s", 256, 2 + 64 + 8 + 32 + 4},
    {T::kIQ2_S, "iq2_s", 256, 2 + 64 + 8 + 8},
    {T::kIQ4_XS, "iq4_xs", 256, 2 + 2 + 4 + 128},
    {T::kI8, "i8", 1, 1},
    {T::kI16, "i16", 1, 2},
    {T::kI32, "i32", 1, 4},
    {T::kI64, "i64", 1, 8},
    {T::kF64, "f64", 1, 8},
    {T::kIQ1_M, "iq1_m", 256, 32 + 16 + 8},
    {T::kBF16, "bf16", 1, 2},
    {T::kTQ1_0, "tq1_0", 256, 48 + 4 + 2},
    {T::kTQ2_0, "tq2_0", 256, 64 + 2},
    {T::kMXFP4, "mxfp4", 32, 1 + 16},
    {T::kNVFP4, "nvfp4", 64, 4 + 32},
    {T::kQ1_0, "q1_0", 128, 2 + 16},
    {T::kQ2_0, "q2_0", 64, 2 + 16},
}};

constexpr uint32_t kMaxId = 42;

// Index into kTypes by id; -1 for ids ggml does not define.
constexpr std::array<int, kMaxId + 1> MakeIndex() {
  std::array<int, kMaxId + 1> index{};
  for (int& i : index) i = -1;
  for (size_t i = 0; i < kTypes.size(); ++i) index[static_cast<uint32_t>(kTypes[i].type)] = static_cast<int>(i);
  return index;
}
constexpr std::array<int, kMaxId + 1> kIndex = MakeIndex();

}  // namespace

absl::StatusOr<GgmlType> GgmlTypeFromId(uint32_t id) {
  if (id > kMaxId || kIndex[id] < 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown ggml tensor type id ", id, " (ggml defines ids 0-", kMaxId,
                                                   " except 4, 5, 31-33, 36-38)"));
  }
  return static_cast<GgmlType>(id);
}

absl::StatusOr<GgmlType> GgmlTypeFromName(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (const GgmlTypeInfo& info : kTypes) {
    if (absl::AsciiStrToLower(info.name) == lower) return info.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown ggml tensor type \"", name, "\""));
}

const GgmlTypeInfo& GetGgmlTypeInfo(GgmlType type) {
  const uint32_t id = static_cast<uint32_t>(type);
  // A GgmlType only comes from the enumerators or GgmlTypeFromId, so the id is
  // valid; fall back to f32's entry rather than read out of bounds if not.
  if (id > kMaxId || kIndex[id] < 0) return kTypes[0];
  return kTypes[kIndex[id]];
}

absl::Span<const GgmlTypeInfo> AllGgmlTypes() { return kTypes; }

absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t row_length) {
  const GgmlTypeInfo& info = GetGgmlTypeInfo(type);
  if (row_length < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative row length ", row_length, " for type ", info.name));
  }
  if (row_length % info.block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("row length ", row_length, " is not a multiple of ", info.name,
                                                   "'s block of ", info.block_size, " values"));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(row_length / info.block_size),
                             static_cast<uint64_t>(info.block_bytes), &bytes) ||
      bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("row of ", row_length, " ", info.name, " values overflows"));
  }
  return bytes;
}

absl::StatusOr<uint64_t> GgmlTensorBytes(GgmlType type, absl::Span<const int64_t> dims) {
  const std::string shape = absl::StrCat("[", absl::StrJoin(dims, ", "), "]");
  for (int64_t d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension in shape ", shape));
  }
  const int64_t row_length = dims.empty() ? 1 : dims[0];
  absl::StatusOr<uint64_t> row_bytes = GgmlRowBytes(type, row_length);
  if (!row_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", shape, ": ", row_bytes.status().message()));
  }
  uint64_t bytes = *row_bytes;
  uint64_t elements = static_cast<uint64_t>(row_length);
  for (size_t i = 1; i < dims.size(); ++i) {
    const uint64_t d = static_cast<uint64_t>(dims[i]);
    if (__builtin_mul_overflow(bytes, d, &bytes) || __builtin_mul_overflow(elements, d, &elements) ||
        bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
        elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", shape, " of type ", GetGgmlTypeInfo(type).name, " overflows 63 bits"));
    }
  }
  return bytes;
}

}  // namespace tandem
