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
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem {

class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess() { Stop(absl::Seconds(3)); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // argv[0] is the binary; stdout and stderr appended to `log`.
  // FailedPrecondition when already running.
  absl::Status Spawn(const std::vector<std::string>& argv, const std::filesystem::path& log);
  // The same with stdout and stderr to separate files (truncated), stdin
  // from /dev/null, and `env` ("NAME=value") overriding this process's
  // environment.
  absl::Status Spawn(const std::vector<std::string>& argv, const std::filesystem::path& out,
                     const std::filesystem::path& err, const std::vector<std::string>& env);
  // Whether it has exited (then reaped; `status` gets waitpid's status).
  bool Exited(int* status = nullptr);
  // Sends `signal`; for SIGKILL/SIGTERM also reaps the process.
  void Kill(int signal);
  // SIGTERM, waits up to `grace` (then SIGKILL) and reaps; the exit code, or -1.
  int Stop(absl::Duration grace = absl::Seconds(5));
  // Waits up to `timeout` for it to exit; its waitpid status, or
  // DeadlineExceeded (it is still running; Stop or Kill it).
  absl::StatusOr<int> Wait(absl::Duration timeout);

  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  std::string LogTail(size_t bytes = 4000) const;

 private:
  absl::Status SpawnWith(const std::vector<std::string>& argv, void* file_actions, const std::vector<std::string>& env);

  pid_t pid_ = -1;
  std::filesystem::path log_;
};

// A second user for tests of who may reach what: "nobody". Running a
// command as it needs root and setpriv(1); CanRunAsOtherUser says why not
// (for GTEST_SKIP) when that is impossible here.
inline constexpr uid_t kOtherUid = 65534;
inline constexpr gid_t kOtherGid = 65534;
bool CanRunAsOtherUser(std::string* why_not);
// argv prefixed with setpriv --reuid/--regid kOtherUid --clear-groups.
std::vector<std::string> AsOtherUser(std::vector<std::string> argv);

}  // namespace tandem
