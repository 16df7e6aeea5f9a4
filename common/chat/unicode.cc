#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

constexpr char32_t kEscapedByteBase = 0xDC80;  // surrogateescape: invalid byte b -> U+DC00 + b

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

}  // namespace

char32_t DecodeUtf8(absl::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  int length = 0;
  char32_t c = 0;
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2) {
    length = 2;
    c = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3;
    c = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
    length = 4;
    c = b0 & 0x07;
  }
  if (length == 0 || *pos + length > s.size()) {
    ++*pos;
    return kEscapedByteBase - 0x80 + b0;
  }
  for (int i = 1; i < length; ++i) {
    const auto b = static_cast<unsigned char>(s[*pos + i]);
    if (!IsContinuation(b)) {
      ++*pos;
      return kEscapedByteBase - 0x80 + b0;
    }
    c = (c << 6) | (b & 0x3F);
  }
  // Overlong forms and surrogates are invalid UTF-8: escape the lead byte.
  if ((length == 3 && (c < 0x800 || (c >= 0xD800 && c <= 0xDFFF))) || (length == 4 && (c < 0x10000 || c > 0x10FFFF))) {
    ++*pos;
    return kEscapedByteBase - 0x80 + b0;
  }
  *pos += length;
  return c;
}

void AppendUtf8(std::string* out, char32_t c) {
  if (c >= kEscapedByteBase && c <= kEscapedByteBase + 0x7F) {  // an escaped invalid byte goes back as itself
    out->push_back(static_cast<char>(c - kEscapedByteBase + 0x80));
  } else if (c < 0x80) {
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

size_t CodePointCount(absl::string_view s) {
  size_t count = 0;
  for (size_t pos = 0; pos < s.size(); ++count) DecodeUtf8(s, &pos);
  return count;
}

std::vector<size_t> CodePointOffsets(absl::string_view s) {
  std::vector<size_t> offsets;
  size_t pos = 0;
  while (pos < s.size()) {
    offsets.push_back(pos);
    DecodeUtf8(s, &pos);
  }
  offsets.push_back(s.size());
  return offsets;
}

bool IsPythonSpace(char32_t c) {
  switch (c) {
    case ' ':
    case '\t':
    case '\n':
    case '\v':
    case '\f':
    case '\r':
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x1F:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsPrintable(char32_t c) {
  if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) return false;
  if (c == ' ') return true;
  if (IsPythonSpace(c)) return false;            // Zs, Zl, Zp other than ' '
  if (c >= 0x200B && c <= 0x200F) return false;  // zero-width and direction marks (Cf)
  if (c >= 0x202A && c <= 0x202E) return false;  // embeddings and overrides (Cf)
  if (c >= 0x2060 && c <= 0x206F) return false;  // word joiner, invisible operators (Cf)
  if (c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFB)) return false;
  if (c >= 0xD800 && c <= 0xDFFF) return false;  // surrogates (and escaped bytes)
  if (c >= 0xE000 && c <= 0xF8FF) return false;  // private use (Co)
  return c <= 0x10FFFF;
}

// Latin Extended-A pairs an upper and a lower letter at adjacent code
// points: upper at even ones in U+0100-0137 and U+014A-0177, at odd ones
// in U+0139-0148 and U+0179-017E.
bool IsLatinExtendedAUpper(char32_t c) {
  if ((c >= 0x100 && c <= 0x137 && c != 0x130) || (c >= 0x14A && c <= 0x177)) return c % 2 == 0;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c % 2 == 1;
  return false;
}
bool IsLatinExtendedALower(char32_t c) {
  if ((c >= 0x100 && c <= 0x137 && c != 0x131) || (c >= 0x14A && c <= 0x177)) return c % 2 == 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return c % 2 == 0;
  return false;
}

char32_t LowerChar(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (IsLatinExtendedAUpper(c)) return c + 1;
  if (c == 0x178) return 0xFF;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 32;  // Greek capitals
  if (c >= 0x410 && c <= 0x42F) return c + 32;                // Cyrillic А-Я
  if (c >= 0x400 && c <= 0x40F) return c + 80;                // Cyrillic Ѐ-Џ
  return c;
}

char32_t UpperChar(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (IsLatinExtendedALower(c)) return c - 1;
  if (c == 0xB5) return 0x39C;
  if (c >= 0x3B1 && c <= 0x3CB && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;  // final sigma
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

bool IsUpper(char32_t c) { return LowerChar(c) != c; }
bool IsLower(char32_t c) { return UpperChar(c) != c || c == 0xDF; }
bool IsCased(char32_t c) { return IsUpper(c) || IsLower(c); }
bool IsDigit(char32_t c) { return c >= '0' && c <= '9'; }
bool IsAlpha(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  if (IsCased(c)) return true;
  return c > 0xFF && IsPrintable(c) && !IsPythonSpace(c) && !(c >= 0x2000 && c <= 0x2BFF) &&
         !(c >= 0x3000 && c <= 0x303F) && !(c >= 0xFF00 && c <= 0xFF20);
}

std::string ToLower(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) AppendUtf8(&out, LowerChar(DecodeUtf8(s, &pos)));
  return out;
}

std::string ToUpper(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    if (c == 0xDF) {  // ß has no single capital: Python gives "SS"
      out += "SS";
    } else {
      AppendUtf8(&out, UpperChar(c));
    }
  }
  return out;
}

absl::string_view StripPython(absl::string_view s, const std::string* chars, bool left, bool right) {
  auto strip_it = [&](char32_t c) {
    if (chars == nullptr) return IsPythonSpace(c);
    for (size_t pos = 0; pos < chars->size();) {
      if (DecodeUtf8(*chars, &pos) == c) return true;
    }
    return false;
  };
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!strip_it(DecodeUtf8(s, &next))) break;
      begin = next;
    }
  }
  if (right) {
    const std::vector<size_t> offsets = CodePointOffsets(s.substr(begin, end - begin));
    size_t i = offsets.size() - 1;  // offsets.back() is the end
    while (i > 0) {
      size_t pos = offsets[i - 1];
      if (!strip_it(DecodeUtf8(s.substr(begin), &pos))) break;
      --i;
    }
    end = begin + offsets[i];
  }
  return s.substr(begin, end - begin);
}

}  // namespace tandem::jinja
