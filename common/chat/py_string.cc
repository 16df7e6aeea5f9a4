#include "common/chat/py_string.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1C || c == 0x1D || c == 0x1E || c == 0x85 ||
         c == 0x2028 || c == 0x2029;
}

template <typename Pred>
bool AllOf(absl::string_view s, Pred pred) {
  if (s.empty()) return false;
  for (size_t pos = 0; pos < s.size();) {
    if (!pred(DecodeUtf8(s, &pos))) return false;
  }
  return true;
}

}  // namespace

std::vector<std::string> PySplit(absl::string_view s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep != nullptr) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      const size_t found = s.find(*sep, start);
      if (found == absl::string_view::npos) break;
      out.emplace_back(s.substr(start, found - start));
      start = found + sep->size();
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t pos = 0;
  while (true) {
    // Skip whitespace; the rest is one field once maxsplit is reached.
    while (pos < s.size()) {
      size_t next = pos;
      if (!IsPythonSpace(DecodeUtf8(s, &next))) break;
      pos = next;
    }
    if (pos >= s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(pos));  // the rest, trailing whitespace included (as Python)
      break;
    }
    const size_t begin = pos;
    while (pos < s.size()) {
      size_t next = pos;
      if (IsPythonSpace(DecodeUtf8(s, &next))) break;
      pos = next;
    }
    out.emplace_back(s.substr(begin, pos - begin));
  }
  return out;
}

std::vector<std::string> PyRSplit(absl::string_view s, const std::string* sep, int64_t maxsplit) {
  if (maxsplit < 0) return PySplit(s, sep, maxsplit);
  std::vector<std::string> out;
  if (sep != nullptr) {
    size_t end = s.size();
    while (static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t found = s.rfind(*sep, end - sep->size());
      if (found == absl::string_view::npos) break;
      out.emplace_back(s.substr(found + sep->size(), end - found - sep->size()));
      end = found;
    }
    out.emplace_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  const std::vector<size_t> offsets = CodePointOffsets(s);
  auto space_at = [&](size_t i) {  // code point i (of offsets.size() - 1)
    size_t pos = offsets[i];
    return IsPythonSpace(DecodeUtf8(s, &pos));
  };
  size_t i = offsets.size() - 1;  // one past the last code point
  while (true) {
    while (i > 0 && space_at(i - 1)) --i;
    if (i == 0) break;
    if (static_cast<int64_t>(out.size()) == maxsplit) {
      out.emplace_back(s.substr(0, offsets[i]));
      break;
    }
    const size_t end = i;
    while (i > 0 && !space_at(i - 1)) --i;
    out.emplace_back(s.substr(offsets[i], offsets[end] - offsets[i]));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> PySplitLines(absl::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t line_begin = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t at = pos;
    const char32_t c = DecodeUtf8(s, &pos);
    if (!IsLineBreak(c)) continue;
    if (c == '\r' && pos < s.size() && s[pos] == '\n') ++pos;
    out.emplace_back(s.substr(line_begin, (keepends ? pos : at) - line_begin));
    line_begin = pos;
  }
  if (line_begin < s.size()) out.emplace_back(s.substr(line_begin));
  return out;
}

std::string PyTitle(absl::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    if (previous_cased) {
      AppendUtf8(&out, LowerChar(c));
    } else if (c == 0xDF) {
      out += "Ss";
    } else {
      AppendUtf8(&out, UpperChar(c));
    }
    previous_cased = IsCased(c);
  }
  return out;
}

std::string PyCapitalize(absl::string_view s) {
  std::string out;
  for (size_t pos = 0; pos < s.size();) {
    const bool first = pos == 0;
    const char32_t c = DecodeUtf8(s, &pos);
    if (first && c == 0xDF) {
      out += "Ss";
    } else {
      AppendUtf8(&out, first ? UpperChar(c) : LowerChar(c));
    }
  }
  return out;
}

std::string PySwapCase(absl::string_view s) {
  std::string out;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    if (c == 0xDF) {
      out += "SS";
    } else {
      AppendUtf8(&out, IsUpper(c) ? LowerChar(c) : UpperChar(c));
    }
  }
  return out;
}

std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view replacement, int64_t count) {
  std::string out;
  int64_t done = 0;
  if (old.empty()) {
    size_t pos = 0;
    while (true) {
      if (count >= 0 && done >= count) break;
      absl::StrAppend(&out, replacement);
      ++done;
      if (pos >= s.size()) break;
      const size_t begin = pos;
      DecodeUtf8(s, &pos);
      absl::StrAppend(&out, s.substr(begin, pos - begin));
    }
    absl::StrAppend(&out, s.substr(std::min(pos, s.size())));
    return out;
  }
  size_t start = 0;
  while (count < 0 || done < count) {
    const size_t found = s.find(old, start);
    if (found == absl::string_view::npos) break;
    absl::StrAppend(&out, s.substr(start, found - start));
    absl::StrAppend(&out, replacement);
    start = found + old.size();
    ++done;
  }
  absl::StrAppend(&out, s.substr(start));
  return out;
}

std::string PyCenter(absl::string_view s, int64_t width, absl::string_view fill) {
  const auto length = static_cast<int64_t>(CodePointCount(s));
  if (width <= length) return std::string(s);
  const int64_t pad = width - length;
  const int64_t left = pad / 2 + (pad & width & 1);  // CPython's split of the padding
  std::string out;
  for (int64_t i = 0; i < left; ++i) absl::StrAppend(&out, fill);
  absl::StrAppend(&out, s);
  for (int64_t i = 0; i < pad - left; ++i) absl::StrAppend(&out, fill);
  return out;
}

std::string PyLJust(absl::string_view s, int64_t width, absl::string_view fill) {
  std::string out(s);
  for (auto n = static_cast<int64_t>(CodePointCount(s)); n < width; ++n) absl::StrAppend(&out, fill);
  return out;
}

std::string PyRJust(absl::string_view s, int64_t width, absl::string_view fill) {
  std::string out;
  for (auto n = static_cast<int64_t>(CodePointCount(s)); n < width; ++n) absl::StrAppend(&out, fill);
  absl::StrAppend(&out, s);
  return out;
}

int64_t PyFind(absl::string_view s, absl::string_view sub, bool from_right) {
  const size_t found = from_right ? s.rfind(sub) : s.find(sub);
  if (found == absl::string_view::npos) return -1;
  return static_cast<int64_t>(CodePointCount(s.substr(0, found)));
}

int64_t PyCount(absl::string_view s, absl::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(CodePointCount(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != absl::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

bool PyIsDigit(absl::string_view s) { return AllOf(s, IsDigit); }
bool PyIsAlpha(absl::string_view s) { return AllOf(s, IsAlpha); }
bool PyIsAlnum(absl::string_view s) {
  return AllOf(s, [](char32_t c) { return IsAlpha(c) || IsDigit(c); });
}
bool PyIsSpace(absl::string_view s) { return AllOf(s, IsPythonSpace); }

bool PyIsLower(absl::string_view s) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    if (IsUpper(c)) return false;
    cased = cased || IsLower(c);
  }
  return cased;
}

bool PyIsUpper(absl::string_view s) {
  bool cased = false;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    if (IsLower(c)) return false;
    cased = cased || IsUpper(c);
  }
  return cased;
}

}  // namespace tandem::jinja
