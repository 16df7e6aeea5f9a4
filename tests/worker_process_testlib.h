// Real tandem-cpu-worker processes for multi-process tests: a ChildProcess
// on a unix socket in a test temp dir, and always cleaned up — the destructor
// stops the process, reaps it and unlinks the shm regions it may have left
// behind, so a failing test never leaks a process or a region.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tandem/v1/expert_worker.pb.h"
#include "tests/child_process_testlib.h"

namespace tandem {

struct WorkerProcessOptions {
  std::string binary;  // TANDEM_BINARY_DIR "/bin/tandem-cpu-worker"
  std::filesystem::path socket;
  std::string region_prefix;  // "/tandem-test-..."; unique per test
  int worker_index = 0;
  int num_workers = 1;
  std::vector<std::string> extra_args;  // e.g. --synthetic tiny --division split --transport shm
  std::filesystem::path log;
};

class WorkerProcess {
 public:
  explicit WorkerProcess(WorkerProcessOptions options);
  ~WorkerProcess();
  WorkerProcess(const WorkerProcess&) = delete;
  WorkerProcess& operator=(const WorkerProcess&) = delete;

  // Spawns the worker (again, after Kill) and waits until it answers Health.
  absl::Status Start(absl::Duration timeout = absl::Seconds(30));
  // Sends `signal`; for SIGKILL/SIGTERM also reaps the process.
  void Kill(int signal);
  // SIGTERM, waits (then SIGKILL) and reaps; the exit status, or -1.
  int Stop(absl::Duration grace = absl::Seconds(5));

  pid_t pid() const { return process_.pid(); }
  bool running() const { return process_.running(); }
  std::string address() const { return "unix:" + options_.socket.string(); }
  const WorkerProcessOptions& options() const { return options_; }
  // The region names without the random suffix the worker appends
  // ("<prefix>-w<i>-experts"; the worker's is that, "-", 16 hex digits).
  std::string experts_region() const;
  std::string arena_region() const;
  std::string LogTail(size_t bytes = 4000) const { return process_.LogTail(bytes); }

 private:
  WorkerProcessOptions options_;
  ChildProcess process_;
};

// A region prefix unique to this process and call: "/tandem-test-<pid>-<n>".
std::string UniqueRegionPrefix();

// Polls Health on `address` until it answers or `timeout` passes.
absl::Status WaitForHealthy(const std::string& address, absl::Duration timeout);

// A Describe that claims the worker for `session` (nonzero), at this
// build's protocol version: what a coordinator sends first.
v1::DescribeRequest ClaimRequest(uint64_t session);

// Unlinks every shm region whose name starts with `prefix` (as /dev/shm
// lists them): what a SIGKILLed worker could not remove.
void UnlinkRegionsWithPrefix(const std::string& prefix);

}  // namespace tandem
