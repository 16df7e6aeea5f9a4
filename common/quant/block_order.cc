#include "common/quant/block_order.h"

#include <immintrin.h>

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

// ggml -> group-major runs at load over every Q4_K/Q6_K matrix a CPU
// process keeps (~180 M blocks for Mixtral-8x7B Q4_K_M), so it is
// vectorised (AVX2, the build's baseline): the block's 256 levels are
// spread one per byte in value order, then each 16-value group l is
// packed into its group-major bytes with in-lane shifts. The way back is
// the scalar Move: only the rare readers of a converted view take it.
//
// The levels of a Q4_K block's qs (or a Q6_K's low four bits), value v at
// values[v].
void SpreadQ4KLevels(const uint8_t* qs, uint8_t* values) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (int c = 0; c < 4; ++c) {  // 64-value chunk c: low nibbles first, then high
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + 64 * c), _mm256_and_si256(q, low4));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(values + 64 * c + 32),
                        _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
  }
}

// Group l's 16 four-bit levels `g` (value order) into group-major qs:
// byte 4l + j takes steps 0 (low nibble) and 1 (high), byte 64 + 4l + j
// steps 2 and 3. Levels < 16, so the 16-bit shift carries nothing across.
void PackGroupLowBits(__m128i g, int l, uint8_t* qs) {
  const __m128i y = _mm_or_si128(g, _mm_slli_epi16(_mm_srli_si128(g, 4), 4));  // y[i] = g[i] | g[i + 4] << 4
  const int steps01 = _mm_cvtsi128_si32(y), steps23 = _mm_extract_epi32(y, 2);
  std::memcpy(qs + 4 * l, &steps01, 4);
  std::memcpy(qs + 64 + 4 * l, &steps23, 4);
}

void Q4KToGroupMajor(const uint8_t* in, uint8_t* out) {
  std::memcpy(out, in, offsetof(BlockQ4_K, qs));  // d, dmin and scales stay
  alignas(32) uint8_t values[kKBlockSize];
  SpreadQ4KLevels(in + offsetof(BlockQ4_K, qs), values);
  for (int l = 0; l < kKBlockSize / 16; ++l) {
    PackGroupLowBits(_mm_load_si128(reinterpret_cast<const __m128i*>(values + 16 * l)), l,
                     out + offsetof(BlockQ4_K, qs));
  }
}

void Q6KToGroupMajor(const uint8_t* in, uint8_t* out) {
  std::memcpy(out + offsetof(BlockQ6_K, scales), in + offsetof(BlockQ6_K, scales),
              sizeof(BlockQ6_K) - offsetof(BlockQ6_K, scales));  // scales and d stay
  // Six-bit levels in value order: value 128h + 32q + i has ql[64h + 32(q %
  // 2) + i]'s nibble q / 2 and bits 2q, 2q + 1 of qh[32h + i] (as bits 4-5).
  alignas(32) uint8_t values[kKBlockSize];
  const __m256i low4 = _mm256_set1_epi8(0x0f), high2 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + offsetof(BlockQ6_K, ql) + 64 * h));
    const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + offsetof(BlockQ6_K, ql) + 64 * h + 32));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + offsetof(BlockQ6_K, qh) + 32 * h));
    // 16-bit shifts: the bits that cross from the neighbour byte are masked.
    const __m256i quarters[4] = {
        _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), high2)),
        _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), high2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(qh, high2)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), high2))};
    for (int q = 0; q < 4; ++q) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(values + 128 * h + 32 * q), quarters[q]);
    }
  }
  const __m128i low4_128 = _mm_set1_epi8(0x0f), two = _mm_set1_epi8(0x03);
  for (int l = 0; l < kKBlockSize / 16; ++l) {
    const __m128i g = _mm_load_si128(reinterpret_cast<const __m128i*>(values + 16 * l));
    PackGroupLowBits(_mm_and_si128(g, low4_128), l, out + offsetof(BlockQ6_K, ql));
    // qh byte 4l + j: step s's two high bits at bits 2s, 2s + 1 (each < 4:
    // no carry across bytes).
    const __m128i top = _mm_and_si128(_mm_srli_epi16(g, 4), two);
    const __m128i z = _mm_or_si128(
        _mm_or_si128(top, _mm_slli_epi16(_mm_srli_si128(top, 4), 2)),
        _mm_or_si128(_mm_slli_epi16(_mm_srli_si128(top, 8), 4), _mm_slli_epi16(_mm_srli_si128(top, 12), 6)));
    const int bits = _mm_cvtsi128_si32(z);
    std::memcpy(out + offsetof(BlockQ6_K, qh) + 4 * l, &bits, 4);
  }
}

void Q4KToGgml(const uint8_t* in, uint8_t* out) {
  Move(
      in, out, sizeof(BlockQ4_K), 4, [](int v) { return LowBitsGroupMajor(v, offsetof(BlockQ4_K, qs)); },
      LowBitsGgmlQ4K);
}
void Q6KToGgml(const uint8_t* in, uint8_t* out) {
  uint8_t low[sizeof(BlockQ6_K)];
  Move(
      in, low, sizeof(BlockQ6_K), 4, [](int v) { return LowBitsGroupMajor(v, offsetof(BlockQ6_K, ql)); },
      LowBitsGgmlQ6K);
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
    return absl::InvalidArgumentError(
        absl::StrCat(blocks.size(), " bytes are not whole ", GgmlTypeName(type), " blocks of ", block_bytes, " bytes"));
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
  if (type == GgmlType::kQ4_K)
    Q4KToGgml(in, out);
  else
    Q6KToGgml(in, out);
}

}  // namespace tandem
