// Replays a routing trace through one combination of policies (initial
// placement, GPU cache, execution) under a cost model, with the very code
// the server runs (Planner, CachePolicy, ResidencyTable): the core of
// tandem-sim. Time is simulated, not measured: every layer takes the
// planner's predicted makespan plus a fixed non-expert time, migrations
// occupy one copy engine back to back, and cache decisions are applied as
// the GPU expert pool will apply them.
//
// One layer of one step, as the engine will run it:
//   non-expert part → router (the trace's rows) → cache.OnRouting →
//   planner.Plan → the layer runs for plan.makespan_us → cache.OnExecuted.
// Sequences run one after another; the cache carries over between them.
//
// Pure and deterministic. Not modelled yet: DAOP's lossy pre-calculation,
// CPU/GPU contention between layers (each layer waits for its own
// makespan), PCIe contention between weight copies and activation DMA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/orchestration/planner/cache_policy.h"
#include "coordinator/orchestration/planner/cost_model.h"
#include "coordinator/orchestration/planner/placement.h"
#include "coordinator/orchestration/planner/planner.h"
#include "coordinator/orchestration/planner/synthetic_trace.h"

namespace tandem {

struct SimOptions {
  PlannerOptions planner;  // execution policy, division, CPU workers
  CachePolicyOptions cache;
  PlacementOptions placement;                     // num_slots = the GPU's expert slots
  const ExpertUsage* usage = nullptr;             // for popularity placement: a calibration profile
  double non_expert_us_per_layer = 0;             // attention, norms, router: the same under every policy
  int max_new_migrations = kUnlimitedMigrations;  // staging buffers per layer plan
};

// One layer's share of a simulation: what its plan was, step by step.
struct SimLayerResult {
  int64_t slots = 0;        // GPU slots the initial placement gave it
  int64_t expert_runs = 0;  // (step, expert) with rows
  int64_t gpu_hits = 0;     // ran on the GPU without a copy of its own
  int64_t migrations = 0;   // copied by the plan to run on the GPU
  int64_t cpu_runs = 0;
  double makespan_us = 0;  // Σ over steps of the plan's makespan
};

struct SimResult {
  double total_us = 0;
  double ttft_us = 0;         // mean over sequences: the prefill step
  double decode_step_us = 0;  // mean per decode step (per-token latency)
  double decode_tokens_per_s = 0;
  int64_t expert_runs = 0;         // (layer, step, expert) with rows
  int64_t gpu_hits = 0;            // resident when planned
  int64_t inflight_waits = 0;      // ran on the GPU after waiting for a copy already in flight
  int64_t planner_migrations = 0;  // copied on demand by the plan
  int64_t cpu_runs = 0;
  int64_t cache_migrations = 0;  // started by the cache policy (post-fetch, swaps, prefetch)
  int64_t cache_admissions = 0;  // planner copies kept in a slot
  double cpu_busy_us = 0;        // Σ over layers of the busiest worker's T_cpu_w
  double gpu_busy_us = 0;        // Σ gpu(s) of the experts run on the GPU
  double copy_busy_us = 0;       // weight copies (cache + planner)
  std::vector<SimLayerResult> layers;  // [num_layers]; a dense layer's stays zero

  double hit_rate() const {
    return expert_runs > 0 ? static_cast<double>(gpu_hits) / static_cast<double>(expert_runs) : 0;
  }
};

// InvalidArgument naming the parameter when the trace, cost model and
// options disagree (shapes, CPU workers) or an option is invalid.
absl::StatusOr<SimResult> Simulate(const RoutingTrace& trace, const CostModel& cost, const SimOptions& options);

}  // namespace tandem
