#include "common/quant/synthetic_blocks.h"

#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/quant/block_formats.h"
#include "common/quant/half.h"
#include "common/quant/quantize.h"

namespace tandem {
namespace {

// Where each type's f16 scales (d, m, dmin) sit in its block.
std::vector<size_t> HalfFields(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0: return {offsetof(BlockQ8_0, d)};
    case GgmlType::kQ4_0: return {offsetof(BlockQ4_0, d)};
    case GgmlType::kQ4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case GgmlType::kQ5_0: return {offsetof(BlockQ5_0, d)};
    case GgmlType::kQ5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case GgmlType::kQ4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case GgmlType::kQ5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case GgmlType::kQ6_K: return {offsetof(BlockQ6_K, d)};
    case GgmlType::kQ3_K: return {offsetof(BlockQ3_K, d)};
    case GgmlType::kQ2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case GgmlType::kIQ4_NL: return {offsetof(BlockIQ4_NL, d)};
    case GgmlType::kIQ4_XS: return {offsetof(BlockIQ4_XS, d)};
    default: return {};
  }
}

}  // namespace

absl::Status SyntheticBlocks(GgmlType type, uint32_t seed, absl::Span<uint8_t> out) {
  const std::vector<size_t> fields = HalfFields(type);
  if (fields.empty() || !CanDequantize(type)) {
    return absl::InvalidArgumentError(absl::StrCat("no synthetic blocks of ", GgmlTypeName(type)));
  }
  const auto block_bytes = static_cast<size_t>(GgmlBlockBytes(type));
  if (out.size() % block_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(out.size(), " bytes are not whole ", GgmlTypeName(type), " blocks of ", block_bytes));
  }
  std::mt19937 rng(seed);
  for (uint8_t& byte : out) byte = static_cast<uint8_t>(rng());
  for (size_t b = 0; b < out.size(); b += block_bytes) {
    for (size_t at : fields) {
      const uint16_t h = GgmlF32ToF16(0.001f + 0.01f * static_cast<float>(rng() % 1000) / 1000.0f);
      std::memcpy(out.data() + b + at, &h, sizeof(h));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem
