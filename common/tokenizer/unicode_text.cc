#include "common/tokenizer/unicode_text.h"

#include <unicode/uchar.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tandem {
namespace {

// The byte range a sequence's second byte may take after `lead` (RFC 3629's
// table); later continuation bytes are always 80..BF.
struct SecondByteRange {
  uint8_t lo, hi;
};
SecondByteRange SecondByte(uint8_t lead) {
  if (lead == 0xE0) return {0xA0, 0xBF};
  if (lead == 0xED) return {0x80, 0x9F};
  if (lead == 0xF0) return {0x90, 0xBF};
  if (lead == 0xF4) return {0x80, 0x8F};
  return {0x80, 0xBF};
}

// Length of the valid sequence lead byte `lead` starts, 0 when it starts none.
size_t ValidSequenceLength(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// How many bytes from `pos` form a valid (possibly truncated) prefix of one
// sequence, and whether it is complete.
struct PrefixLength {
  size_t valid;
  bool complete;
};
PrefixLength ValidPrefix(std::string_view bytes, size_t pos) {
  const uint8_t lead = static_cast<uint8_t>(bytes[pos]);
  const size_t len = ValidSequenceLength(lead);
  if (len == 0) return {0, false};
  size_t n = 1;
  for (; n < len && pos + n < bytes.size(); ++n) {
    const uint8_t c = static_cast<uint8_t>(bytes[pos + n]);
    const SecondByteRange range = n == 1 ? SecondByte(lead) : SecondByteRange{0x80, 0xBF};
    if (c < range.lo || c > range.hi) return {n, false};
  }
  return {n, n == len};
}

}  // namespace

absl::Status CheckUtf8(std::string_view text, std::string_view what) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<uint8_t>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const PrefixLength prefix = ValidPrefix(text, pos);
    if (!prefix.complete) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: not valid UTF-8 at byte %d (0x%02X)", what, pos, static_cast<uint8_t>(text[pos])));
    }
    pos += prefix.valid;
  }
  return absl::OkStatus();
}

size_t Utf8SequenceLength(uint8_t lead) {
  const size_t len = ValidSequenceLength(lead);
  return len == 0 ? 1 : len;
}

char32_t NextCodePoint(std::string_view text, size_t* pos) {
  const uint8_t lead = static_cast<uint8_t>(text[*pos]);
  if (lead < 0x80) {
    ++*pos;
    return lead;
  }
  const size_t len = std::min(Utf8SequenceLength(lead), text.size() - *pos);
  char32_t c = len == 2 ? (lead & 0x1F) : len == 3 ? (lead & 0x0F) : (lead & 0x07);
  for (size_t i = 1; i < len; ++i) c = (c << 6) | (static_cast<uint8_t>(text[*pos + i]) & 0x3F);
  *pos += len;
  return c;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (static_cast<uint8_t>(bytes[pos]) < 0x80) {
      out.push_back(bytes[pos++]);
      continue;
    }
    const PrefixLength prefix = ValidPrefix(bytes, pos);
    if (prefix.complete) {
      out.append(bytes.substr(pos, prefix.valid));
      pos += prefix.valid;
    } else {
      out.append("\xEF\xBF\xBD");
      pos += std::max<size_t>(prefix.valid, 1);
    }
  }
  return out;
}

bool IsWhitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return u_isUWhiteSpace(static_cast<UChar32>(c));
}

bool IsNumeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  const int8_t type = u_charType(static_cast<UChar32>(c));
  return type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80)
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
  return u_ispunct(static_cast<UChar32>(c));
}

bool IsWordCharacter(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const UChar32 u = static_cast<UChar32>(c);
  const int8_t type = u_charType(u);
  return u_hasBinaryProperty(u, UCHAR_ALPHABETIC) || type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK ||
         type == U_COMBINING_SPACING_MARK || type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION ||
         u_hasBinaryProperty(u, UCHAR_JOIN_CONTROL);
}

}  // namespace tandem
