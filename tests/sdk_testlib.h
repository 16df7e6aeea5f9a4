// Helpers for the SDK, CLI and Python SDK tests (which run a ServerProcess,
// server_process_testlib.h): a command run to completion with its stdout and
// stderr kept apart, the model they serve, and the in-process greedy tokens a
// server must reproduce.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/model.h"

namespace tandem {

struct ProcessResult {
  int exit_code = -1;  // -1: ended by a signal
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs argv (argv[0] a path) with `env` ("NAME=value") added to this
// process's environment; its stdout and stderr go to files in `work_dir`.
// DeadlineExceeded, the process killed, after `timeout`.
absl::StatusOr<ProcessResult> RunProcess(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                                         const std::filesystem::path& work_dir,
                                         absl::Duration timeout = absl::Seconds(120));

// The tiny synthetic model (Mixtral-shaped, vocab 512, with a tokenizer).
absl::Status WriteTestModel(const std::filesystem::path& dir);

// Greedy ids (temperature 0, ignore_eos) after `prompt` from the in-process
// engine (LocalRuntime).
absl::StatusOr<std::vector<int32_t>> GreedyInProcess(const std::filesystem::path& model_dir,
                                                     const std::vector<int32_t>& prompt, int max_tokens);
absl::StatusOr<std::vector<int32_t>> GreedyInProcess(std::unique_ptr<Model> model, const std::vector<int32_t>& prompt,
                                                     int max_tokens);

}  // namespace tandem
