// The CUDA expert pool against the CPU: its expert FFN equals the CPU
// worker's ExpertFfn up to rounding (normalised mean squared error, over
// shapes, row counts and dtypes), the bytes in its slots equal the model's,
// and under load — many migrations, stagings, admissions and evictions
// queued while layers compute, with freed buffers poisoned with NaN — no
// output ever comes from a half-copied or freed buffer. A fresh pool's first
// copies are not overwritten by its initial poison fill, and host regions
// are page-locked as ChooseHostPinMode says for this GPU (a read-only
// mapping where read-only registration is unsupported is copied from
// pageable memory, counted, and the pool still works).
//
// RunExperts has two compute paths (grouped cuBLAS GEMMs over all experts
// of a call, and per-expert GEMMs); both are checked against the CPU, on
// eight experts with uneven rows (none, one, many).
//
// Without a CUDA device (or without CUDA in the build) the GPU tests skip,
// saying why; the interface test still runs.
//
// Legend: D hidden size, I intermediate size, R rows.
#include <sys/mman.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/base/dtype.h"
#include "common/model/model_config.h"
#include "cpu_worker/expert_ffn.h"
#include "gpu_worker/cuda/cuda_device.h"
#include "gpu_worker/cuda/cuda_expert_pool.h"
#include "gpu_worker/pinned_regions.h"
#include "gtest/gtest.h"
#include "tests/cuda_skip_testlib.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

// Experts of random weights in one page-aligned mmap'd region, like the CPU
// worker's shared-memory store. Writable (lockable on every GPU), or
// read-only once filled (`read_only`), as the coordinator maps that store
// where its GPU can lock read-only mappings.
class ExpertRegion {
 public:
  ExpertRegion(int layers, int experts, int64_t d, int64_t i, DType dtype, uint32_t seed, bool read_only = false) {
    config_.hidden_size = d;
    config_.intermediate_size = i;
    config_.num_hidden_layers = layers;
    config_.num_local_experts = experts;
    const size_t elt = DTypeSize(dtype);
    const size_t matrix = static_cast<size_t>(d * i) * elt;
    const size_t stride = (matrix + 4095) / 4096 * 4096;
    bytes_ = static_cast<size_t>(layers * experts) * 3 * stride;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      ADD_FAILURE() << "mmap of " << bytes_ << " bytes failed";
      return;
    }
    data_ = static_cast<uint8_t*>(p);
    std::mt19937 rng(seed);
    // Scaled so that every layer of the FFN keeps values O(1).
    std::normal_distribution<float> w_in(0.0f, 1.0f / std::sqrt(static_cast<float>(d)));
    std::normal_distribution<float> w_out(0.0f, 1.0f / std::sqrt(static_cast<float>(i)));
    uint8_t* at = data_;
    experts_.resize(static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) {
      for (int e = 0; e < experts; ++e) {
        ExpertWeights w;
        w.w1 = Fill(at, dtype, i, d, w_in, rng), at += stride;
        w.w3 = Fill(at, dtype, i, d, w_in, rng), at += stride;
        w.w2 = Fill(at, dtype, d, i, w_out, rng), at += stride;
        experts_[static_cast<size_t>(l)].push_back(w);
      }
    }
    if (read_only && mprotect(data_, bytes_, PROT_READ) != 0) ADD_FAILURE() << "mprotect(PROT_READ) failed";
  }
  ~ExpertRegion() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  ExpertRegion(const ExpertRegion&) = delete;
  ExpertRegion& operator=(const ExpertRegion&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::vector<std::vector<ExpertWeights>>& experts() const { return experts_; }
  const ExpertWeights& expert(ExpertKey key) const {
    return experts_[static_cast<size_t>(key.layer)][static_cast<size_t>(key.expert)];
  }
  PinnedHostRegion region() const { return {data_, bytes_}; }

 private:
  template <typename Dist>
  static LinearWeight Fill(uint8_t* at, DType dtype, int64_t n, int64_t k, Dist& dist, std::mt19937& rng) {
    for (int64_t j = 0; j < n * k; ++j) {
      const float v = dist(rng);
      if (dtype == DType::kF32) {
        std::memcpy(at + j * 4, &v, 4);
      } else {
        const uint16_t bits = dtype == DType::kBF16 ? F32ToBf16(v) : F32ToF16(v);
        std::memcpy(at + j * 2, &bits, 2);
      }
    }
    return LinearWeight{at, dtype, n, k};
  }

  ModelConfig config_;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  std::vector<std::vector<ExpertWeights>> experts_;
};

