#include "coordinator/worker_connect.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/model/model_fingerprint.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> ConnectExpertWorkers(const Model& model,
                                                                           const WorkerConnectSettings& settings) {
  absl::StatusOr<WorkerTransport> transport = ParseWorkerTransport(settings.transport);
  if (!transport.ok()) return absl::InvalidArgumentError(absl::StrCat("--transport: ", transport.status().message()));
  if (settings.call_timeout <= absl::ZeroDuration() || settings.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--worker_timeout_ms and --connect_timeout_ms must be > 0");
  }
  RemoteExpertExecutorOptions options;
  for (absl::string_view address : absl::StrSplit(settings.addresses, ',', absl::SkipWhitespace())) {
    options.addresses.emplace_back(address);
  }
  if (options.addresses.empty()) return absl::InvalidArgumentError("--workers: no worker address given");
  options.transports = {*transport};
  options.call_timeout = settings.call_timeout;
  options.connect_timeout = settings.connect_timeout;
  absl::StatusOr<ModelFingerprint> fingerprint = FingerprintModel(model.config, *model.weights->source);
  if (!fingerprint.ok()) return fingerprint.status();
  return RemoteExpertExecutor::Connect(model.config, *fingerprint, options);
}

}  // namespace tandem
