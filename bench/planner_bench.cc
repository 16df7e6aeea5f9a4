// How long the planner takes to plan one layer (it runs once per MoE layer
// per step, on the engine thread, between the router and the experts: it
// must cost microseconds even with 128 experts per layer).
//
// For every execution policy × experts per layer × tokens in the step, plans
// a rotating set of pre-generated layers (routing drawn with a skewed expert
// popularity, a fraction of experts resident, a few copies in flight) and
// prints one JSON line with the median time per plan over --reps runs.
//
// Legend: E experts per layer, K experts per token, T tokens in the step
// (rows routed = T · K), W CPU workers.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "common/base/clock.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/model/expert_partition.h"
#include "coordinator/orchestration/planner/cost_model.h"
#include "coordinator/orchestration/planner/planner.h"
#include "coordinator/orchestration/planner/profile_io.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, profile, TANDEM_SOURCE_DIR "/bench/profiles/collab-rtx4090-tr7960x-mixtral.json",
          "hardware profile (bench/profiles/*.json); default: the collaborative paper's RTX 4090 + TR 7960X "
          "Mixtral numbers");
ABSL_FLAG(std::string, experts, "8,16,64,128", "E values, comma-separated");
ABSL_FLAG(std::string, tokens, "1,2,4,8,16,32,64,128,256,512", "T values (tokens in the step), comma-separated");
ABSL_FLAG(int, experts_per_token, 0, "K; 0: 2 for E <= 16 (Mixtral, Phi-3.5-MoE), 8 above (Qwen3-style)");
ABSL_FLAG(std::string, policies, "threshold,makespan,gpu-only,cpu-only", "execution policies to time");
ABSL_FLAG(std::string, division, "split", "split or shard");
ABSL_FLAG(int, workers, 2, "CPU workers (the profile's whole CPU is divided into this many)");
ABSL_FLAG(double, resident_fraction, 0.25, "fraction of each layer's experts resident on the GPU");
ABSL_FLAG(int, inflight, 1, "experts per layer whose copy is in flight");
ABSL_FLAG(int, layers, 64, "distinct pre-generated layers the timing rotates through");
ABSL_FLAG(int, reps, 7, "timed repetitions; the median is reported");
ABSL_FLAG(double, min_rep_ms, 20, "each repetition plans layers for at least this long");

namespace tandem {
namespace {

using Json = nlohmann::json;

struct Layer {
  std::vector<int32_t> rows;
  std::vector<ExpertState> residency;
};

// T tokens each pick K distinct experts, expert e weighted 1 / (1 + e)^0.5
// shuffled per layer (a mild skew: Fiddler App. C reports popularity mostly
// within 0.6-0.8 of the top expert).
std::vector<Layer> MakeLayers(int num_experts, int k, int tokens, int count, double resident_fraction, int inflight,
                              std::mt19937_64& rng) {
  std::vector<Layer> layers(static_cast<size_t>(count));
  std::vector<double> weight(static_cast<size_t>(num_experts));
  std::vector<int> order(static_cast<size_t>(num_experts));
  for (Layer& layer : layers) {
    for (int e = 0; e < num_experts; ++e) order[static_cast<size_t>(e)] = e;
    std::shuffle(order.begin(), order.end(), rng);
    for (int e = 0; e < num_experts; ++e)
      weight[static_cast<size_t>(order[static_cast<size_t>(e)])] = 1 / std::sqrt(1.0 + e);
    layer.rows.assign(static_cast<size_t>(num_experts), 0);
    for (int t = 0; t < tokens; ++t) {
      std::vector<double> w = weight;
      for (int j = 0; j < k; ++j) {
        std::discrete_distribution<int> pick(w.begin(), w.end());
        const int e = pick(rng);
        ++layer.rows[static_cast<size_t>(e)];
        w[static_cast<size_t>(e)] = 0;
      }
    }
    layer.residency.assign(static_cast<size_t>(num_experts), {});
    std::shuffle(order.begin(), order.end(), rng);
    const int resident = static_cast<int>(std::lround(resident_fraction * num_experts));
    for (int i = 0; i < num_experts; ++i) {
      ExpertState& s = layer.residency[static_cast<size_t>(order[static_cast<size_t>(i)])];
      if (i < resident) {
        s.residency = Residency::kResident;
      } else if (i < resident + inflight) {
        s = {Residency::kMigrating, std::uniform_real_distribution<double>(0, 30000)(rng)};
      }
    }
  }
  return layers;
}

int Run() {
  absl::StatusOr<HardwareProfile> profile = LoadHardwareProfile(absl::GetFlag(FLAGS_profile));
  if (!profile.ok()) {
    LOG_ERROR(profile.status().ToString());
    return 1;
  }
  const CostModelParams& params = profile->cost;
  const std::string& profile_name = profile->name;
  const int num_workers = absl::GetFlag(FLAGS_workers);
  absl::StatusOr<CostModel> cost = CostModelForWorkers(params, num_workers);
  absl::StatusOr<ExpertDivision> division = ParseExpertDivision(absl::GetFlag(FLAGS_division));
  if (!cost.ok() || !division.ok()) {
    LOG_ERROR(cost.ok() ? division.status().ToString() : cost.status().ToString());
    return 1;
  }
  std::vector<ExecutionPolicy> policies;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty())) {
    absl::StatusOr<ExecutionPolicy> policy = ParseExecutionPolicy(std::string(name));
    if (!policy.ok()) {
      LOG_ERROR(policy.status().ToString());
      return 1;
    }
    policies.push_back(*policy);
  }
  EmitJsonLine({{"kind", "config"},
                {"profile", profile_name},
                {"workers", cost->num_cpu_workers()},
                {"division", ExpertDivisionName(*division)},
                {"resident_fraction", absl::GetFlag(FLAGS_resident_fraction)},
                {"inflight", absl::GetFlag(FLAGS_inflight)},
                {"layers", absl::GetFlag(FLAGS_layers)},
                {"reps", absl::GetFlag(FLAGS_reps)}});

