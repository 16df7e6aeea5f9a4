// The CUDA device query: on a machine with a GPU it lists it; without one the
// test says why it skips instead of passing silently.
#include "gpu_worker/cuda/cuda_device.h"

#include <gtest/gtest.h>

#include <iostream>

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
    // Every GPU tandem builds for allows 64 KB of shared memory per block
    // (the prefill attention tiles need 48.1 KB at head_dim 256).
    EXPECT_GE(d.max_shared_bytes_per_block, 64 * 1024) << d.name;
    absl::StatusOr<bool> read_only = HostRegisterReadOnlySupported(d.index);
    ASSERT_TRUE(read_only.ok()) << read_only.status();
    EXPECT_EQ(*read_only, d.host_register_read_only);
    std::cout << "  device " << d.index << " " << d.name << ": host_register_read_only " << d.host_register_read_only
              << ", max_shared_bytes_per_block " << d.max_shared_bytes_per_block << "\n";
  }
  EXPECT_EQ(HostRegisterReadOnlySupported(static_cast<int>(devices->size())).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Without a device (or without CUDA) the attribute query says why, as the
// device list does (with one, the listing test above checks its answers; no
// skip here: deploy/gpu-check.sh fails on any skip on a GPU machine).
TEST(CudaDeviceTest, ReadOnlyRegistrationQueryAnswersOrSaysWhyNot) {
  absl::StatusOr<bool> read_only = HostRegisterReadOnlySupported(0);
  if (ListCudaDevices().ok()) {
    EXPECT_TRUE(read_only.ok()) << read_only.status();
    return;
  }
  ASSERT_FALSE(read_only.ok());
  EXPECT_EQ(read_only.status().code(),
            BuiltWithCuda() ? absl::StatusCode::kUnavailable : absl::StatusCode::kFailedPrecondition)
      << read_only.status();
}

}  // namespace
}  // namespace tandem
