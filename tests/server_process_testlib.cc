#include "tests/server_process_testlib.h"

#include <chrono>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "tests/grpc_channel_testlib.h"

namespace tandem {

std::unique_ptr<v1::Inference::Stub> ServerProcess::NewStub() const {
  return v1::Inference::NewStub(ChannelToChild(address()));
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
    context.set_wait_for_ready(true);  // see ChannelToChild
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
