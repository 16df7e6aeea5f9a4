// The build without CUDA: same interface, a clear answer.
#include "gpu_worker/cuda/cuda_device.h"

namespace tandem {

bool BuiltWithCuda() { return false; }

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  return absl::FailedPreconditionError(
      "this build of tandem has no CUDA support (nvcc was not found at configure time)");
}

absl::StatusOr<bool> HostRegisterReadOnlySupported(int) { return ListCudaDevices().status(); }

}  // namespace tandem
