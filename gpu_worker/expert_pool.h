// The GPU expert pool (ARCHITECTURE.md "Processes", gpu_worker): a fixed
// number of expert slots within a memory budget, a slot table saying which
// (layer, expert) each slot holds, a few staging buffers for experts the
// planner copies for one use, and a migration engine that copies experts'
// weights (w1, w3, w2) into them on its own thread (CUDA: its own stream,
// with an event per copy), so a step never waits for a copy unless its plan
// runs that very expert.
//
// The pool does not choose: what to copy and what to evict is decided by a
// cache policy (coordinator/planner/cache_policy.h) and applied here by the
// coordinator, which mirrors every call in its ResidencyTable. The pool only
// checks that each call is possible (a free slot, a resident victim).
//
// Lifecycle of a buffer's contents:
//   Place            → resident at once (initial placement, synchronous copy)
//   Migrate / Stage  → copying (queued on the migration engine) → ready
//   Admit            → a ready staged expert moves into a slot (no copy)
//   Evict / ReleaseStaging → free
// Readiness is an event per copy: IsReady polls it, WaitReady blocks on it,
// RunExperts waits on it for each expert it computes.
//
// Threads: the control calls (Place, Migrate, Stage, Admit, Evict,
// ReleaseStaging, RunExperts, TakeCompletedMigrations, ResetStats) come from
// one thread at a time (the engine thread); IsReady, WaitReady, SlotTable,
// Find and stats may be called from any thread. The migration engine's
// threads belong to the pool and are joined by its destructor.
//
// Implementations: HostExpertPool (host_expert_pool.h, no GPU: slots in
// host memory, experts computed by the coordinator's CPU from the slot's
// copy) and CudaExpertPool (cuda_expert_pool.h). Both keep their slot
// table, copy queue and stats in SlotPool (slot_pool.h).
//
// Legend: D hidden size, I intermediate size, R rows of one expert.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/base/expert_executor.h"
#include "common/base/expert_key.h"
#include "common/model/model_config.h"

namespace tandem {

// Where one expert's three matrices lie inside a pool buffer, each in its
// stored type: a float type, or a ggml block type kept as its blocks (a
// GGUF with --gguf_experts quantized), so a slot holds and a migration
// copies the bytes as stored — a Q4_K expert is 0.28x a BF16 one, and the
// slot count and copy time follow (docs/gpu.md). Every matrix starts on a
// kExpertBufferAlignment boundary so that vector loads (and DMA) see
// aligned memory. The matrices of one expert may differ in type (llama.cpp's
// Q4_K_M keeps down_proj in Q6_K on some layers), so a pool has a layout per
// layer; its buffers are sized for the largest.
struct ExpertLayout {
  DType w1_dtype = DType::kBF16;
  DType w3_dtype = DType::kBF16;
  DType w2_dtype = DType::kBF16;
  int64_t hidden_size = 0;        // D
  int64_t intermediate_size = 0;  // I
  int64_t w1_offset = 0;          // gate [I, D]
  int64_t w3_offset = 0;          // up   [I, D]
  int64_t w2_offset = 0;          // down [D, I]
  int64_t w1_bytes = 0;           // I * DTypeRowBytes(w1_dtype, D)
  int64_t w3_bytes = 0;           // I * DTypeRowBytes(w3_dtype, D)
  int64_t w2_bytes = 0;           // D * DTypeRowBytes(w2_dtype, I)
  int64_t copy_bytes = 0;         // w1 + w3 + w2 bytes: what one migration copies
  int64_t buffer_bytes = 0;       // one slot or staging buffer, alignment included
  // A dense layer (no experts) holds the first MoE layer's layout as a
  // stand-in; MeanCopyBytes leaves it out.
  bool dense_layer = false;

  // Any of the three matrices in a ggml block type.
  bool quantized() const { return IsQuantized(w1_dtype) || IsQuantized(w3_dtype) || IsQuantized(w2_dtype); }
  // "BF16", or "Q4_K/Q4_K/Q6_K" (w1/w3/w2) when they differ.
  std::string DTypeNames() const;

