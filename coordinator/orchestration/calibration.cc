#include "coordinator/orchestration/calibration.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/base/cpu_features.h"
#include "common/base/log.h"
#include "common/base/sample_stats.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/kernels/kernel_calibration.h"
#include "common/kernels/kernel_plan.h"

namespace tandem {
namespace {

std::string CpuModelName() { return HostCpu().brand; }

// Measures the kernel plan on the setup's matrices and installs it.
absl::Status MeasureAndInstallKernelPlan(const CalibrationSetup& setup, HardwareProfile* profile) {
  TANDEM_ASSIGN_OR_RETURN(KernelCalibration measured, MeasureKernelPlan(setup.kernel_plan_groups, setup.kernel_pool));
  profile->kernel_plan = measured.plan.Spec();
  profile->kernel_plan_source = measured.plan.source();
  LOG_INFO("calibration: kernel plan ", measured.plan.Spec(), " (", absl::StrFormat("%.2f s", measured.seconds), ")");
  SetProcessKernelPlan(std::move(measured.plan));
  return absl::OkStatus();
}

// A cached profile's kernel plan, installed again.
absl::Status InstallCachedKernelPlan(const HardwareProfile& profile, const std::string& path) {
  if (profile.kernel_plan.empty()) return absl::OkStatus();
  absl::StatusOr<KernelPlan> plan =
      KernelPlan::Parse(profile.kernel_plan, profile.kernel_plan_source.empty() ? path : profile.kernel_plan_source);
  if (!plan.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": machine.kernel_plan: ", plan.status().message()));
  LOG_INFO("calibration: kernel plan ", plan->Spec(), " from ", path);
  SetProcessKernelPlan(*std::move(plan));
  return absl::OkStatus();
}

absl::Status CheckSetup(const CalibrationSetup& setup) {
  if (setup.config == nullptr) return absl::InvalidArgumentError("config: calibration needs the model's config");
  if (setup.cpu == nullptr) return absl::InvalidArgumentError("cpu: calibration needs the CPU expert executor");
  if (setup.pool == nullptr) return absl::InvalidArgumentError("pool: calibration needs the expert pool");
  if (setup.num_cpu_workers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_cpu_workers must be >= 1, got ", setup.num_cpu_workers));
  }
  if (setup.pool->num_staging_buffers() < 1) {
    return absl::InvalidArgumentError(
        "num_staging_buffers: calibration times the pool through a staging buffer; give it one");
  }
  return absl::OkStatus();
}

// What Calibrate's steps share: the rows every measurement computes on, and
// the experts in the order they are taken.
struct CalibrationRun {
  CalibrationRun(const CalibrationSetup& setup, const CalibrationOptions& options)
      : setup(setup),
        options(options),
        pool(*setup.pool),
        num_layers(static_cast<int>(setup.config->num_hidden_layers)),
        num_experts(static_cast<int>(setup.config->num_local_experts)),
        start(std::chrono::steady_clock::now()) {
    for (int l = 0; l < num_layers; ++l) {
      if (setup.config->moe_layer(l)) moe_layers.push_back(l);
    }
    const int64_t d = setup.config->hidden_size;
    const int max_rows = options.rows.back();
    input.resize(static_cast<size_t>(max_rows * d));
    output.resize(static_cast<size_t>(max_rows * d));
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (float& x : input) x = uniform(rng);
  }

  // Experts are taken in turn over the whole model, so that one measurement
  // does not find the previous one's weights in the caches.
  ExpertKey NextKey() {
    const int layer = moe_layers[static_cast<size_t>((next / num_experts) % static_cast<int>(moe_layers.size()))];
    const ExpertKey key{layer, next % num_experts};
    ++next;
    return key;
  }

