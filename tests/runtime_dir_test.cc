// Who may take over tandem's runtime dir and sockets (issue 15, item 1):
//  - EnsurePrivateDir creates the dir 0700, tightens ours, and refuses a
//    symlink, a dir of another user and one others may write to;
//  - tandem-server refuses a planted runtime dir and makes its sockets 0600;
//  - deploy/tandem-launch.sh, given the dir another user planted (0777, a
//    server.log symlink to a file of ours, a server.pid naming their own
//    process), refuses it: nothing killed, nothing written through the link;
//    in a dir of ours it never signals a pid that is not its own program;
//  - the CLI and the Python SDK refuse to send prompts to a socket another
//    user owns, and say "permission denied" for a socket they may not open.
// Tests that need a second user run commands as uid 65534 (setpriv) and are
// skipped, saying why, where that is impossible.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/runtime_dir.h"
#include "gtest/gtest.h"
#include "tests/child_process_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const char kServer[] = TANDEM_BINARY_DIR "/bin/tandem-server";
const char kCli[] = TANDEM_BINARY_DIR "/bin/tandem";
const char kLaunch[] = TANDEM_SOURCE_DIR "/deploy/tandem-launch.sh";

mode_t ModeOf(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

std::string ReadText(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A listening unix socket at `path`, owned by this process (closed with it).
class ListeningSocket {
 public:
  explicit ListeningSocket(const fs::path& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
    EXPECT_EQ(listen(fd_, 4), 0);
  }
  ~ListeningSocket() { close(fd_); }

 private:
  int fd_ = -1;
};

// ---- EnsurePrivateDir / EnsureSocketDir ----

TEST(RuntimeDirTest, CreatesAMissingDirPrivately) {
  ScopedTempDir tmp;
  const fs::path dir = tmp.path() / "a" / "tandem-me";
  ASSERT_OK(EnsurePrivateDir(dir.string()));
  EXPECT_TRUE(fs::is_directory(dir));
  EXPECT_EQ(ModeOf(dir), 0700u);
  EXPECT_EQ(ModeOf(dir.parent_path()), 0700u);
  ASSERT_OK(EnsurePrivateDir(dir.string()));  // a second time: ours, fine
}

TEST(RuntimeDirTest, TightensOurReadableDirAndRefusesOneOthersMayWrite) {
  ScopedTempDir tmp;
  const fs::path dir = tmp.path() / "rt";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  ASSERT_OK(EnsurePrivateDir(dir.string()));
  EXPECT_EQ(ModeOf(dir), 0700u);

  ASSERT_EQ(chmod(dir.c_str(), 0777), 0);
  const absl::Status writable = EnsurePrivateDir(dir.string());
  EXPECT_TRUE(absl::IsPermissionDenied(writable)) << writable;
  EXPECT_NE(writable.message().find("mode 0777"), std::string::npos) << writable;
  EXPECT_EQ(ModeOf(dir), 0777u) << "a refused dir is left as it was";
}

TEST(RuntimeDirTest, RefusesASymlinkAndAFile) {
  ScopedTempDir tmp;
  const fs::path real = tmp.path() / "real";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  const fs::path link = tmp.path() / "link";
  fs::create_directory_symlink(real, link);
  const absl::Status symlink = EnsurePrivateDir(link.string());
  EXPECT_TRUE(absl::IsPermissionDenied(symlink)) << symlink;
  EXPECT_NE(symlink.message().find("symlink"), std::string::npos) << symlink;

  const fs::path file = tmp.path() / "file";
  std::ofstream(file) << "x";
  const absl::Status not_dir = EnsurePrivateDir(file.string());
  EXPECT_TRUE(absl::IsPermissionDenied(not_dir)) << not_dir;
  EXPECT_NE(not_dir.message().find("not a directory"), std::string::npos) << not_dir;
}

TEST(RuntimeDirTest, RefusesADirOfAnotherUser) {
  std::string why;
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a dir to a second user (chown)";
  ScopedTempDir tmp;
  const fs::path dir = tmp.path() / "planted";
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(chown(dir.c_str(), kOtherUid, kOtherGid), 0);
  const absl::Status status = EnsurePrivateDir(dir.string());
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_NE(status.message().find("owned by uid 65534"), std::string::npos) << status;

  // A socket folder may be root's or ours, but not another user's, and a
  // folder others may write to must be sticky.
  EXPECT_TRUE(absl::IsPermissionDenied(EnsureSocketDir(dir.string(), "test")));
  const fs::path open = tmp.path() / "open";
  ASSERT_EQ(mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open.c_str(), 0777), 0);
  EXPECT_TRUE(absl::IsPermissionDenied(EnsureSocketDir(open.string(), "test")));
  ASSERT_EQ(chmod(open.c_str(), 01777), 0);
  EXPECT_OK(EnsureSocketDir(open.string(), "test"));
}

// ---- tandem-server ----

// A runtime dir planted by uid 65534, mode 0777.
fs::path PlantRuntimeDir(const fs::path& parent) {
  const fs::path dir = parent / "tandem-victim";
  EXPECT_EQ(mkdir(dir.c_str(), 0777), 0);
  EXPECT_EQ(chmod(dir.c_str(), 0777), 0);
  EXPECT_EQ(chown(dir.c_str(), kOtherUid, kOtherGid), 0);
  return dir;
}

TEST(RuntimeDirServerTest, ServerRefusesAPlantedRuntimeDir) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to plant a dir owned by a second user (chown)";
  ScopedTempDir tmp;
  const fs::path planted = PlantRuntimeDir(tmp.path());
  auto run = RunProcess({kServer, "--synthetic", "tiny", "--threads", "1"}, {"TANDEM_RUNTIME_DIR=" + planted.string()},
                        tmp.path(), absl::Seconds(60));
  ASSERT_OK(run);
  EXPECT_EQ(run->exit_code, 1) << run->err;
  EXPECT_NE(run->err.find("owned by uid 65534"), std::string::npos) << run->err;
  EXPECT_FALSE(fs::exists(planted / "server.sock")) << "a socket was put in the planted dir";
}