std::vector<float> RandomRows(int64_t rows, int64_t d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * d));
  for (float& v : x) v = dist(rng);
  return x;
}

// Σ(got − want)² / Σ want²; +inf when `got` has a NaN or inf.
double Nmse(const float* got, const float* want, size_t n) {
  double err = 0, ref = 0;
  for (size_t j = 0; j < n; ++j) {
    if (!std::isfinite(got[j])) return INFINITY;
    const double diff = static_cast<double>(got[j]) - want[j];
    err += diff * diff;
    ref += static_cast<double>(want[j]) * want[j];
  }
  return ref > 0 ? err / ref : err;
}

// Activations are rounded to the weights' type before each GEMM (the CPU
// keeps them f32): bf16 keeps 8 bits of mantissa, f16 11, f32 all.
double NmseBound(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 2e-4;
    case DType::kF16: return 2e-5;
    case DType::kF32: return 1e-8;
    default: break;  // quantized weights are dequantized before the pool sees them
  }
  return 0;
}

std::vector<float> CpuFfn(const ExpertWeights& w, const std::vector<float>& x, int64_t rows, int64_t d) {
  ExpertFfn ffn(nullptr);
  std::vector<float> y(static_cast<size_t>(rows * d));
  const absl::Status status = ffn.Run(w, x.data(), rows, y.data());
  EXPECT_OK(status);
  return y;
}

// The pool's copy of `key` (read back from the GPU) is `w`'s bytes.
void ExpectHeldBytes(CudaExpertPool& pool, ExpertKey key, const ExpertWeights& w) {
  auto held = pool.ReadHeld(key);
  ASSERT_OK(held);
  const size_t bytes = static_cast<size_t>(pool.layout(key.layer).w1_bytes);
  EXPECT_EQ(std::memcmp(held->data(), w.w1.data, bytes), 0) << "expert " << key.expert << " w1";
  EXPECT_EQ(std::memcmp(held->data() + bytes, w.w3.data, bytes), 0) << "expert " << key.expert << " w3";
  EXPECT_EQ(std::memcmp(held->data() + 2 * bytes, w.w2.data, bytes), 0) << "expert " << key.expert << " w2";
}

TEST(CudaExpertPoolTest, CreateSaysWhyWhenItCannotRun) {
  ExpertRegion region(1, 2, 64, 96, DType::kBF16, 1);
  CudaExpertPoolOptions options;
  options.pool.num_slots = 1;
  options.pool.num_staging_buffers = 1;
  auto pool = CudaExpertPool::Create(region.config(), region.experts(), options);
  if (!BuiltWithCuda()) {
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnimplemented) << pool.status();
    EXPECT_NE(pool.status().message().find("without CUDA"), std::string::npos) << pool.status();
    return;
  }
  if (!ListCudaDevices().ok()) {
    ASSERT_FALSE(pool.ok());
    EXPECT_EQ(pool.status().code(), absl::StatusCode::kUnavailable) << pool.status();
    EXPECT_NE(pool.status().message().find("no usable CUDA device"), std::string::npos) << pool.status();
    return;
  }
  ASSERT_OK(pool);
  EXPECT_NE((*pool)->kind().find("CUDA pool"), std::string::npos);
  // A budget far beyond any GPU is refused up front, naming the need.
  options.pool.num_slots = 1 << 30;
  auto too_big = CudaExpertPool::Create(region.config(), region.experts(), options);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted) << too_big.status();
}

struct FfnCase {
  int64_t d, i;
  DType dtype;
};

