// The expert content hash (issue 15, item 2): the model fingerprint hashes
// config, names, dtypes and shapes, so workers started on the demo model with
// --seed 5 served a coordinator loaded with seed 0 and greedy output was
// silently wrong. Now:
//  - the hash a store computes while it is filled (copied from a checkpoint
//    or generated in place) equals the hash of the same slices from the full
//    model's bytes and from regeneration, for split and shard, and any
//    other seed changes every slice's hash;
//  - workers holding other weights are refused with FailedPrecondition naming
//    the worker and both hashes: by an in-process coordinator with the
//    weights, and by tandem-server over a synthetic model whose experts it
//    does not hold (it regenerates them to hash them).
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/expert_executor.h"
#include "common/base/thread_pool.h"
#include "common/model/expert_content.h"
#include "common/model/expert_partition.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/orchestration/remote_expert_executor.h"
#include "coordinator/orchestration/worker_connect.h"
#include "cpu_worker/expert_store.h"
#include "gtest/gtest.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const char kWorkerBinary[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";
const char kServer[] = TANDEM_BINARY_DIR "/bin/tandem-server";

SyntheticModelSpec Spec(uint64_t seed) {
  return SyntheticModelSpec{.preset = "tiny", .seed = seed, .dtype = DType::kBF16};
}

std::unique_ptr<Model> Load(const SyntheticModelSpec& spec, SyntheticExperts experts = {}) {
  ModelLoadOptions options;
  options.experts = std::move(experts);
  options.tokenizer = false;
  auto model = LoadSyntheticModel(spec, options);
  EXPECT_OK(model);
  return model.ok() ? std::move(*model) : nullptr;
}

struct Case {
  ExpertDivision division;
  int workers;
};

TEST(ContentHashTest, StoreHashEqualsTheModelsAndRegeneratedHashes) {
  const SyntheticModelSpec spec = Spec(7);
  std::unique_ptr<Model> full = Load(spec);
  ASSERT_NE(full, nullptr);
  std::unique_ptr<Model> none = Load(spec, SyntheticExperts{.mode = SyntheticExperts::Mode::kNone});
  ASSERT_NE(none, nullptr);
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "hash-test"});
  for (const Case& c :
       {Case{ExpertDivision::kSplit, 2}, Case{ExpertDivision::kShard, 2}, Case{ExpertDivision::kSplit, 1}}) {
    for (int w = 0; w < c.workers; ++w) {
      const std::string where = absl::StrCat(ExpertDivisionName(c.division), " worker ", w, " of ", c.workers);
      ASSERT_OK_AND_ASSIGN(std::vector<ExpertSlice> slices, PartitionExperts(full->config, c.division, w, c.workers));
      ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> from_model, HashExpertSlices(*full->weights, slices, &pool));
      ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> regenerated, HashSyntheticExpertSlices(spec, slices, &pool));
      EXPECT_EQ(from_model, regenerated) << where;

      // Copied from the model's bytes, hashed as they land.
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<ExpertStore> copied,
                           ExpertStore::Create(*full->weights, {.region_name = absl::StrCat(UniqueRegionPrefix(), "-c"),
                                                                .division = c.division,
                                                                .worker_index = w,
                                                                .num_workers = c.workers,
                                                                .pool = &pool}));
      EXPECT_EQ(copied->slice_hashes(), from_model) << where;
      EXPECT_EQ(copied->content_hash(), CombineExpertContentHashes(slices, from_model)) << where;

      // Generated in place (a synthetic worker), hashed as generated.
      const ModelConfig config = none->config;
      auto fill = [config, spec](int layer, int expert, WeightRole role, int64_t begin, int64_t end, void* out) {
        const WeightSpec weight{WeightName(config, role, layer, expert), role, layer, expert,
                                WeightShape(config, role)};
        FillSyntheticRange(config, weight, spec.seed, spec.dtype, out, begin, end, begin);
      };
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<ExpertStore> generated,
                           ExpertStore::Create(*none->weights, {.region_name = absl::StrCat(UniqueRegionPrefix(), "-g"),
                                                                .division = c.division,
                                                                .worker_index = w,
                                                                .num_workers = c.workers,
                                                                .pool = &pool,
                                                                .fill = fill}));
      EXPECT_EQ(generated->slice_hashes(), from_model) << where;
      EXPECT_EQ(generated->content_hash(), copied->content_hash()) << where;
    }
  }
}

TEST(ContentHashTest, AnotherSeedChangesEverySlicesHash) {
  ASSERT_OK_AND_ASSIGN(const ModelConfig config, SyntheticConfig(Spec(0)));
  ASSERT_OK_AND_ASSIGN(std::vector<ExpertSlice> slices, PartitionExperts(config, ExpertDivision::kSplit, 0, 2));
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> zero, HashSyntheticExpertSlices(Spec(0), slices, nullptr));
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> five, HashSyntheticExpertSlices(Spec(5), slices, nullptr));
  for (size_t i = 0; i < slices.size(); ++i) EXPECT_NE(zero[i], five[i]) << "slice " << i;
  EXPECT_NE(CombineExpertContentHashes(slices, zero), CombineExpertContentHashes(slices, five));
  // The same bytes under another identity (the next expert) hash otherwise.
  std::vector<ExpertSlice> moved = slices;
  for (ExpertSlice& s : moved) s.expert = (s.expert + 1) % static_cast<int>(config.num_local_experts);
  ASSERT_OK_AND_ASSIGN(std::vector<uint64_t> shifted, HashSyntheticExpertSlices(Spec(0), moved, nullptr));
  EXPECT_NE(shifted[0], zero[0]);
}

