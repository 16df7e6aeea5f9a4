// A killed worker's leftovers (issue 15, item 8): its shm regions (expert
// store and arena, named in its lock file), its socket and its lock file
// stayed until a worker on that socket started again. Now
// `tandem-cpu-worker --reclaim` removes them with a successor's checks
// (refused while a live worker holds the lock), and
// `deploy/tandem-launch.sh stop` reclaims every stopped worker's.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
const char kWorkerBinary[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";
const char kLaunch[] = TANDEM_SOURCE_DIR "/deploy/tandem-launch.sh";

// The shm region names a worker's lock file lists (after its pid line).
std::vector<std::string> LockedRegions(const fs::path& lock) {
  std::ifstream in(lock);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (!lines.empty()) lines.erase(lines.begin());
  return lines;
}

bool RegionExists(const std::string& name) { return fs::exists(fs::path("/dev/shm") / name.substr(1)); }

class WorkerReclaimTest : public ::testing::Test {
 protected:
  WorkerProcessOptions Options() {
    WorkerProcessOptions o;
    o.binary = kWorkerBinary;
    o.socket = dir_.path() / "w0.sock";
    o.region_prefix = UniqueRegionPrefix();
    o.extra_args = {"--synthetic", "tiny", "--threads", "1", "--arena_slot_mb", "1"};
    o.log = dir_.path() / "w0.log";
    return o;
  }
  absl::StatusOr<ProcessResult> Reclaim(const WorkerProcessOptions& o) {
    return RunProcess({kWorkerBinary, "--reclaim", "--socket", o.socket.string(), "--region_prefix", o.region_prefix,
                       "--worker_index", "0"},
                      {}, dir_.path(), absl::Seconds(30));
  }

  ScopedTempDir dir_;
};

TEST_F(WorkerReclaimTest, ReclaimRemovesAKilledWorkersRegionsSocketAndLock) {
  const WorkerProcessOptions o = Options();
  WorkerProcess worker(o);
  ASSERT_OK(worker.Start());
  const fs::path lock = o.socket.string() + ".lock";
  const std::vector<std::string> regions = LockedRegions(lock);
  ASSERT_EQ(regions.size(), 2u) << "the expert store and the arena";
  worker.Kill(SIGKILL);
  for (const std::string& r : regions) EXPECT_TRUE(RegionExists(r)) << r << " (the leak this test is about)";
  EXPECT_TRUE(fs::exists(o.socket));
  EXPECT_TRUE(fs::exists(lock));

  auto run = Reclaim(o);
  ASSERT_OK(run);
  EXPECT_EQ(run->exit_code, 0) << run->err;
  for (const std::string& r : regions) EXPECT_FALSE(RegionExists(r)) << r;
  EXPECT_FALSE(fs::exists(o.socket));
  EXPECT_FALSE(fs::exists(lock));
}

TEST_F(WorkerReclaimTest, ReclaimIsRefusedWhileTheWorkerLives) {
  const WorkerProcessOptions o = Options();
  WorkerProcess worker(o);
  ASSERT_OK(worker.Start());
  const std::vector<std::string> regions = LockedRegions(o.socket.string() + ".lock");
  auto run = Reclaim(o);
  ASSERT_OK(run);
  EXPECT_NE(run->exit_code, 0);
  EXPECT_NE(run->err.find("is locked"), std::string::npos) << run->err;
  for (const std::string& r : regions) EXPECT_TRUE(RegionExists(r)) << r;
  EXPECT_OK(WaitForHealthy(worker.address(), absl::Seconds(5)));
}

TEST_F(WorkerReclaimTest, LaunchScriptStopReclaimsAKilledWorker) {
  const fs::path runtime = dir_.path() / "rt";
  ASSERT_EQ(mkdir(runtime.c_str(), 0700), 0);
  auto launch = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/bin/bash", kLaunch};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunProcess(argv, {"TANDEM_RUNTIME_DIR=" + runtime.string(), "TANDEM_BIN=" TANDEM_BINARY_DIR "/bin"},
                      dir_.path(), absl::Seconds(120));
  };
  auto start = launch({"start", "--synthetic", "tiny", "--workers", "2", "--server-args", "--threads 1"});
  ASSERT_OK(start);
  ASSERT_EQ(start->exit_code, 0) << start->out << start->err;
  const fs::path lock = runtime / "worker-1.sock.lock";
  const std::vector<std::string> regions = LockedRegions(lock);
  ASSERT_EQ(regions.size(), 2u);
  std::ifstream pid_file(runtime / "worker-1.pid");
  pid_t pid = 0;
  pid_file >> pid;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  for (int i = 0; i < 100 && fs::exists(fs::path("/proc") / absl::StrCat(pid)); ++i)
    absl::SleepFor(absl::Milliseconds(50));

  auto stop = launch({"stop"});
  ASSERT_OK(stop);
  EXPECT_EQ(stop->exit_code, 0) << stop->err;
  EXPECT_NE(stop->out.find("reclaimed"), std::string::npos) << stop->out << stop->err;
  for (const std::string& r : regions) EXPECT_FALSE(RegionExists(r)) << r;
  EXPECT_FALSE(fs::exists(runtime / "worker-1.sock"));
  EXPECT_FALSE(fs::exists(lock));
  EXPECT_FALSE(fs::exists(runtime / "worker-0.sock.lock"));
}

}  // namespace
}  // namespace tandem
