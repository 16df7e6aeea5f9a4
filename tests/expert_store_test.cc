// The CPU worker's expert store: a shared-memory region holding exactly the
// worker's slices of the model (byte for byte), readable by another mapping,
// rejected when corrupt, gone when the store is; and the executors' numerics:
// per-worker partials summed in worker order equal LocalExpertExecutor with
// split_ways bit for bit, shards equal the full FFN bit for bit.
//
// Legend: L layers, E experts, D hidden, I intermediate, S rows of a slice,
// R rows routed to an expert.
#include "cpu_worker/expert_store.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/thread_pool.h"
#include "common/model/expert_store_view.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/platform/numa_topology.h"
#include "common/platform/shm_region.h"
#include "cpu_worker/local_expert_executor.h"
#include "cpu_worker/store_expert_executor.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

std::string RegionName(const std::string& tag) { return absl::StrCat("/tandem-test-", getpid(), "-", tag); }

std::unique_ptr<Model> LoadTiny(DType dtype = DType::kBF16) {
  absl::StatusOr<std::unique_ptr<Model>> model =
      LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 11, .dtype = dtype});
  EXPECT_OK(model);
  return model.ok() ? std::move(model).value() : nullptr;
}

// The worker's pool as a real worker builds it: pinned to its node's cores.
std::unique_ptr<ThreadPool> PinnedPool(const std::string& name, int* numa_node) {
  absl::StatusOr<NumaTopology> topology = DiscoverTopology();
  EXPECT_OK(topology);
  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(*topology, 1, 0);
  EXPECT_OK(plan);
  ThreadPoolOptions options = (*plan)[0].PoolOptions();
  options.name = name;
  *numa_node = (*plan)[0].numa_node;
  return std::make_unique<ThreadPool>(options);
}

std::vector<std::vector<ExpertFfnWeights>> ExpertTable(const ModelWeights& weights) {
  std::vector<std::vector<ExpertFfnWeights>> table;
  for (const LayerWeights& layer : weights.layers) table.push_back(layer.experts);
  return table;
}

// The store's slice equals the source: w1/w3 rows [begin, end), w2 columns.
void ExpectSliceEqualsSource(const ExpertWeights& stored, const ExpertSlice& slice, const ModelWeights& model) {
  const ExpertWeights& source =
      model.layers[static_cast<size_t>(slice.layer)].experts[static_cast<size_t>(slice.expert)];
  const int64_t d = model.config.hidden_size, i = model.config.intermediate_size, s = slice.size();
  const size_t element = DTypeSize(source.w1.dtype);
  const std::string where = absl::StrCat("layer ", slice.layer, " expert ", slice.expert);
  ASSERT_EQ(stored.w1.n, s) << where;
  ASSERT_EQ(stored.w1.k, d) << where;
  ASSERT_EQ(stored.w3.n, s) << where;
  ASSERT_EQ(stored.w2.n, d) << where;
  ASSERT_EQ(stored.w2.k, s) << where;
  ASSERT_EQ(stored.w1.dtype, source.w1.dtype) << where;
  const auto* src_w1 = static_cast<const char*>(source.w1.data) + slice.intermediate_begin * d * element;
  const auto* src_w3 = static_cast<const char*>(source.w3.data) + slice.intermediate_begin * d * element;
  EXPECT_EQ(std::memcmp(stored.w1.data, src_w1, s * d * element), 0) << where << " w1";
  EXPECT_EQ(std::memcmp(stored.w3.data, src_w3, s * d * element), 0) << where << " w3";
  for (int64_t row = 0; row < d; ++row) {
    const auto* src = static_cast<const char*>(source.w2.data) + (row * i + slice.intermediate_begin) * element;
    const auto* dst = static_cast<const char*>(stored.w2.data) + row * s * element;
    ASSERT_EQ(std::memcmp(dst, src, s * element), 0) << where << " w2 row " << row;
  }
}

class ExpertStoreTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    model_ = LoadTiny(GetParam());
    ASSERT_NE(model_, nullptr);
    pool_ = PinnedPool("store-test", &numa_node_);
  }

  absl::StatusOr<std::unique_ptr<ExpertStore>> Create(const std::string& tag, ExpertDivision division, int worker,
                                                      int workers) {
    return ExpertStore::Create(*model_->weights, ExpertStoreOptions{.region_name = RegionName(tag),
                                                                    .division = division,
                                                                    .worker_index = worker,
                                                                    .num_workers = workers,
                                                                    .numa_node = numa_node_,
                                                                    .pool = pool_.get()});
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  int numa_node_ = -1;
};

TEST_P(ExpertStoreTest, SplitStoresHoldTheirRowsAndColumnsByteForByte) {
  const ModelConfig& config = model_->config;
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<std::unique_ptr<ExpertStore>> store = Create(absl::StrCat("split", w), ExpertDivision::kSplit, w, 2);
    ASSERT_OK(store);
    const ExpertStore& s = **store;
    ASSERT_EQ(s.slices().size(), static_cast<size_t>(config.num_hidden_layers * config.num_local_experts));
    EXPECT_EQ(s.info().division, ExpertDivision::kSplit);
    EXPECT_EQ(s.info().worker_index, w);
    EXPECT_EQ(s.info().num_workers, 2);
    EXPECT_EQ(s.info().dtype, GetParam());
    for (const ExpertSlice& slice : s.slices()) {
      EXPECT_EQ(slice.intermediate_begin, 48 * w);  // tiny: I = 96
      EXPECT_EQ(slice.intermediate_end, 48 * (w + 1));
      const ExpertWeights* stored = s.Find(slice.layer, slice.expert);
      ASSERT_NE(stored, nullptr);
      ExpectSliceEqualsSource(*stored, slice, *model_->weights);
      // Matrices start on pages: binding, DMA registration and vector loads.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(stored->w2.data) % kExpertStoreAlignment, 0u);
    }
    EXPECT_EQ(s.Find(static_cast<int>(config.num_hidden_layers), 0), nullptr);
    EXPECT_EQ(s.Find(0, -1), nullptr);
  }
}

TEST_P(ExpertStoreTest, ShardStoresHoldWholeExpertsOnce) {
  const ModelConfig& config = model_->config;
  std::vector<std::unique_ptr<ExpertStore>> stores;
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<std::unique_ptr<ExpertStore>> store = Create(absl::StrCat("shard", w), ExpertDivision::kShard, w, 2);
    ASSERT_OK(store);
    stores.push_back(std::move(store).value());
  }
  for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (int expert = 0; expert < config.num_local_experts; ++expert) {
      const int owner = ShardWorker(layer, expert, 2);
      const ExpertWeights* held = stores[static_cast<size_t>(owner)]->Find(layer, expert);
      ASSERT_NE(held, nullptr) << "layer " << layer << " expert " << expert;
      EXPECT_EQ(stores[static_cast<size_t>(1 - owner)]->Find(layer, expert), nullptr);
      const ExpertSlice* slice = stores[static_cast<size_t>(owner)]->FindSlice(layer, expert);
      ASSERT_NE(slice, nullptr);
      EXPECT_EQ(slice->size(), config.intermediate_size);
      ExpectSliceEqualsSource(*held, *slice, *model_->weights);
    }
  }
}

