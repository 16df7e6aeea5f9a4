// The synthetic routing traces (their statistics against the papers'
// published ones) and the simulator that replays them through policies.
#include <cmath>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/orchestration/planner/profile_io.h"
#include "coordinator/orchestration/planner/simulator.h"
#include "coordinator/orchestration/planner/synthetic_trace.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

TEST(SyntheticTraceTest, MatchesThePublishedStatistics) {
  SyntheticTraceOptions options;  // Mixtral-8x7B shape, the papers' figures as defaults
  options.num_sequences = 8;
  options.prompt_tokens = 256;
  options.decode_steps = 256;
  absl::StatusOr<RoutingTrace> trace = GenerateSyntheticTrace(options);
  ASSERT_OK(trace);
  const TraceStats stats = MeasureTrace(*trace);
  RecordProperty("popularity_mean", std::to_string(stats.popularity_mean));
  RecordProperty("popularity_sd", std::to_string(stats.popularity_sd));
  RecordProperty("token_reuse", std::to_string(stats.token_reuse));
  RecordProperty("layer_same_id", std::to_string(stats.layer_same_id));
  RecordProperty("prefill_decode_cosine", std::to_string(stats.prefill_decode_cosine));
  // Fiddler App. C: mean 0.71, sd 0.08 relative to the top expert.
  EXPECT_NEAR(stats.popularity_mean, 0.71, 0.06);
  EXPECT_NEAR(stats.popularity_sd, 0.08, 0.04);
  // Collaborative paper: reuse between consecutive tokens 30-50% (uniform
  // routing: 25%), same id in consecutive layers ~44%.
  EXPECT_GE(stats.token_reuse, 0.30);
  EXPECT_LE(stats.token_reuse, 0.50);
  EXPECT_NEAR(stats.layer_same_id, 0.44, 0.03);
  // DAOP Table II: ~90% cosine similarity between prefill and decode.
  EXPECT_NEAR(stats.prefill_decode_cosine, 0.90, 0.04);
}

TEST(SyntheticTraceTest, ShapeAndDeterminism) {
  SyntheticTraceOptions options;
  options.num_layers = 4;
  options.num_experts = 16;
  options.num_sequences = 2;
  options.prompt_tokens = 10;
  options.decode_steps = 5;
  options.decode_rows_per_step = 3;
  absl::StatusOr<RoutingTrace> a = GenerateSyntheticTrace(options);
  absl::StatusOr<RoutingTrace> b = GenerateSyntheticTrace(options);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_EQ(a->steps.size(), 2u * (1 + 5));
  for (size_t i = 0; i < a->steps.size(); ++i) {
    const TraceStep& step = a->steps[i];
    EXPECT_EQ(step.rows, b->steps[i].rows);
    EXPECT_EQ(step.tokens, step.phase == Phase::kPrefill ? 10 : 3);
    for (int l = 0; l < 4; ++l) {
      int sum = 0;
      for (int32_t r : a->LayerRows(i, l)) {
        EXPECT_LE(r, step.tokens);  // a token visits an expert at most once
        sum += r;
      }
      EXPECT_EQ(sum, step.tokens * 2);
    }
  }
  options.seed = 9;
  absl::StatusOr<RoutingTrace> c = GenerateSyntheticTrace(options);
  ASSERT_OK(c);
  EXPECT_NE(c->steps[0].rows, a->steps[0].rows);
}

TEST(SyntheticTraceTest, CalibrationTraceSharesTheModelsPopularity) {
  // Same model_seed, different prompts: the usage profiles agree on which
  // experts are popular (what `popularity` placement relies on).
  SyntheticTraceOptions options;
  options.num_sequences = 8;
  absl::StatusOr<RoutingTrace> a = GenerateSyntheticTrace(options);
  options.seed = 77;
  absl::StatusOr<RoutingTrace> b = GenerateSyntheticTrace(options);
  ASSERT_OK(a);
  ASSERT_OK(b);
  const ExpertUsage ua = TraceUsage(*a), ub = TraceUsage(*b);
  double dot = 0, na = 0, nb = 0, ma = 0, mb = 0;
  for (size_t i = 0; i < ua.tokens.size(); ++i) {
    ma += ua.tokens[i] / ua.tokens.size();
    mb += ub.tokens[i] / ub.tokens.size();
  }
  for (size_t i = 0; i < ua.tokens.size(); ++i) {
    dot += (ua.tokens[i] - ma) * (ub.tokens[i] - mb);
    na += (ua.tokens[i] - ma) * (ua.tokens[i] - ma);
    nb += (ub.tokens[i] - mb) * (ub.tokens[i] - mb);
  }
  // Correlated, weakly: per-sequence variation dominates (DAOP §III ①), and
  // Fiddler App. C finds popularity placement worth only 3-5 points of hit
  // rate over random. (0.29 for these seeds.)
  EXPECT_GT(dot / std::sqrt(na * nb), 0.15);
}

