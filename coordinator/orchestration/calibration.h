// Start-up calibration of the cost model (ARCHITECTURE.md "Cost model"):
// a few seconds at most of measuring
//   - cpu(s): one expert on the CPU executor at several row counts,
//   - gpu(s): one expert computed by the expert pool at the same counts,
//   - migrate: the pool copying one expert's weights (as the pool stores
//     them: quantized blocks when the experts are kept quantized, so the
//     profile's expert_bytes and the cpu(s) of the quantized kernels are
//     what the planner weighs),
// each fitted with FitRoofline (or, for the copy, a per-byte rate), into a
// hardware profile (coordinator/planner/profile_io.h) whose cache_key names
// the machine, the model's fingerprint and the configuration, so that a
// later start with the same key reads the file instead of measuring.
//
// The CPU executor is measured through its RunExperts, as the orchestrator
// calls it: for CPU worker processes the dispatch round trip is folded into
// the curve (the profile's transport then costs nothing extra), and under
// split each worker's curve is W times the whole call (a worker's curve is
// for a whole expert alone; it computes 1/W of each).
//
// First, when the setup names matrices to time, the CPU kernels' plan
// (common/kernels/kernel_calibration.h): which kernel path is fastest at
// each row count here. It is installed for the whole process before cpu(s)
// is measured, so the curve is that of the kernels that will run, and kept
// in the profile, so a cached profile installs it again.
//
// Runs on the engine thread before serving (it uses the executor and the
// pool); the pool must hold no staged experts. Leaves the pool's slots as
// they were and its counters reset.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/expert_executor.h"
#include "common/base/thread_pool.h"
#include "common/kernels/linear_types.h"
#include "common/model/expert_partition.h"
#include "common/model/model_config.h"
#include "common/model/model_fingerprint.h"
#include "coordinator/orchestration/planner/profile_io.h"
#include "gpu_worker/expert_pool.h"

namespace tandem {

struct CalibrationOptions {
  std::vector<int> rows = {1, 2, 4, 8, 16, 32, 64, 128};  // row counts measured, ascending
  int repetitions = 5;                                    // per row count and side; the median is kept
  int migrations = 8;                                     // pool copies timed
  double max_seconds = 3;  // stop adding larger row counts after this (at least 2 are measured)

  absl::Status Validate() const;  // InvalidArgument naming the field
};

struct CalibrationSetup {
  const ModelConfig* config = nullptr;
  ModelFingerprint fingerprint;  // of the model being served
  ExpertExecutor* cpu = nullptr;
  int num_cpu_workers = 1;
  ExpertDivision division = ExpertDivision::kSplit;
  std::string cpu_transport = "local";  // the profile's transport name for the workers
  ExpertPool* pool = nullptr;
  // Non-empty: measure and install the kernel plan first, timing these
  // groups of matrices (e.g. two experts' gate, up, down) on kernel_pool.
  std::vector<std::vector<LinearWeight>> kernel_plan_groups;
  ThreadPool* kernel_pool = nullptr;
  // Whatever else the timings depend on (threads, executor, pool), e.g.
  // "threads=2 executor=local pool=no-GPU host pool": part of the cache key.
  std::string config_description;
};

struct CalibrationResult {
  HardwareProfile profile;
  bool from_cache = false;
  double seconds = 0;  // spent measuring (0 when read from the cache)
};

// "cpu=<model name>; cores=<n>; host=<hostname>; isa=<level the kernels run at>".
std::string MachineDescription();
// The pool's experts' stored types, each distinct layer layout once:
// "BF16", "Q8_0", "Q4_K,Q4_K/Q4_K/Q6_K".
std::string PoolExpertTypes(const ExpertPool& pool);
// machine | model fingerprint | config | division and workers | pool kind
// and its experts' types.
std::string CalibrationCacheKey(const CalibrationSetup& setup);

// Measures and fits. InvalidArgument naming the field for a bad setup (no
// executor, no pool, a pool without staging buffers).
absl::StatusOr<HardwareProfile> Calibrate(const CalibrationSetup& setup, const CalibrationOptions& options = {});

// `path` empty: Calibrate. Otherwise, when the file holds a profile with
// this setup's cache key, it is read; when it is absent or its key differs
// (another machine, model or config), Calibrate runs and overwrites it.
absl::StatusOr<CalibrationResult> LoadOrCalibrate(const std::string& path, const CalibrationSetup& setup,
                                                  const CalibrationOptions& options = {});

}  // namespace tandem
