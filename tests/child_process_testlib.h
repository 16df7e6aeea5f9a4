// A child process for multi-process tests: spawned with posix_spawn (no
// signal blocked, stdout and stderr appended to a log file) and always
// cleaned up — the destructor stops it (SIGCONT + SIGTERM, then SIGKILL) and
// reaps it, so a failing test never leaks a process.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { Stop(absl::Seconds(3)); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // argv[0] is the binary. FailedPrecondition when already running.
  absl::Status Spawn(const std::vector<std::string>& argv, const std::filesystem::path& log);
  // Whether it has exited (then reaped; `status` gets waitpid's status).
  bool Exited(int* status = nullptr);
  // Sends `signal`; for SIGKILL/SIGTERM also reaps the process.
  void Kill(int signal);
  // SIGTERM, waits up to `grace` (then SIGKILL) and reaps; the exit code, or -1.
  int Stop(absl::Duration grace = absl::Seconds(5));

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  std::string LogTail(size_t bytes = 4000) const;

 private:
  pid_t pid_ = -1;
  std::filesystem::path log_;
};

}  // namespace tandem
