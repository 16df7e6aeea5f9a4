// tandem's element types (common/dtype.h) as CUDA and tandem's kernels name
// them, for the host code of the CUDA pool and the CUDA backend. Host C++
// only: common/dtype.h is not for nvcc.
#pragma once

#include <library_types.h>

#include "common/base/dtype.h"
#include "gpu_worker/cuda_expert_kernels.h"

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

}  // namespace tandem
