// tandem's element types (common/dtype.h) as CUDA and tandem's kernels name
// them, for the host code of the CUDA pool and the CUDA backend. Host C++
// only: common/dtype.h is not for nvcc.
#pragma once

#include <library_types.h>

#include "common/base/dtype.h"
#include "gpu_worker/cuda/cuda_expert_kernels.h"
#include "gpu_worker/cuda/cuda_quant_kernels.h"

namespace tandem {

inline cudaDataType CudaDataType(DType dtype) {
  switch (dtype) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: break;  // F32; quantized types never get here (RequireFloatDType)
  }
  return CUDA_R_32F;
}

inline KernelDType ToKernelDType(DType dtype) {
  switch (dtype) {
    case DType::kF16: return KernelDType::kF16;
    case DType::kBF16: return KernelDType::kBF16;
    default: break;  // F32; quantized types never get here (RequireFloatDType)
  }
  return KernelDType::kF32;
}

// A block type's format for the quantized kernels; only for types
// GpuDecodesBlocks accepts (gpu_pool_types.h), which the pool checks first.
inline KernelQuantType ToKernelQuantType(DType dtype, BlockOrder order) {
  if (order == BlockOrder::kGroupMajor && dtype == DType::kQ4_K) return KernelQuantType::kQ4_KGroupMajor;
  if (order == BlockOrder::kGroupMajor && dtype == DType::kQ6_K) return KernelQuantType::kQ6_KGroupMajor;
  switch (dtype) {
    case DType::kQ4_0: return KernelQuantType::kQ4_0;
    case DType::kQ4_1: return KernelQuantType::kQ4_1;
    case DType::kQ5_0: return KernelQuantType::kQ5_0;
    case DType::kQ4_K: return KernelQuantType::kQ4_K;
    case DType::kQ5_K: return KernelQuantType::kQ5_K;
    case DType::kQ6_K: return KernelQuantType::kQ6_K;
    default: break;  // Q8_0
  }
  return KernelQuantType::kQ8_0;
}

}  // namespace tandem
