#include "common/quant/quantize.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/quant/half.h"
#include "common/quant/k_quants.h"
#include "common/quant/legacy_quants.h"
#include "common/quant/nonlinear_quants.h"

namespace tandem {
namespace {

using EncodeBlock = void (*)(const float* x, uint8_t* block);
using DecodeBlock = void (*)(const uint8_t* block, float* y);

struct Codec {
  GgmlType type;
  EncodeBlock encode;  // null: decoded only
  DecodeBlock decode;
};

void EncodeF32(const float* x, uint8_t* out) { std::memcpy(out, x, sizeof(float)); }
void DecodeF32(const uint8_t* in, float* y) { std::memcpy(y, in, sizeof(float)); }

void EncodeF16(const float* x, uint8_t* out) {
  const uint16_t h = GgmlF32ToF16(*x);
  std::memcpy(out, &h, sizeof(h));
}
void DecodeF16(const uint8_t* in, float* y) {
  uint16_t h;
  std::memcpy(&h, in, sizeof(h));
  *y = GgmlF16ToF32(h);
}

void EncodeBf16(const float* x, uint8_t* out) {
  const uint16_t b = GgmlF32ToBf16(*x);
  std::memcpy(out, &b, sizeof(b));
}
void DecodeBf16(const uint8_t* in, float* y) {
  uint16_t b;
  std::memcpy(&b, in, sizeof(b));
  *y = GgmlBf16ToF32(b);
}

constexpr Codec kCodecs[] = {
    {GgmlType::kF32, EncodeF32, DecodeF32},
    {GgmlType::kF16, EncodeF16, DecodeF16},
    {GgmlType::kBF16, EncodeBf16, DecodeBf16},
    {GgmlType::kQ8_0, QuantizeBlockQ8_0, DequantizeBlockQ8_0},
    {GgmlType::kQ4_0, QuantizeBlockQ4_0, DequantizeBlockQ4_0},
    {GgmlType::kQ4_1, QuantizeBlockQ4_1, DequantizeBlockQ4_1},
    {GgmlType::kQ5_0, QuantizeBlockQ5_0, DequantizeBlockQ5_0},
    {GgmlType::kQ4_K, QuantizeBlockQ4_K, DequantizeBlockQ4_K},
    {GgmlType::kQ5_K, QuantizeBlockQ5_K, DequantizeBlockQ5_K},
    {GgmlType::kQ6_K, QuantizeBlockQ6_K, DequantizeBlockQ6_K},
    {GgmlType::kQ5_1, QuantizeBlockQ5_1, DequantizeBlockQ5_1},
    {GgmlType::kQ3_K, nullptr, DequantizeBlockQ3_K},
    {GgmlType::kQ2_K, nullptr, DequantizeBlockQ2_K},
    {GgmlType::kIQ4_NL, nullptr, DequantizeBlockIQ4_NL},
    {GgmlType::kIQ4_XS, nullptr, DequantizeBlockIQ4_XS},
};

const Codec* FindCodec(GgmlType type) {
  for (const Codec& codec : kCodecs) {
    if (codec.type == type) return &codec;
  }
  return nullptr;
}

absl::Status Unsupported(GgmlType type, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tensor type ", GgmlTypeName(type), " cannot be ", what,
                                                 " by tandem (supported: ", SupportedDequantizeTypes(), ")"));
}

}  // namespace

bool CanDequantize(GgmlType type) { return FindCodec(type) != nullptr; }
bool CanQuantize(GgmlType type) {
  const Codec* codec = FindCodec(type);
  return codec != nullptr && codec->encode != nullptr;
}

std::string SupportedDequantizeTypes() {
  std::string out;
  for (const Codec& codec : kCodecs) absl::StrAppend(&out, out.empty() ? "" : ", ", GgmlTypeName(codec.type));
  return out;
}

absl::Status DequantizeRow(GgmlType type, absl::Span<const uint8_t> src, absl::Span<float> dst) {
  const Codec* codec = FindCodec(type);
  if (codec == nullptr) return Unsupported(type, "decoded");
  const GgmlTypeInfo& info = GetGgmlTypeInfo(type);
  const size_t block_bytes = static_cast<size_t>(info.block_bytes);
  const size_t block_size = static_cast<size_t>(info.block_size);
  if (src.size() % block_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(src.size(), " bytes are not whole ", info.name, " blocks of ", block_bytes, " bytes"));
  }
  const size_t blocks = src.size() / block_bytes;
  if (dst.size() != blocks * block_size) {
    return absl::InvalidArgumentError(absl::StrCat(blocks, " ", info.name, " blocks hold ", blocks * block_size,
                                                   " values, not the ", dst.size(), " asked for"));
  }
  for (size_t b = 0; b < blocks; ++b) codec->decode(src.data() + b * block_bytes, dst.data() + b * block_size);
  return absl::OkStatus();
}

absl::Status QuantizeRow(GgmlType type, absl::Span<const float> src, absl::Span<uint8_t> dst) {
  const Codec* codec = FindCodec(type);
  if (codec == nullptr) return Unsupported(type, "encoded");
  if (codec->encode == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor type ", GgmlTypeName(type),
                                                   " is read by tandem but not written (llama-quantize writes it)"));
  }
  absl::StatusOr<uint64_t> row_bytes = GgmlRowBytes(type, static_cast<int64_t>(src.size()));
  if (!row_bytes.ok()) return row_bytes.status();
  if (dst.size() != *row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(src.size(), " values take ", *row_bytes, " bytes as ",
                                                   GgmlTypeName(type), ", not the ", dst.size(), " given"));
  }
  // Infinity and NaN would turn a whole block's scale into garbage silently.
  for (size_t i = 0; i < src.size(); ++i) {
    if (!std::isfinite(src[i])) {
      return absl::InvalidArgumentError(absl::StrCat("value ", i, " of the row is ", src[i], ", not finite"));
    }
  }
  const GgmlTypeInfo& info = GetGgmlTypeInfo(type);
  const size_t blocks = src.size() / static_cast<size_t>(info.block_size);
  for (size_t b = 0; b < blocks; ++b) {
    codec->encode(src.data() + b * info.block_size, dst.data() + b * info.block_bytes);
  }
  return absl::OkStatus();
}

}  // namespace tandem