TEST(CudaExpertPoolTest, FfnMatchesTheCpuExpertFfnByNormalisedMse) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const std::vector<FfnCase> cases = {
      {64, 96, DType::kBF16}, {128, 352, DType::kBF16}, {256, 704, DType::kBF16}, {1024, 3584, DType::kBF16},
      {64, 80, DType::kF16},  {256, 704, DType::kF16},  {64, 96, DType::kF32},    {192, 320, DType::kF32},
  };
  const std::vector<int64_t> row_counts = {1, 3, 17, 64, 257};
  for (const FfnCase& c : cases) {
    SCOPED_TRACE(testing::Message() << "D=" << c.d << " I=" << c.i << " " << DTypeName(c.dtype));
    ExpertRegion region(1, 4, c.d, c.i, c.dtype, static_cast<uint32_t>(c.d * 31 + c.i));
    CudaExpertPoolOptions options;
    options.pool.num_slots = 3;
    options.pool.num_staging_buffers = 1;
    // Pageable sources for even-numbered cases: both copy paths must be right.
    const bool pinned = (c.d / 64) % 2 == 1;
    if (pinned) options.host_regions.push_back(region.region());
    auto created = CudaExpertPool::Create(region.config(), region.experts(), options);
    ASSERT_OK(created);
    CudaExpertPool& pool = **created;
    ASSERT_OK(pool.Place({0, 0}));
    ASSERT_OK(pool.Migrate({0, 1}, std::nullopt));
    ASSERT_OK(pool.Migrate({0, 2}, std::nullopt));
    ASSERT_OK(pool.Stage({0, 3}));
    // The bytes on the GPU are the model's.
    for (int e = 0; e < 4; ++e) ExpectHeldBytes(pool, {0, e}, region.expert({0, e}));
    for (int64_t rows : row_counts) {
      // All four experts in one call, different row counts, one with none.
      std::vector<std::vector<float>> x(4), y(4), want(4);
      std::vector<ExpertWork> work;
      for (int e = 0; e < 4; ++e) {
        const int64_t r = e == 2 ? 0 : rows + e;
        x[e] = RandomRows(r, c.d, static_cast<uint32_t>(rows * 7 + e));
        y[e].assign(static_cast<size_t>(r * c.d), NAN);
        want[e] = CpuFfn(region.expert({0, e}), x[e], r, c.d);
        work.push_back({e, r, x[e].data(), y[e].data()});
      }
      PoolRunTiming timing;
      const absl::Status run = pool.RunExperts(0, work, &timing);
      ASSERT_OK(run);
      EXPECT_EQ(timing.slot_runs + timing.staging_runs, 3);
      EXPECT_EQ(timing.staging_runs, 1);
      for (int e = 0; e < 4; ++e) {
        if (work[static_cast<size_t>(e)].num_rows == 0) continue;
        const double nmse = Nmse(y[e].data(), want[e].data(), y[e].size());
        EXPECT_LT(nmse, NmseBound(c.dtype))
            << "expert " << e << ", " << work[static_cast<size_t>(e)].num_rows << " rows";
        std::cout << "  D=" << c.d << " I=" << c.i << " " << DTypeName(c.dtype)
                  << " rows=" << work[static_cast<size_t>(e)].num_rows << " expert " << e << ": nmse " << nmse << "\n";
      }
    }
    EXPECT_EQ(pool.stats().pageable_copies, pinned ? 0 : 4);  // a placement, two migrations, a staging copy
    ASSERT_OK(pool.ReleaseStaging());
    EXPECT_FALSE(pool.Find({0, 3}).held);
    // A key the pool does not hold is refused, naming it.
    std::vector<float> one_x = RandomRows(1, c.d, 5), one_y(static_cast<size_t>(c.d));
    const ExpertWork missing{3, 1, one_x.data(), one_y.data()};
    const absl::Status refused = pool.RunExperts(0, std::span<const ExpertWork>(&missing, 1), nullptr);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    EXPECT_NE(refused.message().find("layer 0 expert 3"), std::string::npos) << refused;
  }
}

