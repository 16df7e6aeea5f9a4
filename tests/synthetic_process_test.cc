// --synthetic PRESET[:layers] --synthetic_seed N in the real programs: tandem-generate
// prints what it prints for the written model; tandem-server with CPU worker
// processes (all synthetic) answers like the in-process engine while the
// coordinator generates no expert bytes; bad specs fail naming the flag in
// all three programs.
#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

const char kGenerate[] = TANDEM_BINARY_DIR "/bin/tandem-generate";
const char kServer[] = TANDEM_BINARY_DIR "/bin/tandem-server";
const char kWorker[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";

TEST(SyntheticProcessTest, GenerateGivesTheWrittenModelsText) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));  // tiny, seed 7
  const std::vector<std::string> common = {"--prompt",     "The licensee may", "-n", "16",
                                           "--ignore_eos", "--threads",        "2"};
  std::vector<std::string> from_dir = {kGenerate, "--model", (dir.path() / "model").string()};
  std::vector<std::string> synthetic = {kGenerate, "--synthetic", "tiny:2", "--synthetic_seed", "7"};
  from_dir.insert(from_dir.end(), common.begin(), common.end());
  synthetic.insert(synthetic.end(), common.begin(), common.end());
  auto a = RunProcess(from_dir, {}, dir.path());
  auto b = RunProcess(synthetic, {}, dir.path());
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_EQ(a->exit_code, 0) << a->err;
  ASSERT_EQ(b->exit_code, 0) << b->err;
  EXPECT_GT(a->out.size(), std::string("The licensee may").size() + 4);
  EXPECT_EQ(a->out, b->out);
  EXPECT_THAT(b->err, HasSubstr("synthetic:tiny:2 seed 7"));
  EXPECT_THAT(b->err, HasSubstr(" (all experts) in "));  // the generation log line
}

// Two synthetic split workers and a synthetic server over them, with
// `server_args` added; the server's greedy ids for `prompt` and its log.
struct SplitRun {
  std::vector<int32_t> ids;
  std::string server_log, worker_log;
};
void RunSyntheticSplit(const std::filesystem::path& dir, const std::vector<int32_t>& prompt,
                       const std::vector<std::string>& server_args, SplitRun* run) {
  std::vector<std::unique_ptr<WorkerProcess>> workers;
  std::string addresses;
  for (int w = 0; w < 2; ++w) {
    WorkerProcessOptions o;
    o.binary = kWorker;
    o.socket = dir / absl::StrCat("w", w, ".sock");
    o.region_prefix = UniqueRegionPrefix();
    o.worker_index = w;
    o.num_workers = 2;
    o.extra_args = {"--synthetic", "tiny", "--synthetic_seed", "7", "--division",      "split",
                    "--transport", "shm",  "--threads",        "1", "--arena_slot_mb", "1"};
    o.log = dir / absl::StrCat("w", w, ".log");
    workers.push_back(std::make_unique<WorkerProcess>(o));
    const absl::Status started = workers.back()->Start();
    ASSERT_OK(started) << started << workers.back()->LogTail();
    absl::StrAppend(&addresses, w > 0 ? "," : "", workers.back()->address());
  }
  run->worker_log = workers[1]->LogTail(100000);

  std::vector<std::string> args = {"--synthetic", "tiny:2", "--synthetic_seed", "7",
                                   "--threads",   "1",      "--workers",        addresses};
  args.insert(args.end(), server_args.begin(), server_args.end());
  ServerProcess server({.model_dir = {}, .socket = dir / "server.sock", .extra_args = args, .log = dir / "server.log"});
  const absl::Status started = server.Start();
  ASSERT_OK(started);
  auto stub = server.NewStub();

  v1::GenerateRequest request;
  request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  request.set_max_tokens(10);
  request.set_temperature(0);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    for (const v1::Token& t : response.tokens()) run->ids.push_back(t.id());
  }
  const grpc::Status status = reader->Finish();
  ASSERT_OK(status) << status.error_message() << "\n" << server.LogTail();

  // Text works too: the tokenizer was trained in memory.
  grpc::ClientContext info_context;
  v1::ModelInfo info;
  ASSERT_OK(stub->GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info));
  EXPECT_EQ(info.model_dir(), "synthetic:tiny:2 seed 7");
  EXPECT_TRUE(info.has_tokenizer());
  EXPECT_GT(info.expert_bytes(), 0);  // one expert's size, from the shapes
  run->server_log = server.LogTail(100000);
}

