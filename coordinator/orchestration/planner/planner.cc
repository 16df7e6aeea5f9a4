#include "coordinator/orchestration/planner/planner.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Strictly better by more than rounding noise: on ties the plan found first
// (fewer migrations, fewer waits) stays.
bool Better(double candidate, double best) {
  if (std::isinf(best)) return candidate < best;
  return candidate < best - 1e-9 * std::max(1.0, std::abs(best));
}

absl::Status ValidateInput(const LayerPlanInput& input, int num_cpu_workers) {
  if (input.rows.empty()) return absl::InvalidArgumentError("rows must list at least one expert");
  if (input.residency.size() != input.rows.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("residency has ", input.residency.size(), " experts but rows has ", input.rows.size()));
  }
  for (size_t e = 0; e < input.rows.size(); ++e) {
    if (input.rows[e] < 0)
      return absl::InvalidArgumentError(absl::StrCat("rows[", e, "] is negative: ", input.rows[e]));
    const ExpertState& state = input.residency[e];
    if (state.residency == Residency::kMigrating &&
        !(state.migration_eta_us >= 0 && std::isfinite(state.migration_eta_us))) {
      return absl::InvalidArgumentError(
          absl::StrCat("residency[", e, "].migration_eta_us must be finite and >= 0, got ", state.migration_eta_us));
    }
  }
  if (!(input.copy_engine_free_us >= 0 && std::isfinite(input.copy_engine_free_us))) {
    return absl::InvalidArgumentError(
        absl::StrCat("copy_engine_free_us must be finite and >= 0, got ", input.copy_engine_free_us));
  }
  if (input.max_new_migrations < 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_new_migrations must be >= 0, got ", input.max_new_migrations));
  }
  if (!input.shard_owner.empty()) {
    if (input.shard_owner.size() != input.rows.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard_owner has ", input.shard_owner.size(), " experts but rows has ", input.rows.size()));
    }
    for (size_t e = 0; e < input.shard_owner.size(); ++e) {
      if (input.shard_owner[e] < 0 || input.shard_owner[e] >= num_cpu_workers) {
        return absl::InvalidArgumentError(absl::StrCat("shard_owner[", e, "] = ", input.shard_owner[e],
                                                       " is not one of the ", num_cpu_workers, " CPU workers"));
      }
    }
  }
  return absl::OkStatus();
}

int OwnerOf(const LayerPlanInput& input, int expert, int num_cpu_workers) {
  if (!input.shard_owner.empty()) return input.shard_owner[static_cast<size_t>(expert)];
  return ShardWorker(input.layer, expert, num_cpu_workers);
}

// When the copy engine is free for this plan's copies: after everything
// queued, which includes this layer's own in-flight copies.
double CopyEngineFree(const LayerPlanInput& input) {
  double free_us = input.copy_engine_free_us;
  for (const ExpertState& state : input.residency) {
    if (state.residency == Residency::kMigrating) free_us = std::max(free_us, state.migration_eta_us);
  }
  return free_us;
}

// T_cpu_w from its compute and its one-way activation bytes: rows go in
// (dma GPU→host, then the transport) and outputs come back the same way.
double CpuWorkerUs(const CostModel& cost, int worker, double compute_us, double one_way_bytes) {
  if (one_way_bytes <= 0) return 0;
  return 2 * cost.DmaUs(one_way_bytes) + cost.IpcUs(worker, 2 * one_way_bytes) + compute_us;
}

}  // namespace

absl::StatusOr<ExecutionPolicy> ParseExecutionPolicy(const std::string& name) {
  if (name == "threshold") return ExecutionPolicy::kThreshold;
  if (name == "makespan") return ExecutionPolicy::kMakespan;
  if (name == "gpu-only") return ExecutionPolicy::kGpuOnly;
  if (name == "cpu-only") return ExecutionPolicy::kCpuOnly;
  return absl::InvalidArgumentError(
      absl::StrCat("execution policy \"", name, "\" is not one of threshold, makespan, gpu-only, cpu-only"));
}