TEST_P(ExpertStoreTest, ReadOnlyViewSeesTheSameBytesAndOutlivesTheStore) {
  absl::StatusOr<std::unique_ptr<ExpertStore>> store = Create("view", ExpertDivision::kSplit, 1, 2);
  ASSERT_OK(store);
  absl::StatusOr<ExpertStoreView> view = ExpertStore::OpenReadOnly((*store)->region_name());
  ASSERT_OK(view);
  EXPECT_EQ(view->region_bytes(), (*store)->region_bytes());
  ASSERT_EQ(view->slices().size(), (*store)->slices().size());
  absl::StatusOr<ModelFingerprint> fingerprint = FingerprintModel(model_->config, *model_->weights->source);
  ASSERT_OK(fingerprint);
  EXPECT_EQ(view->info().config_hash, fingerprint->config_hash);
  EXPECT_EQ(view->info().tensors_hash, fingerprint->tensors_hash);
  EXPECT_EQ(view->info().worker_index, 1);
  // Moving the view keeps its weights pointing into the same mapping.
  ExpertStoreView moved = std::move(view).value();
  const size_t element = DTypeSize(GetParam());
  for (const ExpertSlice& slice : moved.slices()) {
    const ExpertWeights* mine = (*store)->Find(slice.layer, slice.expert);
    const ExpertWeights* theirs = moved.Find(slice.layer, slice.expert);
    ASSERT_NE(theirs, nullptr);
    ASSERT_NE(mine, nullptr);
    const size_t bytes = slice.size() * model_->config.hidden_size * element;
    EXPECT_EQ(std::memcmp(mine->w1.data, theirs->w1.data, bytes), 0);
    EXPECT_EQ(std::memcmp(mine->w3.data, theirs->w3.data, bytes), 0);
    EXPECT_EQ(std::memcmp(mine->w2.data, theirs->w2.data, bytes), 0);
  }
  // The worker exits: the name goes, the coordinator's mapping stays.
  const std::string name = (*store)->region_name();
  store->reset();
  for (const ExpertSlice& slice : moved.slices())
    ExpectSliceEqualsSource(*moved.Find(slice.layer, slice.expert), slice, *model_->weights);
  EXPECT_EQ(ExpertStore::OpenReadOnly(name).status().code(), absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ExpertStoreTest, ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

class ExpertStoreRegionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadTiny();
    ASSERT_NE(model_, nullptr);
  }
  ExpertStoreOptions Options(const std::string& tag) {
    return ExpertStoreOptions{.region_name = RegionName(tag), .division = ExpertDivision::kSplit, .num_workers = 2};
  }
  std::unique_ptr<Model> model_;
};

TEST_F(ExpertStoreRegionTest, RegionIsUnlinkedWhenTheStoreDies) {
  const std::string name = RegionName("unlink");
  {
    absl::StatusOr<std::unique_ptr<ExpertStore>> store = ExpertStore::Create(*model_->weights, Options("unlink"));
    ASSERT_OK(store);
    const int fd = shm_open(name.c_str(), O_RDONLY, 0);
    EXPECT_GE(fd, 0);
    if (fd >= 0) close(fd);
  }
  errno = 0;
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, ENOENT);
  if (fd >= 0) close(fd);
}

TEST_F(ExpertStoreRegionTest, NameCollisionIsAlreadyExistsNamingTheRegion) {
  absl::StatusOr<std::unique_ptr<ExpertStore>> first = ExpertStore::Create(*model_->weights, Options("collide"));
  ASSERT_OK(first);
  absl::StatusOr<std::unique_ptr<ExpertStore>> second = ExpertStore::Create(*model_->weights, Options("collide"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), RegionName("collide"))) << second.status();
  // The failed attempt left the live region alone.
  EXPECT_OK(ExpertStore::OpenReadOnly(RegionName("collide")));
}

