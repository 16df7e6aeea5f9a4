// The Python SDK installs with pip (client/python/pyproject.toml, stubs
// generated at build) into a fresh virtual environment, and its example
// streams a generation from a real tandem-server with what was installed.
// Skipped, saying what to install, when the configured python3 cannot make
// a venv with pip or lacks setuptools and wheel.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

TEST(PythonPipInstallTest, InstallsInAVenvAndTheExampleRuns) {
  const std::string python = TANDEM_PYTHON3;
  if (python.empty()) {
    GTEST_SKIP() << "no python3 that imports grpc and google.protobuf was found at configure time "
                    "(Debian: python3-grpcio python3-protobuf; reconfigure after installing)";
  }
  ScopedTempDir dir;
  ASSERT_OK_AND_ASSIGN(ProcessResult tools,
                       RunProcess({python, "-c", "import ensurepip, venv, setuptools, wheel"}, {}, dir.path()));
  if (tools.exit_code != 0) {
    GTEST_SKIP() << python << " cannot build and install a package in a venv (Debian: python3-venv "
                 << "python3-setuptools python3-wheel): " << tools.err;
  }
  // A copy of the SDK and the protos, laid out as in the repository: the
  // build writes build/ and *.egg-info beside setup.py, not in the tree.
  const fs::path src = dir.path() / "src";
  fs::create_directories(src / "client");
  fs::copy(TANDEM_SOURCE_DIR "/client/python", src / "client" / "python", fs::copy_options::recursive);
  fs::copy(TANDEM_SOURCE_DIR "/protos", src / "protos", fs::copy_options::recursive);

  const fs::path venv = dir.path() / "venv";
  ASSERT_OK_AND_ASSIGN(ProcessResult made,
                       RunProcess({python, "-m", "venv", "--system-site-packages", venv.string()}, {}, dir.path()));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  ASSERT_OK_AND_ASSIGN(ProcessResult installed,
                       RunProcess({(venv / "bin" / "pip").string(), "install", "--no-build-isolation", "--no-index",
                                   "--disable-pip-version-check", (src / "client" / "python").string()},
                                  {"PIP_NO_INPUT=1"}, dir.path(), absl::Seconds(300)));
  ASSERT_EQ(installed.exit_code, 0) << installed.out << installed.err;
  const std::string venv_python = (venv / "bin" / "python").string();
  ASSERT_OK_AND_ASSIGN(
      ProcessResult where,
      RunProcess({venv_python, "-c", "import tandem, tandem.v1.inference_pb2_grpc; print(tandem.__file__)"},
                 {"PYTHONDONTWRITEBYTECODE=1"}, dir.path()));
  ASSERT_EQ(where.exit_code, 0) << where.err;
  EXPECT_TRUE(absl::StrContains(where.out, (venv / "lib").string())) << "imported from " << where.out;

  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  ServerProcess server({.model_dir = dir.path() / "model",
                        .socket = dir.path() / "server.sock",
                        .extra_args = {"--threads", "1"},
                        .log = dir.path() / "server.log"});
  ASSERT_OK(server.Start());
  ASSERT_OK_AND_ASSIGN(ProcessResult example,
                       RunProcess({venv_python, TANDEM_SOURCE_DIR "/client/python/examples/generate.py", "--target",
                                   server.address(), "--prompt", "The licensee may", "-n", "6", "--temperature", "0"},
                                  {"PYTHONDONTWRITEBYTECODE=1"}, dir.path()));
  EXPECT_EQ(example.exit_code, 0) << example.out << example.err << server.LogTail();
  EXPECT_TRUE(absl::StartsWith(example.out, "The licensee may")) << example.out;
  EXPECT_GT(example.out.size(), std::string("The licensee may\n").size()) << "no generated text: " << example.out;
  EXPECT_TRUE(absl::StrContains(example.err, " tokens (")) << example.err;
}

}  // namespace
}  // namespace tandem
