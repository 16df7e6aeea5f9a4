// The per-layer planner (ARCHITECTURE.md "One decode step", step 3): once
// the router has said how many rows s_e go to each expert, decide for every
// expert with s_e > 0 whether it runs
//   - on the GPU because it is resident,
//   - on the GPU after a migration (one already in flight, or one this plan
//     starts; the copy goes to a staging buffer unless a cache policy then
//     admits it, see cache_policy.h), or
//   - on the CPU workers (split: on all of them, each its slice; shard: on
//     the worker that holds it),
// and predict the layer's makespan T = max(T_gpu, max_w T_cpu_w) with
//   T_cpu_w = dma(bytes_w) + ipc_w(bytes_w) + Σ_{e on w} share_w · cpu_w(s_e)
//   T_gpu   = resident experts first, then each migrated expert as soon as
//             its copy lands (one copy engine, copies back to back after
//             the ones already queued), each taking gpu(s_e).
//
// Execution policies (selectable, so the papers can be compared in one
// binary):
//   threshold — Fiddler (ICLR 2025) Alg. 1, exactly: resident → GPU; else
//               GPU if cpu_lat(s) > gpu_lat(s) + trans_lat(), else CPU.
//   makespan  — Fiddler (2024) objective generalised: CPU workers and GPU in
//               parallel, minimise the max. Optimal under the assumptions in
//               planner.cc (proof there), found by sorting, not by search.
//   gpu-only  — on-demand offloading: every non-resident expert is migrated.
//   cpu-only  — llama.cpp-like: every non-resident expert runs on the CPU.
//
// Pure and deterministic: the same input gives the same plan. A Planner
// keeps scratch buffers so that planning allocates nothing once warm; use
// one per thread. Microseconds per layer with 128 experts (tandem-planner-bench).
//
// Legend: E experts in the layer, W CPU workers.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/expert_division.h"
#include "coordinator/orchestration/planner/cost_model.h"
#include "coordinator/orchestration/planner/residency.h"

namespace tandem {

enum class ExecutionPolicy { kThreshold, kMakespan, kGpuOnly, kCpuOnly };
// "threshold" | "makespan" | "gpu-only" | "cpu-only"
absl::StatusOr<ExecutionPolicy> ParseExecutionPolicy(const std::string& name);
std::string ExecutionPolicyName(ExecutionPolicy policy);

enum class ExpertPlacement : uint8_t {
  kIdle,              // s_e = 0: nothing to run
  kGpuResident,       // resident: runs on the GPU at once
  kGpuAfterInflight,  // its migration was already in flight: the GPU waits for it
  kMigrateThenGpu,    // this plan starts its migration, then the GPU runs it
  kCpu,               // runs on the CPU worker(s)
};
const char* ExpertPlacementName(ExpertPlacement placement);

inline constexpr int kAllCpuWorkers = -1;  // split: every worker runs its slice
inline constexpr int kNoCpuWorker = -2;
inline constexpr int kUnlimitedMigrations = std::numeric_limits<int>::max();

struct ExpertAssignment {
  ExpertPlacement placement = ExpertPlacement::kIdle;
  int cpu_worker = kNoCpuWorker;  // kCpu: the shard owner, or kAllCpuWorkers under split
  double gpu_ready_us = 0;        // GPU placements: when its weights are there (0 when resident)
};

struct PlannerOptions {
  ExecutionPolicy policy = ExecutionPolicy::kMakespan;
  ExpertDivision division = ExpertDivision::kSplit;
  int num_cpu_workers = 1;
  // makespan: experts already migrating in a layer are few (a post-fetch or
  // two); up to this many are decided by trying every wait/run-on-CPU
  // combination, the rest by Fiddler's threshold rule.
  int max_enumerated_inflight = 4;

