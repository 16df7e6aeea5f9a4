#include "coordinator/orchestration/planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

absl::Status FieldError(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

bool Finite(double v) { return std::isfinite(v); }

// Weighted least squares of us ≈ base + per_row * rows with weights 1/us²
// (relative error). Needs two distinct rows; otherwise the line goes flat
// through the weighted mean.
RooflineCurve FitLine(std::span<const TimingSample> samples) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const TimingSample& p : samples) {
    const double w = 1.0 / (p.us * p.us);
    sw += w;
    sx += w * p.rows;
    sy += w * p.us;
    sxx += w * p.rows * p.rows;
    sxy += w * p.rows * p.us;
  }
  RooflineCurve line;
  const double det = sw * sxx - sx * sx;
  if (det > 1e-12 * sw * sxx) {
    line.per_row_us = (sw * sxy - sx * sy) / det;
    line.base_us = (sy - line.per_row_us * sx) / sw;
  }
  if (!(line.per_row_us > 0)) {  // flat or decreasing data: the curve must not fall
    line.per_row_us = 0;
    line.base_us = sy / sw;
  }
  return line;
}

// The plateau minimising Σ ((p - us)/us)²: p = Σ(1/us) / Σ(1/us²).
double FitPlateau(std::span<const TimingSample> samples) {
  double a = 0, b = 0;
  for (const TimingSample& p : samples) {
    a += 1.0 / p.us;
    b += 1.0 / (p.us * p.us);
  }
  return b > 0 ? a / b : 0;
}

double RelativeSquaredError(const RooflineCurve& curve, std::span<const TimingSample> samples) {
  double error = 0;
  for (const TimingSample& p : samples) {
    const double r = (curve.Us(p.rows) - p.us) / p.us;
    error += r * r;
  }
  return error;
}

}  // namespace

double RooflineCurve::Us(double rows) const {
  if (rows <= 0) return 0;
  return std::max(plateau_us, base_us + per_row_us * rows);
}

double RooflineCurve::BreakpointRows() const {
  if (per_row_us <= 0) return std::numeric_limits<double>::infinity();
  return std::max(0.0, (plateau_us - base_us) / per_row_us);
}

absl::Status RooflineCurve::Validate(const std::string& field) const {
  if (!Finite(plateau_us) || plateau_us < 0) return FieldError(field + ".plateau_us", "must be a finite number >= 0");
  if (!Finite(base_us)) return FieldError(field + ".base_us", "must be a finite number");
  if (!Finite(per_row_us) || per_row_us < 0)
    return FieldError(field + ".per_row_us", "must be a finite number >= 0 (latency may not fall with more rows)");
  if (Us(1) <= 0)
    return FieldError(field, "predicts no time for one row (plateau_us and base_us + per_row_us both <= 0)");
  return absl::OkStatus();
}

absl::StatusOr<RooflineCurve> FitRoofline(std::span<const TimingSample> input, const std::string& field) {
  if (input.size() < 2) return FieldError(field, absl::StrCat("needs at least 2 samples to fit, got ", input.size()));
  for (size_t i = 0; i < input.size(); ++i) {
    const TimingSample& p = input[i];
    if (!Finite(p.rows) || p.rows <= 0 || !Finite(p.us) || p.us <= 0) {
      return FieldError(absl::StrCat(field, "[", i, "]"),
                        absl::StrCat("must have rows > 0 and us > 0, got (", p.rows, ", ", p.us, ")"));
    }
  }
  std::vector<TimingSample> samples(input.begin(), input.end());
  std::sort(samples.begin(), samples.end(), [](const TimingSample& a, const TimingSample& b) {
    return a.rows != b.rows ? a.rows < b.rows : a.us < b.us;
  });
  const std::span<const TimingSample> all(samples);

  // Split k: samples [0, k) form the plateau, [k, n) the line. k = 0 is a
  // pure line (Fiddler's CPU model), k = n a pure plateau (its GPU model).
  RooflineCurve best;
  double best_error = std::numeric_limits<double>::infinity();
  const size_t n = samples.size();
  for (size_t k = 0; k <= n; ++k) {
    RooflineCurve curve;
    if (k > 0) curve.plateau_us = FitPlateau(all.subspan(0, k));
    if (n - k >= 2) {
      const RooflineCurve line = FitLine(all.subspan(k));
      curve.base_us = line.base_us;
      curve.per_row_us = line.per_row_us;
    } else if (n - k == 1) {
      // One point past the plateau: the line joins the last plateau sample
      // to it (with no plateau it would be undetermined; skip).
      if (k == 0) continue;
      const TimingSample& a = samples[k - 1];
      const TimingSample& b = samples[k];
      if (b.rows <= a.rows) continue;
      curve.per_row_us = std::max(0.0, (b.us - curve.plateau_us) / (b.rows - a.rows));
      curve.base_us = curve.plateau_us - curve.per_row_us * a.rows;
    }
    const double error = RelativeSquaredError(curve, all);
    // Strictly better only: on ties the simpler split found first stays.
    if (error < best_error * (1 - 1e-12)) {
      best_error = error;
      best = curve;
    }
  }
  TANDEM_RETURN_IF_ERROR(best.Validate(field));
  return best;
}