TEST(SyntheticTraceTest, UniformRoutingHasChanceReuse) {
  SyntheticTraceOptions options;
  options.token_reuse = 0.25;  // = K / E: no copying
  options.layer_same_id = 0.25;
  options.popularity_sd = 0;
  options.sequence_skew = 0;
  options.phase_drift = 0;
  options.decode_steps = 2000;
  absl::StatusOr<RoutingTrace> trace = GenerateSyntheticTrace(options);
  ASSERT_OK(trace);
  const TraceStats stats = MeasureTrace(*trace);
  EXPECT_NEAR(stats.token_reuse, 0.25, 0.02);
  EXPECT_NEAR(stats.layer_same_id, 0.25, 0.02);
}

TEST(SyntheticTraceTest, RejectsBadOptionsNamingTheField) {
  SyntheticTraceOptions options;
  options.num_experts_per_token = 9;
  absl::StatusOr<RoutingTrace> trace = GenerateSyntheticTrace(options);
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(absl::StrContains(trace.status().message(), "num_experts_per_token")) << trace.status();
  options = {};
  options.token_reuse = 0.9;
  options.layer_same_id = 0.9;
  trace = GenerateSyntheticTrace(options);
  ASSERT_FALSE(trace.ok());
  EXPECT_TRUE(absl::StrContains(trace.status().message(), "token_reuse")) << trace.status();
}

// ------------------------------------------------------------ simulator

// Mixtral shape with the collaborative paper's Table III costs: the
// profile the benches use (bench/profiles/, each number's source in it).
CostModel PaperCost() {
  absl::StatusOr<HardwareProfile> profile =
      LoadHardwareProfile(TANDEM_SOURCE_DIR "/bench/profiles/collab-rtx4090-tr7960x-mixtral.json");
  EXPECT_OK(profile);
  absl::StatusOr<CostModel> cost = CostModel::Create(profile->cost);
  EXPECT_OK(cost);
  return *cost;
}

RoutingTrace SmallTrace(uint64_t seed = 3) {
  SyntheticTraceOptions options;
  options.num_sequences = 2;
  options.prompt_tokens = 64;
  options.decode_steps = 32;
  options.seed = seed;
  absl::StatusOr<RoutingTrace> trace = GenerateSyntheticTrace(options);
  EXPECT_OK(trace);
  return *trace;
}

SimOptions Options(ExecutionPolicy execution, CachePolicyKind cache, PlacementPolicy placement, int slots,
                   const ExpertUsage* usage) {
  SimOptions o;
  o.planner.policy = execution;
  o.cache.kind = cache;
  o.cache.lru = {slots / 4, 4};
  o.placement = {placement, slots, 4};
  o.usage = usage;
  return o;
}

TEST(SimulatorTest, NoSlotsRunsEverythingOnTheCpu) {
  const RoutingTrace trace = SmallTrace();
  const CostModel cost = PaperCost();
  absl::StatusOr<SimResult> r = Simulate(
      trace, cost, Options(ExecutionPolicy::kCpuOnly, CachePolicyKind::kStatic, PlacementPolicy::kUniform, 0, nullptr));
  ASSERT_OK(r);
  EXPECT_EQ(r->hit_rate(), 0);
  EXPECT_EQ(r->cpu_runs, r->expert_runs);
  EXPECT_EQ(r->planner_migrations + r->cache_migrations, 0);
  // Each decode step: 32 layers x 2 experts x 7.34 ms, plus the activation
  // round trip (2 x 110 us + bytes) per layer.
  EXPECT_NEAR(r->decode_step_us, 32 * (2 * 7340 + 2 * (110 + 2 * 16384 / 12574.0)), 1);
}

