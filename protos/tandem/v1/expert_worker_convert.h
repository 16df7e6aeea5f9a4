// Conversions between tandem.v1 expert-worker messages and common/ types, and
// between absl::Status and grpc::Status (codes map one to one, messages are
// kept). Shared by both ends of the process boundary (cpu_worker/ and
// coordinator/ meet only in protos/ and common/); common/ itself includes no
// protos, so the conversions live here, header-only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <grpcpp/support/status.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/base/dtype.h"
#include "common/model/expert_partition.h"
#include "common/model/model_fingerprint.h"
#include "common/platform/shm_transport.h"
#include "tandem/v1/expert_worker.pb.h"

namespace tandem {

// Bump on any change to expert_worker.proto that an older peer would misread.
inline constexpr uint32_t kExpertWorkerProtocolVersion = 2;

// CalibrateRequest's bounds (the worker refuses more): a call costs at most
// kMaxCalibrateRowCounts x kMaxCalibrateReps expert runs of kMaxCalibrateRows rows.
inline constexpr int kMaxCalibrateRowCounts = 32;
inline constexpr int64_t kMaxCalibrateRows = 4096;
inline constexpr int kMaxCalibrateReps = 100;

inline void ToProto(const ModelFingerprint& f, v1::ModelFingerprint* out) {
  out->set_architecture(f.architecture);
  out->set_config_hash(f.config_hash);
  out->set_tensors_hash(f.tensors_hash);
  out->set_num_layers(f.num_layers);
  out->set_num_experts(f.num_experts);
  out->set_hidden_size(f.hidden_size);
  out->set_intermediate_size(f.intermediate_size);
}

inline ModelFingerprint FromProto(const v1::ModelFingerprint& p) {
  ModelFingerprint f;
  f.architecture = p.architecture();
  f.config_hash = p.config_hash();
  f.tensors_hash = p.tensors_hash();
  f.num_layers = p.num_layers();
  f.num_experts = p.num_experts();
  f.hidden_size = p.hidden_size();
  f.intermediate_size = p.intermediate_size();
  return f;
}

inline v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32: return v1::DTYPE_F32;
    case DType::kF16: return v1::DTYPE_F16;
    case DType::kBF16: return v1::DTYPE_BF16;
    default: break;  // quantized: no wire dtype yet, so the peer refuses it
  }
  return v1::DTYPE_UNSPECIFIED;
}

inline std::optional<DType> FromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32: return DType::kF32;
    case v1::DTYPE_F16: return DType::kF16;
    case v1::DTYPE_BF16: return DType::kBF16;
    default: return std::nullopt;
  }
}

inline v1::Division ToProto(ExpertDivision division) {
  return division == ExpertDivision::kSplit ? v1::DIVISION_SPLIT : v1::DIVISION_SHARD;
}

inline absl::StatusOr<ExpertDivision> FromProto(v1::Division division) {
  switch (division) {
    case v1::DIVISION_SPLIT: return ExpertDivision::kSplit;
    case v1::DIVISION_SHARD: return ExpertDivision::kShard;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("division ", static_cast<int>(division), " is not split or shard"));
  }
}

inline void ToProto(const ArenaTensorRef& ref, v1::TensorDescriptor* out) {
  out->set_slot(ref.slot);
  out->set_offset(ref.offset);
  out->clear_shape();
  for (int64_t d : ref.shape) out->add_shape(d);
  out->set_dtype(ref.dtype ? ToProto(*ref.dtype) : v1::DTYPE_UNSPECIFIED);
  out->set_sequence(ref.sequence);
}

inline ArenaTensorRef FromProto(const v1::TensorDescriptor& p, ArenaSide side) {
  ArenaTensorRef ref;
  ref.side = side;
  ref.slot = p.slot();
  ref.offset = p.offset();
  ref.shape.assign(p.shape().begin(), p.shape().end());
  ref.dtype = FromProto(p.dtype());
  ref.sequence = p.sequence();
  return ref;
}

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(status.code())), std::string(status.message()));
}

// `peer` prefixes the message (e.g. "worker 1 (unix:/run/w1.sock) RunExperts").
inline absl::Status FromGrpcStatus(const grpc::Status& status, const std::string& peer = "") {
  if (status.ok()) return absl::OkStatus();
  std::string message = peer.empty() ? status.error_message() : absl::StrCat(peer, ": ", status.error_message());
  return absl::Status(static_cast<absl::StatusCode>(static_cast<int>(status.error_code())), message);
}

}  // namespace tandem
