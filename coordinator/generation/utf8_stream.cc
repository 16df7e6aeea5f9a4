#include "coordinator/generation/utf8_stream.h"

#include <cstdint>

namespace tandem {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the sequence a lead byte starts (0: not a lead byte).
int SequenceLength(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 0;
}

// Whether bytes[1..n) are valid continuations for lead bytes[0] (RFC 3629:
// no overlong forms, no surrogates, nothing above U+10FFFF). Checks only the
// bytes present (n may be short of the full length).
bool ValidPrefix(std::string_view bytes, size_t n) {
  const uint8_t lead = static_cast<uint8_t>(bytes[0]);
  for (size_t i = 1; i < n; ++i) {
    const uint8_t c = static_cast<uint8_t>(bytes[i]);
    uint8_t lo = 0x80, hi = 0xBF;
    if (i == 1) {
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    }
    if (c < lo || c > hi) return false;
  }
  return true;
}

// Appends the valid characters of `bytes` to `out`; returns how many
// trailing bytes form an incomplete (but so far valid) sequence, which are
// not consumed when `keep_tail` (else they become U+FFFD).
size_t Decode(std::string_view bytes, bool keep_tail, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const int len = SequenceLength(static_cast<uint8_t>(bytes[i]));
    if (len == 0) {
      out->append(kReplacement);
      ++i;
      continue;
    }
    const size_t available = std::min(static_cast<size_t>(len), bytes.size() - i);
    if (!ValidPrefix(bytes.substr(i), available)) {
      out->append(kReplacement);
      ++i;  // resynchronise at the next byte
      continue;
    }
    if (available < static_cast<size_t>(len)) {
      if (keep_tail) return bytes.size() - i;
      out->append(kReplacement);
      return 0;
    }
    out->append(bytes.substr(i, static_cast<size_t>(len)));
    i += static_cast<size_t>(len);
  }
  return 0;
}

}  // namespace

std::string SanitizeUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Decode(bytes, /*keep_tail=*/false, &out);
  return out;
}

std::string Utf8Stream::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const size_t tail = Decode(pending_, /*keep_tail=*/true, &out);
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out = SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace tandem
