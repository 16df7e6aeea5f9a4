// The process split end to end: a coordinator (this test process) and two
// real tandem-cpu-worker processes on unix sockets, for every transport and
// both divisions: greedy tokens and every logit equal the single-process
// engine's exactly (memcmp). The single-process reference for `split` is
// LocalExpertExecutor with split_ways = 2 (same partials, same summation
// order); for `shard` the plain in-process executor. Connect refuses a worker
// serving another model, listed in the wrong place, or without the arena a
// transport needs.
//
// Legend: P prompt tokens, V vocab.
#include <signal.h>

#include <grpcpp/grpcpp.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/model/expert_content.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "coordinator/orchestration/remote_expert_executor.h"
#include "coordinator/orchestration/worker_connect.h"
#include "coordinator/runtime/local_runtime.h"
#include "cpu_worker/local_expert_executor.h"
#include "gtest/gtest.h"
#include "tandem/v1/expert_worker.grpc.pb.h"
#include "tandem/v1/expert_worker_convert.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

constexpr uint64_t kSeed = 7;
const char kWorkerBinary[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";

// What one generation produced: the tokens and every forward pass's logits.
struct GenerationRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // all "logits" dumps, concatenated
};

std::unique_ptr<Model> LoadTiny(const std::string& preset) {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = preset, .seed = kSeed, .dtype = DType::kBF16});
  EXPECT_OK(model);
  return model.ok() ? std::move(*model) : nullptr;
}

// Greedy generation of `max_tokens` after `prompt` with `experts` (null: the
// runtime's own in-process executor).
absl::StatusOr<GenerationRun> Generate(std::unique_ptr<Model> model, ExpertExecutor* experts,
                                       const std::vector<int32_t>& prompt, int max_tokens) {
  GenerationRun run;
  LocalRuntimeOptions options;
  options.num_threads = 1;
  options.expert_executor = experts;
  options.engine.dump = [&](std::string_view name, int, const float* data, int64_t rows, int64_t cols) {
    if (name == "logits") run.logits.insert(run.logits.end(), data, data + rows * cols);
  };
  auto rt = LocalRuntime::Create(std::move(model), options);
  if (!rt.ok()) return rt.status();
  GenerationRequest request;
  request.prompt_ids = prompt;
  request.max_tokens = max_tokens;
  request.ignore_eos = true;
  auto result = (*rt)->generator().Generate(request);
  if (!result.ok()) return result.status();
  for (const GeneratedToken& t : result->tokens) run.tokens.push_back(t.id);
  return run;
}

// The single-process reference: LocalExpertExecutor with `split_ways`.
GenerationRun Reference(const std::string& preset, int split_ways, const std::vector<int32_t>& prompt, int max_tokens) {
  std::unique_ptr<Model> model = LoadTiny(preset);
  std::vector<std::vector<ExpertFfnWeights>> experts;
  for (const LayerWeights& layer : model->weights->layers) experts.push_back(layer.experts);
  ThreadPool pool(ThreadPoolOptions{.num_threads = 1, .name = "ref"});
  LocalExpertExecutor local(std::move(experts), &pool, LinearOptions{}, split_ways);
  auto run = Generate(std::move(model), &local, prompt, max_tokens);
  EXPECT_OK(run);
  return run.ok() ? *run : GenerationRun{};
}

struct Case {
  std::string division;   // split | shard
  std::string transport;  // inline | shm-grpc | shm
  std::string preset = "tiny";
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.preset << " " << c.division << "/" << c.transport; }