  const CalibrationSetup& setup;
  const CalibrationOptions& options;
  ExpertPool& pool;
  const int num_layers;
  const int num_experts;
  std::vector<int> moe_layers;  // the layers with experts (not the dense ones)
  const std::chrono::steady_clock::time_point start;
  std::vector<float> input, output;  // [max rows, D] f32
  int next = 0;
};

// Experts not in a slot, staged into the pool's staging buffers (one per
// buffer) and waited for: what the pool's compute is timed on.
absl::StatusOr<std::vector<ExpertKey>> StageExperts(CalibrationRun& run) {
  ExpertPool& pool = run.pool;
  std::vector<ExpertKey> staged;
  for (int i = 0; i < static_cast<int>(run.moe_layers.size()) * run.num_experts &&
                  static_cast<int>(staged.size()) < pool.num_staging_buffers();
       ++i) {
    const ExpertKey key = run.NextKey();
    if (pool.Find(key).held) continue;
    TANDEM_RETURN_IF_ERROR(pool.Stage(key));
    staged.push_back(key);
  }
  if (staged.empty()) return absl::FailedPreconditionError("every expert is in a slot: nothing to time the pool with");
  for (const ExpertKey& key : staged) TANDEM_RETURN_IF_ERROR(pool.WaitReady(key));
  return staged;
}

// cpu(s) and gpu(s): the median of options.repetitions calls at each row
// count (after one warm-up), larger counts only while time is left.
absl::Status MeasureCurves(CalibrationRun& run, const std::vector<ExpertKey>& staged,
                           std::vector<TimingSample>* cpu_samples, std::vector<TimingSample>* gpu_samples) {
  const CalibrationOptions& options = run.options;
  for (size_t r = 0; r < options.rows.size(); ++r) {
    if (r >= 2 && SecondsSince(run.start) > options.max_seconds) break;
    const int rows = options.rows[r];
    std::vector<double> cpu_us, gpu_us;
    for (int rep = -1; rep < options.repetitions; ++rep) {  // rep -1 warms up
      const ExpertKey key = run.NextKey();
      const ExpertWork cpu_work{key.expert, rows, run.input.data(), run.output.data()};
      const auto t = std::chrono::steady_clock::now();
      TANDEM_RETURN_IF_ERROR(run.setup.cpu->RunExperts(key.layer, std::span<const ExpertWork>(&cpu_work, 1)));
      const double us = MicrosSince(t);
      const ExpertKey on_pool = staged[static_cast<size_t>(rep + 1) % staged.size()];
      const ExpertWork pool_work{on_pool.expert, rows, run.input.data(), run.output.data()};
      PoolRunTiming timing;
      TANDEM_RETURN_IF_ERROR(run.pool.RunExperts(on_pool.layer, std::span<const ExpertWork>(&pool_work, 1), &timing));
      if (rep < 0) continue;
      cpu_us.push_back(us);
      gpu_us.push_back(timing.compute_us);
    }
    // The clock's resolution is far finer; the floor only keeps a sample valid.
    cpu_samples->push_back({static_cast<double>(rows), std::max(Median(cpu_us), 0.01)});
    gpu_samples->push_back({static_cast<double>(rows), std::max(Median(gpu_us), 0.01)});
  }
  return absl::OkStatus();
}

// options.migrations pool copies of experts not in a slot, one at a time.
absl::StatusOr<std::vector<MigrationRecord>> TimeCopies(CalibrationRun& run) {
  ExpertPool& pool = run.pool;
  std::vector<MigrationRecord> copies;
  for (int m = 0; m < run.options.migrations; ++m) {
    ExpertKey key = run.NextKey();
    for (int tries = 0; pool.Find(key).held && tries < static_cast<int>(run.moe_layers.size()) * run.num_experts;
         ++tries)
      key = run.NextKey();
    if (pool.Find(key).held) break;
    TANDEM_RETURN_IF_ERROR(pool.Stage(key));
    TANDEM_RETURN_IF_ERROR(pool.WaitReady(key));
    TANDEM_RETURN_IF_ERROR(pool.ReleaseStaging());
    for (const MigrationRecord& record : pool.TakeCompletedMigrations()) copies.push_back(record);
  }
  if (copies.empty()) return absl::InternalError("calibration timed no pool copy");
  return copies;
}

// The copy rate in µs per byte: each copy's own rate (its layer's bytes:
// quantized layers may differ, e.g. Q4_K_M's Q6_K down projections), the
// median of those.
double MedianUsPerByte(const std::vector<MigrationRecord>& copies) {
  std::vector<double> rates;
  for (const MigrationRecord& c : copies) {
    if (c.bytes > 0) rates.push_back(c.copy_us / static_cast<double>(c.bytes));
  }
  return rates.empty() ? 0 : Median(rates);
}

// The profile's names: what was measured, on which machine, for which model.
void DescribeProfile(const CalibrationRun& run, size_t num_samples, double max_rows, size_t num_copies,
                     HardwareProfile* profile) {
  const ModelConfig& config = *run.setup.config;
  profile->name = "calibrated";
  profile->source = "measured at start-up (coordinator/calibration.h)";
  profile->description = absl::StrCat("cpu(s) and gpu(s) at ", num_samples, " row counts (1..", max_rows,
                                      "), median of ", run.options.repetitions, "; ", num_copies, " pool copies");
  profile->cache_key = CalibrationCacheKey(run.setup);
  profile->gpu = run.pool.kind();
  profile->cpu = CpuModelName();
  profile->pcie = run.pool.kind() == "no-GPU host pool" ? "none (host memcpy)" : "";
  profile->model.name = config.architecture_name;
  profile->model.num_layers = run.num_layers;
  profile->model.num_experts = run.num_experts;
  profile->model.num_experts_per_token = static_cast<int>(config.num_experts_per_tok);
  profile->model.gpu_expert_slots = run.pool.num_slots();
}

// The cost model from the fitted curves and the copies' median rate.
void FillCost(const CalibrationRun& run, const RooflineCurve& cpu_curve, const RooflineCurve& gpu_curve,
              const std::vector<MigrationRecord>& copies, CostModelParams* cost) {
  // The bytes as the pool stores them (quantized blocks when the experts
  // are kept quantized), so migrate = expert_bytes x rate moves with them.
  cost->expert_bytes = run.pool.expert_bytes();
  cost->activation_row_bytes = run.setup.config->hidden_size * static_cast<int64_t>(sizeof(float));
  // The dispatch round trip is inside the measured curve: the transport
  // adds nothing.
  cost->transports.push_back({run.setup.cpu_transport, TransferCost{}});
  cost->cpu_workers.assign(static_cast<size_t>(run.setup.num_cpu_workers), CpuWorkerCost{cpu_curve, 0});
  cost->gpu = gpu_curve;
  // One expert size only: a pure per-byte rate (no fixed part to separate).
  cost->migrate = TransferCost{0, MedianUsPerByte(copies)};
  cost->dma = TransferCost{};  // the no-GPU pool moves no activations
}

}  // namespace

