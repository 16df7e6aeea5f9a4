// Python str methods on UTF-8 text, with Python's results (indices and
// widths count code points, whitespace is Python's). Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem::jinja {

// str.split / str.rsplit: `sep` null splits on runs of whitespace and drops
// empty ends; maxsplit < 0 means no limit. `sep` must not be empty.
std::vector<std::string> PySplit(absl::string_view s, const std::string* sep, int64_t maxsplit);
std::vector<std::string> PyRSplit(absl::string_view s, const std::string* sep, int64_t maxsplit);
// str.splitlines: \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, \u2028, \u2029.
std::vector<std::string> PySplitLines(absl::string_view s, bool keepends);
std::string PyTitle(absl::string_view s);       // str.title
std::string PyCapitalize(absl::string_view s);  // str.capitalize
std::string PySwapCase(absl::string_view s);
// str.replace; count < 0 replaces all; an empty `old` inserts `replacement`
// around every code point.
std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view replacement, int64_t count);
// str.center / ljust / rjust with a one-code-point fill.
std::string PyCenter(absl::string_view s, int64_t width, absl::string_view fill);
std::string PyLJust(absl::string_view s, int64_t width, absl::string_view fill);
std::string PyRJust(absl::string_view s, int64_t width, absl::string_view fill);
// str.find / rfind: the code-point index, or -1.
int64_t PyFind(absl::string_view s, absl::string_view sub, bool from_right);
int64_t PyCount(absl::string_view s, absl::string_view sub);  // non-overlapping
// str.isdigit, isalpha, isalnum, isspace, islower, isupper (false when empty).
bool PyIsDigit(absl::string_view s);
bool PyIsAlpha(absl::string_view s);
bool PyIsAlnum(absl::string_view s);
bool PyIsSpace(absl::string_view s);
bool PyIsLower(absl::string_view s);
bool PyIsUpper(absl::string_view s);

}  // namespace tandem::jinja