  // Every matrix of `dtype`. InvalidArgument naming the field when the
  // config has no experts' shape, or naming the matrix, its type and the
  // block size when a row is not a whole number of blocks.
  static absl::StatusOr<ExpertLayout> ForModel(const ModelConfig& config, DType dtype);
  static absl::StatusOr<ExpertLayout> ForMatrices(const ModelConfig& config, DType w1, DType w3, DType w2);
};

// One layout per layer ([layer]); what the pools are built from.
using ExpertLayouts = std::vector<ExpertLayout>;
// The largest buffer_bytes of `layouts` (a slot must hold any layer's expert).
int64_t MaxBufferBytes(const ExpertLayouts& layouts);
// The mean copy_bytes over the layers: one migration's expected bytes, for
// the cost model (every layer has as many experts, so each layer counts once).
int64_t MeanCopyBytes(const ExpertLayouts& layouts);

inline constexpr int64_t kExpertBufferAlignment = 4096;

struct ExpertPoolOptions {
  // How many experts the pool holds in slots: num_slots when >= 0, else as
  // many as memory_bytes holds after the staging buffers
  // (memory_bytes / buffer_bytes - num_staging_buffers).
  int num_slots = -1;
  int64_t memory_bytes = 0;
  // Staging buffers: the most migrations one layer plan may start (the
  // planner's max_new_migrations). gpu-only and migrate-then-gpu plans need
  // at least one.
  int num_staging_buffers = 2;

  // The slot count these options give for buffers of `buffer_bytes` (a
  // quantized expert's are smaller, so the same budget holds more).
  // InvalidArgument naming the field (num_slots, memory_bytes,
  // num_staging_buffers) when negative or too small for the staging buffers.
  absl::StatusOr<int> SlotCount(int64_t buffer_bytes) const;
};

enum class BufferState : uint8_t {
  kFree,     // holds nothing
  kCopying,  // a migration is writing it (queued or running)
  kReady,    // holds its expert's weights
};
const char* BufferStateName(BufferState state);

// One row of the slot table (or of the staging buffers).
struct PoolSlot {
  int index = 0;  // slot or staging-buffer number
  bool staging = false;
  std::optional<ExpertKey> expert;  // what it holds (or is being copied into it)
  BufferState state = BufferState::kFree;
};

// Where an expert is in the pool.
struct PoolLocation {
  bool held = false;  // in a slot or a staging buffer
  bool staging = false;
  int index = -1;
  BufferState state = BufferState::kFree;
};

// One finished copy, for the cost model (CostModel::ObserveMigration) and
// the coordinator's residency table (CompleteMigration).
struct MigrationRecord {
  ExpertKey expert;
  bool staging = false;  // a planner copy into a staging buffer, not a slot
  int64_t bytes = 0;     // its layer's copy_bytes
  double queued_us = 0;  // from Migrate/Stage until the copy started
  double copy_us = 0;    // the copy itself
};

// What one RunExperts call spent.
struct PoolRunTiming {
  double wait_us = 0;        // waiting for copies to become ready
  double compute_us = 0;     // computing the experts
  int64_t slot_runs = 0;     // experts computed from a slot
  int64_t staging_runs = 0;  // experts computed from a staging buffer
};

// Counters since creation (or ResetStats).
struct ExpertPoolStats {
  std::string kind;  // e.g. "no-GPU host pool"
  int num_slots = 0;
  int used_slots = 0;  // copying or ready
  int num_staging_buffers = 0;
  int64_t expert_bytes = 0;        // one migration's copy (the mean over layers: MeanCopyBytes)
  int64_t placements = 0;          // initial placement copies (synchronous)
  int64_t migrations_started = 0;  // slot migrations + staging copies queued
  int64_t migrations_completed = 0;
  int64_t staging_copies = 0;  // of those, planner copies into staging buffers
  int64_t bytes_copied = 0;    // by completed migrations
  // Copies (placements and migrations) from host memory that is not
  // page-locked: the driver stages them, at a fraction of DMA's speed
  // (CUDA pool only: see pinned_regions.h for when a region cannot be).
  int64_t pageable_copies = 0;
  double copy_us = 0;      // Σ copy time of completed migrations
  int64_t admissions = 0;  // staged experts kept in a slot
  int64_t evictions = 0;
  int64_t slot_runs = 0;     // hits: experts computed from a slot
  int64_t staging_runs = 0;  // experts computed from a staging buffer
  double wait_us = 0;        // RunExperts waiting for copies
  double compute_us = 0;     // RunExperts computing

