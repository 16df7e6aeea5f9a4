// The Python SDK (client/python) against a real tandem-server process: runs
// client/python/tests/test_client.py, which checks greedy ids against the
// in-process engine's (computed here), beam search, errors and the unary calls.
// Skipped only when no python3 with grpc was found at configure time.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

TEST(PythonSdkTest, TestClientScriptPasses) {
  const std::string python = TANDEM_PYTHON3;
  if (python.empty()) {
    GTEST_SKIP() << "no python3 that imports grpc and google.protobuf was found at configure time "
                    "(Debian: python3-grpcio python3-protobuf; reconfigure after installing)";
  }
  const std::filesystem::path package_dir = TANDEM_BINARY_DIR "/python";
  ASSERT_TRUE(std::filesystem::exists(package_dir / "tandem" / "v1" / "inference_pb2_grpc.py"))
      << "Python stubs missing under " << package_dir << ": build the tandem_python target";

  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  const std::vector<int32_t> prompt = RandomTokens(5, 512, /*seed=*/5);
  auto expected = GreedyInProcess(dir.path() / "model", prompt, 10);
  ASSERT_OK(expected);

  ServerProcess server({.model_dir = dir.path() / "model",
                        .socket = dir.path() / "server.sock",
                        .extra_args = {"--threads", "1"},
                        .log = dir.path() / "server.log"});
  absl::Status started = server.Start();
  ASSERT_OK(started);

  auto run = RunProcess({python, TANDEM_SOURCE_DIR "/client/python/tests/test_client.py", "--target", server.address(),
                         "--prompt_ids", absl::StrJoin(prompt, ","), "--expected_ids", absl::StrJoin(*expected, ",")},
                        {"PYTHONPATH=" + package_dir.string(), "PYTHONDONTWRITEBYTECODE=1"}, dir.path());
  ASSERT_OK(run);
  EXPECT_EQ(run->exit_code, 0) << "stdout:\n"
                               << run->out << "\nstderr:\n"
                               << run->err << "\nserver log:\n"
                               << server.LogTail();
}

}  // namespace
}  // namespace tandem
