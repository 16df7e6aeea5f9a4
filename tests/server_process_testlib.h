// A real tandem-server process for end-to-end tests: started on a unix socket
// in a test temp dir with --exit_with_parent, ready once it answers
// GetModelInfo, and always stopped and reaped (see ChildProcess).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tandem/v1/inference.grpc.pb.h"
#include "tests/child_process_testlib.h"

namespace tandem {

struct ServerProcessOptions {
  std::filesystem::path model_dir;  // empty: no --model (extra_args gives --synthetic)
  std::filesystem::path socket;
  std::vector<std::string> extra_args;  // e.g. --max_sequences 32 --threads 1
  std::filesystem::path log;
};

class ServerProcess {
 public:
  explicit ServerProcess(ServerProcessOptions options) : options_(std::move(options)) {}

  // Spawns TANDEM_BINARY_DIR/bin/tandem-server and waits until it answers.
  absl::Status Start(absl::Duration timeout = absl::Seconds(60));
  int Stop(absl::Duration grace = absl::Seconds(5)) { return process_.Stop(grace); }

  std::string address() const { return "unix:" + options_.socket.string(); }
  std::unique_ptr<v1::Inference::Stub> NewStub() const;
  std::string LogTail(size_t bytes = 4000) const { return process_.LogTail(bytes); }
  ChildProcess& process() { return process_; }

 private:
  ServerProcessOptions options_;
  ChildProcess process_;
};

}  // namespace tandem
