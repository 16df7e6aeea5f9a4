// The fuzz entry points for what a CPU worker trusts least: the RunExperts
// requests a coordinator sends (gRPC or doorbell) with their arena
// descriptors, and the expert store region another process maps.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/model/expert_partition.h"
#include "common/model/expert_store_view.h"
#include "common/model/synthetic_model.h"
#include "cpu_worker/worker_service.h"
#include "fuzz/fuzz_targets.h"
#include "tandem/v1/expert_worker_convert.h"

namespace tandem::fuzz {
namespace {

constexpr uint64_t kSession = 0x5EED;

// An echo worker (output = input: the parsing is what is fuzzed, not the
// FFN) of the tiny synthetic model, holding every expert, with a small arena,
// claimed by kSession. Made once per process.
struct FuzzWorker {
  std::unique_ptr<EchoExpertExecutor> executor;
  std::unique_ptr<WorkerService> service;
};

absl::StatusOr<FuzzWorker> MakeFuzzWorker() {
  // Every rejected request is logged as a warning: millions of lines here.
  SetMinLogLevel(LogLevel::kError);
  FuzzWorker worker;
  WorkerServiceOptions options;
  options.worker_id = "fuzz";
  TANDEM_ASSIGN_OR_RETURN(options.config, SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .num_layers = 2}));
  TANDEM_ASSIGN_OR_RETURN(options.slices, PartitionExperts(options.config, ExpertDivision::kSplit, 0, 1));
  worker.executor = std::make_unique<EchoExpertExecutor>(options.config.hidden_size);
  options.executor = worker.executor.get();
  // No cpu to pin to: the fuzzer must not be tied to one core of a shared
  // machine (the pinning fails with a warning, which is not logged).
  options.cpus = {-1};
  options.arena = ArenaOptions{.name = "/tandem-fuzz-arena",
                               .num_slots = 2,
                               .slot_bytes = 4096,
                               .control_message_bytes = 4096,
                               .unique_suffix = true};
  TANDEM_ASSIGN_OR_RETURN(worker.service, WorkerService::Create(std::move(options)));
  v1::DescribeRequest claim;
  claim.set_protocol_version(kExpertWorkerProtocolVersion);
  claim.set_session(kSession);
  v1::DescribeResponse description;
  TANDEM_RETURN_IF_ERROR(worker.service->Describe(claim, &description));
  return worker;
}

}  // namespace

absl::Status FuzzWorkerRequest(FuzzBytes bytes) {
  // Destroyed at exit, which unlinks the arena.
  static absl::StatusOr<FuzzWorker> worker = MakeFuzzWorker();
  TANDEM_RETURN_IF_ERROR(worker.status());
  v1::RunExpertsRequest request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("not a serialized RunExpertsRequest");
  }
  request.set_session(kSession);
  v1::RunExpertsResponse response;
  return worker->service->Run(request, &response, /*via_doorbell=*/(request.request_id() & 1) != 0);
}

absl::Status FuzzExpertStoreRegion(FuzzBytes bytes) {
  // A real region is page-aligned; an exact-size buffer lets AddressSanitizer
  // catch a matrix the index lets run one byte past the region.
  constexpr std::align_val_t kPage{kExpertStoreAlignment};
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> region(new (kPage) uint8_t[std::max<size_t>(bytes.size(), 1)],
                                                        [](uint8_t* p) { ::operator delete[](p, kPage); });
  if (!bytes.empty()) std::memcpy(region.get(), bytes.data(), bytes.size());
  TANDEM_ASSIGN_OR_RETURN(const ExpertStoreIndex index,
                          IndexExpertStoreRegion(region.get(), bytes.size(), "fuzz-region"));
  uint8_t sum = 0;
  for (const ExpertSlice& slice : index.slices) {
    const ExpertWeights* weights = index.Find(slice.layer, slice.expert);
    if (weights == nullptr) return absl::InternalError("an indexed slice is not found");
    for (const LinearWeight* w : {&weights->w1, &weights->w3, &weights->w2}) {
      const auto* data = static_cast<const uint8_t*>(w->data);
      sum ^= data[0];
      sum ^= data[w->bytes() - 1];
    }
  }
  volatile uint8_t sink = sum;  // the reads must happen
  (void)sink;
  return absl::OkStatus();
}

}  // namespace tandem::fuzz
