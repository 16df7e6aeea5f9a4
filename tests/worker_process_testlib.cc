#include "tests/worker_process_testlib.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "tandem/v1/expert_worker.grpc.pb.h"

extern char** environ;

namespace tandem {

std::string UniqueRegionPrefix() {
  static std::atomic<int> counter{0};
  return absl::StrCat("/tandem-test-", getpid(), "-", counter.fetch_add(1));
}

absl::Status WaitForHealthy(const std::string& address, absl::Duration timeout) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = v1::ExpertWorker::NewStub(channel);
  const absl::Time deadline = absl::Now() + timeout;
  grpc::Status last;
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    v1::HealthResponse response;
    last = stub->Health(&context, v1::HealthRequest(), &response);
    if (last.ok() && response.serving()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(address, " not healthy: ", last.error_message()));
}

WorkerProcess::WorkerProcess(WorkerProcessOptions options) : options_(std::move(options)) {}

WorkerProcess::~WorkerProcess() {
  Stop(absl::Seconds(3));
  // A worker that was SIGKILLed could not unlink its regions.
  shm_unlink(experts_region().c_str());
  shm_unlink(arena_region().c_str());
}

std::string WorkerProcess::experts_region() const {
  return absl::StrCat(options_.region_prefix, "-w", options_.worker_index, "-experts");
}
std::string WorkerProcess::arena_region() const {
  return absl::StrCat(options_.region_prefix, "-w", options_.worker_index, "-arena");
}

absl::Status WorkerProcess::Start(absl::Duration timeout) {
  if (pid_ > 0) return absl::FailedPreconditionError("worker already running");
  std::vector<std::string> args = {options_.binary,
                                   "--socket", options_.socket.string(),
                                   "--region_prefix", options_.region_prefix,
                                   "--worker_index", absl::StrCat(options_.worker_index),
                                   "--num_workers", absl::StrCat(options_.num_workers),
                                   "--exit_with_parent"};
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, options_.log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // The test process may block signals in its threads; the worker starts with none blocked.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, options_.binary.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return absl::InternalError(absl::StrCat("posix_spawn ", options_.binary, ": ", strerror(err)));
  pid_ = pid;

  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("worker ", options_.worker_index, " exited during start-up (status ",
                                              status, "): ", LogTail()));
    }
    if (WaitForHealthy(address(), absl::Milliseconds(200)).ok()) return absl::OkStatus();
  }
  return absl::DeadlineExceededError(absl::StrCat("worker ", options_.worker_index, " not healthy after ",
                                                  absl::FormatDuration(timeout), ": ", LogTail()));
}

void WorkerProcess::Kill(int signal) {
  if (pid_ <= 0) return;
  kill(pid_, signal);
  if (signal == SIGKILL || signal == SIGTERM) {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

int WorkerProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGCONT);  // a stopped (hung-test) worker must run to see SIGTERM
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + grace;
  int status = 0;
  while (absl::Now() < deadline) {
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_ || r < 0) {
      pid_ = -1;
      return r == pid_ && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1;
}

std::string WorkerProcess::LogTail(size_t bytes) const {
  std::ifstream in(options_.log);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

}  // namespace tandem
