#include "tests/sdk_testlib.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/local_runtime.h"
#include "common/synthetic_model.h"

extern char** environ;

namespace tandem {
namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                         const std::filesystem::path& work_dir, absl::Duration timeout) {
  if (argv.empty()) return absl::InvalidArgumentError("no binary to run");
  static std::atomic<int> counter{0};
  const int n = counter.fetch_add(1);
  const std::filesystem::path out = work_dir / absl::StrCat("run-", getpid(), "-", n, ".out");
  const std::filesystem::path err = work_dir / absl::StrCat("run-", getpid(), "-", n, ".err");

  // Ours, with `env` overriding variables of the same name.
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    vars[var.substr(0, var.find('='))] = var;
  }
  for (const std::string& var : env) vars[var.substr(0, var.find('='))] = var;
  std::vector<std::string> strings = argv;
  for (const auto& [name, var] : vars) strings.push_back(var);
  std::vector<char*> args, envp;
  for (size_t i = 0; i < strings.size(); ++i) (i < argv.size() ? args : envp).push_back(strings[i].data());
  args.push_back(nullptr);
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid = -1;
  const int spawn_error = posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (spawn_error != 0) return absl::InternalError(absl::StrCat("posix_spawn ", argv[0], ": ", strerror(spawn_error)));

  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return absl::DeadlineExceededError(absl::StrCat(argv[0], " still running after ", absl::FormatDuration(timeout),
                                                      "; stdout: ", ReadFile(out), "; stderr: ", ReadFile(err)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return ProcessResult{.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                       .out = ReadFile(out),
                       .err = ReadFile(err)};
}

absl::Status WriteTestModel(const std::filesystem::path& dir) {
  return WriteSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 7, .dtype = DType::kBF16}, dir,
                             {.with_tokenizer = true});
}

absl::StatusOr<std::vector<int32_t>> GreedyInProcess(const std::filesystem::path& model_dir,
                                                     const std::vector<int32_t>& prompt, int max_tokens) {
  auto runtime = LocalRuntime::Open(model_dir, {.num_threads = 1});
  if (!runtime.ok()) return runtime.status();
  GenerationRequest request;
  request.prompt_ids = prompt;
  request.max_tokens = max_tokens;
  request.sampling.temperature = 0;
  request.ignore_eos = true;
  auto result = (*runtime)->generator().Generate(request);
  if (!result.ok()) return result.status();
  std::vector<int32_t> ids;
  for (const GeneratedToken& t : result->tokens) ids.push_back(t.id);
  return ids;
}

}  // namespace tandem
