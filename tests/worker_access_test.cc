// Who may use a CPU worker, and how (issue 15, items 4, 10 and 12), with
// real tandem-cpu-worker processes on unix sockets in a temp dir:
//  - a protocol version the worker does not speak is refused (it answered
//    version 999 before);
//  - one coordinator at a time: a second tandem-server pointed at workers in
//    use is refused at start-up and the first keeps its exact tokens; once
//    the first releases them (or dies) another may take them;
//  - RunExperts and Calibrate need the holder's session; Calibrate's row
//    list and repetitions are bounded and it stops at the caller's deadline
//    instead of computing on long after it;
//  - a connection from another user is closed unanswered (SO_PEERCRED),
//    even when the socket's permissions would let it in;
//  - shm region names are random (another user squatting the predictable
//    names does not stop a worker), 0600, and a killed worker's successor
//    still removes the regions it left behind.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/platform/shm_region.h"
#include "coordinator/orchestration/remote_expert_executor.h"
#include "coordinator/orchestration/worker_connect.h"
#include "coordinator/runtime/local_runtime.h"
#include "gtest/gtest.h"
#include "tandem/v1/expert_worker.grpc.pb.h"
#include "tandem/v1/expert_worker_convert.h"
#include "tests/child_process_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 7;
const char kWorkerBinary[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";
const char kServer[] = TANDEM_BINARY_DIR "/bin/tandem-server";

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(5)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

class WorkerAccessTest : public ::testing::Test {
 protected:
  void StartWorkers(int n, const std::string& prefix = UniqueRegionPrefix()) {
    for (int i = 0; i < n; ++i) {
      WorkerProcessOptions o;
      o.binary = kWorkerBinary;
      o.socket = dir_.path() / absl::StrCat("w", i, ".sock");
      o.region_prefix = prefix;
      o.worker_index = i;
      o.num_workers = n;
      o.extra_args = {"--synthetic", "tiny",  "--synthetic_seed", absl::StrCat(kSeed),
                      "--division",  "split", "--transport",      "shm",
                      "--threads",   "1",     "--arena_slot_mb",  "1"};
      o.log = dir_.path() / absl::StrCat("w", i, ".log");
      workers_.push_back(std::make_unique<WorkerProcess>(o));
      ASSERT_OK(workers_.back()->Start());
    }
  }
  std::unique_ptr<v1::ExpertWorker::Stub> Stub(int i = 0) {
    return v1::ExpertWorker::NewStub(
        grpc::CreateChannel(workers_[static_cast<size_t>(i)]->address(), grpc::InsecureChannelCredentials()));
  }
  std::string Addresses() const {
    std::string out;
    for (const auto& w : workers_) absl::StrAppend(&out, out.empty() ? "" : ",", w->address());
    return out;
  }
  static std::unique_ptr<Model> Tiny() {
    auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
    EXPECT_OK(model);
    return model.ok() ? std::move(*model) : nullptr;
  }
  // An in-process coordinator over the workers, with its runtime.
  struct Coordinator {
    std::unique_ptr<RemoteExpertExecutor> remote;
    std::unique_ptr<LocalRuntime> runtime;  // after remote: destroyed first
  };
  absl::StatusOr<Coordinator> Connect() {
    std::unique_ptr<Model> model = Tiny();
    if (model == nullptr) return absl::InternalError("no model");
    WorkerConnectSettings settings;
    settings.addresses = Addresses();
    settings.connect_timeout = absl::Seconds(5);
    Coordinator c;
    TANDEM_ASSIGN_OR_RETURN(c.remote, ConnectExpertWorkers(*model, settings));
    LocalRuntimeOptions options;
    options.num_threads = 1;
    options.expert_executor = c.remote.get();
    TANDEM_ASSIGN_OR_RETURN(c.runtime, LocalRuntime::Create(std::move(model), options));
    return c;
  }
  static absl::StatusOr<std::vector<int32_t>> Greedy(LocalRuntime& runtime) {
    GenerationRequest request;
    request.prompt_ids = RandomTokens(12, runtime.model().config.vocab_size, 31);
    request.max_tokens = 6;
    request.ignore_eos = true;
    TANDEM_ASSIGN_OR_RETURN(GenerationResult result, runtime.generator().Generate(request));
    std::vector<int32_t> ids;
    for (const GeneratedToken& t : result.tokens) ids.push_back(t.id);
    return ids;
  }
  // tandem-server over our workers, run until it exits or `timeout`.
  absl::StatusOr<ProcessResult> ServerOverWorkers(absl::Duration timeout) {
    return RunProcess(
        {kServer, "--synthetic", "tiny", "--synthetic_seed", absl::StrCat(kSeed), "--threads", "1", "--workers",
         Addresses(), "--connect_timeout_ms", "5000", "--listen", "unix:" + (dir_.path() / "second.sock").string()},
        {}, dir_.path(), timeout);
  }

  ScopedTempDir dir_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;  // stopped and reaped with the fixture
};

TEST_F(WorkerAccessTest, AProtocolVersionItDoesNotSpeakIsRefused) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(1));
  auto stub = Stub();
  for (uint32_t version : {0u, 1u, 999u}) {
    v1::DescribeRequest request = ClaimRequest(1);
    request.set_protocol_version(version);
    v1::DescribeResponse response;
    const grpc::Status status = stub->Describe(Context().get(), request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << version;
    EXPECT_NE(status.error_message().find(absl::StrCat("version ", kExpertWorkerProtocolVersion)), std::string::npos)
        << status.error_message();
    EXPECT_NE(status.error_message().find(absl::StrCat("caller version ", version)), std::string::npos)
        << status.error_message();
  }
  v1::DescribeResponse response;
  const grpc::Status no_session = stub->Describe(Context().get(), ClaimRequest(0), &response);
  EXPECT_EQ(no_session.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << no_session.error_message();
}

TEST_F(WorkerAccessTest, RunExpertsAndCalibrateNeedTheHoldersSession) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(1));
  auto stub = Stub();
  v1::RunExpertsRequest run;
  run.set_layer(0);
  run.set_transport(v1::TRANSPORT_INLINE);
  run.set_session(42);
  v1::RunExpertsResponse ran;
  grpc::Status status = stub->RunExperts(Context().get(), run, &ran);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("serves no coordinator"), std::string::npos) << status.error_message();

  v1::DescribeResponse described;
  ASSERT_OK(stub->Describe(Context().get(), ClaimRequest(41), &described));
  status = stub->RunExperts(Context().get(), run, &ran);  // session 42, held by 41
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("000000000000002a"), std::string::npos) << status.error_message();
  v1::CalibrateRequest calibrate;
  calibrate.set_layer(0);
  calibrate.set_expert(0);
  calibrate.add_rows(1);
  calibrate.set_session(42);
  v1::CalibrateResponse points;
  status = stub->Calibrate(Context().get(), calibrate, &points);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  calibrate.set_session(41);
  EXPECT_OK(stub->Calibrate(Context().get(), calibrate, &points));
}

