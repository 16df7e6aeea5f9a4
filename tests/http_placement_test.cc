// GET /v1/tandem/placement, the data of the web page's live view: one cell
// per (layer, expert) saying where its weights are and which CPU workers
// hold it, per-layer expert time, hit rates and migrations. PlacementJson on
// hand-made stats (in-process, split and shard workers, a bad orchestrator
// text), then the endpoint of a real orchestrated tandem-server before and
// after a request, and the page at / (embedded, nothing fetched from
// elsewhere).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/match.h"
#include "common/base/expert_division.h"
#include "coordinator/serving/http/placement_json.h"
#include "tests/http_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

ModelConfig SmallConfig() {
  ModelConfig c;
  c.num_hidden_layers = 2;
  c.num_local_experts = 3;
  c.num_experts_per_tok = 2;
  return c;
}

// What Orchestrator's stats JSON has of a 2 x 3 model, wrapped as the server wraps it.
std::string OrchestratorText() {
  json o = {{"execution_policy", "threshold"},
            {"cache_policy", "lru"},
            {"pool_kind", "no-GPU host pool"},
            {"num_slots", 2},
            {"hit_rate", 0.25},
            {"total", {{"planner_migrations", 1}, {"cache_migrations", 2}}},
            {"pool", {{"used_slots", 2}}},
            {"layers",
             {{{"expert_runs", 4}, {"gpu_hits", 1}, {"cpu_runs", 3}, {"planner_migrations", 1}, {"expert_us", 50.0}},
              {{"expert_runs", 4}, {"gpu_hits", 0}, {"cpu_runs", 4}, {"cache_migrations", 2}, {"evictions", 1}}}},
            {"experts",
             {{"residency", {{1, 0, 0}, {0, 2, 1}}},
              {"gpu_runs", {{1, 0, 0}, {0, 0, 0}}},
              {"cpu_runs", {{0, 2, 1}, {3, 1, 0}}}}}};
  return json{{"orchestrator", o}}.dump();
}

TEST(PlacementJsonTest, InProcessWithoutOrchestratorIsAllCpu) {
  SchedulerStats stats;
  stats.steps = 5;
  stats.generated_tokens = 9;
  stats.mean_layers = {{.attention_us = 3, .experts_us = 10}, {.attention_us = 4, .experts_us = 20}};
  ASSERT_OK_AND_ASSIGN(json p, PlacementJson(SmallConfig(), stats, ServingOptions{}, ""));
  EXPECT_EQ(p["object"], "tandem.placement");
  EXPECT_EQ(p["num_layers"], 2);
  EXPECT_EQ(p["num_experts"], 3);
  EXPECT_EQ(p["division"], "in-process");
  EXPECT_EQ(p["orchestrated"], false);
  EXPECT_EQ(p["steps"], 5);
  EXPECT_EQ(p["generated_tokens"], 9);
  ASSERT_EQ(p["layers"].size(), 2u);
  EXPECT_EQ(p["layers"][1]["expert_us_per_step"], 20.0);
  EXPECT_EQ(p["layers"][0]["attention_us_per_step"], 3.0);
  ASSERT_EQ(p["experts"].size(), 2u);
  for (const json& row : p["experts"]) {
    ASSERT_EQ(row.size(), 3u);
    for (const json& cell : row) {
      EXPECT_EQ(cell["where"], "cpu");
      EXPECT_TRUE(cell["cpu_workers"].empty());
      EXPECT_FALSE(cell.contains("gpu_runs"));
    }
  }
}

TEST(PlacementJsonTest, OrchestratedWithShardAndSplitWorkers) {
  ServingOptions serving;
  serving.num_cpu_workers = 2;
  serving.division = ExpertDivision::kShard;
  ASSERT_OK_AND_ASSIGN(json p, PlacementJson(SmallConfig(), SchedulerStats{}, serving, OrchestratorText()));
  EXPECT_EQ(p["orchestrated"], true);
  EXPECT_EQ(p["division"], "shard");
  EXPECT_EQ(p["cpu_workers"], 2);
  EXPECT_EQ(p["num_slots"], 2);
  EXPECT_EQ(p["used_slots"], 2);
  EXPECT_EQ(p["migrations"], 3);
  EXPECT_EQ(p["hit_rate"], 0.25);
  EXPECT_EQ(p["experts"][0][0]["where"], "gpu");
  EXPECT_EQ(p["experts"][0][1]["where"], "cpu");
  EXPECT_EQ(p["experts"][1][1]["where"], "migrating");
  EXPECT_EQ(p["experts"][1][2]["where"], "gpu");
  EXPECT_EQ(p["experts"][1][0]["cpu_runs"], 3);
  EXPECT_EQ(p["experts"][0][0]["gpu_runs"], 1);
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 3; ++e) {
      EXPECT_EQ(p["experts"][l][e]["cpu_workers"], json::array({ShardWorker(l, e, 2)})) << l << "," << e;
    }
  }
  EXPECT_EQ(p["layers"][0]["hit_rate"], 0.25);
  EXPECT_EQ(p["layers"][0]["migrations"], 1);
  EXPECT_EQ(p["layers"][0]["expert_us"], 50.0);
  EXPECT_EQ(p["layers"][1]["migrations"], 2);
  EXPECT_EQ(p["layers"][1]["evictions"], 1);

  serving.division = ExpertDivision::kSplit;
  ASSERT_OK_AND_ASSIGN(p, PlacementJson(SmallConfig(), SchedulerStats{}, serving, OrchestratorText()));
  EXPECT_EQ(p["division"], "split");
  EXPECT_EQ(p["experts"][1][2]["cpu_workers"], json::array({0, 1}));
}