TEST_F(ExpertStoreRegionTest, BadOptionsAndModelsAreInvalidArgument) {
  ExpertStoreOptions bad_name = Options("x");
  bad_name.region_name = "no-leading-slash";
  EXPECT_EQ(ExpertStore::Create(*model_->weights, bad_name).status().code(), absl::StatusCode::kInvalidArgument);
  ExpertStoreOptions bad_workers = Options("workers");
  bad_workers.num_workers = 0;
  EXPECT_EQ(ExpertStore::Create(*model_->weights, bad_workers).status().code(), absl::StatusCode::kInvalidArgument);
  ModelWeights broken = *model_->weights;
  broken.layers[1].experts[2].w2.n = 5;
  absl::StatusOr<std::unique_ptr<ExpertStore>> store = ExpertStore::Create(broken, Options("broken"));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(store.status().message(), "layer 1 expert 2")) << store.status();
  // Nothing was left behind by the failures.
  EXPECT_EQ(ExpertStore::OpenReadOnly(RegionName("broken")).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ExpertStoreRegionTest, CorruptHeaderOrTableIsDataLossNamingTheRegion) {
  absl::StatusOr<std::unique_ptr<ExpertStore>> store = ExpertStore::Create(*model_->weights, Options("corrupt"));
  ASSERT_OK(store);
  const std::string name = (*store)->region_name();
  // A second, writable mapping of the store's region (the store's own is read-only).
  absl::StatusOr<ShmRegion> rw = ShmRegion::Open(name, ShmAccess::kReadWrite);
  ASSERT_OK(rw);
  auto* header = reinterpret_cast<ExpertStoreHeader*>(rw->data());
  auto* table = reinterpret_cast<ExpertStoreEntry*>(rw->bytes() + header->table_offset);
  const std::vector<uint8_t> pristine(rw->bytes(), rw->bytes() + header->data_offset);

  struct Case {
    std::string what;
    std::function<void()> corrupt;
    absl::StatusCode code = absl::StatusCode::kDataLoss;
    std::string mentions;
  };
  const int64_t intermediate = model_->config.intermediate_size;
  const Case cases[] = {
      {"magic", [&] { header->magic = 0x1234; }, absl::StatusCode::kDataLoss, "magic"},
      {"unfilled", [&] { header->magic = 0; }, absl::StatusCode::kFailedPrecondition, "not ready"},
      {"version", [&] { header->version = 99; }, absl::StatusCode::kDataLoss, "version 99"},
      {"size", [&] { header->region_bytes += 4096; }, absl::StatusCode::kDataLoss, "region_bytes"},
      {"dtype", [&] { header->dtype = 99; }, absl::StatusCode::kDataLoss, "dtype 99"},
      {"matrix dtype", [&] { table[1].w3_dtype = 42; }, absl::StatusCode::kDataLoss, "w3_dtype 42"},
      {"division", [&] { header->division = 9; }, absl::StatusCode::kDataLoss, "division 9"},
      {"count", [&] { header->slice_count = 1u << 30; }, absl::StatusCode::kDataLoss, "slice_count"},
      {"data offset", [&] { header->data_offset = 100; }, absl::StatusCode::kDataLoss, "data_offset"},
      {"worker", [&] { header->worker_index = 2; }, absl::StatusCode::kDataLoss, "worker_index"},
      {"past end", [&] { table[1].w2_offset = header->region_bytes; }, absl::StatusCode::kDataLoss, "slice 1"},
      {"misaligned", [&] { table[2].w1_offset += 8; }, absl::StatusCode::kDataLoss, "slice 2"},
      {"rows", [&] { table[0].intermediate_end = intermediate + 1; }, absl::StatusCode::kDataLoss, "slice 0"},
      {"layer", [&] { table[3].layer = 1000; }, absl::StatusCode::kDataLoss, "slice 3"},
      {"repeated", [&] { table[1] = table[0]; }, absl::StatusCode::kDataLoss, "repeated"},
  };
  for (const Case& c : cases) {
    c.corrupt();
    absl::StatusOr<ExpertStoreView> view = ExpertStore::OpenReadOnly(name);
    std::memcpy(rw->bytes(), pristine.data(), pristine.size());
    ASSERT_FALSE(view.ok()) << c.what;
    EXPECT_EQ(view.status().code(), c.code) << c.what << ": " << view.status();
    EXPECT_TRUE(absl::StrContains(view.status().message(), name)) << c.what << ": " << view.status();
    EXPECT_TRUE(absl::StrContains(view.status().message(), c.mentions)) << c.what << ": " << view.status();
  }
  EXPECT_OK(ExpertStore::OpenReadOnly(name));  // restored
}

TEST_F(ExpertStoreRegionTest, BogusRegionsAreDataLoss) {
  std::mt19937 rng(5);
  for (size_t bytes : {size_t{10}, size_t{8192}}) {
    const std::string name = RegionName(absl::StrCat("bogus", bytes));
    absl::StatusOr<ShmRegion> region = ShmRegion::Create(name, bytes);
    ASSERT_OK(region);
    for (size_t i = 0; i < bytes; ++i) region->bytes()[i] = static_cast<uint8_t>(rng());
    absl::StatusOr<ExpertStoreView> view = ExpertStoreView::Open(name);
    ASSERT_FALSE(view.ok());
    EXPECT_EQ(view.status().code(), absl::StatusCode::kDataLoss) << view.status();
    EXPECT_TRUE(absl::StrContains(view.status().message(), name)) << view.status();
  }
  EXPECT_EQ(ExpertStoreView::Open(RegionName("never-created")).status().code(), absl::StatusCode::kNotFound);
}

