// The Python SDK installs with a plain pip install, offline (--no-index with
// pip's build isolation on: its build backend, client/python/tandem_build.py,
// needs nothing installed), into a fresh virtual environment, from the
// checkout and from its sdist; its example streams a generation from a real
// tandem-server with what was installed. Skipped, saying what to install,
// when the configured python3 cannot make a venv with pip.
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
                       RunProcess({python, "-c", "import ensurepip, venv"}, {}, dir.path()));
  if (tools.exit_code != 0) {
    GTEST_SKIP() << python << " cannot make a venv with pip (Debian: python3-venv): " << tools.err;
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
                       RunProcess({(venv / "bin" / "pip").string(), "install", "--no-index", "--disable-pip-version-check",
                                   (src / "client" / "python").string()},
                                  {"PIP_NO_INPUT=1"}, dir.path(), absl::Seconds(300)));
  ASSERT_EQ(installed.exit_code, 0) << installed.out << installed.err;
  // The sdist carries the proto: it builds and installs away from a checkout.
  const fs::path sdist_dir = dir.path() / "sdist";
  fs::create_directories(sdist_dir);
  ASSERT_OK_AND_ASSIGN(
      ProcessResult sdist,
      RunProcess({python, "-c",
                  absl::StrCat("import sys; sys.path.insert(0, '", (src / "client" / "python").string(),
                               "'); import tandem_build; print(tandem_build.build_sdist('", sdist_dir.string(), "'))")},
                 {"PYTHONDONTWRITEBYTECODE=1"}, dir.path()));
  ASSERT_EQ(sdist.exit_code, 0) << sdist.err;
  const fs::path sdist_venv = dir.path() / "sdist-venv";
  ASSERT_OK_AND_ASSIGN(
      ProcessResult made_sdist_venv,
      RunProcess({python, "-m", "venv", "--system-site-packages", sdist_venv.string()}, {}, dir.path()));
  ASSERT_EQ(made_sdist_venv.exit_code, 0) << made_sdist_venv.err;
  ASSERT_OK_AND_ASSIGN(ProcessResult from_sdist,
                       RunProcess({(sdist_venv / "bin" / "pip").string(), "install", "--no-index",
                                   "--disable-pip-version-check", (sdist_dir / "tandem_client-0.1.0.tar.gz").string()},
                                  {"PIP_NO_INPUT=1"}, dir.path(), absl::Seconds(300)));
  ASSERT_EQ(from_sdist.exit_code, 0) << from_sdist.out << from_sdist.err;
  ASSERT_OK_AND_ASSIGN(ProcessResult sdist_import,
                       RunProcess({(sdist_venv / "bin" / "python").string(), "-c", "import tandem.v1.inference_pb2_grpc"},
                                  {"PYTHONDONTWRITEBYTECODE=1"}, dir.path()));
  EXPECT_EQ(sdist_import.exit_code, 0) << sdist_import.err;
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
