#include "tests/child_process_testlib.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace tandem {

absl::Status ChildProcess::Spawn(const std::vector<std::string>& args, const std::filesystem::path& log) {
  log_ = log;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  absl::Status status = SpawnWith(args, &actions, {});
  posix_spawn_file_actions_destroy(&actions);
  return status;
}

absl::Status ChildProcess::Spawn(const std::vector<std::string>& args, const std::filesystem::path& out,
                                 const std::filesystem::path& err, const std::vector<std::string>& env) {
  log_ = err;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  absl::Status status = SpawnWith(args, &actions, env);
  posix_spawn_file_actions_destroy(&actions);
  return status;
}

absl::Status ChildProcess::SpawnWith(const std::vector<std::string>& args, void* file_actions,
                                     const std::vector<std::string>& env) {
  if (pid_ > 0) return absl::FailedPreconditionError("process already running");
  if (args.empty()) return absl::InvalidArgumentError("no binary to spawn");
  // This process's environment, with `env` overriding variables of the same name.
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    vars[var.substr(0, var.find('='))] = var;
  }
  for (const std::string& var : env) vars[var.substr(0, var.find('='))] = var;
  std::vector<std::string> strings = args;
  for (const auto& [name, var] : vars) strings.push_back(var);
  std::vector<char*> argv, envp;
  for (size_t i = 0; i < strings.size(); ++i) (i < args.size() ? argv : envp).push_back(strings[i].data());
  argv.push_back(nullptr);
  envp.push_back(nullptr);

  // The test process may block signals in its threads; the child starts with none blocked.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, argv[0], static_cast<posix_spawn_file_actions_t*>(file_actions), &attr, argv.data(),
                              envp.data());
  posix_spawnattr_destroy(&attr);
  if (err != 0) return absl::InternalError(absl::StrCat("posix_spawn ", args[0], ": ", strerror(err)));
  pid_ = pid;
  return absl::OkStatus();
}

absl::StatusOr<int> ChildProcess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (!Exited(&status)) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("still running after ", absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return status;
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
      const bool exited = r == pid_ && WIFEXITED(status);  // before pid_ is reset (it used to compare with -1)
      pid_ = -1;
      return exited ? WEXITSTATUS(status) : -1;
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

bool CanRunAsOtherUser(std::string* why_not) {
  if (geteuid() != 0) {
    *why_not = "needs root to run a command as a second user (uid 65534) with setpriv";
    return false;
  }
  if (access("/usr/bin/setpriv", X_OK) != 0) {
    *why_not = "needs /usr/bin/setpriv (util-linux) to run a command as a second user";
    return false;
  }
  return true;
}

std::vector<std::string> AsOtherUser(std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"/usr/bin/setpriv", absl::StrCat("--reuid=", kOtherUid),
                             absl::StrCat("--regid=", kOtherGid), "--clear-groups"});
  return argv;
}

}  // namespace tandem
