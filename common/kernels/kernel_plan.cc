#include "common/kernels/kernel_plan.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/base/status_macros.h"
#include "common/kernels/compute_peak.h"

namespace tandem {
namespace {

struct PlanState {
  // Serialises installs; readers go through `current`.
  absl::Mutex mutex;
  std::deque<KernelPlan> installed ABSL_GUARDED_BY(mutex);  // never shrinks: references stay valid
  std::atomic<const KernelPlan*> current{nullptr};
};

PlanState& State() {
  static PlanState* state = new PlanState;
  return *state;
}

constexpr absl::string_view kQuantizedKey = "quantized";
constexpr auto& kQuantizedTypes = kQuantizedDTypes;

// Checks one list (`what` names it in errors) and merges adjacent steps with
// one path.
absl::StatusOr<KernelPlanSteps> CheckedSteps(KernelPlanSteps steps, absl::string_view what) {
  if (steps.empty()) return absl::InvalidArgumentError(absl::StrCat("kernel plan: ", what, " has no steps"));
  if (steps.front().min_rows != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("kernel plan: ", what, ": the first step must start at 1 row, not ", steps.front().min_rows));
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].min_rows <= steps[i - 1].min_rows)
      return absl::InvalidArgumentError(absl::StrCat("kernel plan: ", what, ": step ", i, " starts at ",
                                                     steps[i].min_rows, " rows, not after step ", i - 1, " (",
                                                     steps[i - 1].min_rows, ")"));
  }
  KernelPlanSteps merged;
  for (const KernelPlanStep& step : steps)
    if (merged.empty() || merged.back().path != step.path) merged.push_back(step);
  return merged;
}

// "1:stream,12:packed" -> steps, unchecked; InvalidArgument naming the item.
absl::StatusOr<KernelPlanSteps> ParseSteps(absl::string_view list, const std::string& spec) {
  KernelPlanSteps steps;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t colon = item.find(':');
    int64_t rows = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(item.substr(0, colon), &rows) || rows < 1) {
      return absl::InvalidArgumentError(absl::StrCat("kernel plan \"", spec, "\": step \"", std::string(item),
                                                     "\" is not ROWS:PATH (e.g. 1:stream,12:packed)"));
    }
    absl::StatusOr<KernelPath> path = ParseKernelPath(std::string(item.substr(colon + 1)));
    if (!path.ok())
      return absl::InvalidArgumentError(absl::StrCat("kernel plan \"", spec, "\": ", path.status().message()));
    steps.push_back({rows, *path});
  }
  return steps;
}

std::string StepsSpec(const KernelPlanSteps& steps) {
  std::vector<std::string> parts;
  for (const KernelPlanStep& step : steps)
    parts.push_back(absl::StrCat(step.min_rows, ":", KernelPathName(step.path)));
  return absl::StrJoin(parts, ",");
}

bool SameSteps(const KernelPlanSteps& a, const KernelPlanSteps& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const KernelPlanStep& x, const KernelPlanStep& y) {
    return x.min_rows == y.min_rows && x.path == y.path;
  });
}

// A key of the spec: "quantized" (nullopt), "bf16" or a quantized type's
// name, case-insensitive ("q8_0", "Q4_K"); InvalidArgument otherwise.
absl::StatusOr<std::optional<DType>> ParseKey(absl::string_view key, const std::string& spec) {
  if (absl::EqualsIgnoreCase(key, kQuantizedKey)) return std::optional<DType>();
  if (absl::EqualsIgnoreCase(key, std::string(DTypeName(DType::kBF16)))) return std::optional<DType>(DType::kBF16);
  for (DType dtype : kQuantizedTypes)
    if (absl::EqualsIgnoreCase(key, std::string(DTypeName(dtype)))) return std::optional<DType>(dtype);
  return absl::InvalidArgumentError(absl::StrCat("kernel plan \"", spec, "\": \"", std::string(key),
                                                 "\" is not \"quantized\", \"bf16\" or a quantized type (q8_0, "
                                                 "q4_0, q4_1, q5_0, q4_K, q5_K, q6_K, ...)"));
}

}  // namespace