absl::Status CalibrationOptions::Validate() const {
  if (rows.size() < 2)
    return absl::InvalidArgumentError(absl::StrCat("rows must list at least 2 row counts, got ", rows.size()));
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 1 || (i > 0 && rows[i] <= rows[i - 1])) {
      return absl::InvalidArgumentError(absl::StrCat("rows must be ascending counts >= 1; rows[", i, "] = ", rows[i]));
    }
  }
  if (repetitions < 1) return absl::InvalidArgumentError(absl::StrCat("repetitions must be >= 1, got ", repetitions));
  if (migrations < 1) return absl::InvalidArgumentError(absl::StrCat("migrations must be >= 1, got ", migrations));
  if (!(max_seconds > 0)) return absl::InvalidArgumentError(absl::StrCat("max_seconds must be > 0, got ", max_seconds));
  return absl::OkStatus();
}

std::string MachineDescription() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat("cpu=", CpuModelName(), "; cores=", AvailableCores(), "; host=", host,
                      "; isa=", IsaLevelName(ActiveIsa()));
}

std::string PoolExpertTypes(const ExpertPool& pool) {
  std::vector<std::string> names;
  for (int l = 0; l < pool.num_layers(); ++l) {
    std::string name = pool.layout(l).DTypeNames();
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(std::move(name));
  }
  return absl::StrJoin(names, ",");
}

std::string CalibrationCacheKey(const CalibrationSetup& setup) {
  // The experts' stored types too: the same file served with
  // --gguf_experts bf16 and quantized has one fingerprint, but other CPU
  // kernels, copy sizes and slot counts.
  return absl::StrCat(MachineDescription(), " | ", FingerprintString(setup.fingerprint), " | ",
                      setup.config_description, " | workers=", setup.num_cpu_workers, " ",
                      ExpertDivisionName(setup.division), " | pool=", setup.pool ? setup.pool->kind() : "none",
                      setup.pool ? absl::StrCat(" experts=", PoolExpertTypes(*setup.pool)) : "");
}

