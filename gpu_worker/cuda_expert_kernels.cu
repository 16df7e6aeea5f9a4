#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu_worker/cuda_expert_kernels.h"

namespace tandem {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void ConvertF32Kernel(const float* __restrict__ in, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(in[i]);
  }
}

template <typename T>
__global__ void SiluMulKernel(const float* __restrict__ gate, const float* __restrict__ up, T* __restrict__ out,
                              int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    // expf of a large -g overflows to inf and g / inf = -0: the right limit.
    out[i] = FromFloat<T>(g / (1.0f + __expf(-g)) * up[i]);
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
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate, const float* up, void* out, KernelDType out_dtype, int64_t n,
                          cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (out_dtype) {
    case KernelDType::kF32:
      SiluMulKernel<<<Blocks(n), kThreads, 0, stream>>>(gate, up, static_cast<float*>(out), n);
      break;
    case KernelDType::kF16:
      SiluMulKernel<<<Blocks(n), kThreads, 0, stream>>>(gate, up, static_cast<__half*>(out), n);
      break;
    case KernelDType::kBF16:
      SiluMulKernel<<<Blocks(n), kThreads, 0, stream>>>(gate, up, static_cast<__nv_bfloat16*>(out), n);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace tandem