TEST(RuntimeDirServerTest, ServerSocketIs0600AndItsDefaultDir0700) {
  ScopedTempDir tmp;
  const fs::path runtime = tmp.path() / "rt" / "tandem-me";
  ChildProcess server;
  ASSERT_OK(server.Spawn({kServer, "--synthetic", "tiny", "--threads", "1", "--exit_with_parent"},
                         tmp.path() / "server.out", tmp.path() / "server.err",
                         {"TANDEM_RUNTIME_DIR=" + runtime.string()}));
  const fs::path socket = runtime / "server.sock";
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (!fs::exists(socket) && absl::Now() < deadline && !server.Exited()) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(fs::exists(socket)) << ReadText(tmp.path() / "server.err");
  EXPECT_EQ(ModeOf(runtime), 0700u);
  EXPECT_EQ(ModeOf(socket), 0600u);
  EXPECT_EQ(server.Stop(), 0);
  EXPECT_FALSE(fs::exists(socket)) << "the server removes its own socket at exit";
}

// ---- deploy/tandem-launch.sh ----

class LaunchScriptTest : public ::testing::Test {
 protected:
  absl::StatusOr<ProcessResult> Launch(const std::vector<std::string>& args, const fs::path& runtime_dir) {
    std::vector<std::string> argv = {"/bin/bash", kLaunch};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, {"TANDEM_RUNTIME_DIR=" + runtime_dir.string(), "TANDEM_BIN=" TANDEM_BINARY_DIR "/bin"},
                      tmp_.path(), absl::Seconds(120));
  }
  static bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

  ScopedTempDir tmp_;
};

// The reproduction: another user pre-creates the runtime dir (0777)
// with a server.log symlink to a file of ours and a server.pid naming their
// own process. start/stop/status refuse the dir: the process lives, the file
// is untouched, no socket lands there.
TEST_F(LaunchScriptTest, RefusesARuntimeDirPlantedByAnotherUser) {
  std::string why;
  if (!CanRunAsOtherUser(&why)) GTEST_SKIP() << why;
  ASSERT_EQ(chmod(tmp_.path().c_str(), 0755), 0);  // so uid 65534 may reach the planted dir
  const fs::path planted = PlantRuntimeDir(tmp_.path());
  const fs::path precious = tmp_.path() / "precious.txt";
  std::ofstream(precious) << "precious\n";
  fs::create_symlink(precious, planted / "server.log");
  ChildProcess theirs;  // the other user's own process
  ASSERT_OK(theirs.Spawn(AsOtherUser({"/bin/sleep", "60"}), tmp_.path() / "sleep.log"));
  std::ofstream(planted / "server.pid") << theirs.pid() << "\n";

  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"start", "--synthetic", "tiny", "--workers", "0"}, {"stop"}, {"status"}}) {
    auto run = Launch(args, planted);
    ASSERT_OK(run);
    EXPECT_EQ(run->exit_code, 1) << args[0] << ": " << run->out << run->err;
    EXPECT_NE(run->err.find("owned by uid 65534"), std::string::npos) << args[0] << ": " << run->err;
  }
  EXPECT_TRUE(Alive(theirs.pid())) << "the launch script killed another user's process";
  EXPECT_EQ(ReadText(precious), "precious\n") << "the launch script wrote through the planted symlink";
  EXPECT_FALSE(fs::exists(planted / "server.sock"));
}

