// The CUDA expert pool: the ExpertPool interface (expert_pool.h) on one GPU.
//
//   Memory   one cudaMalloc of (slots + staging buffers) × layout.buffer_bytes,
//            sized from the budget (ExpertPoolOptions::memory_bytes or
//            num_slots), so an 80 GB GPU can act as a 24 GB one. Scratch for
//            activations is outside the budget and grows to the largest
//            RunExperts batch (options.max_rows preallocates it).
//   Copies   the migration engine: one host thread per copy stream
//            (num_copy_streams, default 2 so that both copy engines of a GPU
//            that has them are used), each taking queued copies in order and
//            issuing w1, w3, w2 host→GPU with cudaMemcpyAsync on its stream,
//            then recording the buffer's readiness event. Sources should lie
//            in page-locked memory: the caller names the host regions that
//            hold the weights (the CPU worker's shared-memory region, mapped
//            read-only) and the pool registers them in place
//            (cudaHostRegister), keeping no second host copy. Weights outside
//            every registered region are still copied correctly, but from
//            pageable memory (the driver bounces them; slower, and the stats
//            count them).
//   Compute  RunExperts on the pool's compute stream: the rows of every
//            expert packed into one [T, D] batch, converted to the weights'
//            type, then per expert: cudaStreamWaitEvent on that expert's
//            readiness event only (the GPU waits, the host does not), gate and
//            up as one strided-batched cuBLAS GEMM (f32 accumulate), the
//            fused silu(gate)·up kernel, the down GEMM. One stream
//            synchronisation at the end (the outputs are host memory); never a
//            device-wide one.
//   Freeing  Evict / ReleaseStaging wait for the buffer's copy; with
//            poison_freed_buffers (default on in debug builds) the freed
//            buffer is filled with 0xFF bytes (NaN in bf16, f16 and f32), so
//            that computing from a freed or half-written buffer shows up as
//            NaN outputs. The next copy into it waits for the fill on the GPU.
//
// Results differ from the CPU ExpertFfn by rounding only: activations are
// rounded to the weights' type (bf16: 8 bits of mantissa) before each GEMM;
// tests compare them by normalised mean squared error.
//
// Owns the device memory, streams, events, cuBLAS handle, host
// registrations and copy threads (joined by the destructor after the queued
// copies finish). Threads as ExpertPool says. Built only with CUDA; without
// it Create returns Unimplemented and everything else is the same interface.
//
// Legend: T rows of one RunExperts call, R rows of one expert, D hidden
// size, I intermediate size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "common/model_weights.h"
#include "gpu_worker/expert_pool.h"
#include "gpu_worker/slot_pool.h"

namespace tandem {

inline constexpr const char* kCudaPoolKind = "CUDA pool";

// A host range holding expert weights, to page-lock in place.
struct PinnedHostRegion {
  const void* data = nullptr;
  size_t bytes = 0;
  bool read_only = true;  // mapped PROT_READ (the worker's store is)
};

struct CudaExpertPoolOptions {
  ExpertPoolOptions pool;  // slots, memory budget, staging buffers
  int device = 0;          // CUDA device index
  int num_copy_streams = 2;
  // Regions to cudaHostRegister for the pool's lifetime (must not overlap
  // one another or memory already pinned).
  std::vector<PinnedHostRegion> host_regions;
  // Fill freed buffers with 0xFF (NaN) on the GPU.
#ifdef NDEBUG
  bool poison_freed_buffers = false;
#else
  bool poison_freed_buffers = true;
#endif
  int64_t max_rows = 0;  // scratch preallocated for this many rows per RunExperts
};

// The slot table, copy queue and stats are SlotPool's (slot_pool.h).
class CudaExpertPool : public SlotPool {
 public:
  // `experts` is [layer][expert] (views, in host memory that outlives the
  // pool), every matrix of the config's shape and of one dtype (bf16, f16 or
  // f32). InvalidArgument naming the field or expert; Unavailable when there
  // is no usable device; ResourceExhausted when the budget does not fit in
  // the device's memory; Internal naming the CUDA/cuBLAS call otherwise;
  // Unimplemented in a build without CUDA.
  static absl::StatusOr<std::unique_ptr<CudaExpertPool>> Create(const ModelConfig& config,
                                                                std::vector<std::vector<ExpertWeights>> experts,
                                                                const CudaExpertPoolOptions& options);

  // The pool's copy of `key` read back to the host (after waiting for its
  // copy): w1, w3, w2 bytes concatenated, layout().copy_bytes in all. For
  // tests; a synchronous device→host copy. FailedPrecondition when not held.
  virtual absl::StatusOr<std::vector<uint8_t>> ReadHeld(ExpertKey key) = 0;
  // Copies whose source lay outside every registered region (pageable).
  virtual int64_t pageable_copies() const = 0;

 protected:
  using SlotPool::SlotPool;
};

}  // namespace tandem