// The reproduction: a second server pointed at running workers.
// It is refused, the first keeps serving the same tokens; once the first is
// gone the workers are free again.
TEST_F(WorkerAccessTest, OneCoordinatorAtATime) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(2));
  absl::StatusOr<Coordinator> first = Connect();
  ASSERT_OK(first);
  auto before = Greedy(*first->runtime);
  ASSERT_OK(before);

  auto second = ServerOverWorkers(absl::Seconds(60));
  ASSERT_OK(second);
  EXPECT_EQ(second->exit_code, 1) << second->err;
  EXPECT_NE(second->err.find("already serves coordinator"), std::string::npos) << second->err;
  EXPECT_NE(second->err.find(absl::StrCat("pid ", getpid())), std::string::npos) << second->err;

  auto after = Greedy(*first->runtime);
  ASSERT_OK(after) << "the first coordinator was disturbed by the second";
  EXPECT_EQ(*after, *before);
  for (const RemoteWorkerStats& s : first->remote->stats()) EXPECT_EQ(s.failures, 0) << s.address;

  // Released (the executor's destructor): another coordinator may connect.
  first->runtime.reset();
  first->remote.reset();
  ChildProcess server;
  ASSERT_OK(server.Spawn({kServer, "--synthetic", "tiny", "--synthetic_seed", absl::StrCat(kSeed), "--threads", "1",
                          "--workers", Addresses(), "--connect_timeout_ms", "5000", "--listen",
                          "unix:" + (dir_.path() / "third.sock").string(), "--exit_with_parent"},
                         dir_.path() / "third.log"));
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!fs::exists(dir_.path() / "third.sock") && absl::Now() < deadline && !server.Exited()) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(fs::exists(dir_.path() / "third.sock")) << server.LogTail();

  // A holder that died frees the workers without a Release.
  server.Kill(SIGKILL);
  absl::StatusOr<Coordinator> fourth = Connect();
  ASSERT_OK(fourth);
  auto again = Greedy(*fourth->runtime);
  ASSERT_OK(again);
  EXPECT_EQ(*again, *before);
}

