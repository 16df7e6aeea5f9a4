// What the benchmarks report of repeated measurements: median, mean, sample
// standard deviation, extremes and p99 in one Summary. Header-only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/base/sample_stats.h"

namespace tandem {

struct Summary {
  int64_t n = 0;
  double median = 0, mean = 0, stddev = 0, min = 0, max = 0, p99 = 0;
};

// All zero for an empty sample.
inline Summary Summarise(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.n = static_cast<int64_t>(n);
  s.median = Median(v);
  s.p99 = Percentile(v, 0.99);
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(n);
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.stddev = n > 1 ? std::sqrt(sq / static_cast<double>(n - 1)) : 0;
  s.min = v.front();
  s.max = v.back();
  return s;
}

}  // namespace tandem
