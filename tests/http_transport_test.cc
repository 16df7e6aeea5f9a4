// The HTTP transport on its own (coordinator/http/http_transport.h), in this
// process with handlers written for the test, against clients written by
// hand on raw sockets: every limit holds whatever the client sends or
// withholds, and the server stays answerable meanwhile.
//   - a header trickled byte by byte is closed at header_timeout, and 32 such
//     clients do not delay anyone else;
//   - headers too large or too many: 431; bodies too large, chunked or not:
//     413 without reading them whole;
//   - at the connection cap the connection idle longest is closed first;
//   - 64 clients at once, more than the threads, all answered (none reset);
//     a full queue is a 503 with Retry-After; the control lane answers while
//     every request thread is busy;
//   - a client that closes while its request is handled is seen as gone;
//   - the port cannot be shared; a draining server answers 503; a handler
//     that throws is a plain 500.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "coordinator/serving/http/http_transport.h"
#include "tests/raw_http_testlib.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

constexpr absl::Duration kWait = absl::Seconds(10);

std::string Get(const std::string& path, int port) {
  return absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1:", port, "\r\n\r\n");
}

// A transport whose handlers answer per path:
//   /echo     the body back        /sleep   after sleep_ms
//   /block    after `release`      /gone    when the client leaves (or 10 s)
//   /stream   three chunks         /throw   throws
class TransportTest : public ::testing::Test {
 protected:
  void Start(HttpTransportOptions options = {}) {
    HttpTransportHooks hooks;
    hooks.admit = [](const HttpRequest& head, HttpLane* lane) -> std::optional<HttpResponse> {
      *lane = head.path == "/health" ? HttpLane::kControl : HttpLane::kRequest;
      return std::nullopt;
    };
    hooks.handle = [this](HttpRequest& request, HttpExchange& exchange) { Handle(request, exchange); };
    auto transport = HttpTransport::Create(options, std::move(hooks));
    ASSERT_OK(transport);
    transport_ = std::move(*transport);
    port_ = transport_->port();
  }
  void TearDown() override {
    if (!release_.HasBeenNotified()) release_.Notify();
    if (transport_) transport_->Stop();
  }