absl::StatusOr<HardwareProfile> Calibrate(const CalibrationSetup& setup, const CalibrationOptions& options) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  TANDEM_RETURN_IF_ERROR(CheckSetup(setup));
  CalibrationRun run(setup, options);
  HardwareProfile profile;
  if (!setup.kernel_plan_groups.empty()) TANDEM_RETURN_IF_ERROR(MeasureAndInstallKernelPlan(setup, &profile));
  TANDEM_ASSIGN_OR_RETURN(const std::vector<ExpertKey> staged, StageExperts(run));
  std::vector<TimingSample> cpu_samples, gpu_samples;
  TANDEM_RETURN_IF_ERROR(MeasureCurves(run, staged, &cpu_samples, &gpu_samples));
  TANDEM_RETURN_IF_ERROR(run.pool.ReleaseStaging());
  (void)run.pool.TakeCompletedMigrations();
  TANDEM_ASSIGN_OR_RETURN(const std::vector<MigrationRecord> copies, TimeCopies(run));
  run.pool.ResetStats();

  // Under split each worker's curve is for a whole expert alone; the call
  // measured all W slices in parallel.
  const double worker_scale = setup.division == ExpertDivision::kSplit ? setup.num_cpu_workers : 1;
  for (TimingSample& s : cpu_samples) s.us *= worker_scale;
  TANDEM_ASSIGN_OR_RETURN(RooflineCurve cpu_curve, FitRoofline(cpu_samples, "cpu"));
  TANDEM_ASSIGN_OR_RETURN(RooflineCurve gpu_curve, FitRoofline(gpu_samples, "gpu"));

  DescribeProfile(run, cpu_samples.size(), cpu_samples.back().rows, copies.size(), &profile);
  FillCost(run, cpu_curve, gpu_curve, copies, &profile.cost);
  TANDEM_RETURN_IF_ERROR(profile.cost.Validate());
  LOG_INFO("calibration: ", absl::StrFormat("%.2f s", SecondsSince(run.start)), "; cpu(1) ",
           absl::StrFormat("%.1f", cpu_curve.Us(1)), " us, cpu(", cpu_samples.back().rows, ") ",
           absl::StrFormat("%.1f", cpu_curve.Us(cpu_samples.back().rows)), " us; pool gpu(1) ",
           absl::StrFormat("%.1f", gpu_curve.Us(1)), " us; migration ",
           absl::StrFormat("%.1f us (%.2f GB/s) for %lld bytes (%s)",
                           profile.cost.migrate.Us(static_cast<double>(profile.cost.expert_bytes)),
                           profile.cost.migrate.GbPerSecond(), static_cast<long long>(profile.cost.expert_bytes),
                           PoolExpertTypes(*setup.pool)));
  return profile;
}

absl::StatusOr<CalibrationResult> LoadOrCalibrate(const std::string& path, const CalibrationSetup& setup,
                                                  const CalibrationOptions& options) {
  CalibrationResult result;
  const std::string key = CalibrationCacheKey(setup);
  if (!path.empty() && std::filesystem::exists(path)) {
    absl::StatusOr<HardwareProfile> cached = LoadHardwareProfile(path);
    if (cached.ok() && cached->cache_key == key) {
      result.profile = std::move(*cached);
      result.from_cache = true;
      TANDEM_RETURN_IF_ERROR(InstallCachedKernelPlan(result.profile, path));
      LOG_INFO("calibration: read ", path, " (same machine, model and config)");
      return result;
    }
    LOG_INFO("calibration: ", path,
             cached.ok() ? " was measured for another machine, model or config"
                         : absl::StrCat(" is unreadable (", cached.status().message(), ")"),
             "; measuring again");
  }
  const auto start = std::chrono::steady_clock::now();
  TANDEM_ASSIGN_OR_RETURN(result.profile, Calibrate(setup, options));
  result.seconds = SecondsSince(start);
  if (!path.empty()) TANDEM_RETURN_IF_ERROR(SaveHardwareProfile(result.profile, path));
  return result;
}

}  // namespace tandem
