// Which CUDA GPUs this process can use, and what they are. Compiled with
// nvcc when CUDA is found; otherwise the build has no GPU support and
// ListCudaDevices says so. Any thread may call it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int64_t total_memory_bytes = 0;
  int64_t free_memory_bytes = 0;
  int multiprocessors = 0;
  int async_copy_engines = 0;  // 2 lets host→GPU and GPU→host copies overlap
  std::string pci_bus_id;
};

// True when this binary was built with CUDA.
bool BuiltWithCuda();

// The visible devices. FailedPrecondition when the build has no CUDA;
// Unavailable when CUDA is built in but no device or driver is present (the
// message carries CUDA's own reason).
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

}  // namespace tandem
