// tandem-server's --listen (issue 15, item 9): what it binds is what was
// asked, or it refuses with a message naming the address, before any model
// is loaded:
//  - "unix:" (an empty path would bind an abstract socket) and abstract
//    sockets (unix:@name, unix-abstract:) have no file permissions: refused;
//  - a port outside 1..65535 (99999 was logged and a random port bound):
//    refused;
//  - whatever is at a unix PATH stays unless it is a stale socket of ours: a
//    live server's socket and a regular file are left alone and refused; a
//    stale socket of ours is replaced; another user's is refused.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

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

class ServerListenTest : public ::testing::Test {
 protected:
  // tandem-server --listen `listen`, run to its end (a refusal ends it at once).
  ProcessResult Refused(const std::string& listen) {
    const absl::Time start = absl::Now();
    auto run = RunProcess({kServer, "--synthetic", "tiny", "--threads", "1", "--listen", listen}, {}, tmp_.path(),
                          absl::Seconds(30));
    EXPECT_OK(run) << listen;
    if (!run.ok()) return {};
    EXPECT_EQ(run->exit_code, 1) << listen << ": " << run->err;
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << listen << ": refused before the model was loaded?";
    return *run;
  }

  // A socket file nothing listens on: bound, then closed.
  static void MakeStaleSocket(const fs::path& path) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << std::strerror(errno);
    close(fd);
  }

  ScopedTempDir tmp_;
};

TEST_F(ServerListenTest, AddressesThatWouldBindSomethingElseAreRefused) {
  struct Case {
    std::string listen, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"unix:", "no path after unix:"},
           {"unix:@tandem-abstract", "abstract"},
           {"unix-abstract:tandem", "abstract"},
           {"99999", "not a number in 1..65535"},
           {"0", "not a number in 1..65535"},
           {"127.0.0.1:70000", "not a number in 1..65535"},
           {"localhost:", "not a number in 1..65535"},
           {"localhost", "neither unix:/path, a port, nor host:port"},
       }) {
    const ProcessResult r = Refused(c.listen);
    EXPECT_NE(r.err.find(c.expect), std::string::npos) << c.listen << ": " << r.err;
  }
}

TEST_F(ServerListenTest, ARegularFileAtThePathIsNeverDeleted) {
  const fs::path path = tmp_.path() / "notes.txt";
  std::ofstream(path) << "keep me\n";
  const ProcessResult r = Refused("unix:" + path.string());
  EXPECT_NE(r.err.find("is a regular file"), std::string::npos) << r.err;
  ASSERT_TRUE(fs::exists(path));
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "keep me");
}

TEST_F(ServerListenTest, ALiveServersSocketIsLeftAloneAndAStaleOneOfOursReplaced) {
  const fs::path socket = tmp_.path() / "server.sock";
  ServerProcess first(
      {.socket = socket, .extra_args = {"--synthetic", "tiny", "--threads", "1"}, .log = tmp_.path() / "first.log"});
  ASSERT_OK(first.Start());
  const ProcessResult r = Refused("unix:" + socket.string());
  EXPECT_NE(r.err.find("live server is listening"), std::string::npos) << r.err;
  {
    auto stub = first.NewStub();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ModelInfo info;
    EXPECT_OK(stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info)) << "the first server lost its socket";
  }
  EXPECT_EQ(first.Stop(), 0);

  const fs::path stale = tmp_.path() / "stale.sock";
  ASSERT_NO_FATAL_FAILURE(MakeStaleSocket(stale));
  ServerProcess second(
      {.socket = stale, .extra_args = {"--synthetic", "tiny", "--threads", "1"}, .log = tmp_.path() / "second.log"});
  EXPECT_OK(second.Start()) << "a stale socket of ours is replaced";
}

TEST_F(ServerListenTest, AnotherUsersStaleSocketIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give a socket to a second user (chown)";
  const fs::path stale = tmp_.path() / "theirs.sock";
  ASSERT_NO_FATAL_FAILURE(MakeStaleSocket(stale));
  ASSERT_EQ(chown(stale.c_str(), kOtherUid, kOtherGid), 0);
  const ProcessResult r = Refused("unix:" + stale.string());
  EXPECT_NE(r.err.find("not removing another user's socket"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(stale));
}

}  // namespace
}  // namespace tandem
