// The orchestrated expert executor: what the engine calls per layer when
// CPU and GPU work in tandem (ARCHITECTURE.md "One decode step", steps 3-5).
// For every layer:
//   rows per expert (from the engine's work)
//   → cache policy OnRouting → its decisions applied: migrations queued on
//     the pool, the residency table updated with their predicted ETAs
//   → planner.Plan under the cost model (threshold / makespan / gpu-only /
//     cpu-only)
//   → execute: the plan's own copies are staged on the pool; CPU experts go
//     to the wrapped CPU executor (in-process, or the worker processes);
//     GPU experts — resident, in flight, or just staged — are computed by
//     the pool from its copy, waiting for each copy's readiness event
//   → cache policy OnExecuted → admissions applied; staging freed
//   → the cost model is fed the measured times (CPU batch, GPU batch, each
//     finished copy, the layer's makespan) and the stats updated.
// The pool's slots are filled at creation by a placement policy
// (popularity / first-layers / uniform). The orchestrator is also a
// ForwardObserver: the engine tells it each step's phase (prefill/decode)
// and when sequences start, which the cache policies need.
//
// Pre-calculation (PrecalcOptions, off by default) is the one LOSSY option:
// with `daop` the orchestrator owns a DaopPrecalc (coordinator/precalc.h)
// over its residency table and CPU executor, which the engine must be given
// as its layer hook (layer_hook()); pre-computed experts are served before
// planning and count in the precalc stats, not as expert runs.
//
// Exactness: every placement computes the same FFN from the same bytes, so
// with the host pool (whose kernel is the CPU executor's) the outputs equal
// the plain engine's bit for bit under every execution and cache policy.
//
// Owns the planner, the cache policy, the residency table and the cost
// model; borrows the CPU executor and the pool (both must outlive it). The
// ExpertExecutor and ForwardObserver calls come from the engine thread;
// stats() from any thread.
//
// Legend: E experts per layer, L layers, W CPU workers.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/expert_executor.h"
#include "common/model/model_config.h"
#include "coordinator/engine/forward_observer.h"
#include "coordinator/engine/layer_hook.h"
#include "coordinator/orchestration/planner/cache_policy.h"
#include "coordinator/orchestration/planner/cost_model.h"
#include "coordinator/orchestration/planner/placement.h"
#include "coordinator/orchestration/planner/planner.h"
#include "coordinator/orchestration/planner/residency.h"
#include "coordinator/orchestration/precalc.h"
#include "gpu_worker/expert_pool.h"

namespace tandem {

struct OrchestratorOptions {
  // Execution policy, division and CPU workers: the division and worker
  // count of the CPU executor (1 for the in-process one).
  PlannerOptions planner;
  CachePolicyOptions cache;
  // Initial placement; num_slots is taken from the pool.
  PlacementOptions placement;
  std::optional<ExpertUsage> usage;  // for `popularity`
  CostModelOptions cost;             // online refinement and the error window (MAPE over the last N)
  // Feed the measured times into the cost model (else it only scores the
  // makespan predictions).
  bool refine_online = true;
  // Run the CPU executor on its own thread while the pool computes. For
  // CPU worker processes (real overlap); the in-process executor shares the
  // compute threads with the host pool, so there it only adds a thread hop.
  bool overlap_cpu = false;
  // off (exact, the default) | daop (lossy, see precalc.h).
  PrecalcOptions precalc;
};

// One layer's (or all layers') counts.
struct OrchestratorLayerStats {
  int64_t expert_runs = 0;         // (step, expert) pairs with rows
  int64_t gpu_hits = 0;            // resident when planned: ran from a slot
  int64_t inflight_waits = 0;      // ran on the GPU after a copy already in flight
  int64_t planner_migrations = 0;  // copied by the plan (staging), then ran on the GPU
  int64_t cpu_runs = 0;
  int64_t cache_migrations = 0;  // copies the cache policy started
  int64_t cache_admissions = 0;  // planner copies the cache policy kept
  int64_t evictions = 0;         // slots the cache policy's decisions freed
  double expert_us = 0;          // measured wall time of the layer's expert work (CPU and pool), summed

  int64_t misses() const { return expert_runs - gpu_hits; }
};

struct OrchestratorStats {
  std::string pool_kind;  // "no-GPU host pool", ...
  std::string execution_policy, cache_policy, placement;
  int num_slots = 0;
  int num_staging_buffers = 0;
  int placed = 0;  // experts the initial placement put in slots
  int64_t steps = 0, prefill_steps = 0, decode_steps = 0;
  int64_t layer_plans = 0;
  int64_t refused_decisions = 0;  // cache decisions the residency table refused (a policy bug; skipped)
  OrchestratorLayerStats total;
  std::vector<OrchestratorLayerStats> layers;  // [L]
  // Per expert, index layer * E + expert: where its weights are (Residency:
  // 0 host only, 1 in a GPU slot, 2 being copied into one) as of its layer's
  // last plan, and how often it ran from the pool (slot or staging) or on
  // the CPU executor.
  int num_experts = 0;  // E
  std::vector<uint8_t> residency;
  std::vector<int64_t> expert_gpu_runs, expert_cpu_runs;
  // Sums over layer plans, µs.
  double plan_us = 0;                // cache policy + planner
  double predicted_makespan_us = 0;  // the plans' makespans
  double measured_makespan_us = 0;   // wall time of the layers' expert work
  double cpu_us = 0;                 // the CPU executor's calls
  double pool_wait_us = 0;           // waiting for copies
  double pool_compute_us = 0;        // the pool computing
  // Per cost-model term, mean |predicted - measured| / measured over the
  // last N observations (CostModelOptions::error_window); makespan: whole
  // layer plans.
  CostModelStats accuracy;
  // The cost model as it stands (refined online from every measurement).
  CostModelParams cost_model;
  ExpertPoolStats pool;
  // policy "off" unless daop; its JSON carries "lossy": "daop pre-calculation".
  PrecalcStats precalc;

