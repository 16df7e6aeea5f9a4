// The GPU flags of tandem-generate and tandem-server (client/runtime_flags):
// names parse, bad ones are named in the error, a flag that needs another
// says which, and --backend cuda where there is no GPU exits non-zero with
// the reason instead of running on the CPU.
#include <string>
#include <vector>

#include "coordinator/runtime/local_runtime.h"
#include "gtest/gtest.h"
#include "tests/cuda_skip_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

TEST(GpuFlagsTest, KindsParseAndBadNamesNameTheFlag) {
  EXPECT_EQ(*ParseBackendKind("cpu", "--backend"), BackendKind::kCpu);
  EXPECT_EQ(*ParseBackendKind("cuda", "--backend"), BackendKind::kCuda);
  EXPECT_EQ(*ParseExpertPoolKind("host", "--expert_pool"), ExpertPoolKind::kHost);
  EXPECT_EQ(*ParseExpertPoolKind("cuda", "--expert_pool"), ExpertPoolKind::kCuda);
  auto backend = ParseBackendKind("gpu", "--backend");
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(backend.status().message().find("--backend"), std::string::npos);
  EXPECT_NE(backend.status().message().find("gpu"), std::string::npos);
  auto pool = ParseExpertPoolKind("vram", "--expert_pool");
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("--expert_pool"), std::string::npos);
}

// The programs say so too, naming the flag, and exit non-zero.
TEST(GpuFlagsTest, TheProgramsRejectGpuFlagsTheyCannotHonour) {
  ScopedTempDir dir;
  const std::string generate = std::string(TANDEM_BINARY_DIR) + "/bin/tandem-generate";
  const std::vector<std::string> base = {generate, "--synthetic", "tiny:2", "--synthetic_seed", "7", "--prompt_ids",
                                         "1,2,3",  "-n",          "2",      "--threads",        "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    return RunProcess(argv, {}, dir.path());
  };
  auto pool_alone = with({"--expert_pool", "cuda"});
  ASSERT_OK(pool_alone);
  EXPECT_NE(pool_alone->exit_code, 0);
  EXPECT_NE(pool_alone->err.find("--expert_pool"), std::string::npos) << pool_alone->err;
  auto bad_backend = with({"--backend", "tpu"});
  ASSERT_OK(bad_backend);
  EXPECT_NE(bad_backend->exit_code, 0);
  EXPECT_NE(bad_backend->err.find("--backend"), std::string::npos) << bad_backend->err;
  auto graphs = with({"--cuda_graphs"});
  ASSERT_OK(graphs);
  EXPECT_NE(graphs->exit_code, 0);
  EXPECT_NE(graphs->err.find("--cuda_graphs needs --backend cuda"), std::string::npos) << graphs->err;

  if (NoCudaDeviceReason()) {
    auto cuda = with({"--backend", "cuda"});
    ASSERT_OK(cuda);
    EXPECT_NE(cuda->exit_code, 0);
    EXPECT_NE(cuda->err.find("CUDA"), std::string::npos) << cuda->err;
  }
}

}  // namespace
}  // namespace tandem
