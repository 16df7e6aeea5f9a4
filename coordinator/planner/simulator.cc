#include "coordinator/planner/simulator.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<SimResult> Simulate(const RoutingTrace& trace, const CostModel& cost, const SimOptions& options) {
  const int L = trace.num_layers, E = trace.num_experts;
  if (L < 1 || E < 1) return absl::InvalidArgumentError("trace has no layers or no experts");
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    if (trace.steps[i].rows.size() != static_cast<size_t>(L) * static_cast<size_t>(E)) {
      return absl::InvalidArgumentError(absl::StrCat("trace steps[", i, "].rows has ", trace.steps[i].rows.size(),
                                                     " entries, expected num_layers x num_experts = ", L * E));
    }
  }
  if (options.non_expert_us_per_layer < 0) return absl::InvalidArgumentError("non_expert_us_per_layer must be >= 0");
  TANDEM_ASSIGN_OR_RETURN(Planner planner, Planner::Create(options.planner));
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CachePolicy> cache, MakeCachePolicy(options.cache, L, E, &cost));
  TANDEM_ASSIGN_OR_RETURN(ResidencyTable table, ResidencyTable::Create(L, E, options.placement.num_slots));
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExpertKey> placed, PlaceExperts(options.placement, L, E, options.usage));
  TANDEM_RETURN_IF_ERROR(ApplyPlacement(placed, &table));
  TANDEM_RETURN_IF_ERROR(cache->Reset(table));

  SimResult result;
  const double migrate_us = cost.MigrateUs();
  double now = 0;
  double copy_free_at = 0;  // absolute time the copy engine becomes idle
  std::vector<ExpertState> states;
  std::vector<CacheDecision> decisions;
  LayerPlan plan;
  int sequences = 0, decode_steps = 0;
  double decode_us = 0, ttft_sum = 0;
  double sequence_start = 0;

  auto apply = [&](double at) -> absl::Status {
    for (const CacheDecision& d : decisions) {
      if (d.kind == CacheDecision::Kind::kMigrate) {
        ++result.cache_migrations;
        result.copy_busy_us += migrate_us;
      } else {
        ++result.cache_admissions;
      }
    }
    return ApplyCacheDecisions(decisions, at, migrate_us, &copy_free_at, &table);
  };

  for (size_t i = 0; i < trace.steps.size(); ++i) {
    const TraceStep& step = trace.steps[i];
    if (i == 0 || trace.steps[i - 1].sequence != step.sequence) {
      // A new sequence: tell the cache how long it will decode, and how wide.
      SequenceInfo info;
      for (size_t j = i; j < trace.steps.size() && trace.steps[j].sequence == step.sequence; ++j) {
        if (trace.steps[j].phase == Phase::kDecode) {
          ++info.expected_decode_steps;
          info.decode_rows_per_step = trace.steps[j].tokens;
        }
      }
      cache->OnSequenceStart(info);
      sequence_start = now;
      ++sequences;
    }
    const double step_start = now;
    for (int l = 0; l < L; ++l) {
      now += options.non_expert_us_per_layer;
      table.CompleteMigrationsBy(now);
      CacheStep cache_step;
      cache_step.layer = l;
      cache_step.phase = step.phase;
      cache_step.rows = trace.LayerRows(i, l);
      cache_step.residency = &table;
      cache_step.copy_backlog_us = std::max(0.0, copy_free_at - now);
      decisions.clear();
      cache->OnRouting(cache_step, &decisions);
      TANDEM_RETURN_IF_ERROR(apply(now));

      table.LayerStates(l, now, &states);
      LayerPlanInput input;
      input.layer = l;
      input.rows = cache_step.rows;
      input.residency = states;
      input.copy_engine_free_us = std::max(0.0, copy_free_at - now);
      input.max_new_migrations = options.max_new_migrations;
      TANDEM_RETURN_IF_ERROR(planner.Plan(input, cost, &plan));
      if (plan.num_migrations > 0) {
        // The plan's copies queue on the same engine, after everything before them.
        copy_free_at = std::max(copy_free_at, now) + plan.num_migrations * migrate_us;
        result.copy_busy_us += plan.num_migrations * migrate_us;
      }
      double slowest_worker = 0;
      for (double t : plan.cpu_worker_us) slowest_worker = std::max(slowest_worker, t);
      result.cpu_busy_us += slowest_worker;
      for (int e = 0; e < E; ++e) {
        const ExpertAssignment& a = plan.experts[static_cast<size_t>(e)];
        const int32_t rows = cache_step.rows[static_cast<size_t>(e)];
        switch (a.placement) {
          case ExpertPlacement::kIdle: continue;
          case ExpertPlacement::kGpuResident: ++result.gpu_hits; break;
          case ExpertPlacement::kGpuAfterInflight: ++result.inflight_waits; break;
          case ExpertPlacement::kMigrateThenGpu: ++result.planner_migrations; break;
          case ExpertPlacement::kCpu: ++result.cpu_runs; break;
        }
        ++result.expert_runs;
        if (a.placement != ExpertPlacement::kCpu) result.gpu_busy_us += cost.GpuUs(rows);
      }
      now += plan.makespan_us;

      table.CompleteMigrationsBy(now);
      decisions.clear();
      cache->OnExecuted(cache_step, plan, &decisions);
      TANDEM_RETURN_IF_ERROR(apply(now));
    }
    if (step.phase == Phase::kPrefill) {
      ttft_sum += now - sequence_start;
    } else {
      decode_us += now - step_start;
      ++decode_steps;
    }
  }
  result.total_us = now;
  result.ttft_us = sequences > 0 ? ttft_sum / sequences : 0;
  result.decode_step_us = decode_steps > 0 ? decode_us / decode_steps : 0;
  result.decode_tokens_per_s = decode_us > 0 ? 1e6 * decode_steps / decode_us : 0;
  return result;
}

}  // namespace tandem