std::string ExecutionPolicyName(ExecutionPolicy policy) {
  switch (policy) {
    case ExecutionPolicy::kThreshold: return "threshold";
    case ExecutionPolicy::kMakespan: return "makespan";
    case ExecutionPolicy::kGpuOnly: return "gpu-only";
    case ExecutionPolicy::kCpuOnly: return "cpu-only";
  }
  return "unknown";
}

const char* ExpertPlacementName(ExpertPlacement placement) {
  switch (placement) {
    case ExpertPlacement::kIdle: return "idle";
    case ExpertPlacement::kGpuResident: return "gpu";
    case ExpertPlacement::kGpuAfterInflight: return "gpu-after-inflight";
    case ExpertPlacement::kMigrateThenGpu: return "migrate-then-gpu";
    case ExpertPlacement::kCpu: return "cpu";
  }
  return "unknown";
}

absl::Status PlannerOptions::Validate() const {
  if (num_cpu_workers < 1)
    return absl::InvalidArgumentError(absl::StrCat("num_cpu_workers must be >= 1, got ", num_cpu_workers));
  if (max_enumerated_inflight < 0 || max_enumerated_inflight > 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_enumerated_inflight must be in [0, 16] (2^n plans are tried), got ", max_enumerated_inflight));
  }
  return absl::OkStatus();
}

absl::StatusOr<Planner> Planner::Create(const PlannerOptions& options) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  return Planner(options);
}

int Planner::Owner(const LayerPlanInput& input, int expert) const {
  return OwnerOf(input, expert, options_.num_cpu_workers);
}

// Every placement possible for its expert; every migration names an
// absent active expert placed kMigrateThenGpu, once, and every
// kMigrateThenGpu is listed. (Planner output is so by construction.)
static absl::Status CheckPlacements(const LayerPlanInput& input, const LayerPlan& plan) {
  const size_t num_experts = input.rows.size();
  if (plan.experts.size() != num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("plan has ", plan.experts.size(), " experts but rows has ", num_experts));
  }
  if (static_cast<int64_t>(plan.migrations.size()) > input.max_new_migrations) {
    return absl::InvalidArgumentError(absl::StrCat("plan starts ", plan.migrations.size(),
                                                   " migrations but max_new_migrations is ", input.max_new_migrations));
  }
  for (size_t i = 0; i < plan.migrations.size(); ++i) {
    const int e = plan.migrations[i];
    if (e < 0 || static_cast<size_t>(e) >= num_experts ||
        plan.experts[static_cast<size_t>(e)].placement != ExpertPlacement::kMigrateThenGpu) {
      return absl::InvalidArgumentError(
          absl::StrCat("migrations[", i, "] = ", e, " is not an expert placed migrate-then-gpu"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (plan.migrations[j] == e)
        return absl::InvalidArgumentError(absl::StrCat("migrations lists expert ", e, " twice"));
    }
  }
  size_t listed = 0;
  for (size_t e = 0; e < num_experts; ++e) {
    const ExpertPlacement placement = plan.experts[e].placement;
    const Residency residency = input.residency[e].residency;
    const char* problem = nullptr;
    if (input.rows[e] == 0) {
      if (placement != ExpertPlacement::kIdle) problem = "has no rows: must be idle";
    } else if (placement == ExpertPlacement::kIdle) {
      problem = "has rows: must run somewhere";
    } else if (placement == ExpertPlacement::kGpuResident && residency != Residency::kResident) {
      problem = "is not resident";
    } else if (placement == ExpertPlacement::kGpuAfterInflight && residency != Residency::kMigrating) {
      problem = "is not migrating";
    } else if (placement == ExpertPlacement::kMigrateThenGpu && residency != Residency::kAbsent) {
      problem = "is not absent";
    }
    if (problem != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("experts[", e, "] (", ExpertPlacementName(placement), ") ", problem));
    }
    listed += placement == ExpertPlacement::kMigrateThenGpu;
  }
  if (listed != plan.migrations.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(listed, " experts are placed migrate-then-gpu but migrations lists ", plan.migrations.size()));
  }
  return absl::OkStatus();
}

