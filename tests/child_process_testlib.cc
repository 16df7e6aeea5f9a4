#include "tests/child_process_testlib.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace tandem {

absl::Status ChildProcess::Spawn(const std::vector<std::string>& args, const std::filesystem::path& log) {
  if (pid_ > 0) return absl::FailedPreconditionError("process already running");
  if (args.empty()) return absl::InvalidArgumentError("no binary to spawn");
  log_ = log;
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // The test process may block signals in its threads; the child starts with none blocked.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, copy[0].c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return absl::InternalError(absl::StrCat("posix_spawn ", copy[0], ": ", strerror(err)));
  pid_ = pid;
  return absl::OkStatus();
}

bool ChildProcess::Exited(int* status) {
  if (pid_ <= 0) return true;
  int s = 0;
  if (waitpid(pid_, &s, WNOHANG) != pid_) return false;
  pid_ = -1;
  if (status != nullptr) *status = s;
  return true;
}

void ChildProcess::Kill(int signal) {
  if (pid_ <= 0) return;
  kill(pid_, signal);
  if (signal == SIGKILL || signal == SIGTERM) {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
}

int ChildProcess::Stop(absl::Duration grace) {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGCONT);  // a stopped (hung-test) child must run to see SIGTERM
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

std::string ChildProcess::LogTail(size_t bytes) const {
  std::ifstream in(log_);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

}  // namespace tandem
