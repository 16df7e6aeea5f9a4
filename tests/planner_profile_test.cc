// Hardware and usage profiles: every profile shipped in bench/profiles/
// loads, cites a source for every number, and reproduces the papers'
// figures; files round-trip; a bad file names the field that is wrong.
#include "coordinator/orchestration/planner/profile_io.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "coordinator/orchestration/planner/planner.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

fs::path ProfilesDir() { return fs::path(__FILE__).parent_path().parent_path() / "bench" / "profiles"; }

std::string Slurp(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

HardwareProfile Load(const std::string& name) {
  absl::StatusOr<HardwareProfile> profile = LoadHardwareProfile((ProfilesDir() / name).string());
  EXPECT_OK(profile);
  return profile.ok() ? *profile : HardwareProfile{};
}

bool HasSource(const HardwareProfile& p, const std::string& path) {
  for (const auto& [key, text] : p.sources) {
    if (key == path && !text.empty()) return true;
  }
  return false;
}

TEST(HardwareProfileTest, EveryShippedProfileLoadsAndCitesItsNumbers) {
  int count = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(ProfilesDir())) {
    if (entry.path().extension() != ".json") continue;
    ++count;
    SCOPED_TRACE(entry.path().filename().string());
    absl::StatusOr<HardwareProfile> p = LoadHardwareProfile(entry.path().string());
    ASSERT_OK(p);
    EXPECT_EQ(p->name + ".json", entry.path().filename().string());
    EXPECT_FALSE(p->source.empty());
    for (const char* path : {"machine", "model", "cost_model.gpu", "cost_model.migrate", "cost_model.dma"}) {
      EXPECT_TRUE(HasSource(*p, path)) << path;
    }
    for (size_t w = 0; w < p->cost.cpu_workers.size(); ++w) {
      EXPECT_TRUE(HasSource(*p, "cost_model.cpu_workers[" + std::to_string(w) + "].compute"));
    }
    for (const NamedTransferCost& t : p->cost.transports) EXPECT_TRUE(HasSource(*p, "cost_model.transports." + t.name));
    absl::StatusOr<CostModel> cost = CostModel::Create(p->cost);
    ASSERT_OK(cost);
    // Every paper's premise: at decode (one row) the CPU beats a migration,
    // and so does a resident expert on the GPU. (Not always the GPU beating
    // the CPU: Fiddler's stated ratios make its GPU path slow, see
    // bench/profiles/README.md.)
    EXPECT_LT(cost->CpuUs(0, 1), cost->MigrateUs());
    EXPECT_LT(cost->GpuUs(1), cost->MigrateUs());
    EXPECT_GT(p->model.gpu_expert_slots, 0);
    EXPECT_LT(p->model.gpu_expert_slots, p->model.num_layers * p->model.num_experts);
  }
  EXPECT_GE(count, 6);
}

TEST(HardwareProfileTest, ReproducesThePublishedFigures) {
  // Collaborative paper, Table III (Mixtral, 24 threads).
  HardwareProfile collab = Load("collab-rtx4090-tr7960x-mixtral.json");
  absl::StatusOr<CostModel> cost = CostModel::Create(collab.cost);
  ASSERT_OK(cost);
  EXPECT_NEAR(cost->MigrateUs(), 28020, 5);
  EXPECT_DOUBLE_EQ(cost->CpuUs(0, 1), 7340);
  EXPECT_DOUBLE_EQ(cost->GpuUs(1), 250);
  EXPECT_EQ(collab.model.gpu_expert_slots, 56);
  HardwareProfile phi = Load("collab-rtx4090-tr7960x-phi35moe.json");
  cost = CostModel::Create(phi.cost);
  ASSERT_OK(cost);
  EXPECT_NEAR(cost->MigrateUs(), 12260, 5);
  EXPECT_EQ(phi.model.num_experts, 16);
  // DAOP Table I.
  HardwareProfile daop = Load("daop-a100-xeon6326-mixtral.json");
  cost = CostModel::Create(daop.cost);
  ASSERT_OK(cost);
  EXPECT_NEAR(cost->MigrateUs(), 39870, 5);
  EXPECT_NEAR(cost->MigrateUs() / (2 * cost->GpuUs(1)), 32, 0.5);  // "approximately 32x slower"
  // Fiddler Table 1 (slots) and its ~50 ms weight copy on Environment 1.
  HardwareProfile env1 = Load("fiddler-env1-quadro-rtx6000-xeon6126.json");
  cost = CostModel::Create(env1.cost);
  ASSERT_OK(cost);
  EXPECT_NEAR(cost->MigrateUs(), 50000, 5);
  EXPECT_EQ(env1.model.gpu_expert_slots, 56);
  EXPECT_EQ(Load("fiddler-env2-rtx6000ada-xeon8480.json").model.gpu_expert_slots, 125);
}

