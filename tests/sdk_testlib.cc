#include "tests/sdk_testlib.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/model/synthetic_model.h"
#include "coordinator/runtime/local_runtime.h"
#include "tests/child_process_testlib.h"

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

  ChildProcess process;
  if (absl::Status spawned = process.Spawn(argv, out, err, env); !spawned.ok()) return spawned;
  absl::StatusOr<int> status = process.Wait(timeout);
  if (!status.ok()) {
    process.Kill(SIGKILL);
    return absl::DeadlineExceededError(absl::StrCat(argv[0], " ", status.status().message(),
                                                    "; stdout: ", ReadFile(out), "; stderr: ", ReadFile(err)));
  }
  return ProcessResult{
      .exit_code = WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, .out = ReadFile(out), .err = ReadFile(err)};
}

absl::Status WriteTestModel(const std::filesystem::path& dir) {
  return WriteSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 7, .dtype = DType::kBF16}, dir,
                             {.with_tokenizer = true});
}

absl::StatusOr<std::vector<int32_t>> GreedyInProcess(std::unique_ptr<Model> model, const std::vector<int32_t>& prompt,
                                                     int max_tokens) {
  auto runtime = LocalRuntime::Create(std::move(model), {.num_threads = 1});
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

absl::StatusOr<std::vector<int32_t>> GreedyInProcess(const std::filesystem::path& model_dir,
                                                     const std::vector<int32_t>& prompt, int max_tokens) {
  auto model = LoadModel(model_dir);
  if (!model.ok()) return model.status();
  return GreedyInProcess(std::move(*model), prompt, max_tokens);
}

}  // namespace tandem
