// Faults at the process boundary, with real tandem-cpu-worker processes:
//  - a worker killed mid-generation: the request fails with Unavailable /
//    DeadlineExceeded within its deadline, the coordinator (this process)
//    stays up, and once the worker is restarted the next request succeeds
//    with the same tokens;
//  - a hung worker (SIGSTOP): DeadlineExceeded within the deadline, and
//    after SIGCONT the next request succeeds;
//  - garbage in the doorbell control block, descriptors pointing outside the
//    arena or at the wrong slot, and stale sequence numbers: rejected with a
//    clear error (InvalidArgument / DataLoss), nothing written, and the
//    worker keeps serving.
#include <signal.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/platform/shm_transport.h"
#include "coordinator/orchestration/remote_expert_executor.h"
#include "coordinator/orchestration/worker_connect.h"
#include "coordinator/runtime/local_runtime.h"
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

class WorkerFixture : public ::testing::Test {
 protected:
  void StartWorkers(int n, const std::string& division) {
    const std::string prefix = UniqueRegionPrefix();
    for (int i = 0; i < n; ++i) {
      WorkerProcessOptions o;
      o.binary = kWorkerBinary;
      o.socket = dir_.path() / absl::StrCat("w", i, ".sock");
      o.region_prefix = prefix;
      o.worker_index = i;
      o.num_workers = n;
      o.extra_args = {"--synthetic", "tiny",   "--synthetic_seed", absl::StrCat(kSeed),
                      "--division",  division, "--transport",      "shm",
                      "--threads",   "1",      "--arena_slot_mb",  "1"};
      o.log = dir_.path() / absl::StrCat("w", i, ".log");
      workers_.push_back(std::make_unique<WorkerProcess>(o));
      absl::Status started = workers_.back()->Start();
      ASSERT_OK(started);
    }
  }

  ScopedTempDir dir_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;  // stopped and reaped with the fixture
};

// ---- dead and hung workers, through the whole engine ----

class WorkerFailureTest : public WorkerFixture, public ::testing::WithParamInterface<std::string> {
 protected:
  static constexpr absl::Duration kCallTimeout = absl::Seconds(2);

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartWorkers(2, "split"));
    auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
    ASSERT_OK(model);
    auto fingerprint = FingerprintModel((*model)->config, *(*model)->weights->source);
    ASSERT_OK(fingerprint);
    auto transport = ParseWorkerTransport(GetParam());
    ASSERT_OK(transport);
    RemoteExpertExecutorOptions options;
    options.addresses = {workers_[0]->address(), workers_[1]->address()};
    options.transports = {*transport};
    options.call_timeout = kCallTimeout;
    options.expected_content = ExpectedExpertContent(**model, std::nullopt, 1);
    auto remote = RemoteExpertExecutor::Connect((*model)->config, *fingerprint, options);
    ASSERT_OK(remote);
    remote_ = std::move(*remote);
    LocalRuntimeOptions rt_options;
    rt_options.num_threads = 1;
    rt_options.expert_executor = remote_.get();
    rt_options.engine.dump = [this](std::string_view name, int layer, const float*, int64_t, int64_t) {
      if (on_moe_input_ && name == "moe_input") on_moe_input_(layer);
    };
    request_.prompt_ids = RandomTokens(16, (*model)->config.vocab_size, 77);
    request_.max_tokens = 8;
    request_.ignore_eos = true;
    auto rt = LocalRuntime::Create(std::move(*model), rt_options);
    ASSERT_OK(rt);
    rt_ = std::move(*rt);
    auto first = rt_->generator().Generate(request_);
    ASSERT_OK(first);
    want_ = Ids(*first);
  }

  std::unique_ptr<RemoteExpertExecutor> remote_;
  std::unique_ptr<LocalRuntime> rt_;  // declared after remote_: destroyed first
  std::function<void(int layer)> on_moe_input_;
  GenerationRequest request_;
  std::vector<int32_t> want_;
};