TEST(SyntheticProcessTest, ServerWithSyntheticWorkersMatchesInProcessAndGeneratesNoExperts) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  const std::vector<int32_t> prompt = RandomTokens(6, 512, 5);
  auto expected = GreedyInProcess(dir.path() / "model", prompt, 10);
  ASSERT_OK(expected);
  SplitRun run;
  ASSERT_NO_FATAL_FAILURE(RunSyntheticSplit(dir.path(), prompt, {}, &run));
  EXPECT_EQ(run.ids, *expected);
  // Each worker generated its slices in place, nothing else of size.
  EXPECT_THAT(run.worker_log, HasSubstr("(no experts, no dense matrices)"));
  EXPECT_THAT(run.worker_log, HasSubstr("generated in place by"));
  // The coordinator generated the dense part only.
  EXPECT_THAT(run.server_log, HasSubstr(" (no experts) in "));
  EXPECT_THAT(run.server_log, HasSubstr("(0.0 MB experts)"));
}

// With the orchestrator too, the coordinator holds no expert: its pool
// copies from the workers' shared-memory stores (split: each expert in
// slices across both), and the tokens stay the single process's.
TEST(SyntheticProcessTest, OrchestratedServerCopiesExpertsFromTheWorkersStores) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  const std::vector<int32_t> prompt = RandomTokens(6, 512, 5);
  auto expected = GreedyInProcess(dir.path() / "model", prompt, 10);
  ASSERT_OK(expected);
  SplitRun run;
  ASSERT_NO_FATAL_FAILURE(RunSyntheticSplit(
      dir.path(), prompt, {"--execution_policy", "gpu-only", "--gpu_slots", "2", "--staging_buffers", "4"}, &run));
  EXPECT_EQ(run.ids, *expected) << run.server_log;
  EXPECT_THAT(run.server_log, HasSubstr(" (no experts) in "));
  EXPECT_THAT(run.server_log, HasSubstr("migrations copy from the 2 workers' expert stores"));
}

TEST(SyntheticProcessTest, BadSpecsNameTheFlagInEveryProgram) {
  ScopedTempDir dir;
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--synthetic", "gpt-5"}, "--synthetic \"gpt-5\": unknown synthetic model preset"},
      {{"--synthetic", "tiny:0"}, "--synthetic \"tiny:0\": expected PRESET or PRESET:layers with layers >= 1"},
      {{"--synthetic", "tiny", "--model", dir.path().string()}, "give exactly one of --model DIR or --synthetic"},
      {{}, "give exactly one of --model DIR or --synthetic"},
  };
  for (const char* binary : {kGenerate, kServer, kWorker}) {
    for (const Case& c : cases) {
      std::vector<std::string> argv = {binary};
      argv.insert(argv.end(), c.args.begin(), c.args.end());
      if (std::string(binary) == kGenerate) argv.insert(argv.end(), {"--prompt_ids", "1,2"});
      if (std::string(binary) == kServer)
        argv.insert(argv.end(), {"--listen", "unix:" + (dir.path() / "s.sock").string()});
      if (std::string(binary) == kWorker) argv.insert(argv.end(), {"--socket", (dir.path() / "w.sock").string()});
      auto result = RunProcess(argv, {}, dir.path(), absl::Seconds(30));
      ASSERT_OK(result);
      EXPECT_NE(result->exit_code, 0) << binary << " " << c.expected;
      EXPECT_THAT(result->err, HasSubstr(c.expected)) << binary;
    }
  }
}

}  // namespace
}  // namespace tandem
