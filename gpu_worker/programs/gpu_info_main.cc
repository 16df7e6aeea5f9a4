// tandem-gpu-info: the CUDA devices tandem would use, one JSON line each.
// host_register_read_only false (discrete GPUs in x86 hosts) means the
// expert pool page-locks only writable mappings (pinned_regions.h);
// max_shared_bytes_per_block bounds the attention kernels' tiles.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "gpu_worker/cuda/cuda_device.h"

int main() {
  auto devices = tandem::ListCudaDevices();
  if (!devices.ok()) {
    std::fprintf(stderr, "tandem-gpu-info: %s\n", std::string(devices.status().message()).c_str());
    return 1;
  }
  for (const auto& d : *devices) {
    std::cout << nlohmann::json{{"index", d.index},
                                {"name", d.name},
                                {"compute_capability", std::to_string(d.compute_capability_major) + "." +
                                                           std::to_string(d.compute_capability_minor)},
                                {"total_memory_bytes", d.total_memory_bytes},
                                {"free_memory_bytes", d.free_memory_bytes},
                                {"multiprocessors", d.multiprocessors},
                                {"async_copy_engines", d.async_copy_engines},
                                {"host_register_read_only", d.host_register_read_only},
                                {"max_shared_bytes_per_block", d.max_shared_bytes_per_block},
                                {"pci_bus_id", d.pci_bus_id}}
                     .dump()
              << "\n";
  }
  return 0;
}
