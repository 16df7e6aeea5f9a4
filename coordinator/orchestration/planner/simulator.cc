#include "coordinator/orchestration/planner/simulator.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

absl::Status CheckTrace(const RoutingTrace& trace, const SimOptions& options) {
  const int L = trace.num_layers, E = trace.num_experts;
  if (L < 1 || E < 1) return absl::InvalidArgumentError("trace has no layers or no experts");
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (trace.steps[i].rows.size() != static_cast<size_t>(L) * static_cast<size_t>(E)) {
      return absl::InvalidArgumentError(absl::StrCat("trace steps[", i, "].rows has ", trace.steps[i].rows.size(),
                                                     " entries, expected num_layers x num_experts = ", L * E));
    }
  }
  if (options.non_expert_us_per_layer < 0) return absl::InvalidArgumentError("non_expert_us_per_layer must be >= 0");
  return absl::OkStatus();
}

// One replay of a trace: the policies, the residency table and the clock,
// carried from layer to layer and step to step.
class Simulation {
 public:
  Simulation(const RoutingTrace& trace, const CostModel& cost, const SimOptions& options, Planner planner,
             std::unique_ptr<CachePolicy> cache, ResidencyTable table)
      : trace_(trace),
        cost_(cost),
        options_(options),
        planner_(std::move(planner)),
        cache_(std::move(cache)),
        table_(std::move(table)),
        migrate_us_(cost.MigrateUs()) {}

  // The initial placement, into the table and the cache policy.
  absl::Status Place();
  // Trace step i: every layer, one after the other.
  absl::Status RunStep(size_t i);
  SimResult Finish();

 private:
  // A new sequence: tell the cache how long it will decode, and how wide.
  void StartSequence(size_t i);
  absl::Status RunLayer(size_t i, int layer);
  void CountPlan(int layer, std::span<const int32_t> rows);
  absl::Status ApplyDecisions(double at);

  const RoutingTrace& trace_;
  const CostModel& cost_;
  const SimOptions& options_;
  Planner planner_;
  std::unique_ptr<CachePolicy> cache_;
  ResidencyTable table_;
  const double migrate_us_;

  SimResult result_;
  double now_ = 0;
  double copy_free_at_ = 0;  // absolute time the copy engine becomes idle
  std::vector<ExpertState> states_;
  std::vector<CacheDecision> decisions_;
  LayerPlan plan_;
  int sequences_ = 0, decode_steps_ = 0;
  double decode_us_ = 0, ttft_sum_ = 0;
  double sequence_start_ = 0;
};

absl::Status Simulation::Place() {
  PlacementOptions placement = options_.placement;
  placement.dense_layers = trace_.dense_layers;  // no experts to place there
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExpertKey> placed,
                          PlaceExperts(placement, trace_.num_layers, trace_.num_experts, options_.usage));
  TANDEM_RETURN_IF_ERROR(ApplyPlacement(placed, &table_));
  result_.layers.assign(static_cast<size_t>(trace_.num_layers), SimLayerResult{});
  for (const ExpertKey& key : placed) ++result_.layers[static_cast<size_t>(key.layer)].slots;
  return cache_->Reset(table_);
}

absl::Status Simulation::RunStep(size_t i) {
  const TraceStep& step = trace_.steps[i];
  if (i == 0 || trace_.steps[i - 1].sequence != step.sequence) StartSequence(i);
  const double step_start = now_;
  for (int l = 0; l < trace_.num_layers; ++l) TANDEM_RETURN_IF_ERROR(RunLayer(i, l));
  if (step.phase == Phase::kPrefill) {
    ttft_sum_ += now_ - sequence_start_;
  } else {
    decode_us_ += now_ - step_start;
    ++decode_steps_;
  }
  return absl::OkStatus();
}

void Simulation::StartSequence(size_t i) {
  const TraceStep& step = trace_.steps[i];
  SequenceInfo info;
  for (size_t j = i; j < trace_.steps.size() && trace_.steps[j].sequence == step.sequence; ++j) {
    if (trace_.steps[j].phase == Phase::kDecode) {
      ++info.expected_decode_steps;
      info.decode_rows_per_step = trace_.steps[j].tokens;
    }
  }
  cache_->OnSequenceStart(info);
  sequence_start_ = now_;
  ++sequences_;
}

