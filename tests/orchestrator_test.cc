// The orchestrator end to end on the tiny model with the no-GPU host pool:
// for every execution policy × cache policy, greedy tokens and every logit
// equal the plain in-process engine's bit for bit (the pool computes from
// its own copy of the weights), and the stats show what the policy should
// have done (static: no cache copies; cpu-only: nothing on the pool but
// resident experts; gpu-only: nothing on the CPU; lru: hits on repeated
// routing). Also: calibration is cached by key, the engine's routing trace
// replays in the simulator, the recorded usage drives popularity placement.
//
// Legend: P prompt tokens.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "common/model/model.h"
#include "coordinator/orchestration/planner/profile_io.h"
#include "coordinator/orchestration/planner/routing_trace_io.h"
#include "coordinator/orchestration/planner/simulator.h"
#include "coordinator/runtime/local_runtime.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/test_cost_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

constexpr uint64_t kSeed = 7;
constexpr int kPromptTokens = 20;
constexpr int kNewTokens = 10;

// What a run produced: tokens of every generation and every forward pass's logits.
struct GenerationRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;
};

std::unique_ptr<LocalRuntime> MakeRuntime(const LocalRuntimeOptions& base, GenerationRun* run) {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed, .dtype = DType::kBF16});
  EXPECT_OK(model);
  if (!model.ok()) return nullptr;
  LocalRuntimeOptions options = base;
  options.num_threads = 2;
  if (run != nullptr) {
    options.engine.dump = [run](std::string_view name, int, const float* data, int64_t rows, int64_t cols) {
      if (name == "logits") run->logits.insert(run->logits.end(), data, data + rows * cols);
    };
  }
  auto runtime = LocalRuntime::Create(std::move(*model), options);
  EXPECT_OK(runtime);
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

// Two greedy generations of the same prompt (routing repeats) and one of another.
void Generate(LocalRuntime& rt, GenerationRun* run) {
  const int64_t vocab = rt.model().config.vocab_size;
  for (uint32_t seed : {500u, 500u, 501u}) {
    GenerationRequest request;
    request.prompt_ids = RandomTokens(kPromptTokens, vocab, seed);
    request.max_tokens = kNewTokens;
    request.ignore_eos = true;
    auto result = rt.generator().Generate(request);
    ASSERT_OK(result);
    const std::vector<int32_t> ids = Ids(*result);
    run->tokens.insert(run->tokens.end(), ids.begin(), ids.end());
  }
}

LocalOrchestratorOptions Orchestrated(ExecutionPolicy execution, CachePolicyKind cache, const ModelConfig& config) {
  LocalOrchestratorOptions o;
  o.enabled = true;
  o.execution = execution;
  o.cache = cache;
  o.placement = PlacementPolicy::kUniform;
  o.gpu_slots = 4;        // half of the tiny model's 8 experts
  o.staging_buffers = 4;  // a whole layer: gpu-only never falls back to the CPU
  o.cost = PoolMattersCost(config);
  return o;
}

const GenerationRun& Reference() {
  static const GenerationRun* reference = [] {
    auto* run = new GenerationRun;
    auto rt = MakeRuntime({}, run);
    if (rt != nullptr) Generate(*rt, run);
    return run;
  }();
  return *reference;
}

class OrchestratorPolicyTest : public ::testing::TestWithParam<std::tuple<ExecutionPolicy, CachePolicyKind>> {};

