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
//            hold the weights (the model's mapped weights, or the CPU
//            workers' shared-memory stores) and the pool registers them in
//            place (cudaHostRegister), keeping no second host copy: read-only
//            where the device supports it, else plainly where the mapping is
//            writable (pinned_regions.h, ChooseHostPinMode). A region that
//            cannot be locked (a read-only mapping on a discrete GPU in an
//            x86 host, or the driver refusing) does not stop the pool: it is
//            logged once, and weights outside every registered region are
//            still copied correctly, but from pageable memory (the driver
//            stages them; slower, and stats().pageable_copies counts them).
//   Compute  RunExperts on the pool's compute stream: the rows of every
//            expert packed on the host into one pinned [T, D] batch (the
//            rows arrive in separate host arrays, so this host copy is the
//            gather: one DMA instead of one per expert; a device gather
//            kernel would need the rows on the device first), copied up and
//            converted to the weights' type. Then, grouped (default): one
//            cudaStreamWaitEvent per expert of the call, on that expert's
//            readiness event only (the GPU waits, the host does not; all
//            before the first GEMM, which needs them all), then
//            ONE cuBLAS grouped GEMM (cublasGemmGroupedBatchedEx) for gate and
//            up of every expert (a group per expert of two problems, w1 and
//            w3, sharing m = I, n = R, k = D), the fused silu(gate)·up
//            kernel over all T rows, ONE grouped GEMM for down (a group per
//            expert), and the output widened to f32. cuBLAS's grouped GEMM
//            writes C in the weights' type for bf16/f16 (its only
//            combinations), so gate, up and the output are rounded to it
//            (f32 accumulation inside each GEMM). The matrix-pointer arrays
//            are built on the host in a pinned buffer and copied to a device
//            scratch buffer on the compute stream, ordered before the GEMMs
//            (no host wait). Fallback (options.grouped_gemm = false, rows
//            not 16-byte aligned, or cuBLAS answering NOT_SUPPORTED, logged
//            once and kept for the pool's life): per expert, the wait on its
//            event, gate and up as one strided-batched GEMM into f32, the
//            fused kernel over all rows, then the down GEMMs into f32. One
//            stream synchronisation at the end (the outputs are host
//            memory); never a device-wide one.
//   Quantized  experts kept as a GGUF's blocks (--gguf_experts quantized;
//            which layouts: gpu_pool_types.h) are stored and copied as
//            blocks, the buffers sized for the largest layer's expert, and
//            computed one expert at a time without the grouped GEMM: up to
//            kQuantGemvMaxRows rows by the decode GEMV on the blocks (f32
//            rows in, f32 gate/up out, bf16 h into down), more rows by
//            dequantizing the expert's matrices into a bf16 scratch and the
//            per-expert bf16 GEMMs (cuda_quant_kernels.h).
//   Freeing  Evict / ReleaseStaging wait for the buffer's copy; with
//            poison_freed_buffers (default on in debug builds) the freed
//            buffer is filled with 0xFF bytes (NaN in bf16, f16 and f32), so
//            that computing from a freed or half-written buffer shows up as
//            NaN outputs. Every fill (the whole pool's at Create, then each
//            freed buffer's) runs on the compute stream and records the
//            buffer's `freed` event there; the next copy into the buffer, on
//            a copy stream (non-blocking: no implicit order with any other
//            stream), waits for that event on the GPU.
//
// Results differ from the CPU ExpertFfn by rounding only: activations are
// rounded to the weights' type (bf16: 8 bits of mantissa) before each GEMM,
// and on the grouped path after each GEMM too; tests compare them by
// normalised mean squared error.
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
#include "common/model/model_config.h"
#include "common/model/model_weights.h"
#include "gpu_worker/expert_pool.h"
#include "gpu_worker/pinned_regions.h"
#include "gpu_worker/slot_pool.h"

namespace tandem {

inline constexpr const char* kCudaPoolKind = "CUDA pool";

struct CudaExpertPoolOptions {
  ExpertPoolOptions pool;  // slots, memory budget, staging buffers
  int device = 0;          // CUDA device index
  int num_copy_streams = 2;
  // Regions to page-lock for the pool's lifetime (must not overlap one
  // another or memory already pinned): ExpertHostRegions (pinned_regions.h),
  // or WorkerExpertSources::regions(). Each is locked as ChooseHostPinMode
  // says for this device and its mapping, or left pageable.
  std::vector<PinnedHostRegion> host_regions;
  // Fill freed buffers with 0xFF (NaN) on the GPU.
#ifdef NDEBUG
  bool poison_freed_buffers = false;
#else
  bool poison_freed_buffers = true;
#endif
  int64_t max_rows = 0;  // scratch preallocated for this many rows per RunExperts
  // RunExperts through cuBLAS's grouped GEMM (two calls per layer) rather
  // than per-expert GEMMs (2 × experts calls); false forces the per-expert
  // path (to compare them, or if the grouped one misbehaves).
  bool grouped_gemm = true;
};

// The slot table, copy queue and stats are SlotPool's (slot_pool.h).
class CudaExpertPool : public SlotPool {
 public:
  // `experts` is [layer][expert] (views, in host memory that outlives the
  // pool), every matrix of the config's shape, and either all of one float
  // dtype (bf16, f16 or f32) or all block-quantized (CheckGpuPoolLayouts).
  // InvalidArgument naming the field, expert or types; Unavailable when there
  // is no usable device; ResourceExhausted when the budget does not fit in
  // the device's memory; Internal naming the CUDA/cuBLAS call otherwise;
  // Unimplemented in a build without CUDA.
  static absl::StatusOr<std::unique_ptr<CudaExpertPool>> Create(const ModelConfig& config,
                                                                const std::vector<std::vector<ExpertWeights>>& experts,
                                                                const CudaExpertPoolOptions& options) {
    if (absl::Status shapes = CheckExperts(config, experts).status(); !shapes.ok()) return shapes;
    return Create(config, WholeExperts(experts), options);
  }
  // The same from sources whose matrices may lie in pieces (expert_source.h:
  // the CPU workers' stores, registered in place through host_regions);
  // each piece is one cudaMemcpy2DAsync.
  static absl::StatusOr<std::unique_ptr<CudaExpertPool>> Create(const ModelConfig& config, ExpertSources experts,
                                                                const CudaExpertPoolOptions& options);

  // The pool's copy of `key` read back to the host (after waiting for its
  // copy): w1, w3, w2 bytes concatenated (blocks as stored),
  // layout(key.layer).copy_bytes in all. For
  // tests; a synchronous device→host copy. FailedPrecondition when not held.
  virtual absl::StatusOr<std::vector<uint8_t>> ReadHeld(ExpertKey key) = 0;
  // How each of options.host_regions was page-locked (same order);
  // kPageable where it could not be. Any thread.
  virtual std::vector<HostPinMode> host_pin_modes() const = 0;
  // Whether RunExperts uses the grouped GEMMs now: asked for, the shape's
  // rows 16-byte aligned, and cuBLAS has not refused them. Any thread.
  virtual bool grouped_gemm() const = 0;

 protected:
  using SlotPool::SlotPool;
};

}  // namespace tandem