  // Achieved copy bandwidth (bytes_copied / copy_us), 0 before any copy.
  double MigrationGbPerSecond() const { return copy_us > 0 ? static_cast<double>(bytes_copied) / copy_us * 1e-3 : 0; }
};

class ExpertPool {
 public:
  virtual ~ExpertPool() = default;

  // What the pool is, in words, for logs and stats ("no-GPU host pool").
  virtual std::string kind() const = 0;
  // Layer `layer`'s expert layout (0 <= layer < num_layers()).
  virtual const ExpertLayout& layout(int layer) const = 0;
  // One slot's (and staging buffer's) bytes: the largest layer's expert.
  virtual int64_t buffer_bytes() const = 0;
  // One migration's bytes, the mean over layers (MeanCopyBytes): the cost
  // model's expert_bytes.
  virtual int64_t expert_bytes() const = 0;
  virtual int num_layers() const = 0;
  virtual int num_experts() const = 0;
  virtual int num_slots() const = 0;
  virtual int num_staging_buffers() const = 0;

  // Initial placement: copies `key` into a free slot before returning.
  // ResourceExhausted when no slot is free; FailedPrecondition when the pool
  // already holds it; InvalidArgument for a key outside the model.
  virtual absl::Status Place(ExpertKey key) = 0;
  // Queues a copy of `key` into a slot: the slot of `evict` (which must be
  // in a slot and ready; it is evicted now) or else a free one.
  // ResourceExhausted / FailedPrecondition / InvalidArgument as Place, and
  // FailedPrecondition when `evict` is not a ready slot.
  virtual absl::Status Migrate(ExpertKey key, std::optional<ExpertKey> evict) = 0;
  // Queues a copy of `key` into a free staging buffer, for this layer's plan
  // only. ResourceExhausted when every staging buffer is taken.
  virtual absl::Status Stage(ExpertKey key) = 0;
  // Moves a staged expert into a slot (that of `evict`, evicted now, or a
  // free one) without copying; waits for its copy first.
  // FailedPrecondition when `key` is not staged.
  virtual absl::Status Admit(ExpertKey key, std::optional<ExpertKey> evict) = 0;
  // Frees `key`'s slot (waiting for its copy when one is in flight).
  // FailedPrecondition when it is not in a slot.
  virtual absl::Status Evict(ExpertKey key) = 0;
  // Frees every staging buffer (after the layer ran; copies still in flight
  // are waited for first).
  virtual absl::Status ReleaseStaging() = 0;

  virtual PoolLocation Find(ExpertKey key) const = 0;
  virtual bool IsReady(ExpertKey key) const = 0;  // held and its copy done
  // Blocks until `key`'s copy is done. FailedPrecondition when the pool does
  // not hold it; DeadlineExceeded after a long wait (a stuck engine, a bug).
  virtual absl::Status WaitReady(ExpertKey key) = 0;
  virtual std::vector<PoolSlot> SlotTable() const = 0;  // slots, then staging buffers

  // Computes FFN_e for every entry of `work` (layer `layer`) from the pool's
  // copy of its weights, waiting for each expert's copy when it is in
  // flight. FailedPrecondition naming the expert when the pool does not hold
  // it; InvalidArgument for a bad entry. `timing` (may be null) gets what
  // the call spent.
  virtual absl::Status RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) = 0;

  // Copies finished since the last call, in completion order.
  virtual std::vector<MigrationRecord> TakeCompletedMigrations() = 0;
  virtual ExpertPoolStats stats() const = 0;
  virtual void ResetStats() = 0;  // counters only; the slot table stays
};

}  // namespace tandem