class RemoteExpertsTest : public ::testing::TestWithParam<Case> {
 protected:
  // Starts `n` workers serving `preset` with `division`.
  void StartWorkers(int n, const std::string& division, const std::string& preset = "tiny",
                    const std::string& worker_transport = "shm", int arena_slot_mb = 4) {
    const std::string prefix = UniqueRegionPrefix();
    for (int i = 0; i < n; ++i) {
      WorkerProcessOptions o;
      o.binary = kWorkerBinary;
      o.socket = dir_.path() / absl::StrCat("w", i, ".sock");
      o.region_prefix = prefix;
      o.worker_index = i;
      o.num_workers = n;
      o.extra_args = {"--synthetic", preset,   "--synthetic_seed", absl::StrCat(kSeed),
                      "--division",  division, "--transport",      worker_transport,
                      "--threads",   "1",      "--arena_slot_mb",  absl::StrCat(arena_slot_mb)};
      o.log = dir_.path() / absl::StrCat("w", i, ".log");
      workers_.push_back(std::make_unique<WorkerProcess>(o));
      absl::Status started = workers_.back()->Start();
      ASSERT_OK(started);
    }
  }
  std::vector<std::string> Addresses() const {
    std::vector<std::string> a;
    for (const auto& w : workers_) a.push_back(w->address());
    return a;
  }
  absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> Connect(const Model& model, const std::string& transport) {
    auto fingerprint = FingerprintModel(model.config, *model.weights->source);
    if (!fingerprint.ok()) return fingerprint.status();
    auto t = ParseWorkerTransport(transport);
    if (!t.ok()) return t.status();
    RemoteExpertExecutorOptions options;
    options.addresses = Addresses();
    options.transports = {*t};
    options.call_timeout = absl::Seconds(5);
    options.expected_content = ExpectedExpertContent(model, std::nullopt, 1);
    return RemoteExpertExecutor::Connect(model.config, *fingerprint, options);
  }

  ScopedTempDir dir_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;  // destroyed (stopped, reaped) with the fixture
};

