// Which kernel path a linear layer takes at each row count: a short list of
// steps "from M rows on, path P" (e.g. 1:stream,16:bf16_dot). Float weights
// (f32, f16, bf16) share one list, but bf16 may have its own (where AMX
// tiles multiply bf16 and nothing else); a quantized type may have its own, since
// the crossovers differ by type and by CPU: the bf16 GEMM beats the
// streaming GEMV from ~12 rows on bf16 weights, but on quantized weights it
// must first dequantize each row, and int8 dot products on the blocks stay
// faster to a few dozen rows, further on some CPUs (docs/BENCHMARKS.md,
// Prefill GEMM and Other instruction sets). The process holds one
// plan, used by every Linear and expert FFN call that does not pass its own:
// the built-in one for the active ISA until start-up installs a measured one
// (coordinator/calibration, tandem-cpu-worker --kernel_plan,
// kernel_calibration.h). Processes that must agree bit for bit (a
// coordinator and its CPU workers) must use the same plan.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/cpu_features.h"
#include "common/base/dtype.h"
#include "common/kernels/linear_kernels.h"

namespace tandem {

struct KernelPlanStep {
  int64_t min_rows = 1;  // this path from this many rows on
  KernelPath path = KernelPath::kStream;
};
using KernelPlanSteps = std::vector<KernelPlanStep>;

// The steps one quantized type takes instead of the plan's common ones.
struct KernelPlanOverride {
  DType dtype = DType::kQ8_0;  // a quantized type
  KernelPlanSteps steps;
};

// How a CPU's bf16 dot products (vdpbf16ps) compare with its f32 FMAs.
// AMD Zen 4/5 run them at the FMA's rate, twice its flops: the bf16 GEMMs
// win prefill. Intel's Sapphire and Emerald Rapids give them no more flops
// than f32 FMA (measured: half), and their int8 dot products four to eight
// times as many: there the int8 GEMM takes quantized prefill and the f32
// GEMM float prefill.
enum class Bf16DotSpeed : uint8_t { kFast, kSlow };

// Immutable; copyable.
class KernelPlan {
 public:
  // `steps` serve every dtype except those `overrides` names, at most once
  // each, bf16 or quantized only. Each list: min_rows strictly ascending,
  // the first 1. InvalidArgument naming the list otherwise.
  static absl::StatusOr<KernelPlan> Create(KernelPlanSteps steps, std::string source,
                                           std::vector<KernelPlanOverride> overrides = {});
  // The built-in plan for a CPU at `isa`, from the crossovers measured on the
  // machines tandem was developed on (docs/BENCHMARKS.md, Prefill GEMM): bf16_dot for
  // GEMMs where the CPU has it and runs it fast (x rounded to bf16, see linear.h).
  static KernelPlan BuiltIn(IsaLevel isa, Bf16DotSpeed bf16_dot = Bf16DotSpeed::kFast);
  // The same without any kernel that rounds its input: stream, then packed
  // (f32 FMA), every layer as if LinearOptions::f32_activations (so the
  // stream is never the bf16 one). What tests holding the engine to a
  // float64 reference at f32 precision run, and --kernel_plan exact.
  static KernelPlan Exact(IsaLevel isa);
  // As Spec() prints: "1:stream,16:bf16_dot" for every dtype, optionally
  // followed by ";bf16=STEPS" (bf16 weights), ";quantized=STEPS" (every
  // quantized type) and ";TYPE=STEPS" (one quantized type, e.g.
  // q8_0=1:int8_dot,32:bf16_dot, overriding "quantized"), each key at most
  // once. InvalidArgument naming the step or key otherwise.
  static absl::StatusOr<KernelPlan> Parse(const std::string& spec, std::string source);

  // The path for `rows` rows of `dtype` weights.
  KernelPath PathFor(int64_t rows, DType dtype) const;
  // The steps of `dtype` (f32 and f16 weights share the common list).
  const KernelPlanSteps& StepsFor(DType dtype) const { return steps_[static_cast<size_t>(dtype)]; }
  std::string Spec() const;
  // Where it came from: "built-in for avx512_bf16", "measured ...", "--kernel_plan".
  const std::string& source() const { return source_; }
  // Exact(): no kernel may round x, whatever its path.
  bool f32_inputs() const { return f32_inputs_; }

 private:
  KernelPlan() = default;
  std::array<KernelPlanSteps, kNumDTypes> steps_;  // by DType
  std::string source_;
  bool f32_inputs_ = false;
};

// This CPU's bf16 dot products, measured once per process (a few ms, one
// thread, best of 5 register-only loops): kSlow where they give less than
// 1.5x the flops of f32 FMA (AMD: 2x; Intel: 0.5-1x); kFast where the CPU
// lacks them (no plan uses them there). Thread-safe.
Bf16DotSpeed MeasuredBf16DotSpeed();
// KernelPlan::BuiltIn(ActiveIsa(), MeasuredBf16DotSpeed()), built once per
// level. Thread-safe; the reference stays valid for the life of the process.
const KernelPlan& BuiltInKernelPlan();
// The process's plan: BuiltInKernelPlan() until set.
// Thread-safe; the reference stays valid for the life of the process.
const KernelPlan& ProcessKernelPlan();
// Installs `plan` for every later call. Call at start-up, before compute
// threads run kernels (a call running meanwhile may see either plan).
void SetProcessKernelPlan(KernelPlan plan);

}  // namespace tandem
