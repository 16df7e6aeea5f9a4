// The no-GPU expert pool: the ExpertPool interface where there is no GPU.
// Its "device memory" is host memory (one aligned buffer per slot and per
// staging buffer); its migration engine is a thread that really copies an
// expert's three matrices from the model's weights into the buffer; its
// readiness events are a condition variable. Experts it holds are computed
// on the coordinator's CPU by `kernel` reading the buffer's copy, so a wrong
// copy would change the model's outputs (the tests rely on that).
//
// It exists so that the whole orchestration — placement, cache policies,
// planner, migrations, readiness waits, admissions, evictions, stats — runs
// and is tested on machines without a GPU, with the same code the CUDA pool
// will sit under. It is not faster than the CPU executor: its "GPU" is the
// same cores. Logs and stats call it "no-GPU host pool".
//
// Owns its buffers' bytes and its copy thread (joined, after finishing the
// queued copies, by the destructor); the slot table, copy queue and stats
// are SlotPool's (slot_pool.h). Threads as ExpertPool says.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "gpu_worker/expert_pool.h"
#include "gpu_worker/slot_pool.h"

namespace tandem {

// Computes one expert, y[R, D] = FFN(x[R, D]), from `weights` on the
// coordinator's CPU (client/local_runtime passes the CPU worker's ExpertFfn,
// so the pool's results equal the in-process executor's bit for bit).
// Called from RunExperts' thread only.
using ExpertKernel =
    std::function<absl::Status(const ExpertWeights& weights, const float* input, int64_t rows, float* output)>;

inline constexpr const char* kHostPoolKind = "no-GPU host pool";

class HostExpertPool final : public SlotPool {
 public:
  // `experts` is [layer][expert], the model's weights (views; the memory
  // must outlive the pool), every matrix of the config's shape, a layer's
  // experts of the same types: float, or block-quantized (kept as blocks,
  // computed by `kernel` from them). InvalidArgument naming the field or
  // the expert otherwise;
  // ResourceExhausted when the buffers cannot be allocated.
  static absl::StatusOr<std::unique_ptr<HostExpertPool>> Create(const ModelConfig& config,
                                                                const std::vector<std::vector<ExpertWeights>>& experts,
                                                                ExpertKernel kernel, const ExpertPoolOptions& options);
  // The same from sources whose matrices may lie in pieces (expert_source.h:
  // the CPU workers' stores).
  static absl::StatusOr<std::unique_ptr<HostExpertPool>> Create(const ModelConfig& config, ExpertSources experts,
                                                                ExpertKernel kernel, const ExpertPoolOptions& options);
  ~HostExpertPool() override;

  absl::Status RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) override;

  // The pool's copy of `key` as views into its buffer, after waiting for
  // the copy (tests compare its bytes with the model's). Valid until the
  // buffer is evicted or released. FailedPrecondition when not held.
  absl::StatusOr<ExpertWeights> HeldWeights(ExpertKey key);

 private:
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };

  HostExpertPool(const ModelConfig& config, ExpertSources experts, ExpertKernel kernel, ExpertLayouts layouts,
                 int num_slots, int num_staging);

  absl::Status CopyNowLocked(int buffer, ExpertKey key) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex());
  void CopyExpert(ExpertKey key, uint8_t* dst) const;                     // the bytes of one migration
  ExpertWeights BufferWeights(const uint8_t* data, ExpertKey key) const;  // `key`'s copy: its layer's layout
  void CopyLoop() ABSL_LOCKS_EXCLUDED(mutex());

  const ExpertKernel kernel_;
  // [slots + staging] by buffer number, [buffer_bytes()] each. Filled
  // by Create, then never resized: the copy thread writes a kCopying
  // buffer's bytes without the lock.
  std::vector<std::unique_ptr<uint8_t, AlignedFree>> data_;
  std::thread copy_thread_;  // last: started when everything above exists
};

}  // namespace tandem
