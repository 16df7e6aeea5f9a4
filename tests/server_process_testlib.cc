#include "tests/server_process_testlib.h"

#include <chrono>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"

namespace tandem {

std::unique_ptr<v1::Inference::Stub> ServerProcess::NewStub() const {
  // gRPC's default reconnect backoff (1 s, 1.6 s, ...) would make every
  // start-up poll wait seconds for a server that is up in a fraction of one.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  return v1::Inference::NewStub(grpc::CreateCustomChannel(address(), grpc::InsecureChannelCredentials(), args));
}

absl::Status ServerProcess::Start(absl::Duration timeout) {
  std::vector<std::string> args = {std::string(TANDEM_BINARY_DIR) + "/bin/tandem-server", "--listen", address(),
                                   "--exit_with_parent"};
  if (!options_.model_dir.empty()) args.insert(args.end(), {"--model", options_.model_dir.string()});
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());
  if (absl::Status status = process_.Spawn(args, options_.log); !status.ok()) return status;
  auto stub = NewStub();
  const absl::Time deadline = absl::Now() + timeout;
  grpc::Status last;
  while (absl::Now() < deadline) {
    int status = 0;
    if (process_.Exited(&status)) {
      return absl::InternalError(
          absl::StrCat("tandem-server exited during start-up (status ", status, "): ", LogTail()));
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    v1::ModelInfo info;
    last = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (last.ok()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("tandem-server not answering after ", absl::FormatDuration(timeout),
                                                  " (", last.error_message(), "): ", LogTail()));
}

}  // namespace tandem
