// The CPU kernel flags every program that computes shares: --max_isa (cap
// the kernels' instruction set) and --kernel_plan (builtin | exact | measure
// | ROWS:PATH,...). In a file of their own so that benchmarks with flags of
// their own can take these two without the rest of runtime_flags.
#pragma once

#include "absl/status/status.h"
#include "runtime/local_runtime.h"

namespace tandem {

// Applies --max_isa (caps the kernels' ISA for the process) and
// --kernel_plan (installs a given plan, or sets options->measure_kernel_plan
// for "measure"; options may be null). InvalidArgument naming the flag.
// OpenRuntimeFromFlags calls it first; call it earlier to cap the ISA
// before anything else runs kernels.
absl::Status ApplyKernelFlags(LocalRuntimeOptions* options);

}  // namespace tandem
