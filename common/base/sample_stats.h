// Order statistics of a sample of measurements (timings, rates): the one
// Median and Percentile of the runtime (calibration, scheduler stats) and the
// benchmarks (bench/bench_stats.h). Header-only. An empty sample gives 0.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace tandem {

// The middle value; the mean of the two middle ones for an even count.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The value at fraction q in [0, 1] of the sorted sample (nearest rank:
// index round(q * (n - 1))).
inline double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t at = static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(at, values.size() - 1)];
}

}  // namespace tandem