class WorkerContentTest : public ::testing::Test {
 protected:
  void StartWorkers(const std::vector<std::string>& model_args) {
    const std::string prefix = UniqueRegionPrefix();
    for (int i = 0; i < 2; ++i) {
      WorkerProcessOptions o;
      o.binary = kWorkerBinary;
      o.socket = dir_.path() / absl::StrCat("w", i, ".sock");
      o.region_prefix = prefix;
      o.worker_index = i;
      o.num_workers = 2;
      o.extra_args = model_args;
      o.extra_args.insert(o.extra_args.end(), {"--division", "split", "--transport", "shm", "--threads", "1"});
      o.log = dir_.path() / absl::StrCat("w", i, ".log");
      workers_.push_back(std::make_unique<WorkerProcess>(o));
      ASSERT_OK(workers_.back()->Start());
    }
  }
  std::string Addresses() const { return workers_[0]->address() + "," + workers_[1]->address(); }
  // Worker `index`'s content hash as the coordinator computes it from `model`.
  static std::string HashOf(const Model& model, int index) {
    auto slices = PartitionExperts(model.config, ExpertDivision::kSplit, index, 2);
    EXPECT_OK(slices);
    auto hashes = HashExpertSlices(*model.weights, *slices, nullptr);
    EXPECT_OK(hashes);
    return ContentHashString(CombineExpertContentHashes(*slices, *hashes));
  }

  ScopedTempDir dir_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;
};

// The reproduction: workers on the --seed 5 folder, a coordinator
// with the seed-0 folder. Same config, names, dtypes and shapes.
TEST_F(WorkerContentTest, WorkersOnOtherWeightsAreRefusedNamingBothHashes) {
  for (uint64_t seed : {0, 5}) {
    ASSERT_OK(WriteSyntheticModel(Spec(seed), dir_.path() / absl::StrCat("seed", seed), {.with_tokenizer = false}));
  }
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"--model", (dir_.path() / "seed5").string()}));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> coordinator, LoadModel(dir_.path() / "seed0"));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> worker_model, LoadModel(dir_.path() / "seed5"));
  WorkerConnectSettings settings;
  settings.addresses = Addresses();
  auto remote = ConnectExpertWorkers(*coordinator, settings);
  ASSERT_FALSE(remote.ok());
  const std::string message(remote.status().message());
  EXPECT_TRUE(absl::IsFailedPrecondition(remote.status())) << remote.status();
  EXPECT_NE(message.find("worker 0"), std::string::npos) << message;
  EXPECT_NE(message.find(HashOf(*worker_model, 0)), std::string::npos) << "the worker's hash: " << message;
  EXPECT_NE(message.find(HashOf(*coordinator, 0)), std::string::npos) << "the coordinator's hash: " << message;

  // The right weights are accepted (and the refused attempt released the workers).
  settings.synthetic = std::nullopt;
  auto accepted = ConnectExpertWorkers(*worker_model, settings);
  EXPECT_OK(accepted);
}

// A worker restarted on other weights is caught at the reconnect, against
// the hashes kept from start-up.
TEST_F(WorkerContentTest, AWorkerRestartedOnOtherWeightsIsRefusedAtTheReconnect) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"--synthetic", "tiny", "--synthetic_seed", "0"}));
  std::unique_ptr<Model> model = Load(Spec(0));
  ASSERT_NE(model, nullptr);
  WorkerConnectSettings settings;
  settings.addresses = Addresses();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RemoteExpertExecutor> remote, ConnectExpertWorkers(*model, settings));
  const int64_t d = model->config.hidden_size;
  std::vector<float> input(static_cast<size_t>(2 * d), 0.25f), output(input.size());
  const ExpertWork work{0, 2, input.data(), output.data()};
  ASSERT_OK(remote->RunExperts(0, std::span<const ExpertWork>(&work, 1)));

  WorkerProcessOptions o = workers_[1]->options();
  workers_[1].reset();  // stopped
  o.extra_args = {"--synthetic", "tiny", "--synthetic_seed", "5", "--division", "split",
                  "--transport", "shm",  "--threads",        "1"};
  workers_[1] = std::make_unique<WorkerProcess>(o);
  ASSERT_OK(workers_[1]->Start());
  absl::Status status = remote->RunExperts(0, std::span<const ExpertWork>(&work, 1));  // the old connection fails
  if (status.ok()) status = remote->RunExperts(0, std::span<const ExpertWork>(&work, 1));
  for (int i = 0; i < 3 && !absl::IsFailedPrecondition(status); ++i) {
    status = remote->RunExperts(0, std::span<const ExpertWork>(&work, 1));  // re-Described and re-checked
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(status)) << status;
  EXPECT_NE(status.message().find("worker 1"), std::string::npos) << status;
  EXPECT_NE(status.message().find("holds other expert weights"), std::string::npos) << status;
}

// A coordinator with a synthetic model holds no expert bytes (the workers
// do): it regenerates the workers' slices to hash them.
TEST_F(WorkerContentTest, SyntheticServerWithoutExpertsChecksByRegenerating) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers({"--synthetic", "tiny", "--synthetic_seed", "5"}));
  auto run =
      RunProcess({kServer, "--synthetic", "tiny", "--synthetic_seed", "0", "--threads", "1", "--workers", Addresses(),
                  "--connect_timeout_ms", "5000", "--listen", "unix:" + (dir_.path() / "server.sock").string()},
                 {}, dir_.path(), absl::Seconds(60));
  ASSERT_OK(run);
  EXPECT_EQ(run->exit_code, 1) << run->err;
  EXPECT_NE(run->err.find("holds other expert weights"), std::string::npos) << run->err;
  EXPECT_NE(run->err.find("worker 0"), std::string::npos) << run->err;
}

}  // namespace
}  // namespace tandem