// Eight experts of one layer in one call, rows 0, 1, 2, 5, 16, 33, 1, 130
// (uneven, one empty, two single rows), through the grouped path and through
// the per-expert path (asked for, and forced by a row size that is not a
// multiple of 16 bytes): every output matches the CPU, and the two paths
// agree with each other to the weights' rounding.
TEST(CudaExpertPoolTest, GroupedAndPerExpertPathsMatchTheCpuOnUnevenRows) {
  SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int64_t d, i;
    DType dtype;
    bool aligned;  // D and I rows are multiples of 16 bytes: grouped possible
  };
  const std::vector<Case> cases = {
      {256, 704, DType::kBF16, true},
      {128, 352, DType::kF16, true},
      {64, 96, DType::kF32, true},
      {36, 100, DType::kBF16, false},  // 72-byte rows: per-expert only
  };
  const std::vector<int64_t> rows = {0, 1, 2, 5, 16, 33, 1, 130};
  constexpr int kExperts = 8;
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "D=" << c.d << " I=" << c.i << " " << DTypeName(c.dtype));
    ExpertRegion region(1, kExperts, c.d, c.i, c.dtype, static_cast<uint32_t>(c.d + c.i));
    std::vector<std::vector<float>> x(kExperts), want(kExperts);
    for (int e = 0; e < kExperts; ++e) {
      x[e] = RandomRows(rows[e], c.d, static_cast<uint32_t>(100 + e));
      want[e] = CpuFfn(region.expert({0, e}), x[e], rows[e], c.d);
    }
    std::vector<std::vector<float>> by_path[2];
    for (const bool grouped : {true, false}) {
      CudaExpertPoolOptions options;
      options.pool.num_slots = kExperts - 1;  // one expert comes from a staging buffer
      options.pool.num_staging_buffers = 1;
      options.grouped_gemm = grouped;
      options.host_regions.push_back(region.region());
      auto created = CudaExpertPool::Create(region.config(), region.experts(), options);
      ASSERT_OK(created);
      CudaExpertPool& pool = **created;
      for (int e = 0; e < kExperts - 1; ++e) ASSERT_OK(pool.Migrate({0, e}, std::nullopt));
      ASSERT_OK(pool.Stage({0, kExperts - 1}));
      // Twice: the second call reuses the pointer arrays and scratch.
      for (int call = 0; call < 2; ++call) {
        std::vector<std::vector<float>> y(kExperts);
        std::vector<ExpertWork> work;
        // Experts in a shuffled order: the packed rows follow `work`, not
        // the expert numbers.
        for (int e : {3, 0, 7, 5, 1, 6, 2, 4}) {
          y[e].assign(static_cast<size_t>(rows[e] * c.d), NAN);
          work.push_back({e, rows[e], x[e].data(), y[e].data()});
        }
        PoolRunTiming timing;
        const absl::Status run = pool.RunExperts(0, work, &timing);
        ASSERT_OK(run);
        EXPECT_EQ(timing.slot_runs + timing.staging_runs, kExperts - 1);  // the empty one does not run
        for (int e = 0; e < kExperts; ++e) {
          if (rows[e] == 0) continue;
          const double nmse = Nmse(y[e].data(), want[e].data(), y[e].size());
          EXPECT_LT(nmse, NmseBound(c.dtype)) << (grouped ? "grouped" : "per-expert") << " call " << call << " expert "
                                              << e << ", " << rows[e] << " rows";
          if (call == 0) {
            std::cout << "  " << (pool.grouped_gemm() ? "grouped   " : "per-expert") << " D=" << c.d << " I=" << c.i
                      << " " << DTypeName(c.dtype) << " rows=" << rows[e] << " expert " << e << ": nmse " << nmse
                      << "\n";
          }
        }
        if (call == 1) by_path[grouped ? 0 : 1] = std::move(y);
      }
      // Asked for and possible, the grouped path must really have run:
      // a NOT_SUPPORTED answer from cuBLAS would silently fall back.
      EXPECT_EQ(pool.grouped_gemm(), grouped && c.aligned)
          << "grouped GEMM " << (grouped ? "asked for" : "not asked for") << "; see the log for cuBLAS's answer";
      ASSERT_OK(pool.ReleaseStaging());
    }
    for (int e = 0; e < kExperts; ++e) {
      if (rows[e] == 0) continue;
      EXPECT_LT(Nmse(by_path[0][e].data(), by_path[1][e].data(), by_path[0][e].size()), NmseBound(c.dtype))
          << "grouped vs per-expert, expert " << e;
    }
  }
}