// ---- Executors: partials summed in worker order == LocalExpertExecutor(split_ways) ----

class StoreExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LoadTiny();
    ASSERT_NE(model_, nullptr);
    pool_ = PinnedPool("exec-store", &numa_node_);
  }

  std::vector<std::unique_ptr<ExpertStore>> Stores(const std::string& tag, ExpertDivision division, int workers) {
    std::vector<std::unique_ptr<ExpertStore>> stores;
    for (int w = 0; w < workers; ++w) {
      absl::StatusOr<std::unique_ptr<ExpertStore>> store =
          ExpertStore::Create(*model_->weights, ExpertStoreOptions{.region_name = RegionName(absl::StrCat(tag, w)),
                                                                   .division = division,
                                                                   .worker_index = w,
                                                                   .num_workers = workers,
                                                                   .numa_node = numa_node_,
                                                                   .pool = pool_.get()});
      EXPECT_OK(store);
      if (store.ok()) stores.push_back(std::move(store).value());
    }
    return stores;
  }

  std::vector<float> Input(int64_t rows, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(rows * model_->config.hidden_size));
    for (float& v : x) v = normal(rng);
    return x;
  }

  // FFN_e(x) for every expert of `layer`, by `executor`: [E][R * D].
  std::vector<std::vector<float>> RunAll(ExpertExecutor& executor, int layer, const std::vector<float>& x, int64_t rows,
                                         const std::vector<int>& experts) {
    const int64_t d = model_->config.hidden_size;
    std::vector<std::vector<float>> out(static_cast<size_t>(model_->config.num_local_experts),
                                        std::vector<float>(static_cast<size_t>(rows * d), -7.0f));
    std::vector<ExpertWork> work;
    for (int e : experts)
      work.push_back(
          ExpertWork{.expert = e, .num_rows = rows, .input = x.data(), .output = out[static_cast<size_t>(e)].data()});
    absl::Status status = executor.RunExperts(layer, work);
    EXPECT_OK(status);
    return out;
  }

  std::vector<int> AllExperts() {
    std::vector<int> experts;
    for (int e = 0; e < model_->config.num_local_experts; ++e) experts.push_back(e);
    return experts;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<ThreadPool> pool_;
  int numa_node_ = -1;
};

TEST_F(StoreExecutorTest, SplitPartialsSummedInWorkerOrderMatchLocalSplitWaysBitForBit) {
  const ModelConfig& config = model_->config;
  for (int workers : {2, 3}) {
    std::vector<std::unique_ptr<ExpertStore>> stores =
        Stores(absl::StrCat("esplit", workers, "-"), ExpertDivision::kSplit, workers);
    ASSERT_EQ(stores.size(), static_cast<size_t>(workers));
    // Workers on one thread, the local executor on the pinned pool: the
    // kernels' arithmetic must not depend on the thread count.
    std::vector<std::unique_ptr<StoreExpertExecutor>> executors;
    for (const auto& store : stores) executors.push_back(std::make_unique<StoreExpertExecutor>(store.get(), nullptr));
    LocalExpertExecutor local(ExpertTable(*model_->weights), pool_.get(), {}, workers);
    LocalExpertExecutor full(ExpertTable(*model_->weights), pool_.get());
    for (int64_t rows : {1, 3, 13, 40}) {  // decode (stream kernel) and prefill (packed kernel) sizes
      for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
        const std::vector<float> x = Input(rows, static_cast<uint32_t>(100 * rows + layer));
        // The coordinator's combine: out = p_0; out += p_1; ...
        std::vector<std::vector<float>> sum = RunAll(*executors[0], layer, x, rows, AllExperts());
        for (int w = 1; w < workers; ++w) {
          const std::vector<std::vector<float>> partial =
              RunAll(*executors[static_cast<size_t>(w)], layer, x, rows, AllExperts());
          for (size_t e = 0; e < sum.size(); ++e)
            for (size_t i = 0; i < sum[e].size(); ++i) sum[e][i] += partial[e][i];
        }
        const std::vector<std::vector<float>> expected = RunAll(local, layer, x, rows, AllExperts());
        const std::vector<std::vector<float>> unsplit = RunAll(full, layer, x, rows, AllExperts());
        for (size_t e = 0; e < sum.size(); ++e) {
          EXPECT_EQ(std::memcmp(sum[e].data(), expected[e].data(), sum[e].size() * sizeof(float)), 0)
              << workers << " workers, " << rows << " rows, layer " << layer << " expert " << e;
          // And the split is the same FFN, up to rounding.
          for (size_t i = 0; i < sum[e].size(); ++i)
            ASSERT_NEAR(sum[e][i], unsplit[e][i], 1e-4f + 1e-4f * std::abs(unsplit[e][i]))
                << workers << " workers, expert " << e << " element " << i;
        }
      }
    }
  }
}