TEST_F(WorkerAccessTest, CalibrateIsBoundedAndStopsAtTheCallersDeadline) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(1));
  auto stub = Stub();
  v1::DescribeResponse described;
  ASSERT_OK(stub->Describe(Context().get(), ClaimRequest(7), &described));
  auto base = [&] {
    v1::CalibrateRequest c;
    c.set_layer(described.experts(0).layer());
    c.set_expert(described.experts(0).expert());
    c.set_session(7);
    return c;
  };
  v1::CalibrateResponse points;
  v1::CalibrateRequest too_many = base();
  for (int i = 0; i < kMaxCalibrateRowCounts + 1; ++i) too_many.add_rows(1);
  grpc::Status status = stub->Calibrate(Context().get(), too_many, &points);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  v1::CalibrateRequest too_large = base();
  too_large.add_rows(kMaxCalibrateRows + 1);
  status = stub->Calibrate(Context().get(), too_large, &points);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  v1::CalibrateRequest too_often = base();
  too_often.add_rows(1);
  too_often.set_reps(kMaxCalibrateReps + 1);
  status = stub->Calibrate(Context().get(), too_often, &points);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();

  // The most a call may ask (minutes of work) with a 300 ms deadline: the
  // worker gives up at the deadline and is free again at once.
  v1::CalibrateRequest huge = base();
  for (int i = 0; i < kMaxCalibrateRowCounts; ++i) huge.add_rows(kMaxCalibrateRows);
  huge.set_reps(kMaxCalibrateReps);
  status = stub->Calibrate(Context(absl::Milliseconds(300)).get(), huge, &points);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  const absl::Time start = absl::Now();
  v1::CalibrateRequest small = base();
  small.add_rows(1);
  small.set_reps(1);
  ASSERT_OK(stub->Calibrate(Context(absl::Seconds(30)).get(), small, &points));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "the worker kept computing after the caller's deadline";
}

