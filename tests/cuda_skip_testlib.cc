#include "tests/cuda_skip_testlib.h"

#include "gpu_worker/cuda/cuda_device.h"

namespace tandem {

std::optional<std::string> NoCudaDeviceReason() {
  auto devices = ListCudaDevices();
  if (!BuiltWithCuda()) return "built without CUDA: " + std::string(devices.status().message());
  if (!devices.ok()) return "no CUDA device: " + std::string(devices.status().message());
  return std::nullopt;
}

}  // namespace tandem
