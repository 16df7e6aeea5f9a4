// Everything needed to run a model in one process, wired together: the model,
// the compute threads, the CPU compute backend, the in-process CPU expert
// executor (or an external one: CPU worker processes), the KV block pool, the
// engine and the generator. Used by the
// tandem-generate CLI, the benchmarks and the tests.
//
// Optionally (off by default) the experts go through the orchestrator
// (coordinator/orchestrator.h): planner, cost model (calibrated at start-up,
// cached in a profile file), cache and placement policies over the no-GPU
// host expert pool (gpu_worker/host_expert_pool.h), wrapping the CPU
// executor. And optionally the engine records routing traces and expert
// usage (coordinator/routing_recorder.h).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/model.h"
#include "common/thread_pool.h"
#include "coordinator/calibration.h"
#include "coordinator/cpu_backend.h"
#include "coordinator/engine.h"
#include "coordinator/generator.h"
#include "coordinator/kv_cache.h"
#include "coordinator/orchestrator.h"
#include "coordinator/precalc.h"
#include "coordinator/routing_recorder.h"
#include "cpu_worker/expert_ffn.h"
#include "cpu_worker/local_expert_executor.h"
#include "gpu_worker/host_expert_pool.h"

namespace tandem {

// The orchestrator over the no-GPU host pool (see the file comment).
struct LocalOrchestratorOptions {
  bool enabled = false;
  ExecutionPolicy execution = ExecutionPolicy::kMakespan;
  CachePolicyKind cache = CachePolicyKind::kStatic;
  PlacementPolicy placement = PlacementPolicy::kUniform;
  bool balance_layers = false;  // popularity: DAOP's per-layer share first
  // Pool size: gpu_slots when >= 0, else what gpu_memory_bytes holds (staging
  // buffers included); neither given: a quarter of the model's experts.
  int gpu_slots = -1;
  int64_t gpu_memory_bytes = 0;
  int staging_buffers = 2;
  int lru_ways = 0;                 // lru: experts cached per layer; 0: slots / layers
  std::string usage_profile;        // expert usage file (popularity placement)
  std::string calibration_profile;  // calibration cache file; empty: calibrate, keep nothing
  std::optional<CostModelParams> cost;  // given: no calibration (tests, what-if runs)
  CalibrationOptions calibration;
  bool refine_online = true;
  // The CPU executor's shape when it is external (CPU worker processes).
  int num_cpu_workers = 1;
  ExpertDivision division = ExpertDivision::kSplit;
  std::string cpu_transport = "local";
  bool overlap_cpu = false;  // run the CPU executor beside the pool (worker processes)
};

struct LocalRuntimeOptions {
  int num_threads = 0;              // 0: every core this process may use
  int64_t kv_cache_tokens = 0;      // 0: one sequence of the model's full context
  int64_t kv_block_size = 16;
  EngineOptions engine;
  // Computes the experts instead of the in-process CPU executor, e.g. a
  // RemoteExpertExecutor over CPU worker processes. Not owned; must outlive
  // the runtime. Null: every expert runs in this process.
  ExpertExecutor* expert_executor = nullptr;
  LocalOrchestratorOptions orchestrator;
  std::string record_trace;  // routing trace file (routing_trace_io.h); empty: none
  std::string record_usage;  // expert usage file (popularity placement); empty: none
  // off (exact, the default) | daop: LOSSY one-layer-ahead expert
  // pre-calculation (coordinator/precalc.h). With the orchestrator, over its
  // pool's residency; without, every expert counts as a CPU expert (pure
  // approximation, no speed benefit).
  PrecalcOptions precalc;
};

// Owns every part; one caller thread at a time.
class LocalRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Create(std::unique_ptr<Model> model,
                                                              const LocalRuntimeOptions& options = {});
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Open(const std::filesystem::path& model_dir,
                                                            const LocalRuntimeOptions& options = {});

  const Model& model() const { return *model_; }
  ThreadPool& pool() { return *pool_; }
  KvBlockPool& kv_pool() { return *kv_pool_; }
  Engine& engine() { return *engine_; }
  Generator& generator() { return *generator_; }
  // Null unless enabled in the options.
  Orchestrator* orchestrator() { return orchestrator_.get(); }
  HostExpertPool* expert_pool() { return expert_pool_.get(); }
  RoutingRecorder* recorder() { return recorder_.get(); }
  // The pre-calculation's counters; policy "off" unless daop.
  PrecalcStats precalc_stats() const;
  // How the orchestrator's cost model was obtained (absent without one, or
  // when the options gave it).
  const std::optional<CalibrationResult>& calibration() const { return calibration_; }
  // Flushes the routing trace and writes the usage profile (also done on
  // destruction, where an error can only be logged).
  absl::Status FinishRecording();

 private:
  LocalRuntime() = default;
  std::unique_ptr<Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<LocalExpertExecutor> experts_;
  // The orchestrator's parts, in dependency order (destroyed in reverse).
  std::unique_ptr<ExpertFfn> pool_ffn_;  // the host pool's kernel: the CPU executor's FFN
  std::unique_ptr<HostExpertPool> expert_pool_;
  std::optional<CalibrationResult> calibration_;
  std::unique_ptr<Orchestrator> orchestrator_;
  std::unique_ptr<DaopPrecalc> precalc_;  // daop without the orchestrator
  std::unique_ptr<RoutingRecorder> recorder_;
  std::unique_ptr<KvBlockPool> kv_pool_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Generator> generator_;
};

}  // namespace tandem