  std::string ToJson() const;  // one JSON object
};

class Orchestrator final : public ExpertExecutor, public ForwardObserver {
 public:
  // Places the initial experts into `pool` (which must be empty) and builds
  // the policies. InvalidArgument naming the field for bad options (e.g.
  // popularity without a usage profile, a planner whose CPU worker count
  // differs from the cost model's, a pool of another model's shape).
  static absl::StatusOr<std::unique_ptr<Orchestrator>> Create(const ModelConfig& config, ExpertExecutor* cpu,
                                                              ExpertPool* pool, CostModel cost,
                                                              const OrchestratorOptions& options);
  ~Orchestrator() override;

  // ExpertExecutor: one layer, as the file comment says.
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override;

  // ForwardObserver.
  void OnStepBegin(const ForwardStep& step) override;
  void OnStepEnd(const ForwardStep& step, const absl::Status& status) override;

  OrchestratorStats stats() const ABSL_LOCKS_EXCLUDED(stats_mutex_);  // any thread
  void ResetStats() ABSL_LOCKS_EXCLUDED(stats_mutex_);                // engine thread; the pool's counters too

  // Engine thread.
  const CostModel& cost_model() const { return cost_; }
  const ResidencyTable& residency() const { return table_; }
  const LayerPlan& last_plan() const { return plan_; }
  // The engine's layer hook with precalc daop (lossy); null when off.
  LayerHook* layer_hook() { return precalc_.get(); }

 private:
  class CpuLane;

  Orchestrator(const ModelConfig& config, ExpertExecutor* cpu, ExpertPool* pool, CostModel cost,
               const OrchestratorOptions& options, Planner planner, std::unique_ptr<CachePolicy> cache,
               ResidencyTable table);

  double NowUs() const;
  // Finished copies → the residency table and the cost model.
  void DrainMigrations();
  // Applies cache decisions to the table and the pool, in order.
  absl::Status ApplyDecisions(std::span<const CacheDecision> decisions, double now_us, OrchestratorLayerStats* layer);
  absl::Status RunCpu(int layer, std::span<const ExpertWork> work, double* us);
  void ObserveCpu(int layer, std::span<const ExpertWork> work, double measured_us);

  // Create's steps after the constructor.
  absl::StatusOr<int> StartPolicies(const ModelConfig& config);
  void InitStats(int placed) ABSL_LOCKS_EXCLUDED(stats_mutex_);
  // stats_.residency of `layer` from the table.
  void SnapshotResidency(int layer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stats_mutex_);
  void LogSetup() const ABSL_LOCKS_EXCLUDED(stats_mutex_);

  // RunExperts' steps, in order.
  struct Execution;
  absl::StatusOr<int64_t> IndexWork(int layer, std::span<const ExpertWork> work);
  CacheStep RoutingStep(int layer, int64_t total_rows, double now) const;
  absl::Status PlanLayer(int layer, double now);
  void SplitWork(std::span<const ExpertWork> work, OrchestratorLayerStats* delta);
  absl::Status Execute(int layer, Execution* execution);
  void ObserveExecution(int layer, const Execution& execution);
  absl::Status AdmitExecuted(CacheStep& step, OrchestratorLayerStats* delta);
  void RecordLayer(int layer, const OrchestratorLayerStats& delta, const Execution& execution, double total_us);

  const int num_layers_;
  const int num_experts_;
  const int num_experts_per_token_;
  ExpertExecutor* cpu_;
  ExpertPool* pool_;
  CostModel cost_;
  OrchestratorOptions options_;
  Planner planner_;
  std::unique_ptr<CachePolicy> cache_;
  ResidencyTable table_;
  std::unique_ptr<CpuLane> cpu_lane_;     // overlap_cpu only
  std::unique_ptr<DaopPrecalc> precalc_;  // precalc daop only
  const std::chrono::steady_clock::time_point epoch_;
  double copy_free_at_us_ = 0;  // when the copy engine is predicted idle (absolute)

  // The current step, from OnStepBegin; without one the phase is guessed.
  bool in_step_ = false;
  bool step_prefill_ = false;

  // Per-layer scratch.
  std::vector<int32_t> rows_;        // [E]
  std::vector<int> work_index_;      // [E] index into the engine's work, or -1
  std::vector<ExpertState> states_;  // [E]
  std::vector<CacheDecision> decisions_;
  LayerPlan plan_;
  std::vector<ExpertWork> cpu_work_, pool_work_;
  std::vector<int32_t> observed_rows_;
  std::vector<ExpertWork> unserved_;  // precalc: the work not pre-computed

  // The stats of the engine thread's calls, read by any thread (stats()).
  mutable absl::Mutex stats_mutex_;
  OrchestratorStats stats_ ABSL_GUARDED_BY(stats_mutex_);  // pool is filled in by stats()
  bool warned_refusal_ ABSL_GUARDED_BY(stats_mutex_) = false;
};

}  // namespace tandem
