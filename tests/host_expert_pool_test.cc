// The no-GPU host expert pool, step by step on the tiny model's experts:
// slot counts from a memory budget, migrations on the copy thread with their
// readiness events, the bytes in a slot equal to the model's, eviction and
// admission (no copy), staging buffers, and experts computed from the
// pool's own copy (equal to the CPU executor bit for bit; a corrupted copy
// changes the output).
//
// Legend: D hidden size, R rows.
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/model/model.h"
#include "cpu_worker/expert_ffn.h"
#include "cpu_worker/local_expert_executor.h"
#include "gpu_worker/host_expert_pool.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

class HostExpertPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = 7, .dtype = DType::kBF16});
    ASSERT_OK(model);
    model_ = std::move(*model);
    for (const LayerWeights& layer : model_->weights->layers) experts_.push_back(layer.experts);
  }

  std::unique_ptr<HostExpertPool> MakePool(int slots, int staging) {
    ExpertPoolOptions options;
    options.num_slots = slots;
    options.num_staging_buffers = staging;
    ExpertFfn* ffn = &ffn_;
    auto pool = HostExpertPool::Create(
        model_->config, experts_,
        [ffn](const ExpertWeights& w, const float* x, int64_t rows, float* y) { return ffn->Run(w, x, rows, y); },
        options);
    EXPECT_OK(pool);
    return pool.ok() ? std::move(*pool) : nullptr;
  }

  // The pool's copy of `key` holds exactly the model's bytes.
  void ExpectSameBytes(HostExpertPool& pool, ExpertKey key) {
    auto held = pool.HeldWeights(key);
    ASSERT_OK(held);
    const ExpertWeights& src = experts_[static_cast<size_t>(key.layer)][static_cast<size_t>(key.expert)];
    const size_t bytes = static_cast<size_t>(pool.layout(key.layer).w1_bytes);
    EXPECT_EQ(std::memcmp(held->w1.data, src.w1.data, bytes), 0);
    EXPECT_EQ(std::memcmp(held->w3.data, src.w3.data, bytes), 0);
    EXPECT_EQ(std::memcmp(held->w2.data, src.w2.data, bytes), 0);
    EXPECT_NE(held->w1.data, src.w1.data);  // a copy, not a view of the model
  }

  std::unique_ptr<Model> model_;
  std::vector<std::vector<ExpertWeights>> experts_;
  ExpertFfn ffn_{nullptr};
};

TEST_F(HostExpertPoolTest, SlotsComeFromTheMemoryBudget) {
  auto layout = ExpertLayout::ForModel(model_->config, DType::kBF16);
  ASSERT_OK(layout);
  const int64_t d = model_->config.hidden_size, i = model_->config.intermediate_size;
  EXPECT_EQ(layout->copy_bytes, 3 * d * i * 2);
  EXPECT_EQ(layout->buffer_bytes % kExpertBufferAlignment, 0);
  ExpertPoolOptions options;
  options.memory_bytes = 7 * layout->buffer_bytes + 100;
  options.num_staging_buffers = 2;
  auto slots = options.SlotCount(layout->buffer_bytes);
  ASSERT_OK(slots);
  EXPECT_EQ(*slots, 5);
  options.memory_bytes = layout->buffer_bytes;  // not even the staging buffers
  auto too_small = options.SlotCount(layout->buffer_bytes);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_small.status().message().find("memory_bytes"), std::string::npos);
  options.num_staging_buffers = -1;
  EXPECT_NE(options.SlotCount(layout->buffer_bytes).status().message().find("num_staging_buffers"), std::string::npos);
}

