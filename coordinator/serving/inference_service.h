// The public gRPC service (protos/tandem/v1/inference.proto) over a
// Scheduler: turns requests into scheduler jobs (defaults filled, every
// field validated, text tokenized) and streams the scheduler's events back.
// A handler thread waits on its request's stream and watches the call: a
// client that cancels, disconnects or passes its deadline cancels the
// request, which frees its KV cache at the next step.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/serving/inference_service_watchdog.h"
#include "coordinator/serving/serving.h"
#include "tandem/v1/inference.grpc.pb.h"

namespace tandem {

// GetModelInfo reports placement_summary; GetStats calls the hooks.
using InferenceServiceOptions = ServingOptions;

// Borrows the model and scheduler. gRPC calls it from its own threads.
class InferenceService final : public v1::Inference::Service {
 public:
  InferenceService(const Model* model, Scheduler* scheduler, InferenceServiceOptions options);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status BeamSearch(grpc::ServerContext* context, const v1::BeamSearchRequest* request,
                          grpc::ServerWriter<v1::BeamSearchResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest* request,
                            v1::ModelInfo* response) override;
  grpc::Status GetStats(grpc::ServerContext* context, const v1::GetStatsRequest* request,
                        v1::ServerStats* response) override;

 private:
  absl::StatusOr<std::vector<int32_t>> PromptIds(const std::string& text,
                                                 const google::protobuf::RepeatedField<int32_t>& ids,
                                                 bool add_bos) const {
    return tandem::PromptIds(*model_, text, std::span<const int32_t>(ids.data(), ids.size()), add_bos, "prompt",
                             max_token_bytes_);
  }
  // Waits for the next event, cancelling the request when the call ends.
  std::optional<StreamEvent> NextEvent(grpc::ServerContext* context, RequestStream& stream);
  grpc::Status ClientGone(grpc::ServerContext* context, RequestStream& stream);
  // writer->Write, under the watchdog: false also when the client took
  // nothing for the watchdog's limit (the call is cancelled).
  template <typename Response>
  bool Write(grpc::ServerContext* context, grpc::ServerWriter<Response>* writer, const Response& response) {
    WriteWatchdog::Guard guard = watchdog_.Watch(context);
    return writer->Write(response);
  }

  const Model* model_;
  Scheduler* scheduler_;
  InferenceServiceOptions options_;
  int64_t parameters_ = 0;
  int64_t expert_bytes_ = 0;
  int64_t max_token_bytes_ = 1;  // MaxTokenTextBytes: long prompt texts are refused by size first
  std::string fingerprint_;
  // Twice the scheduler's stall limit: a client that reads within one more
  // --max_stall_s after its request was stopped still gets the status.
  WriteWatchdog watchdog_;
};

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace tandem