TEST_P(OrchestratorPolicyTest, SameTokensAndLogitsAsThePlainEngine) {
  const auto [execution, cache] = GetParam();
  const GenerationRun& want = Reference();
  ASSERT_EQ(want.tokens.size(), 3u * kNewTokens);

  auto config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  ASSERT_OK(config);
  LocalRuntimeOptions options;
  options.orchestrator = Orchestrated(execution, cache, *config);
  GenerationRun got;
  auto rt = MakeRuntime(options, &got);
  ASSERT_NE(rt, nullptr);
  ASSERT_NE(rt->orchestrator(), nullptr);
  Generate(*rt, &got);
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logits.size(), want.logits.size());
  EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)), 0)
      << "logits differ from the plain engine's";

  const OrchestratorStats s = rt->orchestrator()->stats();
  SCOPED_TRACE(s.ToJson());
  EXPECT_EQ(s.pool_kind, "no-GPU host pool");
  EXPECT_EQ(s.placed, 4);
  EXPECT_EQ(s.refused_decisions, 0);
  EXPECT_EQ(s.steps, 3 * kNewTokens);  // one prefill + kNewTokens - 1 decodes per generation
  EXPECT_EQ(s.prefill_steps, 3);
  EXPECT_EQ(s.layer_plans, 2 * s.steps);
  const OrchestratorLayerStats& t = s.total;
  EXPECT_GT(t.expert_runs, 0);
  EXPECT_EQ(t.expert_runs, t.gpu_hits + t.inflight_waits + t.planner_migrations + t.cpu_runs);
  // The pool computed exactly what the plans put on the GPU, from slots or staging.
  EXPECT_EQ(s.pool.slot_runs, t.gpu_hits + t.inflight_waits);
  EXPECT_EQ(s.pool.staging_runs, t.planner_migrations);
  EXPECT_EQ(s.pool.staging_copies, t.planner_migrations);
  EXPECT_EQ(s.pool.migrations_started, t.planner_migrations + t.cache_migrations);
  EXPECT_EQ(s.pool.admissions, t.cache_admissions);
  EXPECT_EQ(s.pool.placements, 4);
  EXPECT_EQ(s.accuracy.makespan.observations, s.layer_plans);
  ASSERT_EQ(s.layers.size(), 2u);
  EXPECT_EQ(s.layers[0].expert_runs + s.layers[1].expert_runs, t.expert_runs);

  if (cache == CachePolicyKind::kStatic) {
    EXPECT_EQ(t.cache_migrations, 0);
    EXPECT_EQ(t.cache_admissions, 0);
    EXPECT_EQ(t.evictions, 0);
    EXPECT_EQ(s.pool.evictions, 0);
  }
  if (execution == ExecutionPolicy::kCpuOnly) {
    // Nothing runs on the pool unless it is resident.
    EXPECT_EQ(t.planner_migrations, 0);
    EXPECT_EQ(t.inflight_waits, 0);
    EXPECT_EQ(s.pool.staging_runs, 0);
    EXPECT_EQ(s.pool.slot_runs, t.gpu_hits);
  }
  if (execution == ExecutionPolicy::kGpuOnly) {
    EXPECT_EQ(t.cpu_runs, 0);
  }
  if (cache == CachePolicyKind::kLru) {
    EXPECT_GT(t.gpu_hits, 0);
    EXPECT_GT(t.cache_migrations + t.cache_admissions, 0);  // misses were post-fetched or kept
  }
  if (cache == CachePolicyKind::kSequence) {
    // DAOP: swaps only during prefill, each evicting a cold expert.
    EXPECT_EQ(t.cache_admissions, 0);
    EXPECT_EQ(t.evictions, t.cache_migrations);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryExactCombination, OrchestratorPolicyTest,
                         ::testing::Combine(::testing::Values(ExecutionPolicy::kThreshold, ExecutionPolicy::kMakespan,
                                                              ExecutionPolicy::kGpuOnly, ExecutionPolicy::kCpuOnly),
                                            ::testing::Values(CachePolicyKind::kStatic, CachePolicyKind::kLru,
                                                              CachePolicyKind::kSequence, CachePolicyKind::kAdaptive)),
                         [](const auto& info) {
                           std::string name = ExecutionPolicyName(std::get<0>(info.param)) + "_" +
                                              CachePolicyKindName(std::get<1>(info.param));
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(OrchestratorTest, LruHitsOnRepeatedRouting) {
  auto config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  ASSERT_OK(config);
  LocalRuntimeOptions options;
  options.orchestrator = Orchestrated(ExecutionPolicy::kCpuOnly, CachePolicyKind::kLru, *config);
  auto rt = MakeRuntime(options, nullptr);
  ASSERT_NE(rt, nullptr);
  GenerationRequest request;
  request.prompt_ids = RandomTokens(kPromptTokens, config->vocab_size, 500);
  request.max_tokens = kNewTokens;
  request.ignore_eos = true;
  ASSERT_OK(rt->generator().Generate(request));
  rt->orchestrator()->ResetStats();
  // The same prompt again: the cache already holds what it routes to.
  ASSERT_OK(rt->generator().Generate(request));
  const OrchestratorStats s = rt->orchestrator()->stats();
  SCOPED_TRACE(s.ToJson());
  EXPECT_GT(s.total.gpu_hits, 0);
  EXPECT_GT(s.total.gpu_hits, s.total.cpu_runs / 4);
  EXPECT_EQ(s.pool.slot_runs, s.total.gpu_hits);
}

// A model with dense MLP layers (tiny-qwen3moe-dense: layers 0 and 2 dense,
// 1 and 3 MoE): the dense layers hold no expert, so nothing of theirs is
// placed, calibrated, planned, pre-calculated or run on the pool; the
// orchestrated engine still gives the plain engine's tokens and logits; the
// recorded trace names the dense layers and replays in the simulator.
TEST(OrchestratorTest, DenseLayersAreNeverPlacedPlannedOrCalibrated) {
  ScopedTempDir dir;
  const SyntheticModelSpec spec{.preset = "tiny-qwen3moe-dense", .seed = kSeed, .dtype = DType::kBF16};
  auto config = SyntheticConfig(spec);
  ASSERT_OK(config);
  ASSERT_EQ(config->dense_layers, (std::vector<int64_t>{0, 2}));
  auto make = [&](LocalRuntimeOptions options, GenerationRun* run) -> std::unique_ptr<LocalRuntime> {
    auto model = LoadSyntheticModel(spec);
    EXPECT_OK(model);
    if (!model.ok()) return nullptr;
    options.num_threads = 2;
    options.engine.dump = [run](std::string_view name, int, const float* data, int64_t rows, int64_t cols) {
      if (name == "logits") run->logits.insert(run->logits.end(), data, data + rows * cols);
    };
    auto rt = LocalRuntime::Create(std::move(*model), options);
    EXPECT_OK(rt);
    return rt.ok() ? std::move(*rt) : nullptr;
  };
  const std::string trace_path = (dir.path() / "trace.jsonl").string();
  GenerationRun want;
  {
    LocalRuntimeOptions plain;
    plain.record_trace = trace_path;
    auto rt = make(plain, &want);
    ASSERT_NE(rt, nullptr);
    Generate(*rt, &want);
    ASSERT_OK(rt->FinishRecording());
  }
  for (const CachePolicyKind cache : {CachePolicyKind::kLru, CachePolicyKind::kSequence}) {
    SCOPED_TRACE(CachePolicyKindName(cache));
    LocalRuntimeOptions options;
    options.orchestrator = Orchestrated(ExecutionPolicy::kMakespan, cache, *config);
    options.orchestrator.placement = PlacementPolicy::kFirstLayers;
    options.orchestrator.gpu_slots = 8;  // a quarter of the 2 x 16 experts
    options.orchestrator.cost.reset();   // calibrated: it takes experts of the MoE layers only
    options.orchestrator.calibration.rows = {1, 2, 4};
    options.orchestrator.calibration.repetitions = 2;
    options.orchestrator.calibration.migrations = 2;
    options.precalc = {.policy = PrecalcPolicy::kOff};
    GenerationRun got;
    auto rt = make(options, &got);
    ASSERT_NE(rt, nullptr);
    for (const PoolSlot& slot : rt->expert_pool()->SlotTable()) {
      if (slot.expert) EXPECT_TRUE(config->moe_layer(slot.expert->layer)) << "slot " << slot.index;
    }
    Generate(*rt, &got);
    EXPECT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    EXPECT_EQ(std::memcmp(got.logits.data(), want.logits.data(), got.logits.size() * sizeof(float)), 0);
    const OrchestratorStats s = rt->orchestrator()->stats();
    SCOPED_TRACE(s.ToJson());
    EXPECT_EQ(s.placed, 8);
    EXPECT_EQ(s.layer_plans, 2 * s.steps);  // the two MoE layers of each step
    ASSERT_EQ(s.layers.size(), 4u);
    EXPECT_EQ(s.layers[0].expert_runs, 0);
    EXPECT_EQ(s.layers[2].expert_runs, 0);
    EXPECT_GT(s.layers[1].expert_runs, 0);
    EXPECT_GT(s.layers[3].expert_runs, 0);
    EXPECT_EQ(s.layers[1].expert_runs + s.layers[3].expert_runs, s.total.expert_runs);
  }

  auto trace = LoadRoutingTrace(trace_path);
  ASSERT_OK(trace);
  EXPECT_EQ(trace->num_layers, 4);
  EXPECT_EQ(trace->dense_layers, config->dense_layers);
  for (size_t i = 0; i < trace->steps.size(); ++i) {
    for (int l : {0, 2}) {
      for (int32_t r : trace->LayerRows(i, l)) EXPECT_EQ(r, 0) << "step " << i << " dense layer " << l;
    }
  }
  auto cost = CostModel::Create(PoolMattersCost(*config));
  ASSERT_OK(cost);
  SimOptions sim;
  sim.planner.policy = ExecutionPolicy::kMakespan;
  sim.cache.kind = CachePolicyKind::kStatic;
  sim.placement = {PlacementPolicy::kFirstLayers, 8, 4};
  auto result = Simulate(*trace, *cost, sim);
  ASSERT_OK(result);
  EXPECT_GT(result->gpu_hits, 0);  // the slots went to MoE layers' experts
  // A step line that routes rows to a dense layer is refused.
  const std::string bad = (dir.path() / "bad.jsonl").string();
  {
    std::ofstream out(bad);
    out << RoutingTraceHeaderLine("x", 2, 2, 1, std::vector<int64_t>{0}) << "\n"
        << R"({"step":0,"sequence":0,"phase":"decode","start":0,"tokens":1,"rows":[[1,0],[0,1]]})"
        << "\n";
  }
  auto refused = LoadRoutingTrace(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("dense layer"), std::string::npos) << refused.status();
}

TEST(OrchestratorTest, PopularityWithoutUsageIsInvalid) {
  auto config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  ASSERT_OK(config);
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed, .dtype = DType::kBF16});
  ASSERT_OK(model);
  LocalRuntimeOptions options;
  options.num_threads = 1;
  options.orchestrator = Orchestrated(ExecutionPolicy::kMakespan, CachePolicyKind::kStatic, *config);
  options.orchestrator.placement = PlacementPolicy::kPopularity;
  auto rt = LocalRuntime::Create(std::move(*model), options);
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rt.status().message().find("usage"), std::string::npos) << rt.status();
}

