// tandem-server as a real process on a unix socket, through the raw gRPC API
// (the SDKs have their own tests): beam search equals the naive reference,
// 16 concurrent clients each get what they get alone and leave no KV block
// behind, cancellation and deadlines free the cache, every invalid parameter
// is refused naming its field, stop strings and UTF-8 hold for streamed
// text, and a CPU worker that dies fails only the requests in flight.
#include <signal.h>

#include <gtest/gtest.h>

#include <thread>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/model/model.h"
#include "tests/beam_reference_testlib.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/reference_model_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

const bool kExactKernels = test::UseExactKernels();

using v1::BeamSearchRequest;
using v1::BeamSearchResponse;
using v1::GenerateRequest;
using v1::GenerateResponse;

struct Generated {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::string text;
  GenerateResponse last;
};

Generated RunGenerate(v1::Inference::Stub& stub, const GenerateRequest& request,
                      grpc::ClientContext* context = nullptr) {
  grpc::ClientContext own;
  if (context == nullptr) context = &own;
  auto reader = stub.Generate(context, request);
  Generated out;
  GenerateResponse response;
  while (reader->Read(&response)) {
    for (const v1::Token& t : response.tokens()) {
      out.ids.push_back(t.id());
      out.text += t.text();
    }
    out.last = response;
  }
  out.status = reader->Finish();
  return out;
}

struct Beams {
  grpc::Status status;
  std::vector<std::vector<int32_t>> ids;
  std::vector<double> scores;
  int progress = 0;
};

Beams RunBeamSearch(v1::Inference::Stub& stub, const BeamSearchRequest& request,
                    grpc::ClientContext* context = nullptr) {
  grpc::ClientContext own;
  if (context == nullptr) context = &own;
  auto reader = stub.BeamSearch(context, request);
  Beams out;
  BeamSearchResponse response;
  while (reader->Read(&response)) {
    if (response.has_progress()) ++out.progress;
    for (const v1::BeamSequence& s : response.sequences()) {
      out.ids.emplace_back(s.ids().begin(), s.ids().end());
      out.scores.push_back(s.score());
    }
  }
  out.status = reader->Finish();
  return out;
}

GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  GenerateRequest r;
  r.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  r.set_max_tokens(max_tokens);
  r.set_temperature(0);
  r.set_ignore_eos(true);
  return r;
}

BeamSearchRequest BeamRequest(const std::vector<int32_t>& prompt, int width, int max_tokens) {
  BeamSearchRequest r;
  r.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  r.set_beam_width(width);
  r.set_max_tokens(max_tokens);
  r.set_num_return_sequences(width);
  return r;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    ASSERT_OK(WriteTestModel(model_dir()));
    server_ = new ServerProcess({.model_dir = model_dir(),
                                 .socket = dir_->path() / "server.sock",
                                 .extra_args = {"--threads", "2", "--max_sequences", "32", "--kernel_plan", "exact"},
                                 .log = dir_->path() / "server.log"});
    const absl::Status started = server_->Start();
    ASSERT_OK(started);
  }
  static void TearDownTestSuite() {
    delete server_;
    delete dir_;
  }
  static std::filesystem::path model_dir() { return dir_->path() / "model"; }

  v1::ServerStats Stats() {
    grpc::ClientContext context;
    v1::ServerStats stats;
    EXPECT_OK(server_->NewStub()->GetStats(&context, v1::GetStatsRequest(), &stats));
    return stats;
  }
  void ExpectAllBlocksFree() {
    for (int i = 0; i < 200 && Stats().kv_blocks_in_use() != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(Stats().kv_blocks_in_use(), 0);
  }

  static ScopedTempDir* dir_;
  static ServerProcess* server_;
};

ScopedTempDir* ServerTest::dir_ = nullptr;
ServerProcess* ServerTest::server_ = nullptr;