TEST_P(WorkerFailureTest, KilledWorkerFailsTheRequestAndIsReconnectedAfterRestart) {
  // Kill worker 1 in the middle of the 4th forward pass (before layer 1's experts).
  int passes = 0;
  absl::Time killed_at;
  on_moe_input_ = [&](int layer) {
    if (layer == 1 && ++passes == 4) {
      workers_[1]->Kill(SIGKILL);
      killed_at = absl::Now();
    }
  };
  auto failed = rt_->generator().Generate(request_);
  const absl::Duration took = absl::Now() - killed_at;
  on_moe_input_ = nullptr;
  ASSERT_FALSE(failed.ok());
  std::cerr << "killed worker: " << failed.status() << " (after " << took << ")\n";
  EXPECT_TRUE(absl::IsUnavailable(failed.status()) || absl::IsDeadlineExceeded(failed.status())) << failed.status();
  EXPECT_NE(failed.status().message().find("worker 1"), std::string::npos) << failed.status();
  EXPECT_LT(took, kCallTimeout + absl::Seconds(1)) << failed.status();

  // While it is down, requests fail fast and cleanly.
  const absl::Time start = absl::Now();
  auto down = rt_->generator().Generate(request_);
  ASSERT_FALSE(down.ok());
  std::cerr << "worker down: " << down.status() << "\n";
  EXPECT_TRUE(absl::IsUnavailable(down.status()) || absl::IsDeadlineExceeded(down.status())) << down.status();
  EXPECT_LT(absl::Now() - start, kCallTimeout + absl::Seconds(1));

  // Back: the next request is re-Described, re-checked and served.
  ASSERT_OK(workers_[1]->Start()) << workers_[1]->LogTail();
  auto again = rt_->generator().Generate(request_);
  ASSERT_OK(again);
  EXPECT_EQ(Ids(*again), want_);
  EXPECT_GE(remote_->stats()[1].reconnects, 1);
  EXPECT_GE(remote_->stats()[1].failures, 1);
}

TEST_P(WorkerFailureTest, HungWorkerIsDeadlineExceededAndServesAgainWhenResumed) {
  workers_[0]->Kill(SIGSTOP);
  const absl::Time start = absl::Now();
  auto hung = rt_->generator().Generate(request_);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(hung.ok());
  std::cerr << "hung worker: " << hung.status() << " (after " << took << ")\n";
  EXPECT_TRUE(absl::IsDeadlineExceeded(hung.status())) << hung.status();
  EXPECT_NE(hung.status().message().find("worker 0"), std::string::npos) << hung.status();
  EXPECT_GE(took, kCallTimeout - absl::Milliseconds(100));
  EXPECT_LT(took, kCallTimeout + absl::Seconds(1));

  workers_[0]->Kill(SIGCONT);
  auto again = rt_->generator().Generate(request_);
  ASSERT_OK(again);
  EXPECT_EQ(Ids(*again), want_);
}