TEST(OrchestratorTest, CalibrationIsMeasuredOnceAndThenReadFromItsCache) {
  ScopedTempDir dir;
  const std::string profile = (dir.path() / "calibration.json").string();
  auto config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  ASSERT_OK(config);
  LocalRuntimeOptions options;
  options.orchestrator = Orchestrated(ExecutionPolicy::kMakespan, CachePolicyKind::kLru, *config);
  options.orchestrator.cost.reset();
  options.orchestrator.calibration_profile = profile;
  options.orchestrator.calibration.rows = {1, 2, 4, 8, 16};
  options.orchestrator.calibration.repetitions = 3;
  options.orchestrator.calibration.migrations = 4;

  GenerationRun first_run;
  auto first = MakeRuntime(options, &first_run);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->calibration().has_value());
  EXPECT_FALSE(first->calibration()->from_cache);
  EXPECT_GT(first->calibration()->seconds, 0);
  EXPECT_LT(first->calibration()->seconds, 5);
  std::printf("calibration on tiny: %.3f s\n", first->calibration()->seconds);
  ASSERT_TRUE(std::filesystem::exists(profile));
  const HardwareProfile& measured = first->calibration()->profile;
  EXPECT_EQ(measured.gpu, "no-GPU host pool");
  EXPECT_NE(measured.cache_key.find(MachineDescription()), std::string::npos);
  EXPECT_GT(measured.cost.cpu_workers[0].compute.Us(1), 0);
  EXPECT_GT(measured.cost.migrate.GbPerSecond(), 0);
  // Calibration left the pool as placement made it, its counters clean.
  EXPECT_EQ(first->orchestrator()->stats().pool.migrations_started, 0);
  Generate(*first, &first_run);
  EXPECT_EQ(first_run.tokens, Reference().tokens);

  auto second = MakeRuntime(options, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(second->calibration().has_value());
  EXPECT_TRUE(second->calibration()->from_cache);
  EXPECT_EQ(second->calibration()->profile.cache_key, measured.cache_key);
  EXPECT_DOUBLE_EQ(second->calibration()->profile.cost.cpu_workers[0].compute.per_row_us,
                   measured.cost.cpu_workers[0].compute.per_row_us);

  // Another configuration (more staging buffers) does not reuse it.
  options.orchestrator.staging_buffers = 3;
  auto third = MakeRuntime(options, nullptr);
  ASSERT_NE(third, nullptr);
  EXPECT_FALSE(third->calibration()->from_cache);
}

