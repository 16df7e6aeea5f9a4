// The compute backend on one CUDA GPU: embedding, norms, attention (over a
// block KV cache held in device memory), router, combine and lm_head, with
// the same results as CpuBackend up to rounding. Linear layers are cuBLAS
// GEMMs with the weights as stored (bf16, f16 or f32) and the activations
// rounded to the weights' type, f32 accumulation and output; the router is
// the exception: its (small, [E, D]) weights are widened to f32 at Create
// and its GEMM runs in f32, because routing is a discrete choice that bf16
// activations would flip on near ties.
//
// Transfers (a known cost): ComputeBackend passes host pointers, so every
// call copies its inputs host → pinned staging → device and its outputs
// back the same way on the backend's stream, then waits for that stream.
// Per layer that is [T, D] f32 in and out for Attention, [T, D] in and
// [T, D] + [T, E] + 2·[T, K] out for Router, [T, D] + [T·K, D] in and [T, D]
// out for Combine. A device-resident interface (hidden staying on the GPU
// between calls, only routing and expert rows crossing) would save all of
// the hidden-state copies and one stream synchronisation per call.
//
// The KV cache: a KvBlockPool created with NewKvStorage() (or CreateKvPool)
// keeps its blocks in this device's memory; Attention takes only slices of
// such pools (FailedPrecondition otherwise), uploads each slice's block
// table and writes the new rows' K and V straight into the device blocks.
// Copy-on-write (beam search) copies blocks device to device on the
// backend's stream.
//
// Legend: T rows in the batch, D hidden, E experts, K experts per token,
// V vocab, S slices.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "common/model/model_weights.h"
#include "coordinator/engine/compute_backend.h"
#include "coordinator/engine/kv_cache.h"

namespace tandem {

struct CudaBackendOptions {
  int device = 0;  // CUDA device index
  // Capture each layer's decode attention (every slice one new row) as a
  // CUDA graph per (layer, rows, block-table bucket) and replay it. Off by
  // default: written without a GPU to test on; turn on once
  // cuda_backend_test's graph test has passed on the target machine.
  bool decode_graphs = false;
  // Device and pinned buffers are allocated for this many rows at Create;
  // a larger batch grows them (a cudaMalloc, and any graphs are dropped).
  int64_t max_rows = 256;
};

// What the backend has done, for logs and tests.
struct CudaBackendStats {
  int64_t weight_bytes = 0;     // dense weights copied to the device at Create
  int64_t graphs_captured = 0;  // decode-attention graphs captured
  int64_t graph_launches = 0;   // decode-attention calls replayed from a graph
  int64_t h2d_bytes = 0;        // activations copied in (staging → device)
  int64_t d2h_bytes = 0;        // results copied out
};

// Owns its device copy of the dense weights, its stream, cuBLAS handle,
// buffers and graphs; borrows `weights` (must outlive it). Engine thread
// only (one call at a time; each call returns with the device idle for
// this backend's stream).
class CudaBackend final : public ComputeBackend {
 public:
  // Unavailable when no CUDA device is usable, InvalidArgument for a model
  // shape the kernels do not support (cuda_backend_kernels.h) or that needs
  // more shared memory than this GPU has (naming both),
  // ResourceExhausted when the weights do not fit; Unimplemented in a build
  // without CUDA.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const ModelWeights* weights,
                                                             const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  absl::Status Embed(std::span<const int32_t> tokens, float* hidden) override;
  absl::Status Attention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows, float* hidden) override;
  absl::Status Router(int layer, int64_t num_rows, const float* hidden, float* moe_input, float* router_logits,
                      int32_t* experts, float* weights) override;
  absl::Status SharedExpert(int layer, int64_t num_rows, const float* moe_input, float* hidden, float* term) override;
  absl::Status DenseMlp(int layer, int64_t num_rows, float* hidden, float* moe_input) override;
  absl::Status Combine(int64_t num_rows, const float* weights, const float* expert_out, float* hidden) override;
  absl::Status Logits(std::span<const int64_t> rows, const float* hidden, float* logits) override;

  // KV block storage in this device's memory, for KvBlockPool::Create. The
  // pool (and so the storage) must be destroyed before this backend: the
  // storage copies on the backend's stream.
  std::unique_ptr<KvBlockStorage> NewKvStorage();
  // KvBlockPool::Create(options, NewKvStorage()).
  absl::StatusOr<std::unique_ptr<KvBlockPool>> CreateKvPool(const KvCacheOptions& options);

  CudaBackendStats stats() const;

 private:
  struct Impl;
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
