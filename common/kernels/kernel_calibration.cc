#include "common/kernels/kernel_calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/kernels/linear.h"

namespace tandem {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

absl::Status KernelCalibrationOptions::Validate() const {
  if (rows.size() < 1) return absl::InvalidArgumentError("rows must list at least one row count");
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 1 || (i > 0 && rows[i] <= rows[i - 1]))
      return absl::InvalidArgumentError(absl::StrCat("rows must be ascending counts >= 1; rows[", i, "] = ", rows[i]));
  }
  if (reps < 1) return absl::InvalidArgumentError(absl::StrCat("reps must be >= 1, got ", reps));
  if (!(drop_ratio > 1)) return absl::InvalidArgumentError(absl::StrCat("drop_ratio must be > 1, got ", drop_ratio));
  if (!(switch_margin >= 0 && switch_margin < 1))
    return absl::InvalidArgumentError(absl::StrCat("switch_margin must be in [0, 1), got ", switch_margin));
  if (!(max_seconds > 0)) return absl::InvalidArgumentError(absl::StrCat("max_seconds must be > 0, got ", max_seconds));
  return absl::OkStatus();
}

absl::StatusOr<KernelCalibration> MeasureKernelPlan(std::span<const std::vector<LinearWeight>> groups, ThreadPool* pool,
                                                    const KernelCalibrationOptions& options) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  if (groups.empty()) return absl::InvalidArgumentError("kernel calibration: no weights to time");
  int64_t max_k = 0, max_n = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty())
      return absl::InvalidArgumentError(absl::StrCat("kernel calibration: group ", g, " is empty"));
    for (const LinearWeight& w : groups[g]) {
      if (w.data == nullptr || w.n < 1 || w.k < 1)
        return absl::InvalidArgumentError(absl::StrCat("kernel calibration: group ", g, " holds an empty matrix"));
      max_k = std::max(max_k, w.k);
      max_n = std::max(max_n, w.n);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed_s = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  const int64_t max_rows = options.rows.back();
  std::vector<float> x(static_cast<size_t>(max_rows * max_k)), y(static_cast<size_t>(max_rows * max_n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));

  std::vector<KernelPath> candidates;
  for (KernelPath path : kAllKernelPaths) candidates.push_back(path);
  KernelCalibration result{BuiltInKernelPlan(), {}, 0};
  std::vector<KernelPlanStep> steps;
  size_t next_group = 0;
  for (size_t i = 0; i < options.rows.size(); ++i) {
    if (i >= 2 && elapsed_s() > options.max_seconds) break;
    const int64_t rows = options.rows[i];
    std::map<KernelPath, double> us;  // per path at this count
    for (KernelPath path : candidates) {
      const KernelPlan only = *KernelPlan::Create({{1, path}}, "calibration");
      LinearOptions linear{.plan = &only};
      // A path no dtype here can take (bf16_dot without bf16 weights)
      // falls back to another one's kernel: not a candidate of its own.
      bool own_kernel = false;
      for (const LinearWeight& w : groups.front()) own_kernel |= ChooseLinearKernel(rows, w.dtype, linear).path == path;
      if (!own_kernel) continue;
      std::vector<double> samples;
      for (int rep = -1; rep < options.reps; ++rep) {
        const std::vector<LinearWeight>& group = groups[next_group++ % groups.size()];
        const auto t = std::chrono::steady_clock::now();
        for (const LinearWeight& w : group)
          TANDEM_RETURN_IF_ERROR(Linear(x.data(), rows, w, nullptr, y.data(), pool, linear));
        if (rep >= 0)
          samples.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count());
      }
      us[path] = Median(samples);
      result.timings.push_back(
          {rows, std::string(ChooseLinearKernel(rows, groups.front().front().dtype, linear).name), path, us[path]});
    }
    if (us.empty()) continue;
    auto best =
        std::min_element(us.begin(), us.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    KernelPath winner = best->first;
    if (!steps.empty() && us.count(steps.back().path) != 0 &&
        best->second > (1.0 - options.switch_margin) * us[steps.back().path]) {
      winner = steps.back().path;  // not enough faster to switch
    }
    if (steps.empty() || steps.back().path != winner) steps.push_back({steps.empty() ? 1 : rows, winner});
    std::vector<KernelPath> kept;
    for (KernelPath path : candidates)
      if (us.count(path) == 0 || us[path] <= options.drop_ratio * best->second) kept.push_back(path);
    candidates = kept;
  }
  result.seconds = elapsed_s();
  // The steps serve the types timed (float weights, or each quantized type
  // in the groups: a Q4_K_M expert's Q4_K and Q6_K); every other type keeps
  // its built-in steps, since crossovers differ by type.
  const KernelPlan built_in = BuiltInKernelPlan();
  std::set<DType> timed;
  for (const std::vector<LinearWeight>& group : groups)
    for (const LinearWeight& w : group) timed.insert(w.dtype);
  const bool quantized = IsQuantized(groups.front().front().dtype);
  std::vector<std::string> timed_names;
  for (DType dtype : timed) timed_names.emplace_back(DTypeName(dtype));
  // Float weights timed: their steps serve every float type (bf16's own
  // list, where the built-in plan has one, too).
  std::vector<KernelPlanOverride> overrides = {{DType::kBF16, quantized ? built_in.StepsFor(DType::kBF16) : steps}};
  for (size_t d = static_cast<size_t>(DType::kQ8_0); d < kNumDTypes; ++d) {
    const DType dtype = static_cast<DType>(d);
    overrides.push_back({dtype, quantized && timed.count(dtype) != 0 ? steps : built_in.StepsFor(dtype)});
  }
  TANDEM_ASSIGN_OR_RETURN(
      result.plan, KernelPlan::Create(quantized ? built_in.StepsFor(DType::kF32) : steps,
                                      absl::StrFormat("measured on %s at %s (%.1f s) for %s weights", HostCpu().brand,
                                                      IsaLevelName(ActiveIsa()), result.seconds,
                                                      quantized ? absl::StrJoin(timed_names, ", ") : "float"),
                                      std::move(overrides)));
  return result;
}

}  // namespace tandem
