#include "common/kernels/kernel_plan.h"

#include <atomic>
#include <deque>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {
namespace {

struct PlanState {
  std::mutex mutex;
  std::deque<KernelPlan> installed;  // never shrinks: references stay valid
  std::atomic<const KernelPlan*> current{nullptr};
};

PlanState& State() {
  static PlanState* state = new PlanState;
  return *state;
}

}  // namespace

absl::StatusOr<KernelPlan> KernelPlan::Create(std::vector<KernelPlanStep> steps, std::string source) {
  if (steps.empty()) return absl::InvalidArgumentError("kernel plan: no steps");
  if (steps.front().min_rows != 1)
    return absl::InvalidArgumentError(
        absl::StrCat("kernel plan: the first step must start at 1 row, not ", steps.front().min_rows));
  for (size_t i = 1; i < steps.size(); ++i) {
    if (steps[i].min_rows <= steps[i - 1].min_rows)
      return absl::InvalidArgumentError(absl::StrCat("kernel plan: step ", i, " starts at ", steps[i].min_rows,
                                                     " rows, not after step ", i - 1, " (", steps[i - 1].min_rows,
                                                     ")"));
  }
  // Adjacent steps with one path are one step.
  std::vector<KernelPlanStep> merged;
  for (const KernelPlanStep& step : steps)
    if (merged.empty() || merged.back().path != step.path) merged.push_back(step);
  return KernelPlan(std::move(merged), std::move(source));
}

KernelPlan KernelPlan::BuiltIn(IsaLevel isa) {
  // Crossovers measured with tandem-expert-ffn-bench at Mixtral width, bf16
  // (docs/BENCHMARKS.md): AVX2-only Zen 3, stream to packed between 8 and 12
  // rows; Zen 5, stream to avx512_packed at 12 (a tie) and stream to
  // avx512_bf16_dot between 8 (stream 53 ms, bf16_dot 64) and 12 (95 vs 66).
  // bf16_dot costs the same from 1 to 16 rows (16 rows share a vector).
  // Quantized weights: int8_dot at decode (float weights read it as
  // stream), and at 12+ rows bf16_dot: avx512_bf16_q_dot where the CPU has
  // bf16 dot products; below that, ResolveKernel turns bf16_dot into packed
  // for float weights and into int8_dot for quantized ones, whose int8 dot
  // products beat q_packed's f32 FMAs (one Mixtral expert, 2 threads, Zen 5,
  // median ms): at AVX2 at every row count (q4_K 58 vs 141 at 32 rows, 910
  // vs 1008 at 512; q6_K 77 vs 237, 1172 vs 1160), at avx512_vnni, Ice
  // Lake's level, by more (q4_K 14 vs 91 at 16 rows, 399 vs 673 at 512).
  // At plain avx512 (no VNNI) the AVX2 int8 pass ties avx512_q_packed at
  // 128 rows and loses at 512 (q4_K 905 vs 638), so packed returns there.
  // docs/BENCHMARKS.md, "At AVX2 (Zen 3's path)".
  constexpr int64_t kBf16DotFrom = 12;
  constexpr int64_t kAvx512PackedFrom = 128;
  std::vector<KernelPlanStep> steps = {{1, KernelPath::kInt8Dot}, {kBf16DotFrom, KernelPath::kBf16Dot}};
  if (isa == IsaLevel::kAvx512) steps.push_back({kAvx512PackedFrom, KernelPath::kPacked});
  return KernelPlan(std::move(steps), absl::StrCat("built-in for ", IsaLevelName(isa)));
}

KernelPlan KernelPlan::Exact(IsaLevel isa) {
  constexpr int64_t kPackedFrom = 12;
  return KernelPlan({{1, KernelPath::kStream}, {kPackedFrom, KernelPath::kPacked}},
                    absl::StrCat("exact (f32 inputs) for ", IsaLevelName(isa)));
}

absl::StatusOr<KernelPlan> KernelPlan::Parse(const std::string& spec, std::string source) {
  std::vector<KernelPlanStep> steps;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t colon = item.find(':');
    int64_t rows = 0;
    if (colon == std::string_view::npos || !absl::SimpleAtoi(item.substr(0, colon), &rows) || rows < 1) {
      return absl::InvalidArgumentError(absl::StrCat("kernel plan \"", spec, "\": step \"", std::string(item),
                                                     "\" is not ROWS:PATH (e.g. 1:stream,12:packed)"));
    }
    absl::StatusOr<KernelPath> path = ParseKernelPath(std::string(item.substr(colon + 1)));
    if (!path.ok())
      return absl::InvalidArgumentError(absl::StrCat("kernel plan \"", spec, "\": ", path.status().message()));
    steps.push_back({rows, *path});
  }
  absl::StatusOr<KernelPlan> plan = Create(std::move(steps), std::move(source));
  if (!plan.ok()) return absl::InvalidArgumentError(absl::StrCat("\"", spec, "\": ", plan.status().message()));
  return plan;
}

KernelPath KernelPlan::PathFor(int64_t rows) const {
  KernelPath path = steps_.front().path;
  for (const KernelPlanStep& step : steps_) {
    if (step.min_rows > rows) break;
    path = step.path;
  }
  return path;
}

std::string KernelPlan::Spec() const {
  std::vector<std::string> parts;
  for (const KernelPlanStep& step : steps_)
    parts.push_back(absl::StrCat(step.min_rows, ":", KernelPathName(step.path)));
  return absl::StrJoin(parts, ",");
}

const KernelPlan& ProcessKernelPlan() {
  if (const KernelPlan* plan = State().current.load(std::memory_order_acquire)) return *plan;
  // None installed: the built-in plan of the level the kernels run at now
  // (which --max_isa may still lower at start-up).
  static const std::deque<KernelPlan>* built_in = [] {
    auto* plans = new std::deque<KernelPlan>;
    for (IsaLevel level : kAllIsaLevels) plans->push_back(KernelPlan::BuiltIn(level));
    return plans;
  }();
  return (*built_in)[static_cast<size_t>(ActiveIsa())];
}

void SetProcessKernelPlan(KernelPlan plan) {
  PlanState& state = State();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.installed.push_back(std::move(plan));
  state.current.store(&state.installed.back(), std::memory_order_release);
}

}  // namespace tandem