TEST_F(HostExpertPoolTest, MigrationCopiesTheBytesOnItsThreadAndSignalsReadiness) {
  auto pool = MakePool(2, 1);
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->kind(), "no-GPU host pool");
  const ExpertKey key{1, 2};
  EXPECT_FALSE(pool->Find(key).held);
  ASSERT_OK(pool->Migrate(key, std::nullopt));
  const PoolLocation at = pool->Find(key);
  EXPECT_TRUE(at.held);
  EXPECT_FALSE(at.staging);
  // Another thread waits on the readiness event.
  absl::Status waited;
  std::thread waiter([&] { waited = pool->WaitReady(key); });
  waiter.join();
  ASSERT_OK(waited);
  EXPECT_TRUE(pool->IsReady(key));
  ExpectSameBytes(*pool, key);

  const ExpertPoolStats stats = pool->stats();
  EXPECT_EQ(stats.migrations_started, 1);
  EXPECT_EQ(stats.migrations_completed, 1);
  EXPECT_EQ(stats.bytes_copied, pool->layout(0).copy_bytes);
  EXPECT_EQ(stats.used_slots, 1);
  const std::vector<MigrationRecord> done = pool->TakeCompletedMigrations();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].expert, key);
  EXPECT_FALSE(done[0].staging);
  EXPECT_EQ(done[0].bytes, pool->layout(0).copy_bytes);
  EXPECT_GE(done[0].copy_us, 0);
  EXPECT_TRUE(pool->TakeCompletedMigrations().empty());

  EXPECT_EQ(pool->Migrate(key, std::nullopt).code(), absl::StatusCode::kFailedPrecondition);  // already held
  EXPECT_EQ(pool->Migrate({2, 0}, std::nullopt).code(), absl::StatusCode::kInvalidArgument);  // no layer 2
  EXPECT_EQ(pool->WaitReady({0, 0}).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(HostExpertPoolTest, EvictionFreesTheVictimsSlotForTheNewExpert) {
  auto pool = MakePool(2, 1);
  ASSERT_NE(pool, nullptr);
  ASSERT_OK(pool->Place({0, 0}));
  ASSERT_OK(pool->Migrate({0, 1}, std::nullopt));
  EXPECT_TRUE(pool->IsReady({0, 0}));  // placement is synchronous
  EXPECT_EQ(pool->Migrate({1, 3}, std::nullopt).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool->Migrate({1, 3}, ExpertKey{1, 0}).code(), absl::StatusCode::kFailedPrecondition);  // not held
  const int slot_of_victim = pool->Find({0, 0}).index;
  ASSERT_OK(pool->Migrate({1, 3}, ExpertKey{0, 0}));
  EXPECT_FALSE(pool->Find({0, 0}).held);
  EXPECT_EQ(pool->Find({1, 3}).index, slot_of_victim);
  ASSERT_OK(pool->WaitReady({1, 3}));
  ExpectSameBytes(*pool, {1, 3});
  ExpectSameBytes(*pool, {0, 1});  // a victim's neighbour is untouched

  const std::vector<PoolSlot> table = pool->SlotTable();
  ASSERT_EQ(table.size(), 3u);  // 2 slots + 1 staging buffer
  EXPECT_EQ(table[static_cast<size_t>(slot_of_victim)].expert, (ExpertKey{1, 3}));
  EXPECT_EQ(table[2].staging, true);
  EXPECT_FALSE(table[2].expert.has_value());

  ASSERT_OK(pool->Evict({0, 1}));
  EXPECT_EQ(pool->Evict({0, 1}).code(), absl::StatusCode::kFailedPrecondition);
  const ExpertPoolStats stats = pool->stats();
  EXPECT_EQ(stats.placements, 1);
  EXPECT_EQ(stats.evictions, 2);
  EXPECT_EQ(stats.used_slots, 1);
}

TEST_F(HostExpertPoolTest, StagedExpertIsAdmittedWithoutACopy) {
  auto pool = MakePool(1, 1);
  ASSERT_NE(pool, nullptr);
  ASSERT_OK(pool->Place({0, 2}));
  ASSERT_OK(pool->Stage({1, 1}));
  EXPECT_TRUE(pool->Find({1, 1}).staging);
  EXPECT_EQ(pool->Stage({1, 2}).code(), absl::StatusCode::kResourceExhausted);                 // one staging buffer
  EXPECT_EQ(pool->Admit({1, 2}, std::nullopt).code(), absl::StatusCode::kFailedPrecondition);  // not staged
  ASSERT_OK(pool->Admit({1, 1}, ExpertKey{0, 2}));
  const PoolLocation at = pool->Find({1, 1});
  EXPECT_FALSE(at.staging);
  EXPECT_EQ(at.index, 0);
  EXPECT_FALSE(pool->Find({0, 2}).held);
  ExpectSameBytes(*pool, {1, 1});
  ExpertPoolStats stats = pool->stats();
  EXPECT_EQ(stats.migrations_started, 1);  // the staging copy only
  EXPECT_EQ(stats.staging_copies, 1);
  EXPECT_EQ(stats.admissions, 1);
  // The staging buffer is free again for the next plan.
  ASSERT_OK(pool->Stage({1, 2}));
  ASSERT_OK(pool->ReleaseStaging());
  EXPECT_FALSE(pool->Find({1, 2}).held);
  EXPECT_TRUE(pool->TakeCompletedMigrations().size() == 2);
}

TEST_F(HostExpertPoolTest, ComputesFromItsOwnCopy) {
  auto pool = MakePool(2, 1);
  ASSERT_NE(pool, nullptr);
  const int64_t d = model_->config.hidden_size;
  const int64_t rows = 5;
  std::vector<float> x(static_cast<size_t>(rows * d));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1, 1);
  for (float& v : x) v = uniform(rng);
  LocalExpertExecutor cpu(experts_, nullptr);
  std::vector<float> want(x.size()), got(x.size());
  const ExpertWork cpu_work{3, rows, x.data(), want.data()};
  ASSERT_OK(cpu.RunExperts(1, std::span<const ExpertWork>(&cpu_work, 1)));

  const ExpertWork pool_work{3, rows, x.data(), got.data()};
  EXPECT_EQ(pool->RunExperts(1, std::span<const ExpertWork>(&pool_work, 1), nullptr).code(),
            absl::StatusCode::kFailedPrecondition);  // not held
  ASSERT_OK(pool->Migrate({1, 3}, std::nullopt));
  PoolRunTiming timing;
  ASSERT_OK(pool->RunExperts(1, std::span<const ExpertWork>(&pool_work, 1), &timing));  // waits for the copy
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(timing.slot_runs, 1);
  EXPECT_GT(timing.compute_us, 0);

  // Flip bits in the pool's copy of W1: the pool's output changes, so it
  // really computes from its copy, not from the model's weights.
  auto held = pool->HeldWeights({1, 3});
  ASSERT_OK(held);
  auto* w1 = static_cast<uint16_t*>(const_cast<void*>(held->w1.data));
  for (int64_t j = 0; j < d; ++j) w1[j] ^= 0x4000;
  ASSERT_OK(pool->RunExperts(1, std::span<const ExpertWork>(&pool_work, 1), nullptr));
  EXPECT_NE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
  EXPECT_EQ(pool->stats().slot_runs, 2);
}

