// One model shared by runtime after runtime (LocalRuntime::Create over a
// shared_ptr<const Model>, what tandem-scenario-bench does per policy), and
// tandem-scenario-bench itself on the tiny model: every record parses, the
// numbers are positive, every policy generates the same ids as plain (the
// host pool computes the same bits), the summary ranks every policy, and a
// prefill past the model's context is refused naming the flag.
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/model/model.h"
#include "coordinator/runtime/local_runtime.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/test_cost_testlib.h"

namespace tandem {
namespace {

const char kBench[] = TANDEM_BINARY_DIR "/bin/tandem-scenario-bench";

std::vector<int32_t> Greedy(LocalRuntime& rt) {
  GenerationRequest request;
  for (int i = 0; i < 12; ++i) request.prompt_ids.push_back(3 + (i * 37) % 500);
  request.max_tokens = 8;
  request.ignore_eos = true;
  auto result = rt.generator().Generate(request);
  EXPECT_OK(result);
  std::vector<int32_t> ids;
  if (result.ok()) {
    for (const GeneratedToken& t : result->tokens) ids.push_back(t.id);
  }
  return ids;
}

TEST(SharedModelTest, RuntimesOneAfterAnotherShareOneModel) {
  auto loaded = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 3});
  ASSERT_OK(loaded);
  const std::shared_ptr<const Model> model(std::move(*loaded));

  std::vector<int32_t> plain_ids;
  {
    auto rt = LocalRuntime::Create(model, {.num_threads = 1});
    ASSERT_OK(rt);
    EXPECT_EQ(&(*rt)->model(), model.get());  // not a copy
    EXPECT_EQ(model.use_count(), 2);
    plain_ids = Greedy(**rt);
  }
  EXPECT_EQ(model.use_count(), 1);  // the runtime let go of it

  LocalRuntimeOptions options;
  options.num_threads = 1;
  options.orchestrator.enabled = true;
  options.orchestrator.execution = ExecutionPolicy::kGpuOnly;
  options.orchestrator.gpu_slots = 2;
  options.orchestrator.cost = PoolMattersCost(model->config);
  auto rt = LocalRuntime::Create(model, options);
  ASSERT_OK(rt);
  EXPECT_EQ(&(*rt)->model(), model.get());
  EXPECT_EQ(Greedy(**rt), plain_ids);

  EXPECT_FALSE(LocalRuntime::Create(std::shared_ptr<const Model>(), {}).ok());
}

TEST(ScenarioBenchTest, TinyGridRecordsParseAndPoliciesAgree) {
  ASSERT_TRUE(std::filesystem::exists(kBench)) << kBench << " is not built (target tandem-scenario-bench)";
  ScopedTempDir dir;
  const std::filesystem::path out = dir.path() / "scenario.jsonl";
  auto run = RunProcess({kBench,
                         "--synthetic",
                         "tiny",
                         "--policies",
                         "plain,cpu-only,gpu-only,makespan+lru",
                         "--gpu_slots",
                         "2",
                         "--inputs",
                         "8",
                         "--outputs",
                         "6",
                         "--prefills",
                         "32",
                         "--beam_widths",
                         "2",
                         "--beam_input",
                         "8",
                         "--beam_output",
                         "4",
                         "--threads",
                         "1",
                         "--calibration_profile",
                         (dir.path() / "calibration.json").string(),
                         "--out",
                         out.string()},
                        {}, dir.path(), absl::Seconds(60));
  ASSERT_OK(run);
  ASSERT_EQ(run->exit_code, 0) << run->err;

  std::ifstream in(out);
  std::string line;
  std::map<std::string, int> kinds;
  std::map<std::string, std::set<std::string>> fingerprints;  // point → the policies' output fingerprints
  std::set<std::string> ranked;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    ASSERT_TRUE(j.contains("machine") && j.contains("device") && j.contains("command") && j.contains("flags")) << line;
    const std::string kind = j["record"];
    ++kinds[kind];
    if (kind == "e2e") {
      EXPECT_GT(j["tokens_per_s"].get<double>(), 0) << line;
      fingerprints["e2e"].insert(j["output_fingerprint"].get<std::string>());
    } else if (kind == "ttft") {
      EXPECT_GT(j["ttft_ms"].get<double>(), 0) << line;
      fingerprints["ttft"].insert(j["output_fingerprint"].get<std::string>());
    } else if (kind == "beam") {
      EXPECT_GT(j["beam_tokens_per_s"].get<double>(), 0) << line;
      fingerprints["beam"].insert(j["output_fingerprint"].get<std::string>());
    }
    if (kind != "summary" && kind != "model" && kind != "calibration") {
      // Orchestrated policies explain their number; plain has no orchestrator.
      EXPECT_EQ(j["orchestrator"].is_null(), j["policy"] == "plain") << line;
    }
    if (kind == "summary") {
      for (const auto& entry : j["scenarios"]["e2e_tokens_per_s"]["ranking"]) ranked.insert(entry["policy"]);
    }
  }
  EXPECT_EQ(kinds["model"], 1);
  EXPECT_EQ(kinds["e2e"], 4);
  EXPECT_EQ(kinds["ttft"], 4);
  EXPECT_EQ(kinds["beam"], 4);
  EXPECT_EQ(kinds["summary"], 1);
  EXPECT_EQ(kinds.count("error"), 0u);
  for (const auto& [point, set] : fingerprints) EXPECT_EQ(set.size(), 1u) << point << ": policies' outputs differ";
  EXPECT_EQ(ranked, (std::set<std::string>{"plain", "cpu-only", "gpu-only", "makespan+lru"}));
}

TEST(ScenarioBenchTest, PrefillPastTheContextNamesTheFlag) {
  ASSERT_TRUE(std::filesystem::exists(kBench)) << kBench << " is not built (target tandem-scenario-bench)";
  ScopedTempDir dir;
  // tiny's context is 256 positions: a 256-token prefill and its first token need 257.
  auto run = RunProcess({kBench, "--synthetic", "tiny", "--prefills", "256", "--threads", "1"}, {}, dir.path(),
                        absl::Seconds(30));
  ASSERT_OK(run);
  EXPECT_NE(run->exit_code, 0);
  EXPECT_NE(run->err.find("--prefills"), std::string::npos) << run->err;
  EXPECT_NE(run->err.find("max_position_embeddings"), std::string::npos) << run->err;
}

}  // namespace
}  // namespace tandem
