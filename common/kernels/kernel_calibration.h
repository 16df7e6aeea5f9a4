// Measures which kernel path is fastest at each row count on this machine
// and turns the winners into a KernelPlan: the data behind "stream below N
// rows, bf16_dot from N on" instead of a threshold fixed on another machine.
//
// Each path available at ActiveIsa() (stream, packed, bf16_dot for bf16
// weights, onednn) runs Linear over the given matrices back to back (an
// expert's gate, up and down: the shapes that dominate), rotating through
// `weights` so that a call does not find the previous call's weights in the
// caches when they are larger than them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/kernels/kernel_plan.h"
#include "common/kernels/linear_types.h"

namespace tandem {

struct KernelCalibrationOptions {
  std::vector<int64_t> rows = {1, 2, 4, 8, 12, 16, 32, 48, 64, 128, 256, 512};  // ascending
  int reps = 3;  // timed calls per (path, rows) after one warm-up; the median counts
  // A path that takes more than this times the fastest at some row count
  // is not timed at larger counts (the stream kernel at 512 rows).
  double drop_ratio = 2.0;
  // A new path takes over only when it is at least this much faster than
  // the one that won at the previous count: noise does not make the plan
  // flip back and forth.
  double switch_margin = 0.03;
  double max_seconds = 30;  // larger counts are skipped past this (at least 2 are timed)

  absl::Status Validate() const;  // InvalidArgument naming the field
};

struct KernelTiming {
  int64_t rows = 0;
  std::string kernel;  // e.g. "avx512_bf16_dot"
  KernelPath path = KernelPath::kStream;
  double median_us = 0;  // all matrices of one group, one call each
};

struct KernelCalibration {
  KernelPlan plan;
  std::vector<KernelTiming> timings;
  double seconds = 0;
};

// `groups`: one or more sets of matrices, each timed as one unit (e.g. one
// expert's three); consecutive calls take the next group. Every matrix must
// be valid (non-null, n, k >= 1). InvalidArgument for bad options or input.
absl::StatusOr<KernelCalibration> MeasureKernelPlan(std::span<const std::vector<LinearWeight>> groups, ThreadPool* pool,
                                                    const KernelCalibrationOptions& options = {});

}  // namespace tandem