// At the demo preset's width (D = 512, I = 1024) the kernels cut each matrix
// into several tasks, and differently for different thread counts: worker
// executors on one thread and the local executor on three must still agree.
TEST_F(StoreExecutorTest, SplitAtDemoWidthIsIndependentOfThreadCount) {
  absl::StatusOr<std::unique_ptr<Model>> demo =
      LoadSyntheticModel(SyntheticModelSpec{.preset = "demo", .num_layers = 1, .seed = 3});
  ASSERT_OK(demo);
  model_ = std::move(demo).value();
  const ModelConfig& config = model_->config;
  std::vector<std::unique_ptr<ExpertStore>> stores = Stores("edemo", ExpertDivision::kSplit, 2);
  ASSERT_EQ(stores.size(), 2u);
  StoreExpertExecutor worker0(stores[0].get(), nullptr), worker1(stores[1].get(), nullptr);
  ThreadPool three(ThreadPoolOptions{.num_threads = 3, .name = "exec-three"});
  LocalExpertExecutor local(ExpertTable(*model_->weights), &three, {}, 2);
  for (int64_t rows : {1, 13}) {
    const std::vector<float> x = Input(rows, static_cast<uint32_t>(rows));
    std::vector<std::vector<float>> sum = RunAll(worker0, 0, x, rows, AllExperts());
    const std::vector<std::vector<float>> p1 = RunAll(worker1, 0, x, rows, AllExperts());
    for (size_t e = 0; e < sum.size(); ++e)
      for (size_t i = 0; i < sum[e].size(); ++i) sum[e][i] += p1[e][i];
    const std::vector<std::vector<float>> expected = RunAll(local, 0, x, rows, AllExperts());
    for (int e = 0; e < config.num_local_experts; ++e)
      EXPECT_EQ(std::memcmp(sum[static_cast<size_t>(e)].data(), expected[static_cast<size_t>(e)].data(),
                            sum[static_cast<size_t>(e)].size() * sizeof(float)),
                0)
          << rows << " rows, expert " << e;
  }
}

TEST_F(StoreExecutorTest, ShardOutputsMatchLocalFullFfnBitForBit) {
  const ModelConfig& config = model_->config;
  std::vector<std::unique_ptr<ExpertStore>> stores = Stores("eshard", ExpertDivision::kShard, 2);
  ASSERT_EQ(stores.size(), 2u);
  std::vector<std::unique_ptr<StoreExpertExecutor>> executors;
  for (const auto& store : stores) executors.push_back(std::make_unique<StoreExpertExecutor>(store.get(), pool_.get()));
  LocalExpertExecutor local(ExpertTable(*model_->weights), nullptr);
  for (int64_t rows : {1, 13}) {
    for (int layer = 0; layer < config.num_hidden_layers; ++layer) {
      const std::vector<float> x = Input(rows, static_cast<uint32_t>(7 * rows + layer));
      const std::vector<std::vector<float>> expected = RunAll(local, layer, x, rows, AllExperts());
      for (int w = 0; w < 2; ++w) {
        std::vector<int> mine;
        for (int e = 0; e < config.num_local_experts; ++e)
          if (ShardWorker(layer, e, 2) == w) mine.push_back(e);
        const std::vector<std::vector<float>> got = RunAll(*executors[static_cast<size_t>(w)], layer, x, rows, mine);
        for (int e : mine)
          EXPECT_EQ(std::memcmp(got[static_cast<size_t>(e)].data(), expected[static_cast<size_t>(e)].data(),
                                expected[static_cast<size_t>(e)].size() * sizeof(float)),
                    0)
              << rows << " rows, layer " << layer << " expert " << e;
      }
      const ExpertCallStats last = executors[1]->last_call();
      EXPECT_EQ(last.calls, 1);
      EXPECT_EQ(last.rows, rows * 2);  // two experts of four per worker
    }
  }
}

