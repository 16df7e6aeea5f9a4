// Everything needed to run a model in one process, wired together: the model,
// the compute threads, the compute backend (CPU, or CUDA when asked for: then
// the KV cache lives on the GPU too), the in-process CPU expert
// executor (or an external one: CPU worker processes), the KV block pool, the
// engine and the generator. Used by the
// tandem-generate CLI, the benchmarks and the tests.
//
// Optionally (off by default) the experts go through the orchestrator
// (coordinator/orchestrator.h): planner, cost model (calibrated at start-up,
// cached in a profile file), cache and placement policies over an expert
// pool — the no-GPU host pool (gpu_worker/host_expert_pool.h) or the CUDA
// pool (gpu_worker/cuda_expert_pool.h, page-locking the model's expert
// weights in place) — wrapping the CPU executor. And optionally the engine records routing traces and expert
// usage (coordinator/routing_recorder.h).
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/model/model.h"
#include "coordinator/engine/cpu_backend.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/kv_cache.h"
#include "coordinator/generation/generator.h"
#include "coordinator/orchestration/calibration.h"
#include "coordinator/orchestration/orchestrator.h"
#include "coordinator/orchestration/precalc.h"
#include "coordinator/orchestration/routing_recorder.h"
#include "coordinator/orchestration/worker_expert_sources.h"
#include "cpu_worker/expert_ffn.h"
#include "cpu_worker/local_expert_executor.h"
#include "gpu_worker/cuda/cuda_backend.h"
#include "gpu_worker/expert_pool.h"

namespace tandem {

enum class ExpertPoolKind : uint8_t {
  kHost,  // no GPU: slots in host memory, experts computed by this process's CPU
  kCuda,  // slots in GPU memory (gpu_worker/cuda_expert_pool.h)
};
enum class BackendKind : uint8_t { kCpu, kCuda };

// "host" | "cuda"; InvalidArgument naming `flag` otherwise.
absl::StatusOr<ExpertPoolKind> ParseExpertPoolKind(const std::string& name, const std::string& flag);
// "cpu" | "cuda"; InvalidArgument naming `flag` otherwise.
absl::StatusOr<BackendKind> ParseBackendKind(const std::string& name, const std::string& flag);

// The orchestrator over an expert pool (see the file comment).
struct LocalOrchestratorOptions {
  bool enabled = false;
  ExpertPoolKind pool = ExpertPoolKind::kHost;
  int cuda_device = 0;  // the CUDA pool's device
  // The pool copies experts from these (the CPU workers' shared-memory
  // stores, coordinator/worker_expert_sources.h) instead of the model's own
  // weights, which may then hold no experts at all. Not owned; must outlive
  // the runtime. Null: from the model.
  const WorkerExpertSources* worker_experts = nullptr;
  ExecutionPolicy execution = ExecutionPolicy::kMakespan;
  CachePolicyKind cache = CachePolicyKind::kStatic;
  PlacementPolicy placement = PlacementPolicy::kUniform;
  bool balance_layers = false;  // popularity: DAOP's per-layer share first
  // Pool size: gpu_slots when >= 0, else what gpu_memory_bytes holds (staging
  // buffers included); neither given: a quarter of the model's experts.
  int gpu_slots = -1;
  int64_t gpu_memory_bytes = 0;
  int staging_buffers = 2;
  int lru_ways = 0;                     // lru: experts cached per layer; 0: slots / layers
  std::string usage_profile;            // expert usage file (popularity placement)
  std::string calibration_profile;      // calibration cache file; empty: calibrate, keep nothing
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
  int num_threads = 0;  // 0: every core this process may use
  // The dense part's device. cuda: CudaBackend (options below) with its KV
  // cache in device memory; Unavailable at Create when there is no GPU,
  // Unimplemented in a build without CUDA.
  BackendKind backend = BackendKind::kCpu;
  CudaBackendOptions cuda;
  int64_t kv_cache_tokens = 0;  // 0: one sequence of the model's full context
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
  // Time every CPU kernel path on this model's shapes at start-up and
  // install the fastest per row count (common/kernels/kernel_calibration.h)
  // for the whole process. With the orchestrator this is part of its
  // calibration and cached in orchestrator.calibration_profile. Off: the
  // process's plan as it is (built-in, or what --kernel_plan installed).
  bool measure_kernel_plan = false;
};

// Whether `kv_cache_tokens` (> 0; 0 = one sequence's context, grown lazily,
// is not checked) in blocks of `kv_block_size` fit `config` and this host:
// InvalidArgument naming the flag (--kv_cache_tokens, --kv_block_size) when
// the block size is out of [1, kMaxKvBlockSize] or the cache could grow past
// the machine's physical memory. Cheap: call it before loading the model.
absl::Status CheckKvCacheOptions(const ModelConfig& config, int64_t kv_cache_tokens, int64_t kv_block_size);

// Owns every part; one caller thread at a time.
class LocalRuntime {
 public:
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Create(std::unique_ptr<Model> model,
                                                              const LocalRuntimeOptions& options = {});
  // The same over a model shared with other runtimes: a runtime only reads
  // its model, so one generated model (a full Mixtral-8x7B is ~93 GB) can
  // serve runtime after runtime, e.g. one per execution policy in
  // tandem-scenario-bench. Create them one after another: a CUDA expert
  // pool page-locks the model's expert weights in place, and a second pool
  // registering the same pages while the first lives would fail.
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Create(std::shared_ptr<const Model> model,
                                                              const LocalRuntimeOptions& options = {});
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Open(const std::filesystem::path& model_dir,
                                                            const LocalRuntimeOptions& options = {});
  // A folder or a synthetic model (generated with its tokenizer and every
  // expert, on options.num_threads threads).
  static absl::StatusOr<std::unique_ptr<LocalRuntime>> Open(const ModelSource& source,
                                                            const LocalRuntimeOptions& options = {});

  const Model& model() const { return *model_; }
  ThreadPool& pool() { return *pool_; }
  KvBlockPool& kv_pool() { return *kv_pool_; }
  Engine& engine() { return *engine_; }
  Generator& generator() { return *generator_; }
  // Null unless enabled in the options.
  Orchestrator* orchestrator() { return orchestrator_.get(); }
  ExpertPool* expert_pool() { return expert_pool_.get(); }
  ComputeBackend& backend() { return *backend_; }
  // "CPU backend" or "CUDA backend", for logs and stats.
  const std::string& backend_name() const { return backend_name_; }
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
  std::shared_ptr<const Model> model_;  // shared: see Create
  std::unique_ptr<ThreadPool> pool_;
  // Declared before kv_pool_: a CUDA backend's KV storage copies on the
  // backend's stream, so the pool must go first.
  std::unique_ptr<ComputeBackend> backend_;
  std::string backend_name_;
  std::unique_ptr<LocalExpertExecutor> experts_;
  // The orchestrator's parts, in dependency order (destroyed in reverse).
  std::unique_ptr<ExpertFfn> pool_ffn_;  // the host pool's kernel: the CPU executor's FFN
  std::unique_ptr<ExpertPool> expert_pool_;
  std::optional<CalibrationResult> calibration_;
  std::unique_ptr<Orchestrator> orchestrator_;
  std::unique_ptr<DaopPrecalc> precalc_;  // daop without the orchestrator
  std::unique_ptr<RoutingRecorder> recorder_;
  std::unique_ptr<KvBlockPool> kv_pool_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Generator> generator_;
};

}  // namespace tandem