TEST(HardwareProfileTest, FiddlerThresholdOnEnvironmentOne) {
  // Alg. 1 with env1's numbers: copy when 6.9 ms x s > 5 ms + 50 ms, i.e.
  // from 8 rows up.
  HardwareProfile env1 = Load("fiddler-env1-quadro-rtx6000-xeon6126.json");
  absl::StatusOr<CostModel> cost = CostModel::Create(env1.cost);
  ASSERT_OK(cost);
  PlannerOptions options;
  options.policy = ExecutionPolicy::kThreshold;
  absl::StatusOr<Planner> planner = Planner::Create(options);
  ASSERT_OK(planner);
  const std::vector<int32_t> rows = {7, 8, 0, 0, 0, 0, 0, 0};
  const std::vector<ExpertState> residency(8);
  LayerPlanInput input;
  input.rows = rows;
  input.residency = residency;
  LayerPlan plan;
  ASSERT_OK(planner->Plan(input, *cost, &plan));
  EXPECT_EQ(plan.experts[0].placement, ExpertPlacement::kCpu);
  EXPECT_EQ(plan.experts[1].placement, ExpertPlacement::kMigrateThenGpu);
}

TEST(HardwareProfileTest, RoundTripsThroughJson) {
  const HardwareProfile original = Load("daop-a6000-i9-10980xe-mixtral.json");
  absl::StatusOr<HardwareProfile> again = ParseHardwareProfile(HardwareProfileToJson(original), "round-trip");
  ASSERT_OK(again);
  EXPECT_EQ(again->name, original.name);
  EXPECT_EQ(again->model.gpu_expert_slots, original.model.gpu_expert_slots);
  EXPECT_EQ(again->sources, original.sources);
  EXPECT_EQ(again->cost.expert_bytes, original.cost.expert_bytes);
  EXPECT_NEAR(again->cost.migrate.us_per_byte, original.cost.migrate.us_per_byte, 1e-15);
  EXPECT_EQ(again->cost.transports[0].cost.us_per_byte, 0);  // gb_s null stays unbounded
  EXPECT_DOUBLE_EQ(again->cost.cpu_workers[0].compute.plateau_us, original.cost.cpu_workers[0].compute.plateau_us);
  // Saved and loaded from disk, with a calibration key.
  ScopedTempDir dir;
  HardwareProfile measured = original;
  measured.cache_key = "epyc-2core/mixtral-8x7b/split-2";
  // A calibrated profile also carries the CPU kernels' plan it was timed with.
  measured.kernel_plan = "1:stream,8:bf16_dot";
  measured.kernel_plan_source = "measured on Zen 5";
  const std::string path = (dir.path() / "measured.json").string();
  ASSERT_OK(SaveHardwareProfile(measured, path));
  absl::StatusOr<HardwareProfile> loaded = LoadHardwareProfile(path);
  ASSERT_OK(loaded);
  EXPECT_EQ(loaded->cache_key, measured.cache_key);
  EXPECT_EQ(loaded->kernel_plan, measured.kernel_plan);
  EXPECT_EQ(loaded->kernel_plan_source, measured.kernel_plan_source);
  EXPECT_TRUE(again->kernel_plan.empty()) << "paper profiles have no kernel plan";
}

// Removes the object member at `path` (dot-separated; [i] indexes arrays).
std::string Without(const std::string& text, const std::vector<std::string>& path) {
  nlohmann::json root = nlohmann::json::parse(text);
  nlohmann::json* node = &root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    node = path[i][0] == '[' ? &(*node)[static_cast<size_t>(std::stoi(path[i].substr(1)))] : &(*node)[path[i]];
  }
  node->erase(path.back());
  return root.dump();
}

TEST(HardwareProfileTest, MissingFieldsAreNamed) {
  const std::string text = Slurp(ProfilesDir() / "collab-rtx4090-tr7960x-mixtral.json");
  struct Case {
    std::vector<std::string> path;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"format"}, "format is missing"},
      {{"name"}, "name is missing"},
      {{"machine"}, "machine is missing"},
      {{"machine", "gpu"}, "machine.gpu is missing"},
      {{"model", "num_experts"}, "model.num_experts is missing"},
      {{"model", "expert_bytes"}, "model.expert_bytes is missing"},
      {{"model", "activation_row_bytes"}, "model.activation_row_bytes is missing"},
      {{"cost_model"}, "cost_model is missing"},
      {{"cost_model", "cpu_workers"}, "cost_model.cpu_workers is missing"},
      {{"cost_model", "cpu_workers", "[0]", "compute", "plateau_us"},
       "cost_model.cpu_workers[0].compute.plateau_us is missing"},
      {{"cost_model", "cpu_workers", "[0]", "transport"}, "cost_model.cpu_workers[0].transport is missing"},
      {{"cost_model", "gpu"}, "cost_model.gpu is missing"},
      {{"cost_model", "gpu", "per_row_us"}, "cost_model.gpu.per_row_us is missing"},
      {{"cost_model", "migrate", "gb_s"}, "cost_model.migrate.gb_s is missing"},
      {{"cost_model", "dma", "fixed_us"}, "cost_model.dma.fixed_us is missing"},
      {{"cost_model", "transports"}, "cost_model.transports is missing"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(Without(text, c.path), "broken.json");
    ASSERT_FALSE(p.ok()) << c.message;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(p.status().message(), c.message)) << p.status();
    EXPECT_TRUE(absl::StrContains(p.status().message(), "broken.json")) << p.status();
  }
}

