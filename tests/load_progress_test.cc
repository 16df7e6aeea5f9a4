// Long loads say how far they are: ProgressReporter counts bytes from many
// threads, logs at most once per interval and publishes itself for health
// endpoints; tandem-server logs its weight generation (GB, GB/s, ETA) and
// answers /health with 503 {"status": "loading", "progress": ...} until the
// model is ready; tandem-cpu-worker logs the filling of its expert store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/progress.h"
#include "tests/child_process_testlib.h"
#include "tests/http_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// The lines of `log` that contain `what` and `needle`.
std::vector<std::string> LinesWith(const std::string& log, const std::string& what, const std::string& needle) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, what) && absl::StrContains(line, needle)) out.emplace_back(line);
  }
  return out;
}

std::string ReadAll(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ProgressReporterTest, CountsFromManyThreadsAndPublishesWhileAlive) {
  EXPECT_FALSE(CurrentProgress().active);
  {
    ProgressReporter progress("test step", int64_t{4} << 20);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&] {
        for (int i = 0; i < 256; ++i) progress.Add(1024);
      });
    }
    for (std::thread& t : threads) t.join();
    const ProgressSnapshot s = CurrentProgress();
    ASSERT_TRUE(s.active);
    EXPECT_EQ(s.what, "test step");
    EXPECT_EQ(s.done_bytes, int64_t{1} << 20);
    EXPECT_EQ(s.total_bytes, int64_t{4} << 20);
    EXPECT_DOUBLE_EQ(s.fraction(), 0.25);
    EXPECT_GT(s.bytes_per_s, 0);
    EXPECT_GT(s.eta_s, 0);
    {
      // A nested step is the current one while it lives.
      ProgressReporter inner("inner step", 10);
      EXPECT_EQ(CurrentProgress().what, "inner step");
    }
    EXPECT_EQ(CurrentProgress().what, "test step");
  }
  EXPECT_FALSE(CurrentProgress().active);
}

TEST(ProgressReporterTest, LineSaysGigabytesRateAndEta) {
  ProgressSnapshot s{.active = true,
                     .what = "x",
                     .done_bytes = 1'200'000'000,
                     .total_bytes = 4'800'000'000,
                     .elapsed_s = 2,
                     .bytes_per_s = 600'000'000,
                     .eta_s = 6};
  EXPECT_EQ(s.ToString(), "1.20 of 4.80 GB (25%), 0.60 GB/s, ETA 6 s");
  s.eta_s = -1;
  EXPECT_EQ(s.ToString(), "1.20 of 4.80 GB (25%), 0.60 GB/s");
}

TEST(ProgressReporterTest, IntervalIsSettable) {
  const absl::Duration before = ProgressLogInterval();
  EXPECT_EQ(before, absl::Seconds(2));
  SetProgressLogInterval(absl::Milliseconds(5));
  EXPECT_EQ(ProgressLogInterval(), absl::Milliseconds(5));
  SetProgressLogInterval(before);
}

// A synthetic model big enough (about 1.3 GB over 48 layers) that generating
// it takes many progress intervals of 1 ms and many /health polls.
constexpr char kBigSynthetic[] = "demo:48";

TEST(LoadProgressProcessTest, ServerLogsProgressAndHealthSaysLoadingUntilReady) {
  ScopedTempDir dir;
  ASSERT_OK_AND_ASSIGN(const int port, FreeLoopbackPort());
  const std::filesystem::path log = dir.path() / "server.log";
  ChildProcess server;
  ASSERT_OK(
      server.Spawn({std::string(TANDEM_BINARY_DIR) + "/bin/tandem-server", "--listen",
                    "unix:" + (dir.path() / "server.sock").string(), "--exit_with_parent", "--synthetic", kBigSynthetic,
                    "--threads", "2", "--progress_interval", "1ms", "--http_listen", absl::StrCat("127.0.0.1:", port)},
                   log));
  int loading = 0, with_progress = 0;
  double last_fraction = 0;
  bool ready = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  while (!ready && absl::Now() < deadline) {
    int status = 0;
    ASSERT_FALSE(server.Exited(&status)) << server.LogTail();
    absl::StatusOr<HttpReply> reply = HttpGet(port, "/health");
    if (!reply.ok()) {  // not listening yet
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    if (reply->status == 200) {
      EXPECT_EQ(reply->json["status"], "ok") << reply->body;
      ready = true;
      break;
    }
    ASSERT_EQ(reply->status, 503) << reply->body;
    ASSERT_EQ(reply->json["status"], "loading") << reply->body;
    ++loading;
    if (reply->json.contains("progress")) {
      const nlohmann::json& p = reply->json["progress"];
      EXPECT_THAT(p["step"].get<std::string>(), HasSubstr("generating synthetic:demo")) << reply->body;
      EXPECT_GT(p["total_bytes"].get<int64_t>(), int64_t{1} << 30) << reply->body;
      EXPECT_LE(p["done_bytes"].get<int64_t>(), p["total_bytes"].get<int64_t>());
      EXPECT_GE(p["fraction"].get<double>(), last_fraction) << "progress went backwards";
      last_fraction = p["fraction"].get<double>();
      EXPECT_TRUE(p.contains("bytes_per_s") && p.contains("eta_s") && p.contains("elapsed_s")) << reply->body;
      ++with_progress;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(ready) << server.LogTail();
  EXPECT_GT(loading, 0);
  EXPECT_GT(with_progress, 0) << "no /health answer carried the load's progress";

  const std::string text = ReadAll(log);
  const std::vector<std::string> lines = LinesWith(text, "generating synthetic:demo", "GB/s");
  EXPECT_GE(lines.size(), 2u) << server.LogTail();
  EXPECT_FALSE(LinesWith(text, "generating synthetic:demo", "ETA").empty()) << server.LogTail();
  EXPECT_FALSE(LinesWith(text, "generating synthetic:demo", ": done,").empty()) << server.LogTail();
  EXPECT_EQ(server.Stop(), 0);
}

TEST(LoadProgressProcessTest, WorkerLogsTheExpertStoreFill) {
  ScopedTempDir dir;
  WorkerProcess worker(
      WorkerProcessOptions{.binary = std::string(TANDEM_BINARY_DIR) + "/bin/tandem-cpu-worker",
                           .socket = dir.path() / "w0.sock",
                           .region_prefix = UniqueRegionPrefix(),
                           .extra_args = {"--synthetic", "demo:16", "--threads", "2", "--progress_interval", "1ms"},
                           .log = dir.path() / "worker.log"});
  ASSERT_OK(worker.Start(absl::Seconds(120)));
  const std::string text = ReadAll(dir.path() / "worker.log");
  EXPECT_FALSE(LinesWith(text, "filling expert store", "GB/s").empty()) << worker.LogTail();
  EXPECT_FALSE(LinesWith(text, "filling expert store", ": done,").empty()) << worker.LogTail();
  worker.Stop();
}

}  // namespace
}  // namespace tandem