TEST_F(HostExpertPoolTest, ManyQueuedMigrationsAllLandInOrder) {
  auto pool = MakePool(3, 2);
  ASSERT_NE(pool, nullptr);
  // Cycle every expert of the model through three slots, never waiting
  // between migrations except for the victim (which Migrate does itself).
  std::vector<ExpertKey> resident;
  int copies = 0;
  for (int round = 0; round < 3; ++round) {
    for (int l = 0; l < 2; ++l) {
      for (int e = 0; e < 4; ++e) {
        const ExpertKey key{l, e};
        if (pool->Find(key).held) continue;
        std::optional<ExpertKey> victim;
        if (resident.size() == 3) {
          victim = resident.front();
          resident.erase(resident.begin());
        }
        ASSERT_OK(pool->Migrate(key, victim)) << l << " " << e;
        resident.push_back(key);
        ++copies;
      }
    }
  }
  for (const ExpertKey& key : resident) ExpectSameBytes(*pool, key);
  const std::vector<MigrationRecord> done = pool->TakeCompletedMigrations();
  EXPECT_EQ(static_cast<int>(done.size()), copies);
  EXPECT_EQ(pool->stats().migrations_completed, copies);
  EXPECT_EQ(pool->stats().bytes_copied, copies * pool->layout(0).copy_bytes);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// An expert in slices, as the CPU workers' stores hold it under the split
// division: w1/w3 rows and w2 columns [b, e) per worker, each slice a
// separate contiguous array. The pool gathers the pieces into the whole.
TEST_F(HostExpertPoolTest, GathersAnExpertFromWorkerSlices) {
  const ModelConfig& c = model_->config;
  const int64_t d = c.hidden_size, i = c.intermediate_size, cut = i / 2 + 3;  // uneven, not 16-aligned
  const size_t elt = DTypeSize(DType::kBF16);
  std::vector<std::vector<uint8_t>> storage;  // the "stores": one array per slice matrix
  auto slice = [&](const LinearWeight& m, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
    std::vector<uint8_t>& out = storage.emplace_back(static_cast<size_t>(rows * cols) * elt);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(out.data() + static_cast<size_t>(r * cols) * elt,
                  static_cast<const uint8_t*>(m.data) + static_cast<size_t>((row0 + r) * m.k + col0) * elt,
                  static_cast<size_t>(cols) * elt);
    }
    return MatrixPiece{.data = out.data(), .row0 = row0, .col0 = col0, .rows = rows, .cols = cols, .pitch = cols};
  };
  storage.reserve(1024);  // views into the arrays must not move
  ExpertSources sources;
  for (const auto& layer : experts_) {
    std::vector<ExpertSource>& out = sources.emplace_back();
    for (const ExpertWeights& w : layer) {
      ExpertSource& s = out.emplace_back();
      s.w1_dtype = s.w3_dtype = s.w2_dtype = w.w1.dtype;
      for (auto [b, e] : {std::pair<int64_t, int64_t>{0, cut}, {cut, i}}) {
        s.w1.push_back(slice(w.w1, b, e - b, 0, d));
        s.w3.push_back(slice(w.w3, b, e - b, 0, d));
        s.w2.push_back(slice(w.w2, 0, d, b, e - b));
      }
    }
  }
  ExpertFfn* ffn = &ffn_;
  ExpertPoolOptions options;
  options.num_slots = 2;
  options.num_staging_buffers = 1;
  auto pool = HostExpertPool::Create(
      c, sources,
      [ffn](const ExpertWeights& w, const float* x, int64_t rows, float* y) { return ffn->Run(w, x, rows, y); },
      options);
  ASSERT_OK(pool);
  ASSERT_OK((*pool)->Place({0, 1}));
  ASSERT_OK((*pool)->Migrate({1, 3}, std::nullopt));
  ASSERT_OK((*pool)->Stage({1, 0}));
  for (ExpertKey key : {ExpertKey{0, 1}, ExpertKey{1, 3}, ExpertKey{1, 0}}) ExpectSameBytes(**pool, key);

  // Pieces that do not tile the matrix are refused, naming the matrix.
  ExpertSources gap = sources;
  gap[1][2].w2.pop_back();
  auto refused = HostExpertPool::Create(
      c, gap, [ffn](const ExpertWeights& w, const float* x, int64_t rows, float* y) { return ffn->Run(w, x, rows, y); },
      options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("experts[1][2].w2"), std::string::npos) << refused.status();
  ExpertSources overlap = sources;
  overlap[0][0].w1[1].row0 -= 1;
  auto overlapping = HostExpertPool::Create(
      c, overlap,
      [ffn](const ExpertWeights& w, const float* x, int64_t rows, float* y) { return ffn->Run(w, x, rows, y); },
      options);
  ASSERT_FALSE(overlapping.ok());
  EXPECT_NE(overlapping.status().message().find("overlaps"), std::string::npos) << overlapping.status();
}

}  // namespace
}  // namespace tandem