// The times and counts of a plan whose placements are valid.
static void ComputeTimes(const LayerPlanInput& input, const CostModel& cost, ExpertDivision division, LayerPlan* plan) {
  const int num_workers = cost.num_cpu_workers();
  const size_t num_experts = input.rows.size();
  const double row_bytes = static_cast<double>(cost.params().activation_row_bytes);
  double gpu_us = 0;
  plan->num_gpu_resident = plan->num_gpu_after_inflight = plan->num_migrations = plan->num_cpu = 0;
  for (size_t e = 0; e < num_experts; ++e) {
    ExpertAssignment& a = plan->experts[e];
    a.cpu_worker = kNoCpuWorker;
    a.gpu_ready_us = 0;
    switch (a.placement) {
      case ExpertPlacement::kIdle: break;
      case ExpertPlacement::kGpuResident:
        gpu_us += cost.GpuUs(input.rows[e]);  // residents first: nothing to wait for
        ++plan->num_gpu_resident;
        break;
      case ExpertPlacement::kGpuAfterInflight:
        a.gpu_ready_us = input.residency[e].migration_eta_us;
        ++plan->num_gpu_after_inflight;
        break;
      case ExpertPlacement::kMigrateThenGpu: ++plan->num_migrations; break;
      case ExpertPlacement::kCpu:
        a.cpu_worker =
            division == ExpertDivision::kSplit ? kAllCpuWorkers : OwnerOf(input, static_cast<int>(e), num_workers);
        ++plan->num_cpu;
        break;
    }
  }
  // The GPU after the residents: waited in-flight copies in ETA order (the
  // earliest-release-first order is optimal for one machine with release
  // times), then this plan's copies, which queue behind everything already
  // on the copy engine. Selection instead of a sort: nothing to allocate,
  // and in-flight copies are few.
  double last_eta = -1;
  int last_expert = -1;
  for (int done = 0; done < plan->num_gpu_after_inflight; ++done) {
    int next = -1;
    for (size_t e = 0; e < num_experts; ++e) {
      if (plan->experts[e].placement != ExpertPlacement::kGpuAfterInflight) continue;
      const double eta = plan->experts[e].gpu_ready_us;
      const bool after_last = eta > last_eta || (eta == last_eta && static_cast<int>(e) > last_expert);
      if (!after_last) continue;
      if (next < 0 || eta < plan->experts[static_cast<size_t>(next)].gpu_ready_us) next = static_cast<int>(e);
    }
    last_eta = plan->experts[static_cast<size_t>(next)].gpu_ready_us;
    last_expert = next;
    gpu_us = std::max(gpu_us, last_eta) + cost.GpuUs(input.rows[static_cast<size_t>(next)]);
  }
  const double copy_free = CopyEngineFree(input);
  const double migrate_us = cost.MigrateUs();
  for (size_t i = 0; i < plan->migrations.size(); ++i) {
    const size_t e = static_cast<size_t>(plan->migrations[i]);
    plan->experts[e].gpu_ready_us = copy_free + static_cast<double>(i + 1) * migrate_us;
    gpu_us = std::max(gpu_us, plan->experts[e].gpu_ready_us) + cost.GpuUs(input.rows[e]);
  }
  plan->gpu_us = gpu_us;

  plan->cpu_worker_us.assign(static_cast<size_t>(num_workers), 0.0);
  const double share = division == ExpertDivision::kSplit ? 1.0 / num_workers : 1.0;
  for (int w = 0; w < num_workers; ++w) {
    double compute = 0, bytes = 0;
    for (size_t e = 0; e < num_experts; ++e) {
      const ExpertAssignment& a = plan->experts[e];
      if (a.placement != ExpertPlacement::kCpu) continue;
      if (division == ExpertDivision::kShard && a.cpu_worker != w) continue;
      compute += share * cost.CpuUs(w, input.rows[e]);
      bytes += input.rows[e] * row_bytes;
    }
    plan->cpu_worker_us[static_cast<size_t>(w)] = CpuWorkerUs(cost, w, compute, bytes);
  }
  plan->makespan_us = plan->gpu_us;
  for (double t : plan->cpu_worker_us) plan->makespan_us = std::max(plan->makespan_us, t);
}