TransferCost TransferCost::FromBandwidth(double fixed_us, double gb_s) {
  TransferCost cost;
  cost.fixed_us = fixed_us;
  cost.us_per_byte = gb_s > 0 ? 1e-3 / gb_s : 0;
  return cost;
}

absl::Status TransferCost::Validate(const std::string& field) const {
  if (!Finite(fixed_us) || fixed_us < 0) return FieldError(field + ".fixed_us", "must be a finite number >= 0");
  if (!Finite(us_per_byte) || us_per_byte < 0) return FieldError(field + ".gb_s", "must be a finite number > 0");
  return absl::OkStatus();
}

absl::Status CostModelParams::Validate() const {
  if (expert_bytes <= 0) return FieldError("expert_bytes", absl::StrCat("must be > 0, got ", expert_bytes));
  if (activation_row_bytes <= 0)
    return FieldError("activation_row_bytes", absl::StrCat("must be > 0, got ", activation_row_bytes));
  if (cpu_workers.empty()) return FieldError("cpu_workers", "must list at least one worker");
  if (transports.empty()) return FieldError("transports", "must list at least one transport");
  for (size_t t = 0; t < transports.size(); ++t) {
    const std::string field =
        absl::StrCat("transports.", transports[t].name.empty() ? absl::StrCat(t) : transports[t].name);
    if (transports[t].name.empty()) return FieldError(field, "needs a name");
    for (size_t u = 0; u < t; ++u) {
      if (transports[u].name == transports[t].name) return FieldError(field, "is listed twice");
    }
    TANDEM_RETURN_IF_ERROR(transports[t].cost.Validate(field));
  }
  for (size_t w = 0; w < cpu_workers.size(); ++w) {
    const std::string field = absl::StrCat("cpu_workers[", w, "]");
    TANDEM_RETURN_IF_ERROR(cpu_workers[w].compute.Validate(field + ".compute"));
    if (cpu_workers[w].transport < 0 || cpu_workers[w].transport >= static_cast<int>(transports.size())) {
      return FieldError(field + ".transport",
                        absl::StrCat("names no listed transport (index ", cpu_workers[w].transport, ")"));
    }
  }
  TANDEM_RETURN_IF_ERROR(gpu.Validate("gpu"));
  TANDEM_RETURN_IF_ERROR(migrate.Validate("migrate"));
  if (migrate.Us(static_cast<double>(expert_bytes)) <= 0)
    return FieldError("migrate", "predicts no time for a migration");
  TANDEM_RETURN_IF_ERROR(dma.Validate("dma"));
  return absl::OkStatus();
}