TEST_P(RemoteExpertsTest, TokensAndLogitsEqualTheSingleProcessEngine) {
  const Case& c = GetParam();
  ASSERT_NO_FATAL_FAILURE(StartWorkers(2, c.division, c.preset));
  std::unique_ptr<Model> model = LoadTiny(c.preset);
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = RandomTokens(20, model->config.vocab_size, 500);
  auto remote = Connect(*model, c.transport);
  ASSERT_OK(remote);
  EXPECT_EQ(ExpertDivisionName((*remote)->division()), c.division);
  const int64_t moe_layers = model->config.num_moe_layers();  // a dense layer sends nothing

  auto got = Generate(std::move(model), remote->get(), prompt, 12);
  ASSERT_OK(got);
  const GenerationRun want = Reference(c.preset, c.division == "split" ? 2 : 1, prompt, 12);
  ASSERT_EQ(got->tokens.size(), 12u);
  EXPECT_EQ(got->tokens, want.tokens);
  ASSERT_EQ(got->logits.size(), want.logits.size());
  ASSERT_FALSE(want.logits.empty());
  EXPECT_EQ(std::memcmp(got->logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0)
      << "logits differ from the single-process engine's";

  // Every worker took part in every layer of the 12 forward passes (split),
  // or at least some (shard); the stats say so.
  for (const RemoteWorkerStats& s : (*remote)->stats()) {
    EXPECT_GT(s.calls, 0) << s.address;
    EXPECT_EQ(s.failures, 0) << s.address;
    EXPECT_EQ(s.inline_fallbacks, 0) << s.address;
    if (c.division == "split") {
      EXPECT_EQ(s.calls, 12 * moe_layers) << s.address;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, RemoteExpertsTest,
                         ::testing::Values(Case{"split", "inline"}, Case{"split", "shm-grpc"}, Case{"split", "shm"},
                                           Case{"shard", "inline"}, Case{"shard", "shm-grpc"}, Case{"shard", "shm"},
                                           // 16 small experts top-4 (Qwen3-MoE's shape, scaled down);
                                           // Qwen2-MoE's shared expert stays with the coordinator
                                           Case{"split", "shm", "tiny-qwen3moe"}, Case{"shard", "shm", "tiny-qwen3moe"},
                                           Case{"split", "shm", "tiny-qwen2moe"},
                                           // 128 experts top-8: still one message per worker per layer
                                           Case{"split", "shm", "tiny-qwen3moe-128"},
                                           Case{"shard", "shm", "tiny-qwen3moe-128"},
                                           // dense MLP layers stay with the coordinator, first and between
                                           Case{"split", "shm", "tiny-qwen3moe-dense"},
                                           Case{"shard", "shm", "tiny-qwen2moe-dense"},
                                           // GLM-4.5: sigmoid router with its bias, ungated shared expert
                                           Case{"split", "shm", "tiny-glm4moe"},
                                           // DeepSeek-V2: latent attention, grouped softmax router
                                           Case{"shard", "shm", "tiny-deepseek-v2"},
                                           // DeepSeek-V3: 256 routed experts top-8 per layer, both divisions
                                           Case{"split", "shm", "tiny-deepseek-v3-256"},
                                           Case{"shard", "shm", "tiny-deepseek-v3-256"}),
                         [](const auto& info) {
                           std::string name = (info.param.preset == "tiny" ? "" : info.param.preset.substr(5) + "_") +
                                              info.param.division + "_" + info.param.transport;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

class RemoteConnectTest : public RemoteExpertsTest {};

// A layer whose rows do not fit the worker's arena slot (here a 300-token
// prefill of the demo model: 600 rows x 2 KiB per worker under split, against
// 1 MiB slots) travels inline instead, and still gives the single-process
// engine's exact logits; the decode steps after it fit and use the arena.
TEST_F(RemoteConnectTest, LayerTooLargeForTheArenaFallsBackToInlineExactly) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(2, "split", "demo", "shm", /*arena_slot_mb=*/1));
  std::unique_ptr<Model> model = LoadTiny("demo");
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> prompt = RandomTokens(300, model->config.vocab_size, 501);
  auto remote = Connect(*model, "shm");
  ASSERT_OK(remote);
  auto got = Generate(std::move(model), remote->get(), prompt, 3);
  ASSERT_OK(got);
  const GenerationRun want = Reference("demo", 2, prompt, 3);
  EXPECT_EQ(got->tokens, want.tokens);
  ASSERT_EQ(got->logits.size(), want.logits.size());
  EXPECT_EQ(std::memcmp(got->logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0);
  const int64_t layers = 4;  // demo preset
  for (const RemoteWorkerStats& s : (*remote)->stats()) {
    // The last layer's experts run only the prompt's last token, which fits.
    EXPECT_EQ(s.inline_fallbacks, layers - 1) << s.address << ": the prefill's layers but the last go inline";
    EXPECT_EQ(s.calls, 3 * layers) << s.address;
    EXPECT_EQ(s.failures, 0) << s.address;
  }
}

TEST_F(RemoteConnectTest, DescribeCalibrateStatsAndHealth) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(2, "shard"));
  std::unique_ptr<Model> model = LoadTiny("tiny");
  auto stub =
      v1::ExpertWorker::NewStub(grpc::CreateChannel(workers_[1]->address(), grpc::InsecureChannelCredentials()));
  auto context = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return c;
  };
  constexpr uint64_t kSession = 0x5e55;
  v1::DescribeResponse d;
  ASSERT_OK(stub->Describe(context().get(), ClaimRequest(kSession), &d));
  EXPECT_EQ(d.protocol_version(), kExpertWorkerProtocolVersion);
  auto fingerprint = FingerprintModel(model->config, *model->weights->source);
  ASSERT_OK(fingerprint);
  EXPECT_EQ(FromProto(d.fingerprint()), *fingerprint);
  EXPECT_EQ(d.division(), v1::DIVISION_SHARD);
  EXPECT_EQ(d.worker_index(), 1);
  EXPECT_EQ(d.num_workers(), 2);
  EXPECT_EQ(d.experts_size(), 4);  // 2 layers x 4 experts, half of them
  EXPECT_EQ(d.threads(), 1);
  EXPECT_EQ(d.pid(), workers_[1]->pid());
  // The names carry a random suffix of 16 hex digits (no one can take them first).
  EXPECT_EQ(d.weights_region().rfind(workers_[1]->experts_region() + "-", 0), 0u) << d.weights_region();
  EXPECT_EQ(d.weights_region().size(), workers_[1]->experts_region().size() + 17) << d.weights_region();
  EXPECT_GT(d.weights_region_bytes(), 0u);
  EXPECT_EQ(d.arena_region().rfind(workers_[1]->arena_region() + "-", 0), 0u) << d.arena_region();
  // The stored bytes' content hash, per share and in all, equals the model's.
  std::vector<ExpertSlice> shares;
  for (const v1::ExpertShare& share : d.experts()) {
    shares.push_back({share.layer(), share.expert(), share.intermediate_begin(), share.intermediate_end()});
  }
  auto want = HashExpertSlices(*model->weights, shares, nullptr);
  ASSERT_OK(want);
  for (int i = 0; i < d.experts_size(); ++i)
    EXPECT_EQ(d.experts(i).content_hash(), (*want)[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(d.content_hash(), CombineExpertContentHashes(shares, *want));
  EXPECT_TRUE(d.doorbell());
  EXPECT_EQ(d.compute(), "store");

  v1::CalibrateRequest calibrate;
  calibrate.set_layer(d.experts(0).layer());
  calibrate.set_expert(d.experts(0).expert());
  calibrate.add_rows(1);
  calibrate.add_rows(16);
  calibrate.set_reps(3);
  calibrate.set_session(kSession);
  v1::CalibrateResponse points;
  ASSERT_OK(stub->Calibrate(context().get(), calibrate, &points));
  ASSERT_EQ(points.points_size(), 2);
  EXPECT_EQ(points.points(1).rows(), 16);
  EXPECT_GT(points.points(0).median_us(), 0.0);
  calibrate.set_expert((d.experts(0).expert() + 1) % 4);  // held by worker 0 (shard rotates)
  const grpc::Status not_held = stub->Calibrate(context().get(), calibrate, &points);
  EXPECT_EQ(not_held.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << not_held.error_message();

  v1::HealthResponse health;
  ASSERT_OK(stub->Health(context().get(), v1::HealthRequest(), &health));
  EXPECT_TRUE(health.serving());
  v1::StatsResponse stats;
  ASSERT_OK(stub->Stats(context().get(), v1::StatsRequest(), &stats));
  EXPECT_EQ(stats.requests(), 0u);  // Calibrate is not a request
  EXPECT_EQ(stats.rejected(), 0u);
}

TEST_F(RemoteConnectTest, ModelMismatchIsFailedPreconditionNamingBothFingerprints) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(2, "split", "tiny:3"));  // 3 layers; the coordinator has 2
  std::unique_ptr<Model> model = LoadTiny("tiny");
  auto remote = Connect(*model, "shm");
  ASSERT_FALSE(remote.ok());
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition) << remote.status();
  const std::string message(remote.status().message());
  EXPECT_NE(message.find("L=3"), std::string::npos) << message;
  EXPECT_NE(message.find("L=2"), std::string::npos) << message;
  EXPECT_NE(message.find("worker 0"), std::string::npos) << message;
}

TEST_F(RemoteConnectTest, WorkersInTheWrongOrderAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(2, "shard"));
  std::unique_ptr<Model> model = LoadTiny("tiny");
  std::swap(workers_[0], workers_[1]);
  auto remote = Connect(*model, "inline");
  ASSERT_FALSE(remote.ok());
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition) << remote.status();
  EXPECT_NE(remote.status().message().find("worker_index 1"), std::string::npos) << remote.status();
}

