// What every benchmark shares: one JSON object per output line, flushed at
// once (so a run cut short still leaves whole lines), and comma-separated
// lists of positive counts from flags.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace tandem {

inline void EmitJsonLine(const nlohmann::json& line) {
  std::fputs((line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// "1,2,4" → {1, 2, 4}; entries that are not positive integers are skipped.
template <typename Int>
std::vector<Int> ParsePositiveList(const std::string& text) {
  std::vector<Int> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    Int v = 0;
    if (absl::SimpleAtoi(part, &v) && v > 0) values.push_back(v);
  }
  return values;
}

}  // namespace tandem