absl::Status EvaluatePlan(const LayerPlanInput& input, const CostModel& cost, ExpertDivision division,
                          LayerPlan* plan) {
  TANDEM_RETURN_IF_ERROR(ValidateInput(input, cost.num_cpu_workers()));
  TANDEM_RETURN_IF_ERROR(CheckPlacements(input, *plan));
  ComputeTimes(input, cost, division, plan);
  return absl::OkStatus();
}

absl::Status Planner::Plan(const LayerPlanInput& input, const CostModel& cost, LayerPlan* plan) {
  if (cost.num_cpu_workers() != options_.num_cpu_workers) {
    return absl::InvalidArgumentError(absl::StrCat("cost model has ", cost.num_cpu_workers(),
                                                   " CPU workers but num_cpu_workers is ", options_.num_cpu_workers));
  }
  TANDEM_RETURN_IF_ERROR(ValidateInput(input, options_.num_cpu_workers));
  plan->experts.assign(input.rows.size(), ExpertAssignment{});
  plan->migrations.clear();
  for (size_t e = 0; e < input.rows.size(); ++e) {
    if (input.rows[e] > 0 && input.residency[e].residency == Residency::kResident) {
      plan->experts[e].placement = ExpertPlacement::kGpuResident;  // every policy: resident → GPU
    }
  }
  switch (options_.policy) {
    case ExecutionPolicy::kThreshold: PlanThreshold(input, cost, plan); break;
    case ExecutionPolicy::kMakespan: PlanMakespan(input, cost, plan); break;
    case ExecutionPolicy::kGpuOnly: PlanGpuOnly(input, plan); break;
    case ExecutionPolicy::kCpuOnly: PlanCpuOnly(input, plan); break;
  }
  ComputeTimes(input, cost, options_.division, plan);
  return absl::OkStatus();
}

// Absent experts the plan migrates, in copy order: largest s first. Under a
// constant gpu(s) the order does not matter; when gpu(s) grows with s,
// putting the longest GPU jobs on the earliest copies minimises T_gpu.
static void SortBySizeDescending(const LayerPlanInput& input, std::vector<int>* experts) {
  std::sort(experts->begin(), experts->end(), [&](int a, int b) {
    const int32_t sa = input.rows[static_cast<size_t>(a)], sb = input.rows[static_cast<size_t>(b)];
    return sa != sb ? sa > sb : a < b;
  });
}

// The absent experts a policy wants on the GPU: with fewer staging buffers
// (max_new_migrations) than candidates, the largest batches get them, in
// copy order; the rest run on the CPU.
static void MigrateLargest(const LayerPlanInput& input, std::vector<int>* absent, LayerPlan* plan) {
  SortBySizeDescending(input, absent);
  for (size_t i = 0; i < absent->size(); ++i) {
    const size_t e = static_cast<size_t>((*absent)[i]);
    if (static_cast<int64_t>(i) < input.max_new_migrations) {
      plan->experts[e].placement = ExpertPlacement::kMigrateThenGpu;
      plan->migrations.push_back((*absent)[i]);
    } else {
      plan->experts[e].placement = ExpertPlacement::kCpu;
    }
  }
}

