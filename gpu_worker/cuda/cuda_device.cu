#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "gpu_worker/cuda/cuda_device.h"

namespace tandem {

bool BuiltWithCuda() { return true; }

absl::StatusOr<std::vector<CudaDeviceInfo>> ListCudaDevices() {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no usable CUDA device: ", cudaGetErrorString(err)));
  }
  if (count == 0) return absl::UnavailableError("no usable CUDA device: the driver reports 0 devices");
  std::vector<CudaDeviceInfo> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, i);
    if (err != cudaSuccess) {
      return absl::InternalError(absl::StrCat("cudaGetDeviceProperties(", i, "): ", cudaGetErrorString(err)));
    }
    CudaDeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.compute_capability_major = prop.major;
    info.compute_capability_minor = prop.minor;
    info.total_memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    info.multiprocessors = prop.multiProcessorCount;
    info.async_copy_engines = prop.asyncEngineCount;
    int read_only = 0, shared_optin = 0;
    if (cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, i) == cudaSuccess) {
      info.host_register_read_only = read_only != 0;
    }
    if (cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, i) == cudaSuccess) {
      info.max_shared_bytes_per_block = shared_optin;
    }
    char bus[32] = {0};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), i) == cudaSuccess) info.pci_bus_id = bus;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      info.free_memory_bytes = static_cast<int64_t>(free_bytes);
    }
    devices.push_back(std::move(info));
  }
  return devices;
}

absl::StatusOr<bool> HostRegisterReadOnlySupported(int device) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device: ", err != cudaSuccess ? cudaGetErrorString(err) : "the driver reports 0 devices"));
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (", count, " found)"));
  }
  int supported = 0;
  const cudaError_t attr = cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterReadOnlySupported, device);
  if (attr != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaDeviceGetAttribute(HostRegisterReadOnlySupported, ", device,
                                            "): ", cudaGetErrorString(attr)));
  }
  return supported != 0;
}

}  // namespace tandem