TEST(OrchestratorTest, RecordedTraceReplaysInTheSimulatorAndUsageDrivesPopularity) {
  ScopedTempDir dir;
  const std::string trace_path = (dir.path() / "trace.jsonl").string();
  const std::string usage_path = (dir.path() / "usage.json").string();
  auto config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  ASSERT_OK(config);
  {
    LocalRuntimeOptions options;
    options.record_trace = trace_path;
    options.record_usage = usage_path;
    auto rt = MakeRuntime(options, nullptr);
    ASSERT_NE(rt, nullptr);
    GenerationRun run;
    Generate(*rt, &run);
    ASSERT_OK(rt->FinishRecording());
    EXPECT_EQ(rt->recorder()->steps_recorded(), 3 * kNewTokens);
  }
  auto trace = LoadRoutingTrace(trace_path);
  ASSERT_OK(trace);
  EXPECT_EQ(trace->num_layers, 2);
  EXPECT_EQ(trace->num_experts, 4);
  EXPECT_EQ(trace->num_experts_per_token, 2);
  ASSERT_EQ(trace->steps.size(), 3u * kNewTokens);
  int64_t active = 0;
  for (size_t i = 0; i < trace->steps.size(); ++i) {
    const TraceStep& step = trace->steps[i];
    const bool first = i % kNewTokens == 0;
    EXPECT_EQ(step.phase, first ? Phase::kPrefill : Phase::kDecode) << i;
    EXPECT_EQ(step.tokens, first ? kPromptTokens : 1) << i;
    EXPECT_EQ(step.sequence, static_cast<int>(i / kNewTokens)) << i;
    for (int l = 0; l < 2; ++l) {
      int64_t rows = 0;
      for (int32_t r : trace->LayerRows(i, l)) {
        rows += r;
        active += r > 0;
      }
      // The last layer routes only the rows whose logits are asked for.
      EXPECT_EQ(rows, 2 * (l == 1 ? 1 : step.tokens)) << "step " << i << " layer " << l;
    }
  }

  // Replay: every expert run the trace implies is accounted for.
  auto cost = CostModel::Create(PoolMattersCost(*config));
  ASSERT_OK(cost);
  auto usage = LoadExpertUsage(usage_path);
  ASSERT_OK(usage);
  SimOptions sim;
  sim.planner.policy = ExecutionPolicy::kMakespan;
  sim.cache.kind = CachePolicyKind::kLru;
  sim.cache.lru = {2, 2};
  sim.placement.policy = PlacementPolicy::kPopularity;
  sim.placement.num_slots = 4;
  sim.usage = &*usage;
  auto result = Simulate(*trace, *cost, sim);
  ASSERT_OK(result);
  EXPECT_EQ(result->expert_runs, active);
  EXPECT_EQ(result->gpu_hits + result->inflight_waits + result->planner_migrations + result->cpu_runs, active);
  EXPECT_GT(result->decode_step_us, 0);

  // The usage profile counts every routed row (layer 0 every token, the last
  // layer a prefill's last token and each decode token); popularity places
  // the most used.
  double total = 0;
  for (double v : usage->tokens) total += v;
  EXPECT_EQ(total, 2.0 * 3 * ((kPromptTokens + kNewTokens - 1) + kNewTokens));
  LocalRuntimeOptions options;
  options.orchestrator = Orchestrated(ExecutionPolicy::kCpuOnly, CachePolicyKind::kStatic, *config);
  options.orchestrator.placement = PlacementPolicy::kPopularity;
  options.orchestrator.usage_profile = usage_path;
  auto rt = MakeRuntime(options, nullptr);
  ASSERT_NE(rt, nullptr);
  auto want = PlaceExperts({PlacementPolicy::kPopularity, 4, 0, false}, 2, 4, &*usage);
  ASSERT_OK(want);
  for (const ExpertKey& key : *want) {
    EXPECT_EQ(rt->orchestrator()->residency().residency(key), Residency::kResident) << key.layer << "/" << key.expert;
    EXPECT_TRUE(rt->expert_pool()->IsReady(key));
  }
  // Saved and loaded again, the trace is the same.
  const std::string copy = (dir.path() / "copy.jsonl").string();
  ASSERT_OK(SaveRoutingTrace(*trace, "tiny", copy));
  auto reloaded = LoadRoutingTrace(copy);
  ASSERT_OK(reloaded);
  ASSERT_EQ(reloaded->steps.size(), trace->steps.size());
  for (size_t i = 0; i < trace->steps.size(); ++i) {
    EXPECT_EQ(reloaded->steps[i].rows, trace->steps[i].rows);
    EXPECT_EQ(reloaded->steps[i].sequence, trace->steps[i].sequence);
    EXPECT_EQ(reloaded->steps[i].phase, trace->steps[i].phase);
  }
}

