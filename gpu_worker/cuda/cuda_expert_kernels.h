// The GPU expert pool's own kernels (the GEMMs are cuBLAS): activations
// f32 → the weights' element type and back, and the fused SwiGLU gate
// h = silu(gate) ⊙ up, from f32 accumulators (the per-expert GEMM path) or
// from gate/up already in the weights' type (the grouped GEMM path: cuBLAS's
// grouped GEMM writes C in A's type for bf16/f16). Each launches on `stream`
// and returns the launch's error (cudaGetLastError); asynchronous failures
// surface at the next synchronisation, as CUDA's always do.
//
// Legend: R rows, D hidden size, I intermediate size.
// Shapes and ranges: any n >= 0 (grid-stride loops; n < 2^31 per call);
// element types f32, f16, bf16 (KernelDType); pointers device memory.
//
// C++17 on purpose: this header is included by the .cu (nvcc compiles
// device code as C++17 here) and by the C++20 pool.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem {

// Same numbering as common/dtype.h's DType (which nvcc does not include:
// it pulls x86 intrinsics headers).
enum class KernelDType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

// out[n] = in[n] rounded to `out_dtype` (round to nearest even).
cudaError_t LaunchConvertF32(const float* in, void* out, KernelDType out_dtype, int64_t n, cudaStream_t stream);

// out[r, j] = silu(gate[r, j]) * up[r, j] for r < R, j < I, rounded to
// `out_dtype`; gate and up are f32 [R, I] (the GEMM's f32 accumulators),
// out is [R, I]. silu(g) = g / (1 + exp(-g)), computed in f32.
cudaError_t LaunchSiluMul(const float* gate, const float* up, void* out, KernelDType out_dtype, int64_t n,
                          cudaStream_t stream);

// The same with gate, up and out all of `dtype` ([R, I] each); silu and the
// product are computed in f32, the result rounded once to `dtype`.
cudaError_t LaunchSiluMulSameType(const void* gate, const void* up, void* out, KernelDType dtype, int64_t n,
                                  cudaStream_t stream);

// out[n] = in[n] widened to f32 (exact for every input type).
cudaError_t LaunchConvertToF32(const void* in, KernelDType in_dtype, float* out, int64_t n, cudaStream_t stream);

}  // namespace tandem
