// Health that tells the truth, with a real tandem-server and two real
// tandem-cpu-worker processes: while a worker is killed or stopped, the
// grpc.health.v1 service says NOT_SERVING, HTTP /health answers 503 and
// GetStats marks that worker unhealthy (requests would fail); once it is back
// all three say so again, however many requests failed during the outage
// (the worker's health is its state now, not failures <= reconnects). Over
// HTTP every request failed by the outage is the same retryable 503, whether
// the worker refused the connection (killed) or did not answer (stopped).
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/http_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

constexpr char kSeed[] = "7";
const char kWorkerBinary[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";

// grpc.health.v1.HealthCheckResponse.ServingStatus
constexpr int kServing = 1;
constexpr int kNotServing = 2;

// grpc.health.v1.Health/Check for the whole server (service ""), by hand:
// the request is the empty message, the response `status` (field 1,
// varint). The status, or the call's error.
absl::StatusOr<int> HealthCheck(const std::string& address) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  grpc::ByteBuffer request;  // empty: service ""
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  if (!cq.Next(&tag, &ok) || !ok) return absl::InternalError("health check: completion queue failed");
  if (!status.ok()) return absl::UnavailableError(absl::StrCat("health check: ", status.error_message()));
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("health check: unreadable response");
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  if (bytes.empty()) return 0;  // UNKNOWN (the default value is not sent)
  if (bytes.size() != 2 || bytes[0] != 0x08) return absl::InternalError("health check: unexpected response bytes");
  return static_cast<int>(bytes[1]);
}

class ServerHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string prefix = UniqueRegionPrefix();
    std::vector<std::string> addresses;
    for (int i = 0; i < 2; ++i) {
      WorkerProcessOptions o;
      o.binary = kWorkerBinary;
      o.socket = dir_.path() / absl::StrCat("w", i, ".sock");
      o.region_prefix = prefix;
      o.worker_index = i;
      o.num_workers = 2;
      o.extra_args = {"--synthetic", "tiny", "--synthetic_seed", kSeed, "--division", "split",
                      "--threads",   "1",    "--arena_slot_mb",  "1"};
      o.log = dir_.path() / absl::StrCat("w", i, ".log");
      workers_.push_back(std::make_unique<WorkerProcess>(o));
      ASSERT_OK(workers_.back()->Start());
      addresses.push_back(workers_.back()->address());
    }
    auto server = StartHttpServer(
        {}, dir_.path(),
        {"--synthetic", "tiny", "--synthetic_seed", kSeed, "--workers", absl::StrCat(addresses[0], ",", addresses[1]),
         "--threads", "1", "--worker_timeout_ms", "2000"},
        "server");
    ASSERT_OK(server);
    server_ = std::move(*server);
    stub_ = server_.server->NewStub();
  }

  // Polls until grpc.health.v1 reports `want` (within `timeout`).
  bool AwaitHealth(int want, absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    absl::StatusOr<int> got;
    while (absl::Now() < deadline) {
      got = HealthCheck(server_.server->address());
      if (got.ok() && *got == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ADD_FAILURE() << "health never became " << want << ": last "
                  << (got.ok() ? absl::StrCat(*got) : got.status().ToString()) << "\n"
                  << server_.server->LogTail();
    return false;
  }

  std::vector<bool> WorkersHealthy() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ServerStats stats;
    const grpc::Status status = stub_->GetStats(&context, v1::GetStatsRequest(), &stats);
    EXPECT_TRUE(status.ok()) << status.error_message();
    std::vector<bool> out;
    for (const v1::WorkerHealth& w : stats.workers()) out.push_back(w.healthy());
    return out;
  }

  int HttpHealth() {
    absl::StatusOr<HttpReply> reply = HttpGet(server_.port, "/health");
    return reply.ok() ? reply->status : -1;
  }

  // An HTTP completion's status and error code.
  std::pair<int, std::string> HttpCompletion() {
    absl::StatusOr<HttpReply> reply =
        HttpPost(server_.port, "/v1/completions",
                 nlohmann::json{{"prompt", {1, 17, 33, 71, 5, 9}}, {"max_tokens", 6}, {"temperature", 0}});
    if (!reply.ok()) return {-1, reply.status().ToString()};
    std::string code;
    if (reply->json.is_object() && reply->json.contains("error") && reply->json["error"]["code"].is_string()) {
      code = reply->json["error"]["code"];
    }
    return {reply->status, code};
  }

  // A greedy generation: its ids, or the call's status.
  absl::StatusOr<std::vector<int32_t>> Generate() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::GenerateRequest request;
    for (int32_t id : {1, 17, 33, 71, 5, 9}) request.add_prompt_ids(id);
    request.set_max_tokens(6);
    request.set_temperature(0.0f);
    request.set_ignore_eos(true);
    auto reader = stub_->Generate(&context, request);
    std::vector<int32_t> ids;
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      for (const v1::Token& t : response.tokens()) ids.push_back(t.id());
    }
    const grpc::Status status = reader->Finish();
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    }
    return ids;
  }

  ScopedTempDir dir_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
  HttpServerProcess server_;  // declared after the workers: stopped first
  std::unique_ptr<v1::Inference::Stub> stub_;
};

TEST_F(ServerHealthTest, KilledWorkerIsNotServingUntilRestarted) {
  ASSERT_TRUE(AwaitHealth(kServing));
  EXPECT_EQ(HttpHealth(), 200);
  auto want = Generate();
  ASSERT_OK(want);

  workers_[1]->Kill(SIGKILL);
  ASSERT_TRUE(AwaitHealth(kNotServing));
  EXPECT_EQ(HttpHealth(), 503);
  EXPECT_EQ(WorkersHealthy(), (std::vector<bool>{true, false}));
  // Several failed requests in one outage (each a failure, none a reconnect).
  for (int i = 0; i < 3; ++i) {
    auto failed = Generate();
    ASSERT_FALSE(failed.ok());
    EXPECT_TRUE(absl::IsUnavailable(failed.status()) || absl::IsDeadlineExceeded(failed.status())) << failed.status();
    EXPECT_EQ(HttpCompletion().first, 503);
  }

  ASSERT_OK(workers_[1]->Start()) << workers_[1]->LogTail();
  // Back before any request re-Describes it.
  ASSERT_TRUE(AwaitHealth(kServing));
  EXPECT_EQ(HttpHealth(), 200);
  EXPECT_EQ(WorkersHealthy(), (std::vector<bool>{true, true}));
  auto again = Generate();
  ASSERT_OK(again);
  EXPECT_EQ(*again, *want);
  EXPECT_EQ(WorkersHealthy(), (std::vector<bool>{true, true}));
}

TEST_F(ServerHealthTest, StoppedWorkerIsNotServingUntilResumed) {
  ASSERT_TRUE(AwaitHealth(kServing));
  workers_[0]->Kill(SIGSTOP);
  ASSERT_TRUE(AwaitHealth(kNotServing));
  EXPECT_EQ(HttpHealth(), 503);
  EXPECT_EQ(WorkersHealthy(), (std::vector<bool>{false, true}));
  // A worker that does not answer: 503 as for one that is gone, not 504.
  EXPECT_EQ(HttpCompletion(), (std::pair<int, std::string>{503, "worker_unavailable"}));
  workers_[0]->Kill(SIGCONT);
  ASSERT_TRUE(AwaitHealth(kServing));
  EXPECT_EQ(HttpHealth(), 200);
  EXPECT_EQ(WorkersHealthy(), (std::vector<bool>{true, true}));
  ASSERT_OK(Generate());
}

}  // namespace
}  // namespace tandem