TEST_F(RemoteConnectTest, ShmTransportNeedsAWorkerWithAnArena) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(1, "split", "tiny", /*worker_transport=*/"inline"));
  std::unique_ptr<Model> model = LoadTiny("tiny");
  auto remote = Connect(*model, "shm");
  ASSERT_FALSE(remote.ok());
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition) << remote.status();
  EXPECT_NE(remote.status().message().find("arena"), std::string::npos) << remote.status();
  auto inline_ok = Connect(*model, "inline");
  EXPECT_OK(inline_ok);
}

TEST_F(RemoteConnectTest, NoWorkerListeningIsUnavailableOrDeadlineExceeded) {
  std::unique_ptr<Model> model = LoadTiny("tiny");
  auto fingerprint = FingerprintModel(model->config, *model->weights->source);
  ASSERT_OK(fingerprint);
  RemoteExpertExecutorOptions options;
  options.addresses = {"unix:" + (dir_.path() / "nobody.sock").string()};
  options.transports = {WorkerTransport::kShmDoorbell};
  options.connect_timeout = absl::Milliseconds(300);
  const absl::Time start = absl::Now();
  auto remote = RemoteExpertExecutor::Connect(model->config, *fingerprint, options);
  ASSERT_FALSE(remote.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(remote.status()) || absl::IsUnavailable(remote.status())) << remote.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

}  // namespace
}  // namespace tandem