TEST(CudaExpertPoolTest, MigrationsUnderLoadNeverFeedAHalfCopiedOrFreedExpert) {
  SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int kLayers = 4, kExperts = 8, kMaxRows = 48;
  constexpr int64_t kD = 512, kI = 1536;
  ExpertRegion region(kLayers, kExperts, kD, kI, DType::kBF16, 42);
  CudaExpertPoolOptions options;
  options.pool.num_slots = 10;
  options.pool.num_staging_buffers = 2;
  options.poison_freed_buffers = true;  // also in release builds: a freed buffer reads as NaN
  options.host_regions.push_back(region.region());
  auto created = CudaExpertPool::Create(region.config(), region.experts(), options);
  ASSERT_OK(created);
  CudaExpertPool& pool = **created;

  // One fixed input per expert and the CPU's answer; a run uses a prefix of
  // its rows (the FFN is row by row, so the answer's prefix is the answer).
  std::vector<std::vector<float>> inputs, wants;
  for (int l = 0; l < kLayers; ++l) {
    for (int e = 0; e < kExperts; ++e) {
      inputs.push_back(RandomRows(kMaxRows, kD, static_cast<uint32_t>(l * 100 + e)));
      wants.push_back(CpuFfn(region.expert({l, e}), inputs.back(), kMaxRows, kD));
    }
  }
  auto index = [](ExpertKey k) { return static_cast<size_t>(k.layer * kExperts + k.expert); };

  // Any-thread calls hammer the pool's lock meanwhile.
  std::atomic<bool> stop{false};
  std::thread observer([&] {
    std::mt19937 rng(3);
    while (!stop.load()) {
      const ExpertKey key{static_cast<int>(rng() % kLayers), static_cast<int>(rng() % kExperts)};
      (void)pool.IsReady(key);
      (void)pool.SlotTable();
      (void)pool.stats();
    }
  });

  std::mt19937 rng(11);
  std::vector<ExpertKey> in_slots;  // what the test believes is in a slot
  int64_t checked = 0;
  double worst = 0;
  for (int step = 0; step < 400; ++step) {
    const int layer = static_cast<int>(rng() % kLayers);
    // Queue a few migrations, evicting a random slot when the pool is full:
    // some of them into experts this very step computes.
    for (int m = 0; m < 3; ++m) {
      const ExpertKey key{static_cast<int>(rng() % 2 == 0 ? layer : rng() % kLayers),
                          static_cast<int>(rng() % kExperts)};
      if (pool.Find(key).held) continue;
      std::optional<ExpertKey> victim;
      if (static_cast<int>(in_slots.size()) == pool.num_slots()) {
        const size_t v = rng() % in_slots.size();
        victim = in_slots[v];
        in_slots.erase(in_slots.begin() + static_cast<long>(v));
      }
      const absl::Status migrated = pool.Migrate(key, victim);
      ASSERT_OK(migrated);
      in_slots.push_back(key);
    }
    // A plan's copies into staging buffers, for this layer only.
    std::vector<ExpertKey> staged;
    for (int e = 0; e < kExperts && static_cast<int>(staged.size()) < pool.num_staging_buffers(); ++e) {
      const ExpertKey key{layer, static_cast<int>(rng() % kExperts)};
      if (pool.Find(key).held) continue;
      ASSERT_OK(pool.Stage(key));
      staged.push_back(key);
    }
    // Every expert of this layer the pool holds, some still copying.
    std::vector<ExpertWork> work;
    std::vector<std::vector<float>> outputs;
    outputs.reserve(kExperts);
    for (int e = 0; e < kExperts; ++e) {
      if (!pool.Find({layer, e}).held) continue;
      const int64_t rows = 1 + static_cast<int64_t>(rng() % kMaxRows);
      outputs.emplace_back(static_cast<size_t>(rows * kD), NAN);
      work.push_back({e, rows, inputs[index({layer, e})].data(), outputs.back().data()});
    }
    const absl::Status ran = pool.RunExperts(layer, work, nullptr);
    ASSERT_OK(ran);
    for (size_t w = 0; w < work.size(); ++w) {
      const double nmse = Nmse(outputs[w].data(), wants[index({layer, work[w].expert})].data(), outputs[w].size());
      worst = std::max(worst, nmse);
      ASSERT_LT(nmse, NmseBound(DType::kBF16)) << "step " << step << " layer " << layer << " expert " << work[w].expert;
      ++checked;
    }
    // Keep one staged expert now and then (admission evicts when full).
    if (!staged.empty() && rng() % 3 == 0) {
      std::optional<ExpertKey> victim;
      if (static_cast<int>(in_slots.size()) == pool.num_slots()) {
        const size_t v = rng() % in_slots.size();
        victim = in_slots[v];
        in_slots.erase(in_slots.begin() + static_cast<long>(v));
      }
      ASSERT_OK(pool.Admit(staged[0], victim));
      in_slots.push_back(staged[0]);
    }
    ASSERT_OK(pool.ReleaseStaging());
    // Now and then an eviction on its own, and a byte check of a fresh copy
    // (the poison fill of its buffer must have landed before the copy).
    if (!in_slots.empty() && rng() % 4 == 0) {
      const size_t v = rng() % in_slots.size();
      ASSERT_OK(pool.Evict(in_slots[v]));
      in_slots.erase(in_slots.begin() + static_cast<long>(v));
    }
    if (!in_slots.empty() && step % 25 == 0) {
      const ExpertKey key = in_slots.back();
      ASSERT_NO_FATAL_FAILURE(ExpectHeldBytes(pool, key, region.expert(key)));
      ASSERT_FALSE(::testing::Test::HasFailure()) << "layer " << key.layer << " expert " << key.expert;
    }
  }
  stop = true;
  observer.join();
  for (const ExpertKey& key : in_slots) ASSERT_OK(pool.WaitReady(key));
  const ExpertPoolStats stats = pool.stats();
  EXPECT_EQ(stats.migrations_started, stats.migrations_completed);
  EXPECT_EQ(stats.used_slots, static_cast<int>(in_slots.size()));
  EXPECT_EQ(stats.pageable_copies, 0);
  EXPECT_GT(stats.MigrationGbPerSecond(), 0);
  const std::vector<MigrationRecord> done = pool.TakeCompletedMigrations();
  EXPECT_EQ(static_cast<int64_t>(done.size()), stats.migrations_completed);
  std::cout << "  " << stats.migrations_completed << " copies (" << stats.staging_copies << " staging), "
            << stats.evictions << " evictions, " << stats.admissions << " admissions, " << checked
            << " expert outputs checked, worst nmse " << worst << ", copy " << stats.MigrationGbPerSecond()
            << " GB/s, wait " << stats.wait_us << " us, compute " << stats.compute_us << " us\n";
}

