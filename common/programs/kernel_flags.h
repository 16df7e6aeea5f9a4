// The CPU kernel flags every program that computes takes, defined once:
// --max_isa (cap the kernels' instruction set), --kernel_plan (builtin |
// exact | measure | ROWS:PATH,...) and --block_order (Q4_K/Q6_K blocks of
// copied weights). A library of its own so that the coordinator's programs,
// the CPU worker and the benchmarks share one definition: CPU workers need
// the same plan and order as their coordinator for bit-identical results.
#pragma once

#include "absl/status/statusor.h"
#include "common/kernels/linear.h"

namespace tandem {

struct KernelFlags {
  // --kernel_plan measure: time every path on the model at start-up (the
  // caller measures; nothing is installed yet).
  bool measure_kernel_plan = false;
  BlockOrder block_order = BlockOrder::kGgml;  // --block_order, resolved for this CPU
};

// Applies --max_isa (caps the kernels' ISA for the process) and an explicit
// --kernel_plan (builtin, exact, or a spec), and reads --block_order.
// InvalidArgument naming the flag. Call it before anything runs kernels.
absl::StatusOr<KernelFlags> ApplyKernelFlags();

}  // namespace tandem
