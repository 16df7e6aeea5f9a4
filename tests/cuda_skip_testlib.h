// Skipping the GPU tests where there is no GPU, saying why: the build has no
// CUDA, or CUDA is built in but no device (or driver) is visible. A skip on
// a GPU machine is a failure of deploy/gpu-check.sh, so the reason matters.
#pragma once

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace tandem {

// Why this process cannot use a CUDA device, or nullopt when it can.
std::optional<std::string> NoCudaDeviceReason();

}  // namespace tandem

// GTEST_SKIP from the test body (it returns from the calling function).
#define SKIP_WITHOUT_CUDA_DEVICE()                                                             \
  do {                                                                                         \
    if (auto tandem_no_cuda = ::tandem::NoCudaDeviceReason()) GTEST_SKIP() << *tandem_no_cuda; \
  } while (0)