// Fiddler (ICLR 2025) Algorithm 1. is_at_gpu is "resident"; an expert whose
// copy is already in flight (only cache policies make those; Fiddler's
// placement is static) is treated the same way with trans_lat() replaced by
// the time left on its copy. trans_lat() is the plain migration time, not
// queue-aware, and cpu_lat(s) is compute only, as in the paper.
void Planner::PlanThreshold(const LayerPlanInput& input, const CostModel& cost, LayerPlan* plan) {
  absent_.clear();
  const double migrate_us = cost.MigrateUs();
  for (size_t e = 0; e < input.rows.size(); ++e) {
    const int32_t s = input.rows[e];
    if (s == 0 || plan->experts[e].placement == ExpertPlacement::kGpuResident) continue;
    const double cpu_lat = cost.CpuExpertUs(s, options_.division, Owner(input, static_cast<int>(e)));
    const ExpertState& state = input.residency[e];
    if (state.residency == Residency::kMigrating) {
      plan->experts[e].placement =
          cpu_lat > cost.GpuUs(s) + state.migration_eta_us ? ExpertPlacement::kGpuAfterInflight : ExpertPlacement::kCpu;
    } else if (cpu_lat > cost.GpuUs(s) + migrate_us) {
      absent_.push_back(static_cast<int>(e));
    } else {
      plan->experts[e].placement = ExpertPlacement::kCpu;
    }
  }
  MigrateLargest(input, &absent_, plan);
}

// On-demand offloading (DeepSpeed-MII, Mixtral-Offloading, MoE-OnDemand):
// everything runs on the GPU; an in-flight copy is waited for. Only when
// max_new_migrations runs out (no GPU room) does an expert fall back to the
// CPU, largest batches keeping the GPU.
void Planner::PlanGpuOnly(const LayerPlanInput& input, LayerPlan* plan) {
  absent_.clear();
  for (size_t e = 0; e < input.rows.size(); ++e) {
    if (input.rows[e] == 0 || plan->experts[e].placement == ExpertPlacement::kGpuResident) continue;
    if (input.residency[e].residency == Residency::kMigrating) {
      plan->experts[e].placement = ExpertPlacement::kGpuAfterInflight;
    } else {
      absent_.push_back(static_cast<int>(e));
    }
  }
  MigrateLargest(input, &absent_, plan);
}

// llama.cpp-like: what is on the GPU runs there, everything else on the CPU
// (an in-flight copy is not waited for).
void Planner::PlanCpuOnly(const LayerPlanInput& input, LayerPlan* plan) {
  for (size_t e = 0; e < input.rows.size(); ++e) {
    if (input.rows[e] > 0 && plan->experts[e].placement != ExpertPlacement::kGpuResident) {
      plan->experts[e].placement = ExpertPlacement::kCpu;
    }
  }
}

// One PlanMakespan call's constants, and the best plan found so far.
struct Planner::MakespanScan {
  const LayerPlanInput& input;
  const CostModel& cost;
  int num_workers = 1;
  bool split = true;
  double share = 1;        // a worker's part of an expert's CPU compute
  double row_bytes = 0;    // activation bytes of one row
  double migrate_us = 0;   // one copy
  double copy_free = 0;    // when this plan's copies can start
  double resident_us = 0;  // T_gpu of the residents, which run first
  int num_pullable = 0;    // absent experts that may be migrated
  int num_enumerated = 0;  // in-flight experts whose wait-or-CPU choice is enumerated
  double best = kInf;      // the least makespan found
  uint32_t best_mask = 0;  // its waited in-flight experts (best_pulled_: its pulls)
};

