// Tests that hold the engine to the float64 reference at f32 precision (the
// parity, generation and beam tests) run the kernels that keep their inputs
// f32: the built-in plan's bf16_dot rounds GEMM inputs to bf16 (its own
// accuracy is tested in linear_test, expert_ffn_test and forward_parity_test's
// bf16 case). Servers these tests start get --kernel_plan exact.
#pragma once

#include "common/base/cpu_features.h"
#include "common/kernels/kernel_plan.h"

namespace tandem::test {

// Installs KernelPlan::Exact for this process; returns true (for a
// namespace-scope initializer that runs before any test).
inline bool UseExactKernels() {
  SetProcessKernelPlan(KernelPlan::Exact(ActiveIsa()));
  return true;
}

}  // namespace tandem::test