absl::StatusOr<KernelPlan> KernelPlan::Create(KernelPlanSteps steps, std::string source,
                                              std::vector<KernelPlanOverride> overrides) {
  KernelPlan plan;
  TANDEM_ASSIGN_OR_RETURN(const KernelPlanSteps common, CheckedSteps(std::move(steps), "the common list"));
  plan.steps_.fill(common);
  std::array<bool, kNumDTypes> overridden{};
  for (KernelPlanOverride& o : overrides) {
    const std::string name(DTypeName(o.dtype));
    if (!IsQuantized(o.dtype) && o.dtype != DType::kBF16)
      return absl::InvalidArgumentError(
          absl::StrCat("kernel plan: ", name, " takes the common list (only bf16 and quantized types have their own)"));
    if (overridden[static_cast<size_t>(o.dtype)])
      return absl::InvalidArgumentError(absl::StrCat("kernel plan: ", name, " has two lists"));
    overridden[static_cast<size_t>(o.dtype)] = true;
    TANDEM_ASSIGN_OR_RETURN(plan.steps_[static_cast<size_t>(o.dtype)], CheckedSteps(std::move(o.steps), name));
  }
  plan.source_ = std::move(source);
  return plan;
}

namespace {
// Float weights where no bf16 GEMM pays (slow vdpbf16ps; f32/f16 under
// AMX): the stream up to 31 rows, then the f32 packed GEMM (why: BuiltIn).
KernelPlanSteps SlowBf16FloatSteps() {
  constexpr int64_t kSlowBf16PackedFrom = 32;
  return {{1, KernelPath::kInt8Dot}, {kSlowBf16PackedFrom, KernelPath::kPacked}};
}
}  // namespace

KernelPlan KernelPlan::BuiltIn(IsaLevel isa, Bf16DotSpeed bf16_dot) {
  // Float weights, crossovers measured with tandem-expert-ffn-bench on a
  // Mixtral-width bf16 expert (docs/BENCHMARKS.md, Prefill GEMM and Other
  // instruction sets): on an AVX2-only CPU stream gives way to packed
  // between 8 and 12 rows; with AVX-512, stream to avx512_packed at 12 (a
  // tie) and to avx512_bf16_dot between 8 and 12. bf16_dot costs the same
  // from 1 to 16 rows (16 rows share a vector). Float weights read int8_dot
  // as stream.
  //
  // Quantized weights: int8_dot at decode and below avx512_bf16 at every
  // row count (ResolveKernel turns bf16_dot into int8_dot there), whose int8
  // dot products beat q_packed's f32 FMAs at AVX2 and, by more, at
  // avx512_vnni (Ice Lake's level). At plain avx512 (no VNNI) the AVX2 int8
  // pass ties avx512_q_packed at 128 rows and loses beyond, so packed
  // returns there. (Measured on one Mixtral expert, 2026-11-25; raw lines
  // not kept.)
  //
  // Where the CPU has bf16 dot products, the bf16 GEMM on dequantized rows
  // (avx512_bf16_q_dot) takes over from int8_dot at 32 rows, for every
  // type: the crossover measured on one Mixtral expert with the
  // dequantization rounding to bf16 in one instruction (docs/BENCHMARKS.md,
  // Prefill GEMM). Where int8_dot computes relatively faster (a CPU that
  // runs 512-bit operations in two halves), it can win to many more rows:
  // `--kernel_plan measure` or the calibration's plan picks per machine.
  //
  // Where bf16 dot products are slow (Intel's Sapphire/Emerald Rapids,
  // Bf16DotSpeed), the level below's plan: quantized weights int8_dot at
  // every row count (its AVX512-VNNI GEMM from 32 rows), float weights
  // packed's f32 FMAs from 32. The stream reads bf16 W once while it
  // multiplies; packed first widens W into f32 panels, a third of its time
  // on weights that come from memory (a served model's 16-row decode steps:
  // lm_head, shared expert, projections), so it pays only once a call has
  // rows enough (docs/BENCHMARKS.md, Intel and serving).
  //
  // With AMX tiles (Intel Sapphire Rapids on), the AMX GEMM (amx_bf16_dot,
  // amx_q_dot) multiplies at several times any vector path's rate once a
  // call has rows enough to pay for copying or dequantizing W to bf16 rows:
  // from kAmxBf16From rows on bf16 weights, kAmxQuantizedFrom on quantized
  // ones (one Qwen3-30B-A3B expert, tandem-expert-ffn-bench;
  // docs/BENCHMARKS.md, Prefill GEMM). f32 and f16 weights (no AMX entry)
  // take the slow-bf16 list.
  if (isa >= IsaLevel::kAmx) {
    constexpr int64_t kAmxBf16From = 4;
    constexpr int64_t kAmxQuantizedFrom = 12;
    std::vector<KernelPlanOverride> overrides = {
        {DType::kBF16, {{1, KernelPath::kInt8Dot}, {kAmxBf16From, KernelPath::kBf16Dot}}}};
    for (DType dtype : kQuantizedTypes)
      overrides.push_back({dtype, {{1, KernelPath::kInt8Dot}, {kAmxQuantizedFrom, KernelPath::kBf16Dot}}});
    return *Create(SlowBf16FloatSteps(), absl::StrCat("built-in for ", IsaLevelName(isa)), std::move(overrides));
  }
  if (isa >= IsaLevel::kAvx512Bf16 && bf16_dot == Bf16DotSpeed::kSlow) {
    std::vector<KernelPlanOverride> int8_dot;
    for (DType dtype : kQuantizedTypes) int8_dot.push_back({dtype, {{1, KernelPath::kInt8Dot}}});
    return *Create(SlowBf16FloatSteps(),
                   absl::StrCat("built-in for ", IsaLevelName(isa), " with slow bf16 dot products"),
                   std::move(int8_dot));
  }
  constexpr int64_t kBf16DotFrom = 12;
  constexpr int64_t kQuantizedBf16DotFrom = 32;
  constexpr int64_t kAvx512PackedFrom = 128;
  KernelPlanSteps steps = {{1, KernelPath::kInt8Dot}, {kBf16DotFrom, KernelPath::kBf16Dot}};
  std::vector<KernelPlanOverride> overrides;
  if (isa == IsaLevel::kAvx512) {
    steps.push_back({kAvx512PackedFrom, KernelPath::kPacked});
  } else if (isa >= IsaLevel::kAvx512Bf16) {
    // (Below avx512_bf16 the common list already resolves to int8_dot.)
    for (DType dtype : kQuantizedTypes)
      overrides.push_back({dtype, {{1, KernelPath::kInt8Dot}, {kQuantizedBf16DotFrom, KernelPath::kBf16Dot}}});
  }
  return *Create(std::move(steps), absl::StrCat("built-in for ", IsaLevelName(isa)), std::move(overrides));
}