// The makespan policy: choose which non-resident experts run on the GPU so
// that max(T_gpu, max_w T_cpu_w) is least.
//
// Assumptions (A1-A5):
//   A1. gpu(s) is the same constant g for every non-resident expert of the
//       layer: a migrated expert's GPU time is dominated by its weights, not
//       its rows (Fiddler App. A; ARCHITECTURE.md). The code uses the real
//       gpu(s) for the times it reports, so with a sloped GPU curve the
//       choice is a heuristic (within 14% of the optimum on the random
//       layers of tests/planner_test.cc) and the prediction still exact.
//   A2. Every migration costs the same m (every expert has expert_bytes),
//       copies run one at a time on one copy engine, after those queued.
//   A3. cpu_w(s) is non-decreasing in s (RooflineCurve demands per_row >= 0)
//       and so are the activation bytes s * row_bytes, hence T_cpu_w only
//       shrinks when an expert leaves worker w, and shrinks more the larger
//       the expert's s.
//   A4. Resident experts run on the GPU (their GPU time is ~0.25 ms against
//       7-44 ms on a CPU, Table III of the collaborative paper).
//   A5. Experts already migrating are few; their wait/run-on-CPU choice is
//       enumerated (all 2^|F| combinations up to max_enumerated_inflight).
//
// Claim. For a fixed set of waited in-flight experts and a fixed number k of
// absent experts pulled to the GPU, T_gpu is the same whichever k are
// pulled; and the CPU side is minimised by
//   split: the k absent experts with the largest s;
//   shard: pulling, k times, the largest remaining absent expert of the
//          worker whose T_cpu_w is currently the largest.
// Trying every k (and every wait combination) therefore finds the optimum
// in O(2^|F| · E · W) after one sort: no search over the 2^E subsets.
//
// Proof. (GPU side) By A4 the residents run first; the GPU then processes
// the waited in-flight experts and the pulled ones in order of arrival,
// which is optimal for one machine with release times (earliest release
// first, no idling while work is ready). The in-flight ETAs are fixed and
// by A2 the i-th new copy lands at copy_free + i·m whichever expert it
// carries; by A1 each takes g. So T_gpu(k) depends on k only.
// (CPU side, exchange argument) Let M be any k-subset of the absent
// experts, e ∈ M and f ∉ M with s_f > s_e. Swap them: M' = M − e + f.
// T_gpu is unchanged (above). Under split every worker w loses
// share·(cpu_w(s_f) − cpu_w(s_e)) ≥ 0 of compute and (s_f − s_e)·row_bytes
// ≥ 0 of traffic (A3), so no T_cpu_w grows and neither does the max.
// Repeating the swap turns any M into the top-k by s without making it
// worse, so the top-k is optimal for that k. Under shard the same swap
// within one worker shows each worker should give up its largest experts,
// leaving only how many each gives up, k_w with Σ k_w = k. T_w(k_w) is
// non-increasing; let greedy always take from the worker that is currently
// the max. Suppose greedy ends at value V > OPT. Its max worker u* has
// T_u*(k_u*) = V > OPT ≥ T_u*(k*_u*), so the optimum took more from u*
// (k*_u* > k_u*), hence less from some v (k*_v < k_v). Greedy last took
// from v when v was the max, i.e. T_v(k_v − 1) ≥ V (the max never rises
// along greedy). Then T_v(k*_v) ≥ T_v(k_v − 1) ≥ V > OPT: a contradiction.
// When the max worker has nothing left to give up, no larger k can lower
// the CPU side while T_gpu only grows, so the scan stops. ∎
//
// tests/planner_test.cc checks this against brute force over every
// assignment on small random layers, split and shard.
void Planner::PlanMakespan(const LayerPlanInput& input, const CostModel& cost, LayerPlan* plan) {
  MakespanScan m{.input = input, .cost = cost};
  StartMakespan(m);
  best_pulled_.clear();
  for (uint32_t mask = 0; mask < (1u << m.num_enumerated); ++mask) ScanPulls(m, mask);
  ApplyMakespan(m, plan);
}