TEST(RoutingTraceIoTest, BadLinesNameTheFileLineAndField) {
  const std::string header =
      "{\"format\": \"tandem-routing-trace/1\", \"num_layers\": 1, \"num_experts\": 2, \"num_experts_per_token\": 1}\n";
  auto ok = ParseRoutingTrace(
      header +
          "{\"step\": 0, \"sequence\": 4, \"phase\": \"decode\", \"start\": 3, \"tokens\": 1, \"rows\": [[1, 0]]}\n"
          "{\"step\": 0, \"sequence\": 5, \"phase\": \"prefill\", \"start\": 0, \"tokens\": 2, \"rows\": [[1, 1]]}\n",
      "t.jsonl");
  ASSERT_OK(ok);
  ASSERT_EQ(ok->steps.size(), 1u);  // one batch of two sequences
  EXPECT_EQ(ok->steps[0].tokens, 3);
  EXPECT_EQ(ok->steps[0].phase, Phase::kPrefill);
  EXPECT_EQ(ok->steps[0].rows, (std::vector<int32_t>{2, 1}));
  auto bad = ParseRoutingTrace(
      header + "{\"step\": 0, \"phase\": \"decode\", \"start\": 3, \"tokens\": 1, \"rows\": [[1]]}\n", "t.jsonl");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("t.jsonl:2"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("rows[0]"), std::string::npos) << bad.status();
  EXPECT_EQ(ParseRoutingTrace("{\"format\": \"other\"}\n", "t.jsonl").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