TEST_F(ServerTest, GreedyGenerateEqualsTheInProcessEngine) {
  const auto prompt = RandomTokens(11, 512, 77);
  auto expected = GreedyInProcess(model_dir(), prompt, 12);
  ASSERT_OK(expected);
  Generated out = RunGenerate(*server_->NewStub(), GreedyRequest(prompt, 12));
  ASSERT_OK(out.status);
  EXPECT_EQ(out.ids, *expected);
  EXPECT_TRUE(out.last.done());
  EXPECT_EQ(out.last.finish_reason(), v1::FINISH_REASON_MAX_TOKENS);
  EXPECT_EQ(out.last.usage().generated_tokens(), 12);
  EXPECT_EQ(out.last.usage().prompt_tokens(), 11);
}

TEST_F(ServerTest, BeamSearchEqualsTheNaiveReference) {
  auto model = LoadModel(model_dir());
  ASSERT_OK(model);
  auto reference = ReferenceModel::Create(*(*model)->weights);
  ASSERT_OK(reference);
  auto stub = server_->NewStub();
  for (int width : {2, 4, 8}) {
    const auto prompt = RandomTokens(6, 512, 500 + width);
    BeamSearchRequest request = BeamRequest(prompt, width, 5);
    request.set_stream_progress(true);
    Beams out = RunBeamSearch(*stub, request);
    ASSERT_OK(out.status);
    auto expected = NaiveBeamSearch(**reference, prompt,
                                    {.beam_width = width,
                                     .max_tokens = 5,
                                     .num_return_sequences = width,
                                     .end_ids = (*model)->config.eos_token_ids});
    ASSERT_OK(expected);
    ASSERT_EQ(out.ids.size(), expected->size()) << "width " << width;
    for (size_t i = 0; i < expected->size(); ++i) {
      EXPECT_EQ(out.ids[i], (*expected)[i].ids) << "width " << width << " rank " << i;
      EXPECT_NEAR(out.scores[i], (*expected)[i].score, 1e-3);
    }
    EXPECT_GT(out.progress, 0);
  }
}