// The constants; the active experts by residency (absent_ by s descending,
// inflight_ by ETA); for shard, the absent ones grouped by owner, each group
// still by s descending (a stable partition of the sorted list).
void Planner::StartMakespan(MakespanScan& m) {
  const LayerPlanInput& input = m.input;
  const CostModel& cost = m.cost;
  m.num_workers = options_.num_cpu_workers;
  m.split = options_.division == ExpertDivision::kSplit;
  m.share = m.split ? 1.0 / m.num_workers : 1.0;
  m.row_bytes = static_cast<double>(cost.params().activation_row_bytes);
  m.migrate_us = cost.MigrateUs();
  m.copy_free = CopyEngineFree(input);

  absent_.clear();
  inflight_.clear();
  for (size_t e = 0; e < input.rows.size(); ++e) {
    const int32_t s = input.rows[e];
    if (s == 0) continue;
    switch (input.residency[e].residency) {
      case Residency::kResident: m.resident_us += cost.GpuUs(s); break;
      case Residency::kMigrating: inflight_.push_back(static_cast<int>(e)); break;
      case Residency::kAbsent: absent_.push_back(static_cast<int>(e)); break;
    }
  }
  SortBySizeDescending(input, &absent_);
  std::sort(inflight_.begin(), inflight_.end(), [&](int a, int b) {
    const double ea = input.residency[static_cast<size_t>(a)].migration_eta_us;
    const double eb = input.residency[static_cast<size_t>(b)].migration_eta_us;
    return ea != eb ? ea < eb : a < b;
  });
  m.num_pullable = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(absent_.size()), input.max_new_migrations));
  m.num_enumerated = std::min(static_cast<int>(inflight_.size()), options_.max_enumerated_inflight);

  if (!m.split) {
    const int num_workers = m.num_workers;
    worker_begin_.assign(static_cast<size_t>(num_workers) + 1, 0);
    for (int e : absent_) ++worker_begin_[static_cast<size_t>(Owner(input, e)) + 1];
    for (int w = 0; w < num_workers; ++w)
      worker_begin_[static_cast<size_t>(w) + 1] += worker_begin_[static_cast<size_t>(w)];
    worker_next_.assign(worker_begin_.begin(), worker_begin_.end() - 1);
    worker_queue_.resize(absent_.size());
    for (int e : absent_) worker_queue_[static_cast<size_t>(worker_next_[static_cast<size_t>(Owner(input, e))]++)] = e;
  }
  load_us_.resize(static_cast<size_t>(m.num_workers));
  bytes_.resize(static_cast<size_t>(m.num_workers));
}

// Expert e onto (sign +1) or off (sign -1) the CPU workers' loads.
void Planner::AddToCpu(const MakespanScan& m, int e, double sign) {
  const int32_t s = m.input.rows[static_cast<size_t>(e)];
  if (m.split) {
    for (int w = 0; w < m.num_workers; ++w) {
      load_us_[static_cast<size_t>(w)] += sign * m.share * m.cost.CpuUs(w, s);
      bytes_[static_cast<size_t>(w)] += sign * s * m.row_bytes;
    }
  } else {
    const int w = Owner(m.input, e);
    load_us_[static_cast<size_t>(w)] += sign * m.cost.CpuUs(w, s);
    bytes_[static_cast<size_t>(w)] += sign * s * m.row_bytes;
  }
}

// max_w T_cpu_w, and which worker attains it (lowest index on ties).
double Planner::CpuMax(const MakespanScan& m, int* argmax) const {
  double best = 0;
  *argmax = 0;
  for (int w = 0; w < m.num_workers; ++w) {
    const double t = CpuWorkerUs(m.cost, w, load_us_[static_cast<size_t>(w)], bytes_[static_cast<size_t>(w)]);
    if (t > best) {
      best = t;
      *argmax = w;
    }
  }
  return best;
}

