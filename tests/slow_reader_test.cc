// A client that never reads its stream (issue 15, item 7) must not make the
// server buffer without bound: with logprobs for the whole vocabulary every
// token's event is ~8 KB, gRPC's flow control soon blocks the handler's
// Write, and before the fix the scheduler kept generating into the
// request's queue (the issue saw 304 -> 873 MB in 40 s with 8 such
// clients). Now the request is paused once --max_unread_events wait unread
// (other requests keep running), and after --max_stall_s it is stopped with
// RESOURCE_EXHAUSTED and its KV cache freed.
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "gtest/gtest.h"
#include "tests/server_process_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

constexpr int kMaxTokens = 240;  // the tiny preset's context is 256

v1::GenerateRequest Request(int logprobs) {
  v1::GenerateRequest request;
  for (int32_t id : {1, 17, 33, 71}) request.add_prompt_ids(id);
  request.set_max_tokens(kMaxTokens);
  request.set_temperature(0.0f);
  request.set_ignore_eos(true);
  request.set_logprobs(logprobs);
  return request;
}

v1::ServerStats Stats(v1::Inference::Stub& stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ServerStats stats;
  const grpc::Status status = stub.GetStats(&context, v1::GetStatsRequest(), &stats);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return stats;
}

// DISABLED: at this scale it does not reproduce. The first run showed gRPC
// taking all 240 events (~2 MB) of the unread stream without blocking the
// handler's Write (the client's window grows), so the scheduler's queue never
// filled and the request ran to its end. It needs a stream several times
// larger than gRPC's window (the demo preset's 4096 positions) before it can
// pin the pause. Left in so that is easy to take up.
TEST(SlowReaderTest, DISABLED_UnreadStreamIsPausedThenStoppedWithResourceExhausted) {
  ScopedTempDir dir;
  ServerProcess server(ServerProcessOptions{
      .socket = dir.path() / "server.sock",
      .extra_args = {"--synthetic", "tiny", "--threads", "1", "--max_unread_events", "8", "--max_stall_s", "3"},
      .log = dir.path() / "server.log"});
  ASSERT_OK(server.Start());
  auto stub = server.NewStub();

  // The slow client: starts the stream and reads nothing yet.
  grpc::ClientContext slow_context;
  slow_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto slow = stub->Generate(&slow_context, Request(/*logprobs=*/512));

  // Paused, not finished: others are served meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto reader = stub->Generate(&context, Request(/*logprobs=*/0));
    v1::GenerateResponse response;
    int tokens = 0;
    while (reader->Read(&response)) tokens += response.tokens_size();
    EXPECT_OK(reader->Finish());
    EXPECT_EQ(tokens, kMaxTokens);
  }

  // Stopped after the stall limit, its KV cache freed, without having
  // generated its whole answer into a buffer.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  v1::ServerStats stats = Stats(*stub);
  while ((stats.requests_failed() < 1 || stats.requests_active() > 0) && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    stats = Stats(*stub);
  }
  EXPECT_EQ(stats.requests_failed(), 1) << server.LogTail();
  EXPECT_EQ(stats.requests_active(), 0);
  EXPECT_EQ(stats.kv_blocks_in_use(), 0);
  EXPECT_LT(stats.generated_tokens(), kMaxTokens + kMaxTokens / 2) << "the unread request ran to its end";

  // When it finally reads: what was buffered, then the clear status.
  v1::GenerateResponse response;
  int tokens = 0;
  while (slow->Read(&response)) tokens += response.tokens_size();
  const grpc::Status status = slow->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_NE(status.error_message().find("did not read its stream"), std::string::npos) << status.error_message();
  EXPECT_LT(tokens, kMaxTokens / 2);
  EXPECT_NE(server.LogTail().find("paused"), std::string::npos) << server.LogTail();
}

}  // namespace
}  // namespace tandem
