#include "tests/worker_process_testlib.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "tandem/v1/expert_worker.grpc.pb.h"
#include "tandem/v1/expert_worker_convert.h"
#include "tests/grpc_channel_testlib.h"

namespace tandem {

std::string UniqueRegionPrefix() {
  static std::atomic<int> counter{0};
  return absl::StrCat("/tandem-test-", getpid(), "-", counter.fetch_add(1));
}

absl::Status WaitForHealthy(const std::string& address, absl::Duration timeout) {
  auto stub = v1::ExpertWorker::NewStub(ChannelToChild(address));
  const absl::Time deadline = absl::Now() + timeout;
  grpc::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);  // see ChannelToChild
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    v1::HealthResponse response;
    last = stub->Health(&context, v1::HealthRequest(), &response);
    if (last.ok() && response.serving()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(address, " not healthy: ", last.error_message()));
}

WorkerProcess::WorkerProcess(WorkerProcessOptions options) : options_(std::move(options)) {}

v1::DescribeRequest ClaimRequest(uint64_t session) {
  v1::DescribeRequest request;
  request.set_protocol_version(kExpertWorkerProtocolVersion);
  request.set_session(session);
  request.set_coordinator_pid(getpid());
  request.set_coordinator(absl::StrCat("test pid ", getpid()));
  return request;
}

void UnlinkRegionsWithPrefix(const std::string& prefix) {
  // shm names are "/name"; /dev/shm lists "name".
  const std::string stem = prefix.substr(prefix.rfind('/') + 1);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    if (!stem.empty() && name.rfind(stem, 0) == 0) shm_unlink(("/" + name).c_str());
  }
}

WorkerProcess::~WorkerProcess() {
  Stop(absl::Seconds(3));
  // A worker that was SIGKILLed could not unlink its regions (random suffixes).
  UnlinkRegionsWithPrefix(experts_region() + "-");
  UnlinkRegionsWithPrefix(arena_region() + "-");
}

std::string WorkerProcess::experts_region() const {
  return absl::StrCat(options_.region_prefix, "-w", options_.worker_index, "-experts");
}
std::string WorkerProcess::arena_region() const {
  return absl::StrCat(options_.region_prefix, "-w", options_.worker_index, "-arena");
}

absl::Status WorkerProcess::Start(absl::Duration timeout) {
  if (process_.running()) return absl::FailedPreconditionError("worker already running");
  std::vector<std::string> args = {options_.binary,
                                   "--socket",
                                   options_.socket.string(),
                                   "--region_prefix",
                                   options_.region_prefix,
                                   "--worker_index",
                                   absl::StrCat(options_.worker_index),
                                   "--num_workers",
                                   absl::StrCat(options_.num_workers),
                                   "--exit_with_parent"};
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  if (absl::Status status = process_.Spawn(args, options_.log); !status.ok()) return status;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (process_.Exited(&status)) {
      return absl::InternalError(
          absl::StrCat("worker ", options_.worker_index, " exited during start-up (status ", status, "): ", LogTail()));
    }
    if (WaitForHealthy(address(), absl::Milliseconds(200)).ok()) return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat("worker ", options_.worker_index, " not healthy after ",
                                                  absl::FormatDuration(timeout), ": ", LogTail()));
}

void WorkerProcess::Kill(int signal) { process_.Kill(signal); }

int WorkerProcess::Stop(absl::Duration grace) { return process_.Stop(grace); }

}  // namespace tandem