// SO_PEERCRED: another user connecting (the socket made 0666 and its folder
// 0755 by a careless operator) is closed without a byte; we are answered.
TEST_F(WorkerAccessTest, ConnectionsFromAnotherUserAreClosed) {
  std::string why;
  if (!CanRunAsOtherUser(&why)) GTEST_SKIP() << why;
  if (std::string(TANDEM_PYTHON3).empty()) GTEST_SKIP() << "needs python3 for the raw client";
  ASSERT_NO_FATAL_FAILURE(StartWorkers(1));
  ASSERT_EQ(chmod(dir_.path().c_str(), 0755), 0);
  const fs::path socket = workers_[0]->options().socket;
  struct stat st {};
  ASSERT_EQ(stat(socket.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "the worker's socket is 0600";
  ASSERT_EQ(chmod(socket.c_str(), 0666), 0);
  // An HTTP/2 preface and an empty SETTINGS frame: a gRPC server answers with its SETTINGS.
  const std::string client =
      "import socket, sys\n"
      "s = socket.socket(socket.AF_UNIX)\n"
      "s.settimeout(5)\n"
      "s.connect(sys.argv[1])\n"
      "try:\n"
      "    s.sendall(b'PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))\n"
      "    data = s.recv(100)\n"
      "except (ConnectionResetError, BrokenPipeError):  # closed before or while we wrote\n"
      "    data = b''\n"
      "except socket.timeout:\n"
      "    print('timeout'); sys.exit(0)\n"
      "print('closed' if not data else 'answered')\n";
  auto theirs =
      RunProcess(AsOtherUser({TANDEM_PYTHON3, "-c", client, socket.string()}), {}, dir_.path(), absl::Seconds(30));
  ASSERT_OK(theirs);
  EXPECT_EQ(theirs->out, "closed\n") << theirs->err;
  auto ours = RunProcess({TANDEM_PYTHON3, "-c", client, socket.string()}, {}, dir_.path(), absl::Seconds(30));
  ASSERT_OK(ours);
  EXPECT_EQ(ours->out, "answered\n") << ours->err;

  v1::StatsResponse stats;
  ASSERT_OK(Stub()->Stats(Context().get(), v1::StatsRequest(), &stats));
  EXPECT_EQ(stats.refused_connections(), 1u);
  EXPECT_NE(workers_[0]->LogTail().find("refused a connection"), std::string::npos) << workers_[0]->LogTail();
  EXPECT_NE(workers_[0]->LogTail().find(absl::StrCat("uid ", kOtherUid)), std::string::npos);
}

// Region names end in 16 random hex digits: someone who creates the names a
// worker used to take (prefix-w0-experts, -arena) blocks nothing.
TEST_F(WorkerAccessTest, SquattedRegionNamesDoNotStopAWorker) {
  const std::string prefix = UniqueRegionPrefix();
  std::vector<std::string> squatted = {absl::StrCat(prefix, "-w0-experts"), absl::StrCat(prefix, "-w0-arena")};
  const bool root = geteuid() == 0;
  for (const std::string& name : squatted) {
    const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0644);
    ASSERT_GE(fd, 0) << name;
    if (root) {
      EXPECT_EQ(fchown(fd, kOtherUid, kOtherGid), 0);
    }
    close(fd);
  }
  ASSERT_NO_FATAL_FAILURE(StartWorkers(1, prefix));
  v1::DescribeResponse d;
  ASSERT_OK(Stub()->Describe(Context().get(), ClaimRequest(5), &d));
  for (const std::string& region : {d.weights_region(), d.arena_region()}) {
    EXPECT_EQ(std::find(squatted.begin(), squatted.end(), region), squatted.end()) << region;
    EXPECT_TRUE(region.rfind(squatted[0] + "-", 0) == 0 || region.rfind(squatted[1] + "-", 0) == 0) << region;
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm" + region).c_str(), &st), 0) << region;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << region;
    EXPECT_EQ(st.st_uid, geteuid()) << region;
  }

  // Mapping a region of another user is refused; creating a fixed name
  // another user holds says so.
  if (root) {
    auto theirs = ShmRegion::Open(squatted[0], ShmAccess::kReadOnly);
    EXPECT_TRUE(absl::IsPermissionDenied(theirs.status())) << theirs.status();
    auto create = ShmRegion::Create(squatted[1], 4096);
    EXPECT_TRUE(absl::IsAlreadyExists(create.status())) << create.status();
    EXPECT_NE(create.status().message().find("another user"), std::string::npos) << create.status();
  }
  auto a = ShmRegion::Create(prefix + "-u", 4096, {.unique_suffix = true});
  auto b = ShmRegion::Create(prefix + "-u", 4096, {.unique_suffix = true});
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_NE(a->name(), b->name());

  // A killed worker's regions (random names) are removed by its successor,
  // which finds them listed in the socket's lock file.
  workers_[0]->Kill(SIGKILL);
  ASSERT_OK(workers_[0]->Start());
  for (const std::string& old : {d.weights_region(), d.arena_region()}) {
    EXPECT_FALSE(fs::exists("/dev/shm" + old)) << old << " of the killed worker is still there";
  }
  for (const std::string& name : squatted) shm_unlink(name.c_str());
}

}  // namespace
}  // namespace tandem