  absl::Status Validate() const;  // InvalidArgument naming the field
};

// One layer's routing and residency: what the planner decides from.
struct LayerPlanInput {
  int layer = 0;
  std::span<const int32_t> rows;           // [E] s_e, rows routed to expert e
  std::span<const ExpertState> residency;  // [E]
  // µs from now until the copy engine can start a new migration (copies
  // already queued, for this layer or others). Plans queue after them.
  double copy_engine_free_us = 0;
  // Migrations this plan may start (staging buffers); kUnlimitedMigrations
  // when the pool can stream any number through its staging buffers; 0 when
  // there is no GPU room at all.
  int max_new_migrations = kUnlimitedMigrations;
  // [E] shard owner of each expert; empty: ShardWorker(layer, e, W), as
  // PartitionExperts places them. Ignored under split.
  std::span<const int> shard_owner;
};

struct LayerPlan {
  std::vector<ExpertAssignment> experts;  // [E]
  std::vector<int> migrations;            // experts whose copy this plan starts, in copy order
  std::vector<double> cpu_worker_us;      // [W] T_cpu_w
  double gpu_us = 0;                      // T_gpu, waits for copies included
  double makespan_us = 0;                 // max(T_gpu, max_w T_cpu_w)
  int num_gpu_resident = 0;
  int num_gpu_after_inflight = 0;
  int num_migrations = 0;
  int num_cpu = 0;
};

class Planner {
 public:
  static absl::StatusOr<Planner> Create(const PlannerOptions& options);

  const PlannerOptions& options() const { return options_; }

  // Fills `plan` (reusing its buffers). InvalidArgument naming the field when
  // rows and residency differ in size, a row count is negative, an ETA is
  // negative, shard_owner is malformed, or the cost model has a different
  // number of CPU workers than options.num_cpu_workers.
  absl::Status Plan(const LayerPlanInput& input, const CostModel& cost, LayerPlan* plan);

 private:
  explicit Planner(const PlannerOptions& options) : options_(options) {}
  void PlanThreshold(const LayerPlanInput& input, const CostModel& cost, LayerPlan* plan);
  void PlanGpuOnly(const LayerPlanInput& input, LayerPlan* plan);
  void PlanCpuOnly(const LayerPlanInput& input, LayerPlan* plan);
  void PlanMakespan(const LayerPlanInput& input, const CostModel& cost, LayerPlan* plan);
  int Owner(const LayerPlanInput& input, int expert) const;

  // PlanMakespan's steps.
  struct MakespanScan;
  void StartMakespan(MakespanScan& m);
  void AddToCpu(const MakespanScan& m, int e, double sign);
  double CpuMax(const MakespanScan& m, int* argmax) const;
  bool Waits(const MakespanScan& m, uint32_t mask, size_t i) const;
  void ScanPulls(MakespanScan& m, uint32_t mask);
  void ApplyMakespan(const MakespanScan& m, LayerPlan* plan) const;

  PlannerOptions options_;
  // Scratch, kept between calls so that planning does not allocate.
  std::vector<int> absent_;        // absent active experts, by s descending
  std::vector<int> inflight_;      // migrating active experts, by ETA
  std::vector<int> worker_queue_;  // shard: absent experts grouped by owner, each group by s descending
  std::vector<int> worker_begin_;  // [W + 1] group bounds in worker_queue_
  std::vector<int> worker_next_;   // [W] next expert to pull in each group
  std::vector<double> load_us_;    // [W] compute part of T_cpu_w
  std::vector<double> bytes_;      // [W] activation bytes of T_cpu_w
  std::vector<int> pulled_;        // absent experts pulled to the GPU, in pull order
  std::vector<int> best_pulled_;
};

// The ground truth every policy (and every test) is scored by: given the
// placements in plan->experts and the copy order in plan->migrations, fills
// the times and counts of `plan`. InvalidArgument when a placement is
// impossible (a GPU placement of an absent expert that is not in
// migrations, kGpuAfterInflight of an expert that is not migrating, a
// migration of an expert that is not absent or listed twice, more
// migrations than max_new_migrations).
absl::Status EvaluatePlan(const LayerPlanInput& input, const CostModel& cost, ExpertDivision division, LayerPlan* plan);

}  // namespace tandem
