// The few Unicode operations a Jinja template needs on Python str semantics
// while strings stay UTF-8: code-point iteration, Python's whitespace set,
// case mapping and repr's printability. Pure functions; any thread.
//
// Case mapping covers ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
// (the scripts whose case a chat template plausibly changes); other code
// points map to themselves. Invalid UTF-8 bytes are taken as one code point each (U+DC80 +
// byte, Python's surrogateescape), so nothing is ever dropped.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::jinja {

// The code point starting at s[*pos]; advances *pos past it.
char32_t DecodeUtf8(absl::string_view s, size_t* pos);
void AppendUtf8(std::string* out, char32_t c);

// Number of code points (Python len()).
size_t CodePointCount(absl::string_view s);
// Byte offset of every code point, plus s.size() at the end.
std::vector<size_t> CodePointOffsets(absl::string_view s);

// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t c);
// Python str.isprintable() for one code point (what repr leaves unescaped),
// for the categories repr meets in practice: C0/C1 controls, separators
// other than ' ', and the common format characters are not printable.
bool IsPrintable(char32_t c);
bool IsCased(char32_t c);  // has an upper or lower form in the covered scripts
bool IsUpper(char32_t c);
bool IsLower(char32_t c);
bool IsAlpha(char32_t c);  // letters of the covered scripts and any CJK/other letter above U+00FF
bool IsDigit(char32_t c);  // ASCII digits

std::string ToLower(absl::string_view s);
std::string ToUpper(absl::string_view s);
char32_t LowerChar(char32_t c);
char32_t UpperChar(char32_t c);

// Python str.strip/lstrip/rstrip: `chars` null strips whitespace, else any
// of the code points in *chars.
absl::string_view StripPython(absl::string_view s, const std::string* chars, bool left, bool right);

}  // namespace tandem::jinja
