#include "common/quant/block_order.h"

#include <array>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/quant/block_formats.h"

namespace tandem {
namespace {

// Where a value's bits sit: a byte offset into the block and a shift.
struct BitsAt {
  int byte, shift;
};

// Value v's four low bits (Q4_K's whole level): ggml's qs/ql position, and
// the group-major one (block_order.h).
BitsAt LowBitsGgmlQ4K(int v) {
  const int half = v % 64 >= 32;
  return {static_cast<int>(offsetof(BlockQ4_K, qs)) + 32 * (v / 64) + v % 32, 4 * half};
}
BitsAt LowBitsGgmlQ6K(int v) {
  const int h = v / 128, q = v % 128 / 32, i = v % 32;
  return {static_cast<int>(offsetof(BlockQ6_K, ql)) + 64 * h + i + 32 * (q % 2), 4 * (q / 2)};
}
BitsAt LowBitsGroupMajor(int v, int levels_at) {
  const int l = v / 16, s = v % 16 / 4, j = v % 4;
  return {levels_at + 64 * (s / 2) + 4 * l + j, 4 * (s % 2)};
}
// Q6_K's two high bits.
BitsAt HighBitsGgmlQ6K(int v) {
  const int h = v / 128, q = v % 128 / 32, i = v % 32;
  return {static_cast<int>(offsetof(BlockQ6_K, qh)) + 32 * h + i, 2 * q};
}
BitsAt HighBitsGroupMajorQ6K(int v) {
  const int l = v / 16, s = v % 16 / 4, j = v % 4;
  return {static_cast<int>(offsetof(BlockQ6_K, qh)) + 4 * l + j, 2 * s};
}

// Moves every value's bits of one block from `from` positions to `to`
// positions; the bytes no value uses (scales, d, dmin) are copied as they are.
template <class From, class To>
void Move(const uint8_t* in, uint8_t* out, size_t bytes, int bits, From from, To to) {
  std::memcpy(out, in, bytes);
  const uint8_t mask = static_cast<uint8_t>((1 << bits) - 1);
  for (int v = 0; v < kKBlockSize; ++v) out[to(v).byte] &= static_cast<uint8_t>(~(mask << to(v).shift));
  for (int v = 0; v < kKBlockSize; ++v) {
    const uint8_t value = (in[from(v).byte] >> from(v).shift) & mask;
    out[to(v).byte] |= static_cast<uint8_t>(value << to(v).shift);
  }
}

void Q4KToGroupMajor(const uint8_t* in, uint8_t* out) {
  Move(in, out, sizeof(BlockQ4_K), 4, LowBitsGgmlQ4K, [](int v) { return LowBitsGroupMajor(v, offsetof(BlockQ4_K, qs)); });
}
void Q4KToGgml(const uint8_t* in, uint8_t* out) {
  Move(in, out, sizeof(BlockQ4_K), 4, [](int v) { return LowBitsGroupMajor(v, offsetof(BlockQ4_K, qs)); }, LowBitsGgmlQ4K);
}
void Q6KToGroupMajor(const uint8_t* in, uint8_t* out) {
  uint8_t low[sizeof(BlockQ6_K)];
  Move(in, low, sizeof(BlockQ6_K), 4, LowBitsGgmlQ6K, [](int v) { return LowBitsGroupMajor(v, offsetof(BlockQ6_K, ql)); });
  Move(low, out, sizeof(BlockQ6_K), 2, HighBitsGgmlQ6K, HighBitsGroupMajorQ6K);
}
void Q6KToGgml(const uint8_t* in, uint8_t* out) {
  uint8_t low[sizeof(BlockQ6_K)];
  Move(in, low, sizeof(BlockQ6_K), 4, [](int v) { return LowBitsGroupMajor(v, offsetof(BlockQ6_K, ql)); }, LowBitsGgmlQ6K);
  Move(low, out, sizeof(BlockQ6_K), 2, HighBitsGroupMajorQ6K, HighBitsGgmlQ6K);
}

using BlockConversion = void (*)(const uint8_t* in, uint8_t* out);

absl::Status ConvertBlocks(GgmlType type, absl::Span<uint8_t> blocks, BlockConversion q4k, BlockConversion q6k) {
  if (!HasGroupMajorOrder(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat(GgmlTypeName(type), " blocks have one order (only Q4_K and Q6_K have a group-major one)"));
  }
  const size_t block_bytes = static_cast<size_t>(GgmlBlockBytes(type));
  if (blocks.size() % block_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(blocks.size(), " bytes are not whole ", GgmlTypeName(type),
                                                   " blocks of ", block_bytes, " bytes"));
  }
  const BlockConversion convert = type == GgmlType::kQ4_K ? q4k : q6k;
  std::array<uint8_t, sizeof(BlockQ6_K)> converted;
  for (size_t at = 0; at < blocks.size(); at += block_bytes) {
    convert(blocks.data() + at, converted.data());
    std::memcpy(blocks.data() + at, converted.data(), block_bytes);
  }
  return absl::OkStatus();
}

}  // namespace

bool HasGroupMajorOrder(GgmlType type) { return type == GgmlType::kQ4_K || type == GgmlType::kQ6_K; }

absl::Status ToGroupMajorOrder(GgmlType type, absl::Span<uint8_t> blocks) {
  return ConvertBlocks(type, blocks, Q4KToGroupMajor, Q6KToGroupMajor);
}

absl::Status ToGgmlOrder(GgmlType type, absl::Span<uint8_t> blocks) {
  return ConvertBlocks(type, blocks, Q4KToGgml, Q6KToGgml);
}

void GroupMajorBlockToGgml(GgmlType type, const uint8_t* in, uint8_t* out) {
  if (type == GgmlType::kQ4_K) Q4KToGgml(in, out);
  else Q6KToGgml(in, out);
}

}  // namespace tandem
