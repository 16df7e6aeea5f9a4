// Which kernel path a linear layer takes at each row count: a short list of
// steps "from M rows on, path P" (e.g. 1:stream,16:bf16_dot). The process
// holds one plan, used by every Linear and expert FFN call that does not
// pass its own: the built-in one for the active ISA until start-up installs
// a measured one (coordinator/calibration, tandem-cpu-worker --kernel_plan,
// kernel_calibration.h). Processes that must agree bit for bit (a
// coordinator and its CPU workers) must use the same plan.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/cpu_features.h"
#include "common/kernels/linear_kernels.h"

namespace tandem {

struct KernelPlanStep {
  int64_t min_rows = 1;  // this path from this many rows on
  KernelPath path = KernelPath::kStream;
};

// Immutable; copyable.
class KernelPlan {
 public:
  // steps: min_rows strictly ascending, the first 1. InvalidArgument otherwise.
  static absl::StatusOr<KernelPlan> Create(std::vector<KernelPlanStep> steps, std::string source);
  // The built-in plan for a CPU at `isa`, from the crossovers measured on the
  // machines tandem was developed on (docs/BENCHMARKS.md): bf16_dot for
  // GEMMs where the CPU has it (x rounded to bf16, see linear.h).
  static KernelPlan BuiltIn(IsaLevel isa);
  // The same without any kernel that rounds its input: stream, then packed
  // (f32 FMA). What tests holding the engine to a float64 reference at f32
  // precision run, and --kernel_plan exact.
  static KernelPlan Exact(IsaLevel isa);
  // "1:stream,16:bf16_dot" (what Spec() prints); InvalidArgument naming the
  // step otherwise.
  static absl::StatusOr<KernelPlan> Parse(const std::string& spec, std::string source);

  KernelPath PathFor(int64_t rows) const;
  std::string Spec() const;
  const std::vector<KernelPlanStep>& steps() const { return steps_; }
  // Where it came from: "built-in for avx512_bf16", "measured ...", "--kernel_plan".
  const std::string& source() const { return source_; }

 private:
  KernelPlan(std::vector<KernelPlanStep> steps, std::string source)
      : steps_(std::move(steps)), source_(std::move(source)) {}
  std::vector<KernelPlanStep> steps_;
  std::string source_;
};

// The process's plan: KernelPlan::BuiltIn(ActiveIsa()) until set.
// Thread-safe; the reference stays valid for the life of the process.
const KernelPlan& ProcessKernelPlan();
// Installs `plan` for every later call. Call at start-up, before compute
// threads run kernels (a call running meanwhile may see either plan).
void SetProcessKernelPlan(KernelPlan plan);

}  // namespace tandem
