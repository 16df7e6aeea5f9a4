// The build without CUDA: the same CudaExpertPool interface, a clear answer.
#include "gpu_worker/cuda/cuda_expert_pool.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<CudaExpertPool>> CudaExpertPool::Create(const ModelConfig&, ExpertSources,
                                                                       const CudaExpertPoolOptions&) {
  return absl::UnimplementedError(
      "CUDA pool: this build of tandem has no CUDA support (built without CUDA: nvcc was not found at configure "
      "time, or -DTANDEM_ENABLE_CUDA=OFF)");
}

}  // namespace tandem