// Item by item what an x86 host with a discrete GPU does differently: there
// cudaDevAttrHostRegisterReadOnlySupported is 0, so a read-only mapping
// cannot be locked at all. The pool must still start, copy every byte right
// from pageable memory and count those copies; a writable mapping is locked
// (plainly) everywhere. Where the attribute is 1, both are locked read-only.
TEST(CudaExpertPoolTest, ReadOnlyMappingsAreLockedWhereTheGpuCanElseCopiedFromPageableMemory) {
  SKIP_WITHOUT_CUDA_DEVICE();
  absl::StatusOr<bool> supported = HostRegisterReadOnlySupported(0);
  ASSERT_OK(supported);
  std::cout << "  device 0: cudaDevAttrHostRegisterReadOnlySupported = " << *supported << "\n";
  for (const bool read_only : {true, false}) {
    SCOPED_TRACE(read_only ? "read-only mapping" : "writable mapping");
    ExpertRegion region(1, 4, 64, 96, DType::kBF16, 5, read_only);
    CudaExpertPoolOptions options;
    options.pool.num_slots = 2;
    options.pool.num_staging_buffers = 1;
    options.host_regions.push_back(region.region());
    auto created = CudaExpertPool::Create(region.config(), region.experts(), options);
    ASSERT_OK(created);
    CudaExpertPool& pool = **created;
    const HostPinMode want = ChooseHostPinMode(*supported, /*mapping_writable_in_place=*/!read_only);
    ASSERT_EQ(pool.host_pin_modes().size(), 1u);
    EXPECT_EQ(pool.host_pin_modes()[0], want) << HostPinModeName(pool.host_pin_modes()[0]);
    ASSERT_OK(pool.Place({0, 0}));
    ASSERT_OK(pool.Migrate({0, 1}, std::nullopt));
    ASSERT_OK(pool.Stage({0, 2}));
    for (int e = 0; e < 3; ++e) ExpectHeldBytes(pool, {0, e}, region.expert({0, e}));
    EXPECT_EQ(pool.stats().pageable_copies, want == HostPinMode::kPageable ? 3 : 0);
  }
}