// In a dir of our own, a pid file naming a process that is not the program
// it should be (a reused pid) is never signalled, and a symlinked log is
// never written through.
TEST_F(LaunchScriptTest, NeverSignalsAForeignPidNorFollowsASymlink) {
  const fs::path runtime = tmp_.path() / "rt";
  ASSERT_EQ(mkdir(runtime.c_str(), 0700), 0);
  ChildProcess other;  // ours, but not tandem-server
  ASSERT_OK(other.Spawn({"/bin/sleep", "60"}, tmp_.path() / "sleep.log"));
  std::ofstream(runtime / "server.pid") << other.pid() << "\n";
  auto stop = Launch({"stop"}, runtime);
  ASSERT_OK(stop);
  EXPECT_EQ(stop->exit_code, 0) << stop->err;
  EXPECT_NE(stop->err.find("not your tandem-server"), std::string::npos) << stop->err;
  EXPECT_TRUE(Alive(other.pid())) << "stop killed a process that is not tandem-server";
  EXPECT_FALSE(fs::exists(runtime / "server.pid"));

  const fs::path precious = tmp_.path() / "precious.txt";
  std::ofstream(precious) << "precious\n";
  fs::create_symlink(precious, runtime / "server.log");
  auto start = Launch({"start", "--synthetic", "tiny", "--workers", "0"}, runtime);
  ASSERT_OK(start);
  EXPECT_EQ(start->exit_code, 1) << start->err;
  EXPECT_NE(start->err.find("symlink"), std::string::npos) << start->err;
  EXPECT_EQ(ReadText(precious), "precious\n");
}

// ---- clients ----

TEST(ClientSocketTest, CliAndPythonRefuseASocketOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a socket to a second user (chown)";
  ScopedTempDir tmp;
  const fs::path path = tmp.path() / "server.sock";
  ListeningSocket impostor(path);
  ASSERT_EQ(chown(path.c_str(), kOtherUid, kOtherGid), 0);
  auto cli = RunProcess({kCli, "info", "--server", "unix:" + path.string(), "--connect_timeout_s", "2"}, {}, tmp.path(),
                        absl::Seconds(30));
  ASSERT_OK(cli);
  EXPECT_EQ(cli->exit_code, 1) << cli->err;
  EXPECT_NE(cli->err.find("belongs to uid 65534"), std::string::npos) << cli->err;

  if (std::string(TANDEM_PYTHON3).empty()) GTEST_SKIP() << "no python3 with grpc for the Python SDK half";
  auto python = RunProcess({TANDEM_PYTHON3, "-c",
                            "import sys, tandem\n"
                            "try:\n  tandem.Client(sys.argv[1], connect_timeout=2)\n"
                            "except tandem.TandemError as e:\n  print(e)\n",
                            "unix:" + path.string()},
                           {"PYTHONPATH=" TANDEM_BINARY_DIR "/python"}, tmp.path(), absl::Seconds(30));
  ASSERT_OK(python);
  EXPECT_NE(python->out.find("PERMISSION_DENIED"), std::string::npos) << python->out << python->err;
  EXPECT_NE(python->out.find("belongs to uid 65534"), std::string::npos) << python->out << python->err;
}

// A socket only its owner may open: the hint says permission denied, not
// "still starting or stale".
TEST(ClientSocketTest, APermissionDeniedSocketIsNamedSo) {
  std::string why;
  if (!CanRunAsOtherUser(&why)) GTEST_SKIP() << why;
  ScopedTempDir tmp;
  ASSERT_EQ(chmod(tmp.path().c_str(), 0755), 0);
  const fs::path path = tmp.path() / "server.sock";
  ListeningSocket ours(path);
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  auto cli = RunProcess(AsOtherUser({kCli, "info", "--server", "unix:" + path.string(), "--connect_timeout_s", "1"}),
                        {}, tmp.path(), absl::Seconds(30));
  ASSERT_OK(cli);
  EXPECT_EQ(cli->exit_code, 1) << cli->err;
  EXPECT_NE(cli->err.find("permission denied opening"), std::string::npos) << cli->err;
  EXPECT_EQ(cli->err.find("still starting"), std::string::npos) << cli->err;

  if (std::string(TANDEM_PYTHON3).empty()) GTEST_SKIP() << "no python3 with grpc for the Python SDK half";
  auto python = RunProcess(AsOtherUser({TANDEM_PYTHON3, "-c",
                                        "import sys, tandem\n"
                                        "try:\n  tandem.Client(sys.argv[1], connect_timeout=1)\n"
                                        "except tandem.TandemError as e:\n  print(e)\n",
                                        "unix:" + path.string()}),
                           {"PYTHONPATH=" TANDEM_BINARY_DIR "/python"}, tmp.path(), absl::Seconds(30));
  ASSERT_OK(python);
  EXPECT_NE(python->out.find("permission denied opening"), std::string::npos) << python->out << python->err;
}

}  // namespace
}  // namespace tandem
