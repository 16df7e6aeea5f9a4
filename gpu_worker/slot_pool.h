// The bookkeeping half of an ExpertPool (expert_pool.h), shared by the pools
// that keep experts in numbered buffers: the no-GPU host pool and the CUDA
// pool. They differ only in where the bytes live and how they are copied;
// everything about which expert lies where, in what state, is here.
//
// Owns:
//   - the experts' source views ([layer][expert]) and their layouts (one per
//     layer; every buffer holds the largest);
//   - the slot table: buffers numbered 0 .. slots + staging - 1, each
//     holding an expert (or nothing) in a BufferState, and the positions
//     (slot s, or staging buffer j at num_slots + j) that map onto them, so
//     that Admit moves a staged expert into a slot by swapping buffer
//     numbers, without a copy;
//   - the copy queue the migration engine's threads take from, the
//     completed migrations, the stats, and the first failed copy (every
//     later wait returns it);
//   - the mutex guarding all of that (mutex(); the *Locked calls need it
//     held, which the thread-safety analysis checks) and the condition
//     variables for "a copy changed state" and "a copy was queued, or stop".
// It implements every ExpertPool call but RunExperts. A derived pool owns the
// buffers' bytes (indexed by buffer number), the copy threads and the
// compute, and fills in the hooks below.
//
// Threads: as ExpertPool says. The control calls come from the engine
// thread; the copy threads call NextCopyLocked / CopyDoneLocked /
// CopyFailedLocked; queries may come from any thread. A derived pool's
// destructor must call StopCopies and join its copy threads before its own
// members go (the base outlives them).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/base/expert_key.h"
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "gpu_worker/expert_pool.h"
#include "gpu_worker/expert_source.h"

namespace tandem {

class SlotPool : public ExpertPool {
 public:
  ~SlotPool() override = default;
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  std::string kind() const override { return kind_; }
  const ExpertLayout& layout(int layer) const override { return layouts_[static_cast<size_t>(layer)]; }
  int64_t buffer_bytes() const override { return buffer_bytes_; }
  int64_t expert_bytes() const override { return expert_bytes_; }
  const ExpertLayouts& layouts() const { return layouts_; }
  int num_layers() const override { return static_cast<int>(experts_.size()); }
  int num_experts() const override { return num_experts_; }
  int num_slots() const override { return num_slots_; }
  int num_staging_buffers() const override { return num_staging_; }

  absl::Status Place(ExpertKey key) override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status Migrate(ExpertKey key, std::optional<ExpertKey> evict) override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status Stage(ExpertKey key) override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status Admit(ExpertKey key, std::optional<ExpertKey> evict) override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status Evict(ExpertKey key) override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status ReleaseStaging() override ABSL_LOCKS_EXCLUDED(mutex_);

  PoolLocation Find(ExpertKey key) const override ABSL_LOCKS_EXCLUDED(mutex_);
  bool IsReady(ExpertKey key) const override ABSL_LOCKS_EXCLUDED(mutex_);
  absl::Status WaitReady(ExpertKey key) override ABSL_LOCKS_EXCLUDED(mutex_);
  std::vector<PoolSlot> SlotTable() const override ABSL_LOCKS_EXCLUDED(mutex_);

  std::vector<MigrationRecord> TakeCompletedMigrations() override ABSL_LOCKS_EXCLUDED(mutex_);
  ExpertPoolStats stats() const override ABSL_LOCKS_EXCLUDED(mutex_);
  void ResetStats() override ABSL_LOCKS_EXCLUDED(mutex_);

  // The layouts, per layer, of `experts` ([layer][expert], every matrix of
  // the config's shape, each layer's experts of the same types; float or
  // block types, which a pool then checks it can compute).
  // InvalidArgument naming the field or expert.
  static absl::StatusOr<ExpertLayouts> CheckExperts(const ModelConfig& config,
                                                    const std::vector<std::vector<ExpertWeights>>& experts);
  // The same for sources whose matrices may lie in pieces (expert_source.h):
  // every matrix's pieces tile it exactly (whole blocks for a block type).
  static absl::StatusOr<ExpertLayouts> CheckExpertSources(const ModelConfig& config, const ExpertSources& experts);
  static std::string KeyName(ExpertKey key);

 protected:
  // One queued migration: a copy of `expert` into buffer `buffer`.
  struct CopyTask {
    int buffer = 0;
    ExpertKey expert;
    bool staging = false;
    double queued_at_us = 0;
  };

  SlotPool(std::string kind, ExpertSources experts, int num_experts, ExpertLayouts layouts, int num_slots,
           int num_staging);

