// The CUDA expert pool's kernels for block-quantized weights (a GGUF's
// experts kept as ggml blocks, --gguf_experts quantized): the blocks are
// decoded inside the kernels, never stored dequantized in a slot.
//
//   decode GEMV   y[r, j] = Σ_c x[r, c] · w[j, c] for the few rows of a
//                 decode step (rows <= kQuantGemvMaxRows): one warp per
//                 output row j, its lanes walking the row's values and
//                 decoding each once for every input row; f32 accumulation,
//                 a warp reduction at the end. Reads the weights once:
//                 what a memory-bound decode step should cost.
//   dequantize    w → a dense [n, k] bf16 (or f32) matrix, for the batched
//                 path (more rows): the pool decodes an expert's matrices
//                 into a scratch buffer and runs its cuBLAS bf16 GEMMs on
//                 them (tensor cores), so a large batch pays one decode per
//                 matrix, not one per row.
//
// Formats (common/quant/block_formats.h gives the byte layouts, written
// here from those layouts): Q8_0, Q4_0, Q4_1, Q5_0 (32 values a block) and
// Q4_K, Q5_K, Q6_K (256). Values decode exactly as the CPU's reference
// decoders do (f16 scales widened, then d·q - m in f32; the GPU may fuse the
// multiply-add, so a value can differ in its last bit).
//
// Shapes and ranges: w is [n, k] row-major of whole blocks (k a multiple of
// the format's block size; rows of DTypeRowBytes bytes, 2-byte aligned as
// every block size is even), device memory; n, k < 2^31; x is [rows, k]
// f32 or bf16 with leading dimension ldx; y f32 [rows, n] with ldy. Each
// launches on `stream` and returns the launch's error.
//
// C++17 on purpose: included by the .cu and by the C++20 pool.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_worker/cuda/cuda_expert_kernels.h"

namespace tandem {

// Same order as common/dtype.h's quantized DTypes (kQ8_0 .. kQ6_K), which
// nvcc does not include; then Q4_K and Q6_K blocks in group-major order
// (BlockOrder::kGroupMajor, common/quant/block_order.h), which a pool copies
// from a CPU worker's store or a CPU process's own copy as they are.
enum class KernelQuantType : uint8_t {
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ4_KGroupMajor,
  kQ6_KGroupMajor
};

// The decode GEMV serves up to this many rows per expert; more take the
// dequantize + GEMM path. Eight keeps the accumulators in registers.
inline constexpr int kQuantGemvMaxRows = 8;

cudaError_t LaunchQuantGemv(const void* w, KernelQuantType type, int64_t n, int64_t k, const void* x,
                            KernelDType x_dtype, int64_t ldx, int rows, float* y, int64_t ldy, cudaStream_t stream);

// out [n, k] of out_dtype (kBF16 or kF32) = the decoded values of w.
cudaError_t LaunchDequantize(const void* w, KernelQuantType type, int64_t n, int64_t k, void* out,
                             KernelDType out_dtype, cudaStream_t stream);

}  // namespace tandem