TEST(SimulatorTest, EveryExpertResidentNeverMigrates) {
  const RoutingTrace trace = SmallTrace();
  const CostModel cost = PaperCost();
  for (ExecutionPolicy p : {ExecutionPolicy::kThreshold, ExecutionPolicy::kMakespan, ExecutionPolicy::kGpuOnly,
                            ExecutionPolicy::kCpuOnly}) {
    absl::StatusOr<SimResult> r =
        Simulate(trace, cost, Options(p, CachePolicyKind::kStatic, PlacementPolicy::kUniform, 256, nullptr));
    ASSERT_OK(r);
    EXPECT_EQ(r->hit_rate(), 1) << ExecutionPolicyName(p);
    EXPECT_EQ(r->planner_migrations, 0);
    EXPECT_NEAR(r->decode_step_us, 32 * 2 * 250, 1e-6);  // gpu(1) = max(250, 2.35)
  }
}

TEST(SimulatorTest, DeterministicAndCountsAddUp) {
  const RoutingTrace trace = SmallTrace();
  const CostModel cost = PaperCost();
  const ExpertUsage usage = TraceUsage(SmallTrace(11));
  SimOptions o =
      Options(ExecutionPolicy::kMakespan, CachePolicyKind::kAdaptive, PlacementPolicy::kPopularity, 56, &usage);
  absl::StatusOr<SimResult> a = Simulate(trace, cost, o);
  absl::StatusOr<SimResult> b = Simulate(trace, cost, o);
  ASSERT_OK(a) << a.status();
  ASSERT_OK(b) << a.status();
  EXPECT_EQ(a->total_us, b->total_us);
  EXPECT_EQ(a->gpu_hits + a->inflight_waits + a->planner_migrations + a->cpu_runs, a->expert_runs);
  int64_t runs = 0;
  for (const TraceStep& step : trace.steps) {
    for (int32_t r : step.rows) runs += r > 0;
  }
  EXPECT_EQ(a->expert_runs, runs);
}

TEST(SimulatorTest, LruPostFetchesOnMisses) {
  const RoutingTrace trace = SmallTrace();
  const CostModel cost = PaperCost();
  absl::StatusOr<SimResult> fixed = Simulate(
      trace, cost,
      Options(ExecutionPolicy::kCpuOnly, CachePolicyKind::kStatic, PlacementPolicy::kFirstLayers, 56, nullptr));
  absl::StatusOr<SimResult> lru =
      Simulate(trace, cost,
               Options(ExecutionPolicy::kCpuOnly, CachePolicyKind::kLru, PlacementPolicy::kFirstLayers, 56, nullptr));
  ASSERT_OK(fixed);
  ASSERT_OK(lru);
  EXPECT_GT(lru->cache_migrations, 0);
  EXPECT_GT(lru->hit_rate(), fixed->hit_rate());
}

TEST(SimulatorTest, MakespanAdaptiveIsNotSlowerThanFiddler) {
  // The target on one scenario: makespan + adaptive against
  // Fiddler's own combination, on the collaborative paper's machine.
  const RoutingTrace trace = SmallTrace();
  const CostModel cost = PaperCost();
  const ExpertUsage usage = TraceUsage(SmallTrace(11));
  absl::StatusOr<SimResult> fiddler = Simulate(
      trace, cost,
      Options(ExecutionPolicy::kThreshold, CachePolicyKind::kStatic, PlacementPolicy::kPopularity, 56, &usage));
  absl::StatusOr<SimResult> ours = Simulate(
      trace, cost,
      Options(ExecutionPolicy::kMakespan, CachePolicyKind::kAdaptive, PlacementPolicy::kPopularity, 56, &usage));
  ASSERT_OK(fiddler);
  ASSERT_OK(ours);
  EXPECT_LE(ours->ttft_us, fiddler->ttft_us);
  EXPECT_LE(ours->decode_step_us, fiddler->decode_step_us);
}

TEST(SimulatorTest, RejectsMismatchedInputs) {
  RoutingTrace trace = SmallTrace();
  trace.steps[1].rows.pop_back();
  absl::StatusOr<SimResult> r =
      Simulate(trace, PaperCost(),
               Options(ExecutionPolicy::kCpuOnly, CachePolicyKind::kStatic, PlacementPolicy::kUniform, 0, nullptr));
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "steps[1].rows")) << r.status();
  SimOptions o = Options(ExecutionPolicy::kCpuOnly, CachePolicyKind::kStatic, PlacementPolicy::kPopularity, 8, nullptr);
  r = Simulate(SmallTrace(), PaperCost(), o);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "usage")) << r.status();
}

}  // namespace
}  // namespace tandem