  // Hooks. EnterDevice runs before the control calls that may touch buffers
  // (not Stage, which only queues); the *Locked ones run with mutex() held
  // (an override repeats ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex())).
  virtual absl::Status EnterDevice() { return absl::OkStatus(); }
  // Place: copy `key` into the (free, unshared) `buffer` before returning.
  virtual absl::Status CopyNowLocked(int buffer, ExpertKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) = 0;
  // `buffer` was just given a queued copy.
  virtual void OnQueuedLocked(int buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { (void)buffer; }
  // `buffer` was just freed (its copy, if any, done).
  virtual absl::Status OnFreedLocked(int buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    (void)buffer;
    return absl::OkStatus();
  }

  // The pool's mutex, for a derived pool's own state and the *Locked calls
  // (LOCK_RETURNED: the analysis knows it is mutex_).
  absl::Mutex& mutex() const ABSL_LOCK_RETURNED(mutex_) { return mutex_; }
  // Signal after changing something a WaitLocked predicate reads.
  void NotifyReady() { ready_cv_.SignalAll(); }
  void SetKind(std::string kind) ABSL_LOCKS_EXCLUDED(mutex_);  // before the copy threads start
  const ExpertSources& experts() const { return experts_; }
  const ExpertSource& source(ExpertKey key) const {
    return experts_[static_cast<size_t>(key.layer)][static_cast<size_t>(key.expert)];
  }
  size_t Index(ExpertKey key) const {
    return static_cast<size_t>(key.layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(key.expert);
  }
  absl::Status CheckKey(ExpertKey key, const char* what) const;
  double NowUs() const;

  // RunExperts' checks: layer in range, every entry well formed and held.
  // The total rows of `work`.
  absl::StatusOr<int64_t> CheckWork(int layer, std::span<const ExpertWork> work) const;
  // Adds one RunExperts call's timing to the stats.
  void RecordRun(const PoolRunTiming& run) ABSL_LOCKS_EXCLUDED(mutex_);
  // One copy (placement or migration) read pageable host memory.
  void CountPageableCopyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { ++stats_.pageable_copies; }

  // The buffer at `position`, the position holding `key` (-1: none).
  int BufferAtLocked(int position) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return position_buffer_[static_cast<size_t>(position)];
  }
  int PositionLocked(ExpertKey key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return where_[Index(key)]; }
  bool IsStaging(int position) const { return position >= num_slots_; }
  BufferState StateLocked(int buffer) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return entries_[static_cast<size_t>(buffer)].state;
  }

  // Waits (releasing mutex() meanwhile) until `done` or a copy failed: the
  // failed copy's status, or DeadlineExceeded ("did not <verb> in 60 s").
  // `done` runs with mutex() held.
  absl::Status WaitLocked(ExpertKey key, const char* verb, const std::function<bool()>& done)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Waits until `buffer`'s copy is done.
  absl::Status WaitCopiedLocked(int buffer, ExpertKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Waits for `key`'s copy; its buffer. FailedPrecondition ("<prefix>the pool
  // does not hold ...") when not held.
  absl::StatusOr<int> WaitHeldLocked(ExpertKey key, const char* prefix = "") ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  // Copy threads. The next queued copy (blocking, mutex() released, while
  // none); nullopt once stopping and the queue is empty.
  std::optional<CopyTask> NextCopyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // `task` finished: copy started at `start_us` (NowUs) and took `copy_us`.
  void CopyDoneLocked(const CopyTask& task, double start_us, double copy_us) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // `key`'s copy failed: the first failure is kept (and logged), and every
  // wait returns it from now on.
  void CopyFailedLocked(ExpertKey key, const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Lets the copy threads finish the queue and return (then join them).
  void StopCopies() ABSL_LOCKS_EXCLUDED(mutex_);

 private:
  struct Entry {
    std::optional<ExpertKey> expert;
    BufferState state = BufferState::kFree;
  };

  absl::StatusOr<int> TakeSlotLocked(std::optional<ExpertKey> evict) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status EvictPositionLocked(int position) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void EnqueueLocked(int position, ExpertKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  Entry& EntryAt(int position) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return entries_[static_cast<size_t>(BufferAtLocked(position))];
  }
  const Entry& EntryAt(int position) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return entries_[static_cast<size_t>(BufferAtLocked(position))];
  }

  const ExpertSources experts_;  // [layer][expert] source views
  const int num_experts_;
  const ExpertLayouts layouts_;  // [layer]
  const int64_t buffer_bytes_;   // MaxBufferBytes(layouts_)
  const int64_t expert_bytes_;   // MeanCopyBytes(layouts_)
  const int num_slots_;
  const int num_staging_;
  const std::chrono::steady_clock::time_point epoch_;
  // Not guarded: SetKind writes it (under mutex_) only before the copy
  // threads start; kind() reads it without the lock.
  std::string kind_;

  mutable absl::Mutex mutex_;
  absl::CondVar ready_cv_;                              // a copy changed state (issued, finished, failed)
  absl::CondVar work_cv_;                               // a copy was queued, or stop
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mutex_);  // [slots + staging] by buffer number
  // [slots + staging] position (slot s, or staging num_slots + j) -> buffer
  std::vector<int> position_buffer_ ABSL_GUARDED_BY(mutex_);
  std::vector<int> where_ ABSL_GUARDED_BY(mutex_);  // [L * E] position holding the expert, or -1
  std::deque<CopyTask> queue_ ABSL_GUARDED_BY(mutex_);
  std::vector<MigrationRecord> completed_ ABSL_GUARDED_BY(mutex_);
  ExpertPoolStats stats_ ABSL_GUARDED_BY(mutex_);
  absl::Status copy_error_ ABSL_GUARDED_BY(mutex_);  // the first failed copy
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace tandem