// Whether in-flight expert inflight_[i] waits for its copy under `mask`.
bool Planner::Waits(const MakespanScan& m, uint32_t mask, size_t i) const {
  if (static_cast<int>(i) < m.num_enumerated) return ((mask >> i) & 1u) != 0;
  // Beyond the enumerated ones: Fiddler's rule with the time left on the copy.
  const int e = inflight_[i];
  const int32_t s = m.input.rows[static_cast<size_t>(e)];
  return m.cost.CpuExpertUs(s, options_.division, Owner(m.input, e)) >
         m.cost.GpuUs(s) + m.input.residency[static_cast<size_t>(e)].migration_eta_us;
}

// One wait combination: the in-flight experts `mask` waits for run on the
// GPU, the others and every absent one on the CPU; then k = 1, 2, ... absent
// experts are pulled to the GPU (the claim above says which), keeping the
// best makespan in m.
void Planner::ScanPulls(MakespanScan& m, uint32_t mask) {
  const LayerPlanInput& input = m.input;
  double gpu_us = m.resident_us;
  std::fill(load_us_.begin(), load_us_.end(), 0.0);
  std::fill(bytes_.begin(), bytes_.end(), 0.0);
  for (size_t i = 0; i < inflight_.size(); ++i) {
    const int e = inflight_[i];
    if (Waits(m, mask, i)) {
      gpu_us = std::max(gpu_us, input.residency[static_cast<size_t>(e)].migration_eta_us) +
               m.cost.GpuUs(input.rows[static_cast<size_t>(e)]);
    } else {
      AddToCpu(m, e, +1);
    }
  }
  for (int e : absent_) AddToCpu(m, e, +1);
  if (!m.split) worker_next_.assign(worker_begin_.begin(), worker_begin_.end() - 1);

  int max_worker = 0;
  double cpu_us = CpuMax(m, &max_worker);
  pulled_.clear();
  if (Better(std::max(gpu_us, cpu_us), m.best)) {
    m.best = std::max(gpu_us, cpu_us);
    m.best_mask = mask;
    best_pulled_.clear();
  }
  for (int k = 1; k <= m.num_pullable; ++k) {
    int e;
    if (m.split) {
      e = absent_[static_cast<size_t>(k - 1)];
    } else {
      int& next = worker_next_[static_cast<size_t>(max_worker)];
      if (next == worker_begin_[static_cast<size_t>(max_worker) + 1]) break;  // the max worker has nothing to give up
      e = worker_queue_[static_cast<size_t>(next++)];
    }
    AddToCpu(m, e, -1);
    // Removing the last expert of a worker must leave exactly no traffic.
    for (double& b : bytes_) {
      if (b < 0.5) b = 0;
    }
    gpu_us = std::max(gpu_us, m.copy_free + k * m.migrate_us) + m.cost.GpuUs(input.rows[static_cast<size_t>(e)]);
    pulled_.push_back(e);
    if (!Better(gpu_us, m.best)) break;  // T_gpu only grows with k
    cpu_us = CpuMax(m, &max_worker);
    if (Better(std::max(gpu_us, cpu_us), m.best)) {
      m.best = std::max(gpu_us, cpu_us);
      m.best_mask = mask;
      best_pulled_.assign(pulled_.begin(), pulled_.end());
    }
  }
}

// The best combination's placements and copies into `plan`.
void Planner::ApplyMakespan(const MakespanScan& m, LayerPlan* plan) const {
  for (size_t i = 0; i < inflight_.size(); ++i) {
    plan->experts[static_cast<size_t>(inflight_[i])].placement =
        Waits(m, m.best_mask, i) ? ExpertPlacement::kGpuAfterInflight : ExpertPlacement::kCpu;
  }
  for (int e : absent_) plan->experts[static_cast<size_t>(e)].placement = ExpertPlacement::kCpu;
  for (int e : best_pulled_) {
    plan->experts[static_cast<size_t>(e)].placement = ExpertPlacement::kMigrateThenGpu;
    plan->migrations.push_back(e);
  }
}

}  // namespace tandem