TEST(PlacementJsonTest, OrchestratorTextOfAnotherShapeIsAnError) {
  ModelConfig c = SmallConfig();
  c.num_local_experts = 4;
  absl::StatusOr<json> p = PlacementJson(c, SchedulerStats{}, ServingOptions{}, OrchestratorText());
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("[2][4]"));
  EXPECT_FALSE(PlacementJson(SmallConfig(), SchedulerStats{}, ServingOptions{}, "{not json").ok());
}

TEST(PlacementEndpointTest, OrchestratedServerShowsSlotsRunsAndLayerTimes) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  ASSERT_OK_AND_ASSIGN(HttpServerProcess server, StartHttpServer(dir.path() / "model", dir.path(),
                                                                 {"--threads", "2", "--execution_policy", "threshold",
                                                                  "--cache_policy", "lru", "--gpu_slots", "3"},
                                                                 "server"));
  ASSERT_OK_AND_ASSIGN(HttpReply before, HttpGet(server.port, "/v1/tandem/placement"));
  ASSERT_EQ(before.status, 200) << before.body;
  const json& p0 = before.json;
  EXPECT_EQ(p0["orchestrated"], true);
  EXPECT_EQ(p0["num_slots"], 3);
  const int layers = p0["num_layers"], experts = p0["num_experts"];
  ASSERT_EQ(layers, 2);
  ASSERT_EQ(experts, 4);
  int gpu = 0;
  for (const json& row : p0["experts"]) {
    ASSERT_EQ(row.size(), static_cast<size_t>(experts));
    for (const json& cell : row) gpu += cell["where"] == "gpu";
  }
  EXPECT_EQ(gpu, p0["used_slots"].get<int>()) << "every used slot is one resident expert";
  EXPECT_GT(gpu, 0);
  EXPECT_EQ(p0["generated_tokens"], 0);

  ASSERT_OK_AND_ASSIGN(HttpReply completion,
                       HttpPost(server.port, "/v1/completions",
                                json{{"prompt", RandomTokens(6, 512, 9)}, {"max_tokens", 5}, {"ignore_eos", true}}));
  ASSERT_EQ(completion.status, 200) << completion.body;
  ASSERT_OK_AND_ASSIGN(HttpReply after, HttpGet(server.port, "/v1/tandem/placement"));
  ASSERT_EQ(after.status, 200) << after.body;
  const json& p = after.json;
  EXPECT_EQ(p["generated_tokens"], 5);
  EXPECT_GT(p["steps"].get<int>(), 0);
  int64_t cell_runs = 0, layer_runs = 0;
  for (const json& row : p["experts"]) {
    for (const json& cell : row) cell_runs += cell["gpu_runs"].get<int64_t>() + cell["cpu_runs"].get<int64_t>();
  }
  for (const json& layer : p["layers"]) {
    layer_runs += layer["expert_runs"].get<int64_t>();
    EXPECT_GT(layer["expert_us"].get<double>(), 0) << layer;
    EXPECT_GT(layer["expert_us_per_step"].get<double>(), 0) << layer;
    EXPECT_GE(layer["hit_rate"].get<double>(), 0);
    EXPECT_LE(layer["hit_rate"].get<double>(), 1);
  }
  EXPECT_GT(cell_runs, 0);
  EXPECT_EQ(cell_runs, layer_runs) << "each (step, expert) run is counted in its cell and its layer";
}

TEST(PlacementEndpointTest, ThePageIsServedAndSelfContained) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  ASSERT_OK_AND_ASSIGN(HttpServerProcess server,
                       StartHttpServer(dir.path() / "model", dir.path(), {"--threads", "1"}, "server"));
  ASSERT_OK_AND_ASSIGN(HttpReply page, HttpGet(server.port, "/"));
  ASSERT_EQ(page.status, 200);
  EXPECT_THAT(page.content_type, HasSubstr("text/html"));
  EXPECT_THAT(page.body, HasSubstr("/v1/tandem/placement"));
  EXPECT_THAT(page.body, HasSubstr("/v1/chat/completions"));
  EXPECT_THAT(page.body, HasSubstr("</html>"));
  // Offline: no script, style or font from anywhere else.
  EXPECT_FALSE(absl::StrContains(page.body, "http://")) << "the page must not fetch from other hosts";
  EXPECT_FALSE(absl::StrContains(page.body, "https://")) << "the page must not fetch from other hosts";
  // Without an orchestrator every expert is on the CPU, in this process.
  ASSERT_OK_AND_ASSIGN(HttpReply placement, HttpGet(server.port, "/v1/tandem/placement"));
  ASSERT_EQ(placement.status, 200) << placement.body;
  EXPECT_EQ(placement.json["orchestrated"], false);
  EXPECT_EQ(placement.json["division"], "in-process");
  EXPECT_EQ(placement.json["experts"][1][3]["where"], "cpu");
}

}  // namespace
}  // namespace tandem