absl::StatusOr<CostModelParams> DivideCpuIntoWorkers(const CostModelParams& params, int num_workers) {
  if (params.cpu_workers.size() != 1) {
    return FieldError("cpu_workers", absl::StrCat("must hold exactly one (whole-CPU) worker to divide, got ",
                                                  params.cpu_workers.size()));
  }
  if (num_workers < 1) return FieldError("num_workers", absl::StrCat("must be >= 1, got ", num_workers));
  CostModelParams divided = params;
  CpuWorkerCost worker = params.cpu_workers[0];
  worker.compute.plateau_us *= num_workers;
  worker.compute.base_us *= num_workers;
  worker.compute.per_row_us *= num_workers;
  divided.cpu_workers.assign(static_cast<size_t>(num_workers), worker);
  return divided;
}

absl::Status CostModelOptions::Validate() const {
  if (!(ewma_alpha > 0 && ewma_alpha <= 1))
    return FieldError("ewma_alpha", absl::StrCat("must be in (0, 1], got ", ewma_alpha));
  if (error_window < 1) return FieldError("error_window", absl::StrCat("must be >= 1, got ", error_window));
  return absl::OkStatus();
}

absl::StatusOr<CostModel> CostModel::Create(CostModelParams params, CostModelOptions options) {
  TANDEM_RETURN_IF_ERROR(params.Validate());
  TANDEM_RETURN_IF_ERROR(options.Validate());
  return CostModel(std::move(params), options);
}

CostModel::CostModel(CostModelParams params, CostModelOptions options)
    : params_(std::move(params)),
      options_(options),
      cpu_error_(options.error_window),
      gpu_error_(options.error_window),
      migrate_error_(options.error_window),
      dma_error_(options.error_window),
      ipc_error_(options.error_window),
      makespan_error_(options.error_window) {}

double CostModel::IpcUs(int worker, double bytes) const {
  const int t = params_.cpu_workers[static_cast<size_t>(worker)].transport;
  return params_.transports[static_cast<size_t>(t)].cost.Us(bytes);
}

absl::StatusOr<double> CostModel::TransportUs(const std::string& transport, double bytes) const {
  for (const NamedTransferCost& t : params_.transports) {
    if (t.name == transport) return t.cost.Us(bytes);
  }
  return absl::InvalidArgumentError(absl::StrCat("transport \"", transport, "\" is not in the cost model"));
}

double CostModel::CpuExpertUs(double rows, ExpertDivision division, int owner) const {
  if (division == ExpertDivision::kShard) return CpuUs(owner, rows);
  const double share = 1.0 / num_cpu_workers();
  double slowest = 0;
  for (int w = 0; w < num_cpu_workers(); ++w) slowest = std::max(slowest, share * CpuUs(w, rows));
  return slowest;
}

void CostModel::ErrorWindow::Add(double predicted, double measured) {
  errors_[static_cast<size_t>(count_ % static_cast<int64_t>(errors_.size()))] =
      std::abs(predicted - measured) / measured;
  ++count_;
}

TermAccuracy CostModel::ErrorWindow::Accuracy() const {
  TermAccuracy accuracy;
  accuracy.observations = count_;
  accuracy.window = static_cast<int>(std::min<int64_t>(count_, static_cast<int64_t>(errors_.size())));
  double sum = 0;
  for (int i = 0; i < accuracy.window; ++i) sum += errors_[static_cast<size_t>(i)];
  accuracy.mape_percent = accuracy.window > 0 ? 100.0 * sum / accuracy.window : 0;
  return accuracy;
}

// Keeps the curve's shape and learns its scale: the parts of the curve the
// observation exercised (plateau and/or line) are scaled so that this
// prediction moves ewma_alpha of the way to the measurement. A batch mixes
// experts on both parts; then both scale together.
void CostModel::RefineCurve(RooflineCurve& curve, std::span<const int32_t> rows, double measured_us) {
  double on_plateau = 0, on_line = 0;
  for (int32_t s : rows) {
    if (s <= 0) continue;
    const double us = curve.Us(s);
    if (curve.plateau_us >= curve.base_us + curve.per_row_us * s) {
      on_plateau += us;
    } else {
      on_line += us;
    }
  }
  const double predicted = on_plateau + on_line;
  if (predicted <= 0) return;
  const double factor = 1 + options_.ewma_alpha * (measured_us / predicted - 1);
  if (on_plateau > 0 && on_line > 0) {
    curve.plateau_us *= factor;
    curve.base_us *= factor;
    curve.per_row_us *= factor;
  } else if (on_plateau > 0) {
    curve.plateau_us *= factor;
  } else {
    curve.base_us *= factor;
    curve.per_row_us *= factor;
  }
}

