// Connecting the coordinator to its CPU worker processes from command-line
// style settings (a comma-separated address list, a transport name), shared
// by tandem-generate and tandem-server so both check and report the same way.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/model.h"
#include "coordinator/remote_expert_executor.h"

namespace tandem {

struct WorkerConnectSettings {
  std::string addresses;  // "unix:/run/tandem/w0.sock,unix:/run/tandem/w1.sock", in worker-index order
  std::string transport = "shm";  // shm | shm-grpc | inline
  absl::Duration call_timeout = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(10);
};

// Connects to every worker and checks it serves `model` (fingerprint and
// protocol version). InvalidArgument naming the setting when one is bad.
absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> ConnectExpertWorkers(const Model& model,
                                                                           const WorkerConnectSettings& settings);

}  // namespace tandem
