// A connection flood must not kill a listener (issue 15, item 3): with its
// open-file limit lowered (prlimit on the running process), tandem-server
// and tandem-cpu-worker are flooded with connections until they run out of
// descriptors (EMFILE); once the flood is closed, both must accept and serve
// again, on the unix socket and on TCP. gRPC's own listener stopped for good
// after one EMFILE. And tandem-server's per-listener --max_connections cap:
// connections beyond it are closed at once, and the server still serves.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/http_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

const char kWorkerBinary[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";

int OpenDescriptors(pid_t pid) {
  int n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    ++n;
  }
  return n;
}

// Lowers `pid`'s open-file limit (soft and hard) to what it has open plus
// `headroom`; the new limit.
absl::StatusOr<int> LowerOpenFileLimit(pid_t pid, int headroom) {
  const int limit = OpenDescriptors(pid) + headroom;
  rlimit r{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
  if (prlimit(pid, RLIMIT_NOFILE, &r, nullptr) != 0) return absl::InternalError("prlimit failed");
  return limit;
}

// A non-blocking connection attempt to a unix socket or 127.0.0.1:port; -1
// when refused at once (a full backlog).
int ConnectUnix(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path.c_str());
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}
int ConnectTcp(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

void CloseAll(std::vector<int>& fds) {
  for (int fd : fds) close(fd);
  fds.clear();
}

// Whether a server at `address` answers GetModelInfo within `timeout` (a
// fresh channel: a new connection must be accepted).
absl::Status ServerAnswers(const std::string& address, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  grpc::Status last;
  while (absl::Now() < deadline) {
    auto stub = v1::Inference::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
    v1::ModelInfo info;
    last = stub->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (last.ok()) return absl::OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::UnavailableError(absl::StrCat(address, " does not answer: ", last.error_message()));
}

class ConnectionFloodTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> extra) {
    auto port = FreeLoopbackPort();
    ASSERT_OK(port);
    port_ = *port;
    socket_ = dir_.path() / "server.sock";
    extra.insert(extra.end(), {"--synthetic", "tiny", "--threads", "1", "--listen",
                               absl::StrCat("unix:", socket_.string(), ",127.0.0.1:", port_)});
    server_ = std::make_unique<ServerProcess>(
        ServerProcessOptions{.socket = socket_, .extra_args = extra, .log = dir_.path() / "server.log"});
    ASSERT_OK(server_->Start());
  }

  ScopedTempDir dir_;
  std::filesystem::path socket_;
  int port_ = 0;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ConnectionFloodTest, ServerAcceptsAgainAfterRunningOutOfDescriptors) {
  ASSERT_NO_FATAL_FAILURE(StartServer({}));
  const pid_t pid = server_->process().pid();
  auto limit = LowerOpenFileLimit(pid, 48);
  ASSERT_OK(limit);
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) {
    if (int fd = ConnectUnix(socket_.string()); fd >= 0) flood.push_back(fd);
    if (int fd = ConnectTcp(port_); fd >= 0) flood.push_back(fd);
  }
  // The server takes what it can, then meets EMFILE.
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (OpenDescriptors(pid) < *limit && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(OpenDescriptors(pid), *limit) << "the flood never exhausted the server's descriptors";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // accept keeps failing with EMFILE meanwhile
  CloseAll(flood);
  EXPECT_OK(ServerAnswers(server_->address(), absl::Seconds(15))) << server_->LogTail();
  EXPECT_OK(ServerAnswers(absl::StrCat("127.0.0.1:", port_), absl::Seconds(15))) << server_->LogTail();
  EXPECT_EQ(server_->process().running(), true);
}

TEST_F(ConnectionFloodTest, ConnectionsBeyondTheCapAreClosedAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartServer({"--max_connections", "16"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // Start's own probe connection is gone
  std::vector<int> flood;
  for (int i = 0; i < 48; ++i) {
    const int fd = ConnectUnix(socket_.string());
    ASSERT_GE(fd, 0);
    flood.push_back(fd);
  }
  // An accepted connection gets the server's HTTP/2 SETTINGS; a refused one
  // is closed (EOF or reset).
  int refused = 0, served = 0;
  for (int fd : flood) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 3000) != 1) continue;
    char byte;
    const ssize_t n = read(fd, &byte, 1);
    if (n > 0) ++served;
    if (n <= 0) ++refused;
  }
  EXPECT_LE(served, 16);
  EXPECT_GE(refused, 48 - 16 - 1);
  CloseAll(flood);
  EXPECT_OK(ServerAnswers(server_->address(), absl::Seconds(15))) << server_->LogTail();
  EXPECT_NE(server_->LogTail().find("--max_connections"), std::string::npos) << server_->LogTail();
}

TEST_F(ConnectionFloodTest, WorkerAcceptsAgainAfterRunningOutOfDescriptors) {
  WorkerProcessOptions o;
  o.binary = kWorkerBinary;
  o.socket = dir_.path() / "w0.sock";
  o.region_prefix = UniqueRegionPrefix();
  o.extra_args = {"--synthetic", "tiny", "--threads", "1", "--arena_slot_mb", "1"};
  o.log = dir_.path() / "w0.log";
  WorkerProcess worker(o);
  ASSERT_OK(worker.Start());
  auto limit = LowerOpenFileLimit(worker.pid(), 32);
  ASSERT_OK(limit);
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) {
    if (int fd = ConnectUnix(o.socket.string()); fd >= 0) flood.push_back(fd);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (OpenDescriptors(worker.pid()) < *limit && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(OpenDescriptors(worker.pid()), *limit) << "the flood never exhausted the worker's descriptors";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  CloseAll(flood);
  EXPECT_OK(WaitForHealthy(worker.address(), absl::Seconds(15))) << worker.LogTail();
  EXPECT_TRUE(worker.running());
}

}  // namespace
}  // namespace tandem