TEST_F(ServerTest, SixteenConcurrentClientsEachGetWhatTheyGetAlone) {
  struct Job {
    bool beam;
    GenerateRequest generate;
    BeamSearchRequest beam_request;
  };
  std::vector<Job> jobs;
  for (int i = 0; i < 16; ++i) {
    const auto prompt = RandomTokens(2 + (i * 5) % 30, 512, 2000 + i);
    if (i % 4 == 1) {
      jobs.push_back({true, {}, BeamRequest(prompt, 2 + i % 3, 3 + i % 4)});
    } else {
      jobs.push_back({false, GreedyRequest(prompt, 3 + (i * 3) % 15), {}});
    }
  }
  std::vector<std::vector<std::vector<int32_t>>> alone;
  auto stub = server_->NewStub();
  for (const Job& job : jobs) {
    if (job.beam) {
      Beams b = RunBeamSearch(*stub, job.beam_request);
      ASSERT_OK(b.status);
      alone.push_back(b.ids);
    } else {
      Generated g = RunGenerate(*stub, job.generate);
      ASSERT_OK(g.status);
      alone.push_back({g.ids});
    }
  }
  std::vector<std::vector<std::vector<int32_t>>> together(jobs.size());
  std::vector<grpc::Status> statuses(jobs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < jobs.size(); ++i) {
    clients.emplace_back([&, i] {
      auto own_stub = server_->NewStub();  // a connection per client
      if (jobs[i].beam) {
        Beams b = RunBeamSearch(*own_stub, jobs[i].beam_request);
        statuses[i] = b.status;
        together[i] = b.ids;
      } else {
        Generated g = RunGenerate(*own_stub, jobs[i].generate);
        statuses[i] = g.status;
        together[i] = {g.ids};
      }
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_OK(statuses[i]) << "client " << i << ": " << statuses[i].error_message();
    EXPECT_EQ(together[i], alone[i]) << "client " << i;
  }
  const v1::ServerStats stats = Stats();
  EXPECT_GT(stats.mean_batch_rows(), 1.0) << "requests were batched";
  EXPECT_EQ(stats.layers_size(), 2);
  ExpectAllBlocksFree();
}

TEST_F(ServerTest, CancellationAndDeadlinesFreeTheCache) {
  auto stub = server_->NewStub();
  const int64_t cancelled_before = Stats().requests_cancelled();
  {
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, GreedyRequest(RandomTokens(4, 512, 1), 250));
    GenerateResponse response;
    ASSERT_TRUE(reader->Read(&response));
    context.TryCancel();
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  {
    // 240 steps of 16 beams: far longer than the deadline even on a fast
    // machine (a greedy decode of the tiny model can finish 250 tokens in 20 ms).
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(20));
    BeamSearchRequest request = BeamRequest(RandomTokens(4, 512, 2), 16, 240);
    request.set_ignore_eos(true);
    Beams out = RunBeamSearch(*stub, request, &context);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  ExpectAllBlocksFree();
  for (int i = 0; i < 200 && Stats().requests_cancelled() < cancelled_before + 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(Stats().requests_cancelled(), cancelled_before + 2) << "the server stopped both";
}

TEST_F(ServerTest, EveryInvalidParameterIsRefusedNamingIt) {
  auto stub = server_->NewStub();
  struct GenerateCase {
    std::string field;
    std::function<void(GenerateRequest&)> mutate;
  };
  const std::vector<GenerateCase> generate_cases = {
      {"prompt", [](GenerateRequest& r) { r.clear_prompt_ids(); }},
      {"prompt", [](GenerateRequest& r) { r.set_prompt("text as well"); }},
      {"prompt_ids[2]", [](GenerateRequest& r) { r.set_prompt_ids(2, 512); }},
      {"max_tokens", [](GenerateRequest& r) { r.set_max_tokens(0); }},
      {"context", [](GenerateRequest& r) { r.set_max_tokens(1000); }},
      {"temperature", [](GenerateRequest& r) { r.set_temperature(-0.5f); }},
      {"top_k", [](GenerateRequest& r) { r.set_top_k(-1); }},
      {"top_p", [](GenerateRequest& r) { r.set_top_p(0.0f); }},
      {"top_p", [](GenerateRequest& r) { r.set_top_p(1.01f); }},
      {"logprobs", [](GenerateRequest& r) { r.set_logprobs(-3); }},
      {"stop_ids[0]", [](GenerateRequest& r) { r.add_stop_ids(70000); }},
      {"stop[0]", [](GenerateRequest& r) { r.add_stop(""); }},
  };
  for (const GenerateCase& c : generate_cases) {
    GenerateRequest request = GreedyRequest({5, 6, 7, 8}, 4);
    c.mutate(request);
    Generated out = RunGenerate(*stub, request);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(out.status.error_message().find(c.field), std::string::npos) << out.status.error_message();
  }
  {
    GenerateRequest request = GreedyRequest(RandomTokens(300, 512, 1), 4);  // longer than the context
    Generated out = RunGenerate(*stub, request);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(out.status.error_message().find("context"), std::string::npos) << out.status.error_message();
  }
  struct BeamCase {
    std::string field;
    std::function<void(BeamSearchRequest&)> mutate;
  };
  const std::vector<BeamCase> beam_cases = {
      {"beam_width", [](BeamSearchRequest& r) { r.set_beam_width(0); }},
      {"beam_width", [](BeamSearchRequest& r) { r.set_beam_width(65); }},
      {"num_return_sequences", [](BeamSearchRequest& r) { r.set_num_return_sequences(3); }},
      {"length_penalty", [](BeamSearchRequest& r) { r.set_length_penalty(std::nanf("")); }},
      {"max_tokens", [](BeamSearchRequest& r) { r.set_max_tokens(-1); }},
      {"stop_ids[0]", [](BeamSearchRequest& r) { r.add_stop_ids(-4); }},
      {"prompt", [](BeamSearchRequest& r) { r.clear_prompt_ids(); }},
  };
  for (const BeamCase& c : beam_cases) {
    BeamSearchRequest request = BeamRequest({5, 6, 7}, 2, 4);
    c.mutate(request);
    Beams out = RunBeamSearch(*stub, request);
    EXPECT_EQ(out.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_NE(out.status.error_message().find(c.field), std::string::npos) << out.status.error_message();
  }
  grpc::ClientContext context;
  v1::DetokenizeRequest detokenize;
  detokenize.add_ids(3);
  detokenize.add_ids(-1);
  v1::DetokenizeResponse text;
  const grpc::Status status = stub->Detokenize(&context, detokenize, &text);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("ids[1]"), std::string::npos) << status.error_message();
  EXPECT_EQ(Stats().requests_active(), 0);
}

TEST_F(ServerTest, StopStringsEndTheTextBeforeThem) {
  auto stub = server_->NewStub();
  GenerateRequest request;
  request.set_prompt("The licensee may");
  request.set_max_tokens(24);
  request.set_temperature(0);
  request.set_ignore_eos(true);
  Generated full = RunGenerate(*stub, request);
  ASSERT_OK(full.status);
  ASSERT_GT(full.text.size(), 8u) << full.text;
  // A stop string from the middle of the text: the stream ends right before it.
  // A visible ASCII character from the second half of a random model's text.
  size_t at = full.text.size() / 2;
  while (at < full.text.size() && !(static_cast<unsigned char>(full.text[at]) < 0x80 && std::isgraph(full.text[at]))) {
    ++at;
  }
  ASSERT_LT(at, full.text.size()) << "no ASCII character to stop at in: " << full.text;
  const std::string stop = full.text.substr(at, 1);
  request.add_stop(stop);
  Generated stopped = RunGenerate(*stub, request);
  ASSERT_OK(stopped.status);
  EXPECT_EQ(stopped.last.finish_reason(), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(stopped.text, full.text.substr(0, full.text.find(stop)));
  EXPECT_LT(stopped.ids.size(), full.ids.size());
}

TEST_F(ServerTest, StreamedTextIsValidUtf8EvenFromBytePieces) {
  // Hot sampling over a byte-fallback vocabulary emits <0xNN> pieces that
  // split characters; an invalid string field would fail to parse here.
  auto stub = server_->NewStub();
  GenerateRequest request;
  request.set_prompt("caf\xC3\xA9 \xE2\x82\xAC");
  request.set_max_tokens(120);
  request.set_temperature(2.0f);
  request.set_seed(11);
  request.set_logprobs(5);
  request.set_ignore_eos(true);
  Generated out = RunGenerate(*stub, request);
  ASSERT_OK(out.status);
  EXPECT_EQ(out.ids.size(), 120u);
  EXPECT_EQ(out.last.seed(), 11u);
}

TEST_F(ServerTest, ModelInfoDescribesTheModel) {
  grpc::ClientContext context;
  v1::ModelInfo info;
  ASSERT_OK(server_->NewStub()->GetModelInfo(&context, v1::GetModelInfoRequest(), &info));
  EXPECT_EQ(info.architecture(), "MixtralForCausalLM");
  EXPECT_EQ(info.num_layers(), 2);
  EXPECT_EQ(info.num_experts(), 4);
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_TRUE(info.has_tokenizer());
  EXPECT_GT(info.parameters(), 0);
  EXPECT_EQ(info.expert_bytes(), 3 * 64 * 96 * 2);
  EXPECT_NE(info.placement_summary().find("in this process"), std::string::npos) << info.placement_summary();
  EXPECT_EQ(info.max_sequences(), 32);
}

// ---- a worker process dies under the server ----

TEST(ServerWorkerFailureTest, ADeadWorkerFailsTheRequestInFlightAndTheServerRecovers) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  WorkerProcessOptions o;
  o.binary = std::string(TANDEM_BINARY_DIR) + "/bin/tandem-cpu-worker";
  o.socket = dir.path() / "w0.sock";
  o.region_prefix = UniqueRegionPrefix();
  o.extra_args = {"--model", (dir.path() / "model").string(), "--transport", "shm", "--threads", "1", "--arena_slot_mb",
                  "1"};
  o.log = dir.path() / "w0.log";
  WorkerProcess worker(o);
  ASSERT_OK(worker.Start());
  ServerProcess server({.model_dir = dir.path() / "model",
                        .socket = dir.path() / "server.sock",
                        .extra_args = {"--threads", "1", "--workers", worker.address(), "--worker_timeout_ms", "2000",
                                       "--kernel_plan", "exact"},
                        .log = dir.path() / "server.log"});
  const absl::Status started = server.Start();
  ASSERT_OK(started);
  auto stub = server.NewStub();
  const auto prompt = RandomTokens(5, 512, 9);
  Generated before = RunGenerate(*stub, GreedyRequest(prompt, 8));
  ASSERT_OK(before.status);

  {
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, GreedyRequest(prompt, 250));
    GenerateResponse response;
    ASSERT_TRUE(reader->Read(&response));
    worker.Kill(SIGKILL);
    while (reader->Read(&response)) {
    }
    const grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        << status.error_code() << " " << status.error_message();
    EXPECT_NE(status.error_message().find("worker"), std::string::npos) << status.error_message();
  }
  // The server is still up, and serves again once the worker is back.
  grpc::ClientContext context;
  v1::ModelInfo info;
  EXPECT_OK(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info));
  ASSERT_OK(worker.Start());
  Generated after = RunGenerate(*stub, GreedyRequest(prompt, 8));
  ASSERT_OK(after.status) << after.status.error_message() << "\n" << server.LogTail();
  EXPECT_EQ(after.ids, before.ids);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// ---- the orchestrator under the server ----

TEST(ServerOrchestratorTest, OrchestratedServerGivesTheSameTokensAndReportsHitRates) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  ServerProcess server({.model_dir = dir.path() / "model",
                        .socket = dir.path() / "server.sock",
                        .extra_args = {"--threads", "1", "--execution_policy", "makespan", "--cache_policy", "lru",
                                       "--gpu_slots", "4", "--kernel_plan", "exact"},
                        .log = dir.path() / "server.log"});
  const absl::Status started = server.Start();
  ASSERT_OK(started);
  auto stub = server.NewStub();
  const auto prompt = RandomTokens(7, 512, 41);
  auto expected = GreedyInProcess(dir.path() / "model", prompt, 10);
  ASSERT_OK(expected);
  Generated out = RunGenerate(*stub, GreedyRequest(prompt, 10));
  ASSERT_OK(out.status);
  EXPECT_EQ(out.ids, *expected) << "an exact policy changes no token";

  grpc::ClientContext info_context;
  v1::ModelInfo info;
  ASSERT_OK(stub->GetModelInfo(&info_context, v1::GetModelInfoRequest(), &info));
  EXPECT_NE(info.placement_summary().find("no-GPU host pool"), std::string::npos) << info.placement_summary();
  grpc::ClientContext stats_context;
  v1::ServerStats stats;
  ASSERT_OK(stub->GetStats(&stats_context, v1::GetStatsRequest(), &stats));
  const nlohmann::json orchestrator = nlohmann::json::parse(stats.orchestrator_json())["orchestrator"];
  EXPECT_EQ(orchestrator["execution_policy"], "makespan");
  EXPECT_EQ(orchestrator["cache_policy"], "lru");
  EXPECT_GT(orchestrator["total"]["expert_runs"].get<int64_t>(), 0);
  EXPECT_GE(orchestrator["hit_rate"].get<double>(), 0.0);
  // The cost model as it stands, and how well it predicted.
  EXPECT_EQ(orchestrator["cost_model"]["cpu_workers"].size(), 1u);
  EXPECT_GT(orchestrator["cost_model"]["migrate_us"].get<double>(), 0.0);
  EXPECT_GT(orchestrator["cost_model_mape"]["makespan"]["observations"].get<int64_t>(), 0);
}

}  // namespace
}  // namespace tandem
