// Connecting the coordinator to its CPU worker processes from command-line
// style settings (a comma-separated address list, a transport name), shared
// by tandem-generate and tandem-server so both check and report the same way.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/orchestration/remote_expert_executor.h"

namespace tandem {

struct WorkerConnectSettings {
  std::string addresses;          // "unix:/run/tandem/w0.sock,unix:/run/tandem/w1.sock", in worker-index order
  std::string transport = "shm";  // shm | shm-grpc | inline
  absl::Duration call_timeout = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(10);
  // The model's synthetic spec, when it is one: how the workers' content is
  // checked when this process holds no expert bytes (see below).
  std::optional<SyntheticModelSpec> synthetic;
  // The model's GGUF file when this process dequantized its experts without
  // keeping them (--gguf_experts bf16 with workers): the expected content is
  // hashed from the file's blocks, dequantized row by row as the workers'
  // loader did (HashDequantizedExpertSlices).
  std::string gguf_path;
  int num_threads = 1;  // for hashing the expected content
};

// The workers' expected content hashes (RemoteExpertExecutorOptions::
// expected_content) for `model`: hashed from its own expert bytes when it
// has them (a folder, mapped; or a synthetic model with its experts), else
// regenerated from `synthetic` row by row and hashed (a synthetic model
// whose experts live on the workers: the same generation work as the
// workers', never held in memory). A model with neither gets none (and a
// worker holding weights is then refused: nothing to check it against).
// A model with no expert bytes loaded from a GGUF (`gguf_path`): hashed
// from the file's blocks, mapped again for the call, dequantized as the
// workers' loader dequantizes them.
// The returned function reads `model`: call it only while `model` lives.
std::function<absl::StatusOr<std::vector<uint64_t>>(std::span<const ExpertSlice>)> ExpectedExpertContent(
    const Model& model, const std::optional<SyntheticModelSpec>& synthetic, int num_threads,
    const std::string& gguf_path = "");

// RemoteExpertExecutorOptions::expected_dtypes for `model`: the types of its
// experts' matrices for the given slices ("BF16", "Q4_K+Q6_K"). Reads
// `model`: call it only while `model` lives.
std::function<std::string(std::span<const ExpertSlice>)> ExpectedExpertDTypes(const Model& model);

// Connects to every worker and checks it serves `model` (fingerprint, the
// experts' types, content hash and protocol version). InvalidArgument naming the setting
// when one is bad.
absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> ConnectExpertWorkers(const Model& model,
                                                                           const WorkerConnectSettings& settings);

}  // namespace tandem