  void Handle(HttpRequest& request, HttpExchange& exchange) {
    HttpResponse r;
    if (request.path == "/echo") {
      r.body = request.body;
    } else if (request.path == "/sleep") {
      absl::SleepFor(absl::Milliseconds(sleep_ms_));
      r.body = "slept";
    } else if (request.path == "/block") {
      ++blocked_;
      release_.WaitForNotificationWithTimeout(kWait);
      r.body = "released";
    } else if (request.path == "/gone") {
      const absl::Time deadline = absl::Now() + kWait;
      while (!exchange.ClientGone() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
      saw_gone_ = exchange.ClientGone();
      r.body = "late";
    } else if (request.path == "/stream") {
      if (!exchange.StartStream(200, "text/event-stream", {})) return;
      for (const char* chunk : {"data: 1\n\n", "data: 2\n\n", "data: 3\n\n"}) exchange.Write(chunk);
      exchange.EndStream();
      return;
    } else if (request.path == "/throw") {
      throw std::runtime_error("secret library text");
    } else {
      r.body = "ok";
    }
    exchange.Respond(std::move(r));
  }

  // One request on a fresh connection: the response, or a failure.
  std::string RoundTrip(const std::string& request) {
    absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
    if (!fd.ok()) return fd.status().ToString();
    if (absl::Status s = SendAll(fd->get(), request); !s.ok()) return s.ToString();
    absl::StatusOr<std::string> response = ReadResponse(fd->get(), kWait);
    return response.ok() ? *response : response.status().ToString();
  }

  std::unique_ptr<HttpTransport> transport_;
  int port_ = 0;
  int sleep_ms_ = 200;
  absl::Notification release_;
  std::atomic<int> blocked_{0};
  std::atomic<bool> saw_gone_{false};
};

TEST_F(TransportTest, TrickledHeadersAreClosedAndStarveNoOne) {
  HttpTransportOptions options;
  options.header_timeout = absl::Milliseconds(600);
  Start(options);
  // 32 clients sending one header byte every 100 ms: each would take far
  // longer than the timeout to finish.
  std::vector<ScopedFd> slow;
  for (int i = 0; i < 32; ++i) {
    absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
    ASSERT_OK(fd);
    slow.push_back(std::move(*fd));
  }
  const std::string header =
      absl::StrCat("GET /echo HTTP/1.1\r\nHost: 127.0.0.1:", port_, "\r\nX-Pad: ", std::string(200, 'a'), "\r\n\r\n");
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (size_t at = 0; at < header.size() && !stop; ++at) {
      for (ScopedFd& fd : slow) (void)SendAll(fd.get(), header.substr(at, 1));
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  // Meanwhile a normal client is answered at once, again and again.
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    EXPECT_EQ(ResponseStatus(RoundTrip(Get("/health", port_))), 200);
    EXPECT_LT(absl::Now() - start, absl::Milliseconds(500));
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (ScopedFd& fd : slow) EXPECT_TRUE(PeerClosed(fd.get(), absl::Seconds(3)));
  stop = true;
  trickle.join();
  EXPECT_GE(transport_->Stats().header_timeouts, 32);
}

TEST_F(TransportTest, OversizedHeadersAre431) {
  HttpTransportOptions options;
  options.max_header_bytes = 4096;
  options.max_header_fields = 16;
  Start(options);
  const std::string big = absl::StrCat("GET /echo HTTP/1.1\r\nHost: x\r\nX-Big: ", std::string(8000, 'a'), "\r\n\r\n");
  EXPECT_EQ(ResponseStatus(RoundTrip(big)), 431);
  std::string many = "GET /echo HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 40; ++i) absl::StrAppend(&many, "X-F", i, ": v\r\n");
  many += "\r\n";
  EXPECT_EQ(ResponseStatus(RoundTrip(many)), 431);
  EXPECT_EQ(ResponseStatus(RoundTrip(Get("/echo", port_))), 200);
}

TEST_F(TransportTest, BodyLimitHoldsChunkedOrNot) {
  HttpTransportOptions options;
  options.max_body_bytes = 64 << 10;
  Start(options);
  // Content-Length over the limit: refused from the header, body unread.
  EXPECT_EQ(ResponseStatus(
                RoundTrip(absl::StrCat("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: ", 1 << 30, "\r\n\r\n"))),
            413);
  // Chunked within the limit: read and decoded.
  const std::string chunked_ok =
      "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
  const std::string echoed = RoundTrip(chunked_ok);
  EXPECT_EQ(ResponseStatus(echoed), 200) << echoed;
  EXPECT_EQ(ResponseBody(echoed), "hello world");
  // Chunked past the limit: 413 once it passes, however much more is sent.
  absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
  ASSERT_OK(fd);
  ASSERT_OK(SendAll(fd->get(), "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = absl::StrCat("4000\r\n", std::string(0x4000, 'z'), "\r\n");
  for (int i = 0; i < 64; ++i) {
    if (!SendAll(fd->get(), chunk).ok()) break;  // the server may close once it has answered
  }
  absl::StatusOr<std::string> refused = ReadResponse(fd->get(), kWait);
  ASSERT_OK(refused);
  EXPECT_EQ(ResponseStatus(*refused), 413) << *refused;
  EXPECT_EQ(transport_->Stats().memory_in_use_bytes, 0);
}

TEST_F(TransportTest, SlowBodiesAreClosedAtTheBodyTimeout) {
  HttpTransportOptions options;
  options.body_timeout = absl::Milliseconds(500);
  Start(options);
  absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
  ASSERT_OK(fd);
  ASSERT_OK(SendAll(fd->get(), "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"));
  EXPECT_TRUE(PeerClosed(fd->get(), absl::Seconds(5)));
  EXPECT_EQ(transport_->Stats().body_timeouts, 1);
}

TEST_F(TransportTest, AtTheCapTheConnectionIdleLongestIsClosedFirst) {
  HttpTransportOptions options;
  options.max_open_connections = 8;
  Start(options);
  std::vector<ScopedFd> idle;
  for (int i = 0; i < 8; ++i) {
    absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
    ASSERT_OK(fd);
    idle.push_back(std::move(*fd));
    absl::SleepFor(absl::Milliseconds(20));  // a clear order of age
  }
  // The ninth is served; the oldest idle one made room for it.
  EXPECT_EQ(ResponseStatus(RoundTrip(Get("/echo", port_))), 200);
  EXPECT_TRUE(PeerClosed(idle[0].get(), absl::Seconds(3)));
  EXPECT_FALSE(PeerClosed(idle[7].get(), absl::Milliseconds(200)));
  EXPECT_GE(transport_->Stats().idle_evictions, 1);
}

TEST_F(TransportTest, SixtyFourClientsAtOnceAreAllAnswered) {
  HttpTransportOptions options;
  options.max_request_threads = 8;
  Start(options);
  sleep_ms_ = 100;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&] {
      if (ResponseStatus(RoundTrip(Get("/sleep", port_))) == 200) ++ok;
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), 64);
}

TEST_F(TransportTest, AFullQueueIs503AndControlStaysAnswerable) {
  HttpTransportOptions options;
  options.max_request_threads = 2;
  options.max_queued_requests = 2;
  Start(options);
  std::vector<std::thread> blockers;
  std::atomic<int> released{0};
  for (int i = 0; i < 4; ++i) {
    blockers.emplace_back([&] {
      if (ResponseStatus(RoundTrip(Get("/block", port_))) == 200) ++released;
    });
  }
  const absl::Time deadline = absl::Now() + kWait;
  while ((blocked_ < 2 || transport_->Stats().requests_queued < 2) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const std::string refused = RoundTrip(Get("/block", port_));
  EXPECT_EQ(ResponseStatus(refused), 503) << refused;
  EXPECT_EQ(ResponseHeader(refused, "retry-after"), "1");
  EXPECT_EQ(ResponseStatus(RoundTrip(Get("/health", port_))), 200);
  release_.Notify();
  for (std::thread& t : blockers) t.join();
  EXPECT_EQ(released.load(), 4);
}

TEST_F(TransportTest, AClientThatLeavesIsSeenGone) {
  Start();
  {
    absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
    ASSERT_OK(fd);
    ASSERT_OK(SendAll(fd->get(), Get("/gone", port_)));
    absl::SleepFor(absl::Milliseconds(100));
  }  // closed here
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (!saw_gone_ && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(saw_gone_);
  EXPECT_GE(transport_->Stats().clients_gone, 1);
}

TEST_F(TransportTest, StreamsArriveChunkedAndKeepAliveAndPipeliningWork) {
  Start();
  const std::string streamed = RoundTrip(Get("/stream", port_));
  EXPECT_EQ(ResponseStatus(streamed), 200);
  EXPECT_EQ(ResponseBody(streamed), "data: 1\n\ndata: 2\n\ndata: 3\n\n");
  // Two requests in one write on one connection: both answered, in order.
  absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
  ASSERT_OK(fd);
  ASSERT_OK(SendAll(fd->get(), absl::StrCat(JsonPost("/echo", "first", port_), JsonPost("/echo", "second", port_))));
  std::string both;
  const absl::Time deadline = absl::Now() + kWait;
  while (!absl::EndsWith(both, "second") && absl::Now() < deadline) {
    absl::StatusOr<std::string> more = ReadResponse(fd->get(), absl::Seconds(1));
    if (more.ok()) both += *more;
  }
  const size_t first = both.find("\r\n\r\nfirst");
  const size_t second = both.find("\r\n\r\nsecond");
  EXPECT_NE(first, std::string::npos) << both;
  EXPECT_NE(second, std::string::npos) << both;
  EXPECT_LT(first, second) << both;
}

TEST_F(TransportTest, ExpectContinueIsAnswered) {
  Start();
  absl::StatusOr<ScopedFd> fd = ConnectLoopback(port_);
  ASSERT_OK(fd);
  ASSERT_OK(SendAll(fd->get(), "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  absl::StatusOr<std::string> interim = ReadResponse(fd->get(), absl::Seconds(2));
  // "100 Continue" has no body: its header alone is complete.
  ASSERT_TRUE(interim.ok() && ResponseStatus(*interim) == 100) << interim.status();
  ASSERT_OK(SendAll(fd->get(), "body"));
  absl::StatusOr<std::string> response = ReadResponse(fd->get(), kWait);
  ASSERT_OK(response);
  EXPECT_EQ(ResponseBody(*response), "body");
}

TEST_F(TransportTest, ThePortIsNotShared) {
  Start();
  HttpTransportOptions second;
  second.port = port_;
  auto other = HttpTransport::Create(second, {});
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(absl::IsUnavailable(other.status())) << other.status();
  EXPECT_TRUE(absl::StrContains(other.status().message(), "in use")) << other.status();
}

TEST_F(TransportTest, DrainingAnswers503AndLetsRunningRequestsFinish) {
  Start();
  std::string running;
  std::thread client([&] { running = RoundTrip(Get("/block", port_)); });
  const absl::Time deadline = absl::Now() + kWait;
  while (blocked_ < 1 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  transport_->Drain();
  const std::string refused = RoundTrip(Get("/echo", port_));
  EXPECT_EQ(ResponseStatus(refused), 503) << refused;
  EXPECT_TRUE(absl::StrContains(refused, "shutting_down")) << refused;
  release_.Notify();
  client.join();
  EXPECT_EQ(ResponseStatus(running), 200) << running;
}

TEST_F(TransportTest, AThrowingHandlerIsAPlain500) {
  Start();
  const std::string response = RoundTrip(Get("/throw", port_));
  EXPECT_EQ(ResponseStatus(response), 500);
  EXPECT_FALSE(absl::StrContains(response, "secret")) << response;
  EXPECT_EQ(ResponseStatus(RoundTrip(Get("/echo", port_))), 200);
}

TEST_F(TransportTest, RequestMemoryOverBudgetIs503) {
  HttpTransportOptions options;
  options.max_body_bytes = 1 << 20;
  options.max_request_memory_bytes = 2 << 20;
  Start(options);
  // Two bodies of 1 MiB held by blocked handlers fill the budget.
  std::vector<std::thread> holders;
  for (int i = 0; i < 2; ++i) {
    holders.emplace_back([&] {
      (void)RoundTrip(absl::StrCat("POST /block HTTP/1.1\r\nHost: x\r\nContent-Length: ", 1 << 20, "\r\n\r\n",
                                   std::string(1 << 20, 'x')));
    });
  }
  const absl::Time deadline = absl::Now() + kWait;
  while (blocked_ < 2 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  const std::string refused = RoundTrip(JsonPost("/echo", "tiny", port_));
  EXPECT_EQ(ResponseStatus(refused), 503) << refused;
  EXPECT_EQ(transport_->Stats().memory_in_use_bytes, 2 << 20);
  release_.Notify();
  for (std::thread& t : holders) t.join();
  EXPECT_EQ(ResponseStatus(RoundTrip(JsonPost("/echo", "tiny", port_))), 200);
}

}  // namespace
}  // namespace tandem