TEST(HardwareProfileTest, BadValuesAreNamed) {
  nlohmann::json root = nlohmann::json::parse(Slurp(ProfilesDir() / "collab-rtx4090-tr7960x-mixtral.json"));
  auto expect = [&](nlohmann::json changed, const std::string& message) {
    absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(changed.dump(), "bad.json");
    ASSERT_FALSE(p.ok()) << message;
    EXPECT_TRUE(absl::StrContains(p.status().message(), message)) << p.status();
  };
  nlohmann::json j = root;
  j["cost_model"]["cpu_workers"][0]["transport"] = "rdma";
  expect(j, "cost_model.cpu_workers[0].transport names \"rdma\"");
  j = root;
  j["cost_model"]["gpu"]["per_row_us"] = -1;
  expect(j, "cost_model.gpu.per_row_us");
  j = root;
  j["cost_model"]["migrate"]["gb_s"] = 0;
  expect(j, "cost_model.migrate.gb_s must be a number > 0 or null");
  j = root;
  j["model"]["num_experts"] = "eight";
  expect(j, "model.num_experts must be an integer");
  j = root;
  j["format"] = "tandem-hardware-profile/0";
  expect(j, "format must be");
  j = root;
  j["model"]["gpu_expert_slots"] = 300;
  expect(j, "model.gpu_expert_slots exceeds");
  EXPECT_FALSE(ParseHardwareProfile("{not json", "x.json").ok());
  absl::StatusOr<HardwareProfile> missing = LoadHardwareProfile("/nonexistent/profile.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(HardwareProfileTest, CurvesMayBeGivenAsMeasuredTables) {
  nlohmann::json root = nlohmann::json::parse(Slurp(ProfilesDir() / "collab-rtx4090-tr7960x-mixtral.json"));
  // The development VM's measured expert-FFN table (docs/BENCHMARKS.md,
  // "Other instruction sets").
  root["cost_model"]["cpu_workers"][0]["compute"] = {
      {"table",
       {{1, 13700}, {2, 14800}, {4, 22800}, {8, 35600}, {16, 74400}, {32, 97000}, {64, 190000}, {128, 386000}}},
      {"source", "measured"}};
  absl::StatusOr<HardwareProfile> p = ParseHardwareProfile(root.dump(), "table.json");
  ASSERT_OK(p);
  EXPECT_NEAR(p->cost.cpu_workers[0].compute.Us(1), 13700, 0.25 * 13700);
  EXPECT_NEAR(p->cost.cpu_workers[0].compute.Us(128), 386000, 0.1 * 386000);
  root["cost_model"]["cpu_workers"][0]["compute"] = {{"table", {{1, 13700}}}};
  p = ParseHardwareProfile(root.dump(), "table.json");
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(absl::StrContains(p.status().message(), "cost_model.cpu_workers[0].compute.table")) << p.status();
}

TEST(ExpertUsageTest, RoundTripsAndNamesErrors) {
  ExpertUsage usage{2, 3, {1, 2, 3, 4, 5, 6}};
  absl::StatusOr<ExpertUsage> again = ParseExpertUsage(ExpertUsageToJson(usage, "tiny"), "usage.json");
  ASSERT_OK(again);
  EXPECT_EQ(again->tokens, usage.tokens);
  EXPECT_EQ(again->num_layers, 2);
  ScopedTempDir dir;
  const std::string path = (dir.path() / "usage.json").string();
  ASSERT_OK(SaveExpertUsage(usage, "tiny", path));
  again = LoadExpertUsage(path);
  ASSERT_OK(again);
  EXPECT_EQ(again->At(1, 2), 6);
  absl::StatusOr<ExpertUsage> bad = ParseExpertUsage(
      R"({"format": "tandem-expert-usage/1", "num_layers": 2, "num_experts": 3, "tokens": [[1, 2, 3], [4, -5, 6]]})",
      "usage.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "tokens[1][1]")) << bad.status();
  bad = ParseExpertUsage(R"({"format": "tandem-expert-usage/1", "num_layers": 2, "tokens": []})", "usage.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "num_experts is missing")) << bad.status();
}

}  // namespace
}  // namespace tandem
