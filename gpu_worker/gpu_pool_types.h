// Which experts the CUDA pool can compute, decided on the host so that the
// build without CUDA (and its tests) gives the same answer as the GPU build:
//   - float experts: every matrix of every layer of one type (F32, F16 or
//     BF16; the activations are rounded to it for cuBLAS);
//   - block-quantized experts (a GGUF's, --gguf_experts quantized): every
//     matrix of a type the pool's kernels decode (GpuDecodesBlocks); types
//     may differ between matrices and layers (Q4_K_M's Q6_K down_proj).
// A layer mixing float and block matrices is refused (the pool has no
// kernel for that mix; such files are dequantized with --gguf_experts bf16).
#pragma once

#include "absl/status/status.h"
#include "common/base/dtype.h"
#include "gpu_worker/expert_pool.h"

namespace tandem {

// A block type the CUDA pool's kernels decode (gpu_worker/cuda_quant_kernels.h):
// Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K.
bool GpuDecodesBlocks(DType dtype);

// OK when the CUDA pool computes experts of these layouts ([layer]);
// InvalidArgument naming the layer, its types and what the pool takes
// otherwise.
absl::Status CheckGpuPoolLayouts(const ExpertLayouts& layouts);

}  // namespace tandem