INSTANTIATE_TEST_SUITE_P(Transports, WorkerFailureTest, ::testing::Values("inline", "shm-grpc", "shm"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

// ---- malformed requests, sent by hand ----

class MalformedRequestTest : public WorkerFixture {
 protected:
  static constexpr uint64_t kSession = 0x7e57;  // this test's claim on the worker

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartWorkers(1, "split"));
    channel_ = grpc::CreateChannel(workers_[0]->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::ExpertWorker::NewStub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ASSERT_OK(stub_->Describe(&context, ClaimRequest(kSession), &describe_));
    hidden_ = describe_.fingerprint().hidden_size();
    auto arena = ShmArena::Open(describe_.arena_region());
    ASSERT_OK(arena);
    arena_ = std::move(*arena);
  }

  // A valid request for layer 0, expert 1, `rows` rows: inputs written into
  // input slot 0, output to output slot 0 at offset 0.
  v1::RunExpertsRequest Valid(int64_t rows = 3) {
    const uint64_t in_seq = arena_->AdvanceSequence(ArenaSide::kInput, 0);
    const uint64_t out_seq = arena_->AdvanceSequence(ArenaSide::kOutput, 0);
    float* in = reinterpret_cast<float*>(arena_->slot_data(ArenaSide::kInput, 0));
    for (int64_t i = 0; i < rows * hidden_; ++i) in[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
    v1::RunExpertsRequest request;
    request.set_request_id(++request_id_);
    request.set_session(kSession);
    request.set_layer(0);
    request.set_transport(v1::TRANSPORT_SHM);
    v1::ExpertTask* task = request.add_tasks();
    task->set_expert(1);
    task->set_num_rows(rows);
    ToProto(ArenaTensorRef{ArenaSide::kInput, 0, 0, {rows, hidden_}, DType::kF32, in_seq}, task->mutable_shm_rows());
    ToProto(ArenaTensorRef{ArenaSide::kOutput, 0, 0, {rows, hidden_}, DType::kF32, out_seq},
            task->mutable_shm_output());
    return request;
  }

  absl::Status ViaGrpc(const v1::RunExpertsRequest& request, v1::RunExpertsResponse* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::RunExpertsResponse ignored;
    return FromGrpcStatus(stub_->RunExperts(&context, request, response ? response : &ignored));
  }

  absl::Status ViaDoorbell(const v1::RunExpertsRequest& request, v1::RunExpertsResponse* response = nullptr) {
    auto seq = arena_->PostRequest(request.SerializeAsString());
    if (!seq.ok()) return seq.status();
    std::string_view message;
    absl::Status status = arena_->AwaitResponse(*seq, absl::Now() + absl::Seconds(5), absl::Microseconds(50), &message);
    if (status.ok() && response != nullptr &&
        !response->ParseFromArray(message.data(), static_cast<int>(message.size()))) {
      return absl::DataLossError("response does not parse");
    }
    return status;
  }

  // Fills the first `bytes` of output slot 0 with a sentinel; true if still intact.
  void Poison(size_t bytes = 64 << 10) { std::memset(arena_->slot_data(ArenaSide::kOutput, 0), 0x5a, bytes); }
  bool Intact(size_t bytes = 64 << 10) const {
    const uint8_t* p = arena_->slot_data(ArenaSide::kOutput, 0);
    for (size_t i = 0; i < bytes; ++i)
      if (p[i] != 0x5a) return false;
    return true;
  }

  uint64_t Rejected() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsResponse stats;
    EXPECT_OK(stub_->Stats(&context, v1::StatsRequest(), &stats));
    return stats.rejected();
  }

  // The worker still serves both paths, and they agree with gRPC inline.
  void ExpectStillServing() {
    v1::RunExpertsResponse via_doorbell, via_grpc, via_inline;
    v1::RunExpertsRequest request = Valid();
    ASSERT_OK(ViaDoorbell(request, &via_doorbell));
    std::vector<float> doorbell_out(static_cast<size_t>(3 * hidden_));
    std::memcpy(doorbell_out.data(), arena_->slot_data(ArenaSide::kOutput, 0), doorbell_out.size() * sizeof(float));
    ASSERT_OK(ViaGrpc(Valid(), &via_grpc));
    EXPECT_EQ(
        std::memcmp(doorbell_out.data(), arena_->slot_data(ArenaSide::kOutput, 0), doorbell_out.size() * sizeof(float)),
        0);
    v1::RunExpertsRequest inline_request = Valid();
    inline_request.set_transport(v1::TRANSPORT_INLINE);
    v1::ExpertTask* task = inline_request.mutable_tasks(0);
    task->set_inline_rows(std::string(reinterpret_cast<const char*>(arena_->slot_data(ArenaSide::kInput, 0)),
                                      doorbell_out.size() * sizeof(float)));
    task->clear_shm_output();
    ASSERT_OK(ViaGrpc(inline_request, &via_inline));
    ASSERT_EQ(via_inline.results_size(), 1);
    ASSERT_EQ(via_inline.results(0).inline_output().size(), doorbell_out.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(doorbell_out.data(), via_inline.results(0).inline_output().data(),
                          doorbell_out.size() * sizeof(float)),
              0);
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ExpertWorker::Stub> stub_;
  v1::DescribeResponse describe_;
  int64_t hidden_ = 0;
  std::unique_ptr<ShmArena> arena_;
  uint64_t request_id_ = 0;
};

TEST_F(MalformedRequestTest, GarbageInTheDoorbellControlBlockIsRejected) {
  const std::string garbage(48, '\xff');  // an unterminated varint tag: never a valid message
  uint32_t seq = arena_->PostRawRequest(garbage, static_cast<uint32_t>(garbage.size()));
  std::string_view message;
  absl::Status status = arena_->AwaitResponse(seq, absl::Now() + absl::Seconds(5), absl::Microseconds(50), &message);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("does not parse"), std::string::npos) << status;

  seq = arena_->PostRawRequest("abc", 1u << 30);  // a length beyond the control block
  status = arena_->AwaitResponse(seq, absl::Now() + absl::Seconds(5), absl::Microseconds(50), &message);
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("claims"), std::string::npos) << status;

  // A message that parses but says nothing sensible (no transport).
  v1::RunExpertsRequest empty;
  empty.set_session(kSession);
  empty.set_layer(0);
  status = ViaDoorbell(empty);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_NE(status.message().find("transport"), std::string::npos) << status;

  EXPECT_EQ(Rejected(), 3u);
  ExpectStillServing();
}