// Layer `layer` of step i: the cache policy's decisions on the routing, the
// plan and its copies, the plan's makespan on the clock, then admissions.
absl::Status Simulation::RunLayer(size_t i, int layer) {
  now_ += options_.non_expert_us_per_layer;
  table_.CompleteMigrationsBy(now_);
  CacheStep cache_step;
  cache_step.layer = layer;
  cache_step.phase = trace_.steps[i].phase;
  cache_step.rows = trace_.LayerRows(i, layer);
  cache_step.residency = &table_;
  cache_step.copy_backlog_us = std::max(0.0, copy_free_at_ - now_);
  decisions_.clear();
  cache_->OnRouting(cache_step, &decisions_);
  TANDEM_RETURN_IF_ERROR(ApplyDecisions(now_));

  table_.LayerStates(layer, now_, &states_);
  LayerPlanInput input;
  input.layer = layer;
  input.rows = cache_step.rows;
  input.residency = states_;
  input.copy_engine_free_us = std::max(0.0, copy_free_at_ - now_);
  input.max_new_migrations = options_.max_new_migrations;
  TANDEM_RETURN_IF_ERROR(planner_.Plan(input, cost_, &plan_));
  if (plan_.num_migrations > 0) {
    // The plan's copies queue on the same engine, after everything before them.
    copy_free_at_ = std::max(copy_free_at_, now_) + plan_.num_migrations * migrate_us_;
    result_.copy_busy_us += plan_.num_migrations * migrate_us_;
  }
  CountPlan(layer, cache_step.rows);
  now_ += plan_.makespan_us;
  result_.layers[static_cast<size_t>(layer)].makespan_us += plan_.makespan_us;

  table_.CompleteMigrationsBy(now_);
  decisions_.clear();
  cache_->OnExecuted(cache_step, plan_, &decisions_);
  return ApplyDecisions(now_);
}

// The plan's placements and busy times into the result.
void Simulation::CountPlan(int layer, std::span<const int32_t> rows) {
  SimLayerResult& per_layer = result_.layers[static_cast<size_t>(layer)];
  double slowest_worker = 0;
  for (double t : plan_.cpu_worker_us) slowest_worker = std::max(slowest_worker, t);
  result_.cpu_busy_us += slowest_worker;
  for (int e = 0; e < trace_.num_experts; ++e) {
    const ExpertAssignment& a = plan_.experts[static_cast<size_t>(e)];
    switch (a.placement) {
      case ExpertPlacement::kIdle: continue;
      case ExpertPlacement::kGpuResident: ++result_.gpu_hits, ++per_layer.gpu_hits; break;
      case ExpertPlacement::kGpuAfterInflight: ++result_.inflight_waits, ++per_layer.gpu_hits; break;
      case ExpertPlacement::kMigrateThenGpu: ++result_.planner_migrations, ++per_layer.migrations; break;
      case ExpertPlacement::kCpu: ++result_.cpu_runs, ++per_layer.cpu_runs; break;
    }
    ++result_.expert_runs, ++per_layer.expert_runs;
    if (a.placement != ExpertPlacement::kCpu) result_.gpu_busy_us += cost_.GpuUs(rows[static_cast<size_t>(e)]);
  }
}

absl::Status Simulation::ApplyDecisions(double at) {
  for (const CacheDecision& d : decisions_) {
    if (d.kind == CacheDecision::Kind::kMigrate) {
      ++result_.cache_migrations;
      result_.copy_busy_us += migrate_us_;
    } else {
      ++result_.cache_admissions;
    }
  }
  return ApplyCacheDecisions(decisions_, at, migrate_us_, &copy_free_at_, &table_);
}

SimResult Simulation::Finish() {
  result_.total_us = now_;
  result_.ttft_us = sequences_ > 0 ? ttft_sum_ / sequences_ : 0;
  result_.decode_step_us = decode_steps_ > 0 ? decode_us_ / decode_steps_ : 0;
  result_.decode_tokens_per_s = decode_us_ > 0 ? 1e6 * decode_steps_ / decode_us_ : 0;
  return result_;
}

}  // namespace

absl::StatusOr<SimResult> Simulate(const RoutingTrace& trace, const CostModel& cost, const SimOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckTrace(trace, options));
  const int L = trace.num_layers, E = trace.num_experts;
  TANDEM_ASSIGN_OR_RETURN(Planner planner, Planner::Create(options.planner));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CachePolicy> cache, MakeCachePolicy(options.cache, L, E, &cost));
  TANDEM_ASSIGN_OR_RETURN(ResidencyTable table, ResidencyTable::Create(L, E, options.placement.num_slots));
  Simulation simulation(trace, cost, options, std::move(planner), std::move(cache), std::move(table));
  TANDEM_RETURN_IF_ERROR(simulation.Place());
  for (size_t i = 0; i < trace.steps.size(); ++i) TANDEM_RETURN_IF_ERROR(simulation.RunStep(i));
  return simulation.Finish();
}

}  // namespace tandem