// A fresh pool's first copies land after its initial poison fill, not under
// it: the fill runs on the compute stream and every buffer's `freed` event
// follows it, so copies on the (non-blocking) copy streams wait for it. A
// fill on the legacy default stream ordered nothing and could overwrite a
// just-copied expert with 0xFF. Many large buffers, copies queued the
// moment the pool exists, every byte read back; a few fresh pools.
TEST(CudaExpertPoolTest, FirstCopiesOfAFreshPoolAreNotOverwrittenByItsPoisonFill) {
  SKIP_WITHOUT_CUDA_DEVICE();
  constexpr int kExperts = 48;
  ExpertRegion region(1, kExperts, 512, 1536, DType::kBF16, 9);
  for (int round = 0; round < 3; ++round) {
    CudaExpertPoolOptions options;
    options.pool.num_slots = kExperts - 2;
    options.pool.num_staging_buffers = 2;
    options.poison_freed_buffers = true;
    options.host_regions.push_back(region.region());
    auto created = CudaExpertPool::Create(region.config(), region.experts(), options);
    ASSERT_OK(created);
    CudaExpertPool& pool = **created;
    for (int e = 0; e < kExperts - 2; ++e) ASSERT_OK(pool.Migrate({0, e}, std::nullopt));
    for (int e = kExperts - 2; e < kExperts; ++e) ASSERT_OK(pool.Stage({0, e}));
    for (int e = 0; e < kExperts; ++e) {
      ASSERT_NO_FATAL_FAILURE(ExpectHeldBytes(pool, {0, e}, region.expert({0, e})));
      ASSERT_FALSE(::testing::Test::HasFailure()) << "round " << round << ", expert " << e;
    }
  }
}

// Experts in slices, as the CPU workers' stores hold them under the split
// division (w1/w3 row blocks, w2 column blocks): the pool gathers them with
// one copy per piece (cudaMemcpy2DAsync for the strided ones) from the
// registered region, and the bytes on the GPU are the whole matrices'.
TEST(CudaExpertPoolTest, GathersSplitSlicesWithStridedCopies) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t d = 64, i = 96, cut = 40;
  ExpertRegion region(1, 4, d, i, DType::kBF16, 11);
  ExpertSources sources;
  std::vector<ExpertSource>& layer = sources.emplace_back();
  for (const ExpertWeights& w : region.experts()[0]) {
    ExpertSource& s = layer.emplace_back();
    s.w1_dtype = s.w3_dtype = s.w2_dtype = DType::kBF16;
    const auto* w1 = static_cast<const uint8_t*>(w.w1.data);
    const auto* w3 = static_cast<const uint8_t*>(w.w3.data);
    const auto* w2 = static_cast<const uint8_t*>(w.w2.data);
    for (auto [b, e] : {std::pair<int64_t, int64_t>{cut, i}, {0, cut}}) {  // out of order on purpose
      s.w1.push_back({.data = w1 + b * d * 2, .row0 = b, .col0 = 0, .rows = e - b, .cols = d, .pitch = d});
      s.w3.push_back({.data = w3 + b * d * 2, .row0 = b, .col0 = 0, .rows = e - b, .cols = d, .pitch = d});
      s.w2.push_back({.data = w2 + b * 2, .row0 = 0, .col0 = b, .rows = d, .cols = e - b, .pitch = i});
    }
  }
  CudaExpertPoolOptions options;
  options.pool.num_slots = 2;
  options.pool.num_staging_buffers = 1;
  options.host_regions.push_back(region.region());
  auto created = CudaExpertPool::Create(region.config(), std::move(sources), options);
  ASSERT_OK(created);
  CudaExpertPool& pool = **created;
  ASSERT_EQ(pool.host_pin_modes().size(), 1u);
  EXPECT_NE(pool.host_pin_modes()[0], HostPinMode::kPageable);
  ASSERT_OK(pool.Place({0, 0}));
  ASSERT_OK(pool.Migrate({0, 2}, std::nullopt));
  ASSERT_OK(pool.Stage({0, 3}));
  for (int e : {0, 2, 3}) ExpectHeldBytes(pool, {0, e}, region.expert({0, e}));
  EXPECT_EQ(pool.stats().pageable_copies, 0) << "every piece lies in the registered region";
}

}  // namespace
}  // namespace tandem