// Same idea for fixed + per-byte costs: both scale together.
void CostModel::RefineTransfer(TransferCost& cost, double bytes, double measured_us) {
  const double predicted = cost.Us(bytes);
  if (predicted <= 0) return;
  const double factor = 1 + options_.ewma_alpha * (measured_us / predicted - 1);
  cost.fixed_us *= factor;
  cost.us_per_byte *= factor;
}

void CostModel::ObserveCpu(int worker, std::span<const int32_t> rows, double measured_us, double share) {
  if (worker < 0 || worker >= num_cpu_workers() || !(measured_us > 0) || !(share > 0 && share <= 1)) return;
  RooflineCurve& curve = params_.cpu_workers[static_cast<size_t>(worker)].compute;
  double predicted = 0;
  for (int32_t s : rows) predicted += share * curve.Us(s);
  if (predicted <= 0) return;
  cpu_error_.Add(predicted, measured_us);
  RefineCurve(curve, rows, measured_us / share);  // the curve is for whole experts
}

void CostModel::ObserveGpu(std::span<const int32_t> rows, double measured_us) {
  if (!(measured_us > 0)) return;
  double predicted = 0;
  for (int32_t s : rows) predicted += params_.gpu.Us(s);
  if (predicted <= 0) return;
  gpu_error_.Add(predicted, measured_us);
  RefineCurve(params_.gpu, rows, measured_us);
}

void CostModel::ObserveMigration(double measured_us, double bytes) {
  if (!(measured_us > 0)) return;
  if (!(bytes > 0)) bytes = static_cast<double>(params_.expert_bytes);
  migrate_error_.Add(params_.migrate.Us(bytes), measured_us);
  RefineTransfer(params_.migrate, bytes, measured_us);
}

void CostModel::ObserveDma(double bytes, double measured_us) {
  if (!(measured_us > 0) || !(bytes > 0)) return;
  const double predicted = params_.dma.Us(bytes);
  if (predicted <= 0) return;
  dma_error_.Add(predicted, measured_us);
  RefineTransfer(params_.dma, bytes, measured_us);
}

void CostModel::ObserveIpc(int worker, double bytes, double measured_us) {
  if (worker < 0 || worker >= num_cpu_workers() || !(measured_us > 0)) return;
  TransferCost& cost =
      params_.transports[static_cast<size_t>(params_.cpu_workers[static_cast<size_t>(worker)].transport)].cost;
  const double predicted = cost.Us(bytes);
  if (predicted <= 0) return;
  ipc_error_.Add(predicted, measured_us);
  RefineTransfer(cost, bytes, measured_us);
}

void CostModel::ObserveMakespan(double predicted_us, double measured_us) {
  if (!(measured_us > 0) || !(predicted_us >= 0)) return;
  makespan_error_.Add(predicted_us, measured_us);
}

CostModelStats CostModel::Stats() const {
  CostModelStats stats;
  stats.cpu = cpu_error_.Accuracy();
  stats.gpu = gpu_error_.Accuracy();
  stats.migrate = migrate_error_.Accuracy();
  stats.dma = dma_error_.Accuracy();
  stats.ipc = ipc_error_.Accuracy();
  stats.makespan = makespan_error_.Accuracy();
  return stats;
}

absl::StatusOr<CostModel> CostModelForWorkers(const CostModelParams& params, int num_workers) {
  if (num_workers <= 1 || static_cast<int>(params.cpu_workers.size()) == num_workers) return CostModel::Create(params);
  if (params.cpu_workers.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("the profile lists ", params.cpu_workers.size(),
                                                   " CPU workers, not 1 or ", num_workers, " (workers)"));
  }
  absl::StatusOr<CostModelParams> divided = DivideCpuIntoWorkers(params, num_workers);
  if (!divided.ok()) return divided.status();
  return CostModel::Create(*divided);
}

}  // namespace tandem