TEST_F(MalformedRequestTest, DescriptorsOutsideTheArenaAreRejectedAndWriteNothing) {
  const uint64_t slot_bytes = arena_->slot_bytes();
  struct BadCase {
    std::string name;
    std::string expect;  // in the message
    std::function<void(v1::RunExpertsRequest&)> spoil;
  };
  const std::vector<BadCase> cases = {
      {"input past the slot end", "outside the slot",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->mutable_shm_rows()->set_offset(slot_bytes - 4); }},
      {"output past the slot end", "outside the slot",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->mutable_shm_output()->set_offset(slot_bytes - 64); }},
      {"offset wrapping around", "outside the slot",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->mutable_shm_output()->set_offset(~uint64_t{0} - 3); }},
      {"slot out of range", "slot 99 out of range",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->mutable_shm_rows()->set_slot(99); }},
      {"unaligned offset", "aligned",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->mutable_shm_rows()->set_offset(2); }},
      {"shape not [rows, hidden]", "shape",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->mutable_shm_rows()->set_shape(1, hidden_ - 1); }},
      {"dtype not f32", "dtype",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->mutable_shm_output()->set_dtype(v1::DTYPE_BF16); }},
      {"absurd row count", "num_rows",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->set_num_rows(int64_t{1} << 50); }},
      {"expert out of range", "expert 9", [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->set_expert(9); }},
      {"layer out of range", "layer 5", [&](v1::RunExpertsRequest& r) { r.set_layer(5); }},
      {"no output descriptor", "no shm_output",
       [&](v1::RunExpertsRequest& r) { r.mutable_tasks(0)->clear_shm_output(); }},
  };
  for (const BadCase& c : cases) {
    for (bool doorbell : {false, true}) {
      v1::RunExpertsRequest request = Valid();
      c.spoil(request);
      Poison();
      const absl::Status status = doorbell ? ViaDoorbell(request) : ViaGrpc(request);
      const std::string where = absl::StrCat(c.name, doorbell ? " (doorbell)" : " (gRPC)");
      EXPECT_TRUE(absl::IsInvalidArgument(status)) << where << ": " << status;
      EXPECT_NE(status.message().find(c.expect), std::string::npos) << where << ": " << status;
      EXPECT_TRUE(Intact()) << where << ": the output slot was written";
    }
  }
  EXPECT_EQ(Rejected(), 2 * cases.size());
  ExpectStillServing();
}

TEST_F(MalformedRequestTest, StaleOrWrongSequenceNumbersAreDataLoss) {
  for (bool doorbell : {false, true}) {
    // A replayed request: its slots have been reclaimed since.
    v1::RunExpertsRequest stale = Valid();
    Valid();  // advances both slots' sequences
    Poison();
    absl::Status status = doorbell ? ViaDoorbell(stale) : ViaGrpc(stale);
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_NE(status.message().find("sequence"), std::string::npos) << status;
    EXPECT_TRUE(Intact());

    // An output descriptor naming a sequence the slot has not reached.
    v1::RunExpertsRequest ahead = Valid();
    ahead.mutable_tasks(0)->mutable_shm_output()->set_sequence(ahead.tasks(0).shm_output().sequence() + 1);
    Poison();
    status = doorbell ? ViaDoorbell(ahead) : ViaGrpc(ahead);
    EXPECT_TRUE(absl::IsDataLoss(status)) << status;
    EXPECT_NE(status.message().find("sequence"), std::string::npos) << status;
    EXPECT_TRUE(Intact());
  }
  EXPECT_EQ(Rejected(), 4u);
  ExpectStillServing();
}

}  // namespace
}  // namespace tandem
