#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu_worker/cuda/cuda_convert.cuh"
#include "gpu_worker/cuda/cuda_expert_kernels.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;

using cuda_convert::FromFloat;
using cuda_convert::ToFloat;

template <typename T>
__global__ void ConvertF32Kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(in[i]);
  }
}

template <typename T>
__global__ void ConvertToF32Kernel(const T* __restrict__ in, float* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = ToFloat<T>(in[i]);
  }
}

// TIn: gate/up's type (f32 accumulators, or the weights' type from the
// grouped GEMM); TOut: the weights' type.
template <typename TIn, typename TOut>
__global__ void SiluMulKernel(const TIn* __restrict__ gate, const TIn* __restrict__ up, TOut* __restrict__ out,
                              int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = ToFloat<TIn>(gate[i]);
    // expf of a large -g overflows to inf and g / inf = -0: the right limit.
    out[i] = FromFloat<TOut>(g / (1.0f + __expf(-g)) * ToFloat<TIn>(up[i]));
  }
}

unsigned int Blocks(int64_t n) {
  // Enough blocks to fill the GPU; the grid-stride loop covers the rest.
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

cudaError_t LaunchConvertF32(const float* in, void* out, KernelDType out_dtype, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (out_dtype) {
    case KernelDType::kF32:
      return cudaMemcpyAsync(out, in, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case KernelDType::kF16:
      ConvertF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(in, static_cast<__half*>(out), n);
      break;
    case KernelDType::kBF16:
      ConvertF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(in, static_cast<__nv_bfloat16*>(out), n);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate, const float* up, void* out, KernelDType out_dtype, int64_t n,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (out_dtype) {
    case KernelDType::kF32:
      SiluMulKernel<float, float><<<Blocks(n), kThreads, 0, stream>>>(gate, up, static_cast<float*>(out), n);
      break;
    case KernelDType::kF16:
      SiluMulKernel<float, __half><<<Blocks(n), kThreads, 0, stream>>>(gate, up, static_cast<__half*>(out), n);
      break;
    case KernelDType::kBF16:
      SiluMulKernel<float, __nv_bfloat16>
          <<<Blocks(n), kThreads, 0, stream>>>(gate, up, static_cast<__nv_bfloat16*>(out), n);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchSiluMulSameType(const void* gate, const void* up, void* out, KernelDType dtype, int64_t n,
                                  cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (dtype) {
    case KernelDType::kF32:
      SiluMulKernel<float, float><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const float*>(gate), static_cast<const float*>(up), static_cast<float*>(out), n);
      break;
    case KernelDType::kF16:
      SiluMulKernel<__half, __half><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const __half*>(gate), static_cast<const __half*>(up), static_cast<__half*>(out), n);
      break;
    case KernelDType::kBF16:
      SiluMulKernel<__nv_bfloat16, __nv_bfloat16><<<Blocks(n), kThreads, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(gate), static_cast<const __nv_bfloat16*>(up),
          static_cast<__nv_bfloat16*>(out), n);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchConvertToF32(const void* in, KernelDType in_dtype, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (in_dtype) {
    case KernelDType::kF32:
      return cudaMemcpyAsync(out, in, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case KernelDType::kF16:
      ConvertToF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(in), out, n);
      break;
    case KernelDType::kBF16:
      ConvertToF32Kernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), out, n);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tandem
