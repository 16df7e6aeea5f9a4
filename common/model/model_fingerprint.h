// A model's identity, exchanged at connect so two processes serving different
// weights never agree to work together: a hash of the config fields that change
// the forward pass (architecture, sizes, RoPE, norms, router, biases, special
// ids) and a hash of every tensor's name, dtype and shape (the architecture's
// ExpectedWeights, with the dtype and shape each stored tensor actually has:
// its type in the file, so processes that load a GGUF's blocks differently,
// e.g. a worker that never reads the dense matrices, still agree; the
// experts' in-memory types are compared separately at connect).
// Weight values are not hashed here (the same shapes with other values is
// not caught): the expert workers' bytes are checked by their content hash
// (common/model/expert_content.h).
//
// Hashes are FNV-1a 64 over a canonical text, stable across processes, builds
// and hosts (unlike absl::Hash). Mirrors tandem.v1.ModelFingerprint; common/
// includes no protos, so the RPC sides convert field by field.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"

namespace tandem {

struct ModelFingerprint {
  std::string architecture;  // e.g. "MixtralForCausalLM"
  uint64_t config_hash = 0;
  uint64_t tensors_hash = 0;
  int32_t num_layers = 0;
  int32_t num_experts = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;

  friend bool operator==(const ModelFingerprint&, const ModelFingerprint&) = default;
};

// "MixtralForCausalLM L=2 E=4 D=64 I=96 config=0123456789abcdef tensors=fedcba9876543210"
std::string FingerprintString(const ModelFingerprint& fingerprint);

// From the config and the tensors `source` actually holds. NotFound naming the
// tensor and the source when an expected tensor is missing.
absl::StatusOr<ModelFingerprint> FingerprintModel(const ModelConfig& config, const TensorSource& source);

// From the config alone, as if every tensor were stored with `dtype` at its
// expected shape (equals FingerprintModel of such a checkpoint). For processes
// that hold no weights, e.g. the transport benchmark's echo worker.
ModelFingerprint FingerprintConfig(const ModelConfig& config, DType dtype);

}  // namespace tandem