KernelPlan KernelPlan::Exact(IsaLevel isa) {
  constexpr int64_t kPackedFrom = 12;
  KernelPlan plan = *Create({{1, KernelPath::kStream}, {kPackedFrom, KernelPath::kPacked}},
                            absl::StrCat("exact (f32 inputs) for ", IsaLevelName(isa)));
  plan.f32_inputs_ = true;
  return plan;
}

absl::StatusOr<KernelPlan> KernelPlan::Parse(const std::string& spec, std::string source) {
  const std::vector<absl::string_view> lists = absl::StrSplit(spec, ';');
  TANDEM_ASSIGN_OR_RETURN(KernelPlanSteps common, ParseSteps(lists[0], spec));
  std::optional<KernelPlanSteps> quantized;
  std::vector<KernelPlanOverride> overrides;
  for (size_t i = 1; i < lists.size(); ++i) {
    const absl::string_view list = absl::StripAsciiWhitespace(lists[i]);
    const size_t equals = list.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("kernel plan \"", spec, "\": \"", std::string(list),
                                                     "\" is not KEY=STEPS (e.g. quantized=1:int8_dot,64:bf16_dot)"));
    }
    TANDEM_ASSIGN_OR_RETURN(const std::optional<DType> key,
                            ParseKey(absl::StripAsciiWhitespace(list.substr(0, equals)), spec));
    TANDEM_ASSIGN_OR_RETURN(KernelPlanSteps steps, ParseSteps(list.substr(equals + 1), spec));
    if (key.has_value()) {
      overrides.push_back({*key, std::move(steps)});
    } else if (quantized.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("kernel plan \"", spec, "\": \"quantized\" given twice"));
    } else {
      quantized = std::move(steps);
    }
  }
  // "quantized" serves every quantized type a list of its own does not.
  if (quantized.has_value()) {
    for (DType dtype : kQuantizedTypes) {
      const bool own = std::any_of(overrides.begin(), overrides.end(),
                                   [&](const KernelPlanOverride& o) { return o.dtype == dtype; });
      if (!own) overrides.push_back({dtype, *quantized});
    }
  }
  absl::StatusOr<KernelPlan> plan = Create(std::move(common), std::move(source), std::move(overrides));
  if (!plan.ok()) return absl::InvalidArgumentError(absl::StrCat("\"", spec, "\": ", plan.status().message()));
  return plan;
}