TEST_F(StoreExecutorTest, RejectsExpertsTheWorkerDoesNotHoldBeforeComputingAny) {
  std::vector<std::unique_ptr<ExpertStore>> stores = Stores("ereject", ExpertDivision::kShard, 2);
  ASSERT_EQ(stores.size(), 2u);
  StoreExpertExecutor executor(stores[0].get(), pool_.get());
  const int64_t d = model_->config.hidden_size;
  const std::vector<float> x = Input(2, 3);
  std::vector<float> a(static_cast<size_t>(2 * d), 5.0f), b(static_cast<size_t>(2 * d), 5.0f);
  // Layer 0: worker 0 holds experts 0 and 2, not 1.
  const ExpertWork work[] = {{.expert = 0, .num_rows = 2, .input = x.data(), .output = a.data()},
                             {.expert = 1, .num_rows = 2, .input = x.data(), .output = b.data()}};
  absl::Status status = executor.RunExperts(0, work);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "layer 0 expert 1")) << status;
  for (float v : a) ASSERT_EQ(v, 5.0f);  // nothing computed
  EXPECT_EQ(executor.RunExperts(5, {}).code(), absl::StatusCode::kInvalidArgument);
  const ExpertWork negative[] = {{.expert = 0, .num_rows = -1}};
  EXPECT_EQ(executor.RunExperts(0, negative).code(), absl::StatusCode::kInvalidArgument);
}

// The engine may hand the same buffer as input and output.
TEST_F(StoreExecutorTest, SplitWaysAndStoreExecutorsWorkInPlace) {
  std::vector<std::unique_ptr<ExpertStore>> stores = Stores("einplace", ExpertDivision::kSplit, 2);
  ASSERT_EQ(stores.size(), 2u);
  StoreExpertExecutor worker(stores[1].get(), pool_.get());
  LocalExpertExecutor local(ExpertTable(*model_->weights), pool_.get(), {}, 2);
  for (ExpertExecutor* executor : std::initializer_list<ExpertExecutor*>{&worker, &local}) {
    for (int64_t rows : {1, 13}) {
      const std::vector<float> x = Input(rows, 9);
      std::vector<float> separate(x.size()), in_place = x;
      const ExpertWork apart[] = {{.expert = 1, .num_rows = rows, .input = x.data(), .output = separate.data()}};
      const ExpertWork same[] = {{.expert = 1, .num_rows = rows, .input = in_place.data(), .output = in_place.data()}};
      ASSERT_OK(executor->RunExperts(1, apart));
      ASSERT_OK(executor->RunExperts(1, same));
      EXPECT_EQ(std::memcmp(separate.data(), in_place.data(), x.size() * sizeof(float)), 0) << rows << " rows";
    }
  }
}

TEST_F(StoreExecutorTest, LocalSplitWaysLargerThanIntermediateIsInvalidArgument) {
  LocalExpertExecutor local(ExpertTable(*model_->weights), nullptr, {}, 97);  // tiny: I = 96
  const std::vector<float> x = Input(1, 1);
  std::vector<float> y(static_cast<size_t>(model_->config.hidden_size), 5.0f);
  const ExpertWork work[] = {{.expert = 0, .num_rows = 1, .input = x.data(), .output = y.data()}};
  absl::Status status = local.RunExperts(0, work);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "split_ways 97")) << status;
  for (float v : y) ASSERT_EQ(v, 5.0f);
}

}  // namespace
}  // namespace tandem
