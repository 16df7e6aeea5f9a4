// What every benchmark shares: one JSON object per output line, flushed at
// once (so a run cut short still leaves whole lines), stamped with the
// machine it ran on (CPU, its flags, the ISA level the kernels run at, the
// kernel choice when the bench set one, the load average at that moment),
// and comma-separated lists of positive counts from flags.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace tandem {

// The stamp: {"cpu", "cpu_flags", "isa", "load_1m", and what
// SetBenchStamp added}. Fields a line already has are kept.
nlohmann::json BenchStamp();
// Adds `key` to every later stamp (e.g. "kernels": the kernel choice).
void SetBenchStamp(const std::string& key, nlohmann::json value);

// Writes `line` plus the stamp to stdout.
void EmitJsonLine(nlohmann::json line);

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
