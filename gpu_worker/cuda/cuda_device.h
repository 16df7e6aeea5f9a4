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
  // cudaDevAttrHostRegisterReadOnlySupported: read-only mappings can be
  // page-locked in place (not on discrete GPUs in x86 hosts; see
  // pinned_regions.h for what the expert pool does then).
  bool host_register_read_only = false;
  // cudaDevAttrMaxSharedMemoryPerBlockOptin: the most shared memory one
  // block may use (after opting in above 48 KB).
  int64_t max_shared_bytes_per_block = 0;
  std::string pci_bus_id;
};

// True when this binary was built with CUDA.
bool BuiltWithCuda();

// The visible devices. FailedPrecondition when the build has no CUDA;
// Unavailable when CUDA is built in but no device or driver is present (the
// message carries CUDA's own reason).
absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices();

// Whether `device` can page-lock a read-only mapping in place
// (cudaDevAttrHostRegisterReadOnlySupported). Errors as ListCudaDevices,
// and InvalidArgument for a device index out of range.
absl::StatusOr<bool> HostRegisterReadOnlySupported(int device);

}  // namespace tandem
