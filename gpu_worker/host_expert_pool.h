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
// Owns its buffers and its copy thread (joined, after finishing the queued
// copies, by the destructor). Threads as ExpertPool says.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "common/model_weights.h"
#include "gpu_worker/expert_pool.h"

namespace tandem {

// Computes one expert, y[R, D] = FFN(x[R, D]), from `weights` on the
// coordinator's CPU (client/local_runtime passes the CPU worker's ExpertFfn,
// so the pool's results equal the in-process executor's bit for bit).
// Called from RunExperts' thread only.
using ExpertKernel =
    std::function<absl::Status(const ExpertWeights& weights, const float* input, int64_t rows, float* output)>;

inline constexpr const char* kHostPoolKind = "no-GPU host pool";

class HostExpertPool final : public ExpertPool {
 public:
  // `experts` is [layer][expert], the model's weights (views; the memory
  // must outlive the pool), every matrix of the config's shape and of one
  // dtype. InvalidArgument naming the field or the expert otherwise;
  // ResourceExhausted when the buffers cannot be allocated.
  static absl::StatusOr<std::unique_ptr<HostExpertPool>> Create(const ModelConfig& config,
                                                                std::vector<std::vector<ExpertWeights>> experts,
                                                                ExpertKernel kernel, const ExpertPoolOptions& options);
  ~HostExpertPool() override;
  HostExpertPool(const HostExpertPool&) = delete;
  HostExpertPool& operator=(const HostExpertPool&) = delete;

  std::string kind() const override { return kHostPoolKind; }
  const ExpertLayout& layout() const override { return layout_; }
  int num_layers() const override { return static_cast<int>(experts_.size()); }
  int num_experts() const override { return num_experts_; }
  int num_slots() const override { return num_slots_; }
  int num_staging_buffers() const override { return num_staging_; }

  absl::Status Place(ExpertKey key) override;
  absl::Status Migrate(ExpertKey key, std::optional<ExpertKey> evict) override;
  absl::Status Stage(ExpertKey key) override;
  absl::Status Admit(ExpertKey key, std::optional<ExpertKey> evict) override;
  absl::Status Evict(ExpertKey key) override;
  absl::Status ReleaseStaging() override;

  PoolLocation Find(ExpertKey key) const override;
  bool IsReady(ExpertKey key) const override;
  absl::Status WaitReady(ExpertKey key) override;
  std::vector<PoolSlot> SlotTable() const override;

  absl::Status RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) override;

  std::vector<MigrationRecord> TakeCompletedMigrations() override;
  ExpertPoolStats stats() const override;
  void ResetStats() override;

  // The pool's copy of `key` as views into its buffer, after waiting for
  // the copy (tests compare its bytes with the model's). Valid until the
  // buffer is evicted or released. FailedPrecondition when not held.
  absl::StatusOr<ExpertWeights> HeldWeights(ExpertKey key);

 private:
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  struct Buffer {
    std::unique_ptr<uint8_t, AlignedFree> data;  // [layout_.buffer_bytes]
    std::optional<ExpertKey> expert;
    BufferState state = BufferState::kFree;
  };
  struct CopyTask {
    int buffer = 0;
    ExpertKey expert;
    bool staging = false;
    double queued_at_us = 0;
  };

  HostExpertPool(const ModelConfig& config, std::vector<std::vector<ExpertWeights>> experts, ExpertKernel kernel,
                 const ExpertLayout& layout, int num_slots, int num_staging);

  absl::Status CheckKey(ExpertKey key, const char* what) const;
  size_t Index(ExpertKey key) const {
    return static_cast<size_t>(key.layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(key.expert);
  }
  bool IsStaging(int position) const { return position >= num_slots_; }
  // The slot `evict` frees, or a free slot; -1 when none. Caller holds mutex_.
  absl::StatusOr<int> TakeSlotLocked(std::unique_lock<std::mutex>& lock, std::optional<ExpertKey> evict);
  // Waits (releasing `lock`) until `buffer` is not being copied.
  absl::Status WaitBufferLocked(std::unique_lock<std::mutex>& lock, int buffer, ExpertKey key);
  void EvictPositionLocked(int position);
  void Enqueue(std::unique_lock<std::mutex>& lock, int position, ExpertKey key);
  void CopyExpert(ExpertKey key, uint8_t* dst) const;  // the bytes of one migration
  ExpertWeights BufferWeights(const uint8_t* data) const;
  void CopyLoop();
  double NowUs() const;

  const std::vector<std::vector<ExpertWeights>> experts_;  // [layer][expert] source views
  const int num_experts_;
  const ExpertKernel kernel_;
  const ExpertLayout layout_;
  const int num_slots_;
  const int num_staging_;
  const std::chrono::steady_clock::time_point epoch_;

  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;  // a copy finished
  std::condition_variable work_cv_;   // a copy was queued, or stop
  std::vector<Buffer> buffers_;       // [slots + staging]
  std::vector<int> position_buffer_;  // [slots + staging] position (slot s, or staging num_slots + j) -> buffer
  std::vector<int> where_;            // [L * E] position holding the expert, or -1
  std::deque<CopyTask> queue_;
  std::vector<MigrationRecord> completed_;
  ExpertPoolStats stats_;
  bool stop_ = false;
  std::thread copy_thread_;  // last: started when everything above exists
};

}  // namespace tandem
