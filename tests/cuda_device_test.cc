// The CUDA device query: on a machine with a GPU it lists it; without one the
// test says why it skips instead of passing silently.
#include "gpu_worker/cuda_device.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(CudaDeviceTest, ListsDevicesOrExplainsWhyNot) {
  auto devices = ListCudaDevices();
  if (!BuiltWithCuda()) {
    ASSERT_FALSE(devices.ok());
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "built without CUDA: " << devices.status().message();
  }
  if (!devices.ok()) {
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kUnavailable);
    GTEST_SKIP() << "no CUDA device on this machine: " << devices.status().message();
  }
  ASSERT_FALSE(devices->empty());
  for (const CudaDeviceInfo& d : *devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.compute_capability_major, 7) << "tandem builds for Turing (7.5) and newer";
    EXPECT_GT(d.total_memory_bytes, 0);
    EXPECT_GT(d.multiprocessors, 0);
  }
}

}  // namespace
}  // namespace tandem