KernelPath KernelPlan::PathFor(int64_t rows, DType dtype) const {
  const KernelPlanSteps& steps = StepsFor(dtype);
  KernelPath path = steps.front().path;
  for (const KernelPlanStep& step : steps) {
    if (step.min_rows > rows) break;
    path = step.path;
  }
  return path;
}

std::string KernelPlan::Spec() const {
  const KernelPlanSteps& common = StepsFor(DType::kF32);
  // "quantized=" is the list most quantized types take (the first such on a
  // tie); the types that differ from it follow by name.
  const KernelPlanSteps* quantized = &common;
  size_t best = 0;
  for (DType candidate : kQuantizedTypes) {
    const size_t count = std::count_if(std::begin(kQuantizedTypes), std::end(kQuantizedTypes),
                                       [&](DType d) { return SameSteps(StepsFor(d), StepsFor(candidate)); });
    if (count > best) best = count, quantized = &StepsFor(candidate);
  }
  std::string spec = StepsSpec(common);
  if (!SameSteps(StepsFor(DType::kBF16), common))
    absl::StrAppend(&spec, ";", std::string(DTypeName(DType::kBF16)), "=", StepsSpec(StepsFor(DType::kBF16)));
  if (!SameSteps(*quantized, common)) absl::StrAppend(&spec, ";", kQuantizedKey, "=", StepsSpec(*quantized));
  for (DType dtype : kQuantizedTypes) {
    if (!SameSteps(StepsFor(dtype), *quantized))
      absl::StrAppend(&spec, ";", std::string(DTypeName(dtype)), "=", StepsSpec(StepsFor(dtype)));
  }
  return spec;
}

Bf16DotSpeed MeasuredBf16DotSpeed() {
  static const Bf16DotSpeed speed = [] {
    const ComputePeakOptions options{.flops_per_task = int64_t{1} << 24, .tasks_per_thread = 2, .reps = 5};
    const absl::StatusOr<ComputePeak> bf16 = MeasureComputePeak(PeakInstruction::kBf16Dot, nullptr, options);
    const absl::StatusOr<ComputePeak> fma = MeasureComputePeak(PeakInstruction::kAvx512Fma, nullptr, options);
    if (!bf16.ok() || !fma.ok()) return Bf16DotSpeed::kFast;  // no bf16 dot products: nothing uses them
    return bf16->gflops < 1.5 * fma->gflops ? Bf16DotSpeed::kSlow : Bf16DotSpeed::kFast;
  }();
  return speed;
}

const KernelPlan& BuiltInKernelPlan() {
  // The level the kernels run at now, which --max_isa may still lower at
  // start-up; the bf16 speed is measured only for a level that uses it.
  static std::array<std::atomic<const KernelPlan*>, std::size(kAllIsaLevels)> plans{};
  const IsaLevel isa = ActiveIsa();
  std::atomic<const KernelPlan*>& slot = plans[static_cast<size_t>(isa)];
  if (const KernelPlan* plan = slot.load(std::memory_order_acquire)) return *plan;
  const Bf16DotSpeed speed = isa >= IsaLevel::kAvx512Bf16 ? MeasuredBf16DotSpeed() : Bf16DotSpeed::kFast;
  auto* built = new KernelPlan(KernelPlan::BuiltIn(isa, speed));
  const KernelPlan* expected = nullptr;
  if (!slot.compare_exchange_strong(expected, built, std::memory_order_acq_rel)) {
    delete built;  // another thread built the same plan first
    return *expected;
  }
  return *built;
}

const KernelPlan& ProcessKernelPlan() {
  if (const KernelPlan* plan = State().current.load(std::memory_order_acquire)) return *plan;
  return BuiltInKernelPlan();  // none installed
}

void SetProcessKernelPlan(KernelPlan plan) {
  PlanState& state = State();
  absl::MutexLock lock(&state.mutex);
  state.installed.push_back(std::move(plan));
  state.current.store(&state.installed.back(), std::memory_order_release);
}

}  // namespace tandem