  std::mt19937_64 rng(20250517);
  for (int num_experts : ParsePositiveList<int>(absl::GetFlag(FLAGS_experts))) {
    const int k = absl::GetFlag(FLAGS_experts_per_token) > 0 ? absl::GetFlag(FLAGS_experts_per_token)
                                                             : (num_experts <= 16 ? 2 : 8);
    if (k > num_experts) continue;
    for (int tokens : ParsePositiveList<int>(absl::GetFlag(FLAGS_tokens))) {
      const std::vector<Layer> layers =
          MakeLayers(num_experts, k, tokens, absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_resident_fraction),
                     std::min(absl::GetFlag(FLAGS_inflight), num_experts), rng);
      double active = 0;
      for (const Layer& layer : layers) {
        for (int32_t s : layer.rows) active += s > 0;
      }
      active /= static_cast<double>(layers.size());
      for (ExecutionPolicy policy : policies) {
        PlannerOptions options;
        options.policy = policy;
        options.division = *division;
        options.num_cpu_workers = cost->num_cpu_workers();
        absl::StatusOr<Planner> planner = Planner::Create(options);
        if (!planner.ok()) {
          LOG_ERROR(planner.status().ToString());
          return 1;
        }
        LayerPlan plan;
        LayerPlanInput input;
        double makespan_sum = 0;
        int64_t migrations = 0;
        auto plan_one = [&](size_t i) -> bool {
          const Layer& layer = layers[i % layers.size()];
          input.layer = static_cast<int>(i % 32);
          input.rows = layer.rows;
          input.residency = layer.residency;
          absl::Status s = planner->Plan(input, *cost, &plan);
          if (!s.ok()) {
            LOG_ERROR(s.ToString());
            return false;
          }
          return true;
        };
        for (size_t i = 0; i < layers.size(); ++i) {  // warm-up; also the plan statistics
          if (!plan_one(i)) return 1;
          makespan_sum += plan.makespan_us;
          migrations += plan.num_migrations;
        }
        std::vector<double> ns_per_plan;
        for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
          const auto start = std::chrono::steady_clock::now();
          const auto budget = std::chrono::duration<double, std::milli>(absl::GetFlag(FLAGS_min_rep_ms));
          size_t planned = 0;
          while (std::chrono::steady_clock::now() - start < budget) {
            for (size_t i = 0; i < layers.size(); ++i) plan_one(i);
            planned += layers.size();
          }
          const double ns = 1e3 * MicrosSince(start);
          ns_per_plan.push_back(ns / static_cast<double>(planned));
        }
        const Summary plan_ns = Summarise(ns_per_plan);
        EmitJsonLine({{"kind", "plan"},
                      {"policy", ExecutionPolicyName(policy)},
                      {"experts", num_experts},
                      {"experts_per_token", k},
                      {"tokens", tokens},
                      {"active_experts", active},
                      {"median_us_per_plan", plan_ns.median / 1000},
                      {"min_us_per_plan", plan_ns.min / 1000},
                      {"mean_predicted_makespan_us", makespan_sum / static_cast<double>(layers.size())},
                      {"mean_migrations", static_cast<double>(migrations) / static_cast<double>(layers.size())}});
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage("How long the planner takes to plan one layer.");
  tandem::ParseProgramFlags(argc, argv);
  return tandem::Run();
}
