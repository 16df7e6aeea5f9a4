// Which host memory the CUDA expert pool page-locks, and how; all of it host
// arithmetic, so it runs (and must pass) on every machine, GPU or not:
//  - ExpertHostRegions: the experts' matrices widened to pages and merged
//    into disjoint, sorted regions;
//  - ChooseHostPinMode: read-only registration where the device supports it,
//    else a plain one on a writable mapping, else pageable (a discrete GPU
//    in an x86 host cannot lock a PROT_READ mapping at all);
//  - RangeWritableInPlace: a mapping's protection from /proc/<pid>/maps
//    text (parsed lines, holes, several mappings, private file mappings),
//    and from this process's own map for real mappings;
//  - WorkerExpertSources: the workers' stores mapped read-only by default
//    and writable when asked, so that such a GPU can lock them.
#include "gpu_worker/pinned_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/orchestration/worker_expert_sources.h"
#include "cpu_worker/expert_store.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

constexpr uint64_t kSeed = 7;

LinearWeight Matrix(const void* data, int64_t n, int64_t k) {
  return LinearWeight{.data = data, .dtype = DType::kBF16, .n = n, .k = k};
}

TEST(PinnedRegionsTest, BackToBackExpertsBecomeOneRegionAndFarOnesStayApart) {
  constexpr size_t kPage = 4096;
  alignas(kPage) static uint8_t arena[16 * kPage];
  // Expert 0: three 1000-element bf16 matrices back to back from the arena's
  // start (6000 bytes in all: pages 0-1). Expert 1 starts mid-page 1 (shares
  // it) and ends in page 2. Expert 2 lies alone in pages 10-11.
  std::vector<std::vector<ExpertWeights>> experts(1);
  experts[0].push_back(
      {.w1 = Matrix(arena, 10, 100), .w2 = Matrix(arena + 4000, 10, 100), .w3 = Matrix(arena + 2000, 10, 100)});
  experts[0].push_back(
      {.w1 = Matrix(arena + 6000, 10, 100), .w2 = Matrix(arena + 10000, 10, 100), .w3 = Matrix(arena + 8000, 10, 100)});
  experts[0].push_back({.w1 = Matrix(arena + 10 * kPage, 10, 100),
                        .w2 = Matrix(arena + 10 * kPage + 4000, 10, 100),
                        .w3 = Matrix(arena + 10 * kPage + 2000, 10, 100)});
  experts[0].push_back({});  // an expert without weights (e.g. generated elsewhere) is skipped

  const std::vector<PinnedHostRegion> regions = ExpertHostRegions(WholeExperts(experts), kPage);
  ASSERT_EQ(regions.size(), 2u);
  EXPECT_EQ(regions[0].data, arena);
  EXPECT_EQ(regions[0].bytes, 3 * kPage);  // 0..12000 → pages 0, 1, 2
  EXPECT_EQ(regions[1].data, arena + 10 * kPage);
  EXPECT_EQ(regions[1].bytes, 2 * kPage);  // 6000 bytes from a page start → 2 pages
  for (const PinnedHostRegion& r : regions) EXPECT_EQ(reinterpret_cast<uintptr_t>(r.data) % kPage, 0u);
}

TEST(PinnedRegionsTest, TheTinyModelsExpertsAreCoveredByDisjointPageAlignedWritableRegions) {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  ASSERT_OK(model);
  std::vector<std::vector<ExpertWeights>> experts;
  for (const LayerWeights& layer : (*model)->weights->layers) experts.push_back(layer.experts);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const std::vector<PinnedHostRegion> regions = ExpertHostRegions(WholeExperts(experts), page);
  ASSERT_FALSE(regions.empty());
  for (size_t i = 0; i + 1 < regions.size(); ++i) {
    EXPECT_LT(static_cast<const uint8_t*>(regions[i].data) + regions[i].bytes, regions[i + 1].data) << "region " << i;
  }
  auto covered = [&](const void* p, size_t bytes) {
    for (const PinnedHostRegion& r : regions) {
      const uint8_t* b = static_cast<const uint8_t*>(r.data);
      if (static_cast<const uint8_t*>(p) >= b && static_cast<const uint8_t*>(p) + bytes <= b + r.bytes) return true;
    }
    return false;
  };
  for (const auto& layer : experts) {
    for (const ExpertWeights& e : layer) {
      for (const LinearWeight* m : {&e.w1, &e.w2, &e.w3}) {
        EXPECT_TRUE(covered(m->data, static_cast<size_t>(m->n * m->k) * DTypeSize(m->dtype)));
      }
    }
  }
  // The synthetic model's tensors are private anonymous memory: a plain
  // registration locks them on any GPU, read-only registration or not.
  absl::StatusOr<std::string> map = ReadSelfMemoryMap();
  ASSERT_OK(map);
  for (const PinnedHostRegion& r : regions) {
    absl::StatusOr<bool> writable = RangeWritableInPlace(*map, r.data, r.bytes);
    ASSERT_OK(writable);
    EXPECT_TRUE(*writable);
    EXPECT_EQ(ChooseHostPinMode(/*read_only_register_supported=*/false, *writable), HostPinMode::kReadWrite);
  }
}

// The whole table: (device attribute, mapping) → registration.
TEST(HostPinModeTest, ReadOnlyWhereSupportedElsePlainOnWritableMappingsElsePageable) {
  struct Case {
    bool read_only_supported, writable;
    HostPinMode want;
  };
  const Case cases[] = {
      {true, false, HostPinMode::kReadOnly},   // e.g. Grace Hopper: PROT_READ locks in place
      {true, true, HostPinMode::kReadOnly},    // the GPU never writes expert weights
      {false, true, HostPinMode::kReadWrite},  // x86 + discrete GPU, writable mapping
      {false, false, HostPinMode::kPageable},  // x86 + discrete GPU, PROT_READ: cannot be locked
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ChooseHostPinMode(c.read_only_supported, c.writable), c.want)
        << "read-only registration " << (c.read_only_supported ? "supported" : "unsupported") << ", mapping "
        << (c.writable ? "writable" : "read-only");
  }
  EXPECT_STREQ(HostPinModeName(HostPinMode::kPageable), "pageable");
}

// A maps file as the kernel writes it (ascending addresses).
constexpr char kMaps[] =
    "10000-20000 r-xp 00000000 08:01 1234   /usr/bin/tandem-server\n"
    "20000-30000 rw-p 00000000 00:00 0      [heap]\n"
    "30000-40000 rw-p 00000000 00:00 0 \n"
    "40000-50000 rw-s 00000000 00:19 77     /dev/shm/tandem-w0\n"
    "60000-70000 r--s 00000000 00:19 78     /dev/shm/tandem-w1\n"
    "70000-80000 rw-p 00000000 08:01 99     /models/x/model.safetensors\n"
    "80000-90000 r--p 00000000 08:01 99     /models/x/model with spaces.safetensors\n";

absl::StatusOr<bool> InMaps(uintptr_t begin, uintptr_t end, const char* maps = kMaps) {
  return RangeWritableInPlace(maps, reinterpret_cast<const void*>(begin), static_cast<size_t>(end - begin));
}

TEST(RangeWritableInPlaceTest, ReadsTheProtectionOfEveryMappingARangeSpans) {
  struct Case {
    uintptr_t begin, end;
    bool want;
    const char* what;
  };
  const Case cases[] = {
      {0x20000, 0x30000, true, "anonymous private (heap)"},
      {0x21000, 0x22000, true, "inside one mapping"},
      {0x20000, 0x40000, true, "two adjacent anonymous mappings"},
      {0x38000, 0x48000, true, "anonymous then shared writable"},
      {0x40000, 0x50000, true, "shared writable (a worker store mapped read-write)"},
      {0x60000, 0x70000, false, "shared read-only (a worker store mapped read-only)"},
      {0x70000, 0x80000, false, "private file mapping: pinning for write would copy its pages"},
      {0x80000, 0x90000, false, "private read-only file (the mapped safetensors)"},
      {0x10000, 0x30000, false, "text then heap"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<bool> got = InMaps(c.begin, c.end);
    ASSERT_OK(got) << c.what << ": " << got.status();
    EXPECT_EQ(*got, c.want) << c.what;
  }
}

TEST(RangeWritableInPlaceTest, RefusesUnmappedRangesAndUnparsableText) {
  // 0x50000-0x60000 is a hole; 0x90000 on is past every mapping.
  for (auto [begin, end] :
       {std::pair<uintptr_t, uintptr_t>{0x48000, 0x61000}, {0x50000, 0x51000}, {0x88000, 0x98000}, {0x1000, 0x2000}}) {
    absl::StatusOr<bool> got = InMaps(begin, end);
    ASSERT_FALSE(got.ok()) << absl::StrFormat("[%#x, %#x)", begin, end);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
    EXPECT_NE(got.status().message().find("not mapped"), std::string::npos) << got.status();
  }
  EXPECT_EQ(InMaps(0x20000, 0x20000).status().code(), absl::StatusCode::kInvalidArgument);  // empty
  absl::StatusOr<bool> garbage = InMaps(0x20000, 0x21000, "20000-30000 rw-p\n");
  EXPECT_EQ(garbage.status().code(), absl::StatusCode::kDataLoss) << garbage.status();
  EXPECT_NE(garbage.status().message().find("20000-30000 rw-p"), std::string::npos) << garbage.status();
  EXPECT_EQ(InMaps(0x20000, 0x21000, "zz-30000 rw-p 0 00:00 0\n").status().code(), absl::StatusCode::kDataLoss);
}

// An mmap'd region of this process, unmapped when done.
class Mapping {
 public:
  Mapping(size_t bytes, int prot, int flags, int fd = -1) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, prot, flags, fd, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Mapping() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

absl::StatusOr<bool> WritableNow(const void* data, size_t bytes) {
  absl::StatusOr<std::string> map = ReadSelfMemoryMap();
  if (!map.ok()) return map.status();
  return RangeWritableInPlace(*map, data, bytes);
}

TEST(RangeWritableInPlaceTest, SeesThisProcesssOwnMappings) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Mapping anonymous(16 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS);
  ASSERT_NE(anonymous.data(), nullptr);
  absl::StatusOr<bool> rw = WritableNow(anonymous.data(), anonymous.bytes());
  ASSERT_OK(rw);
  EXPECT_TRUE(*rw);
  // Made read-only (as the CUDA pool tests' regions once were): not lockable
  // without read-only registration; half of it read-only is not either.
  ASSERT_EQ(mprotect(static_cast<uint8_t*>(anonymous.data()) + 8 * page, 8 * page, PROT_READ), 0);
  absl::StatusOr<bool> half = WritableNow(anonymous.data(), anonymous.bytes());
  ASSERT_OK(half);
  EXPECT_FALSE(*half);
  absl::StatusOr<bool> first_half = WritableNow(anonymous.data(), 8 * page);
  ASSERT_OK(first_half);
  EXPECT_TRUE(*first_half) << "the writable half is still writable";

  // A private, writable mapping of a file: writable, but not in place.
  char path[] = "/tmp/tandem-pinned-regions-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(4 * page)), 0);
  {
    Mapping file(4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd);
    ASSERT_NE(file.data(), nullptr);
    absl::StatusOr<bool> got = WritableNow(file.data(), file.bytes());
    ASSERT_OK(got);
    EXPECT_FALSE(*got);
    Mapping shared(4 * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd);
    ASSERT_NE(shared.data(), nullptr);
    got = WritableNow(shared.data(), shared.bytes());
    ASSERT_OK(got);
    EXPECT_TRUE(*got);
  }
  close(fd);
}

// The coordinator maps the workers' stores read-only unless asked: a GPU
// without read-only registration then gets writable mappings to lock, and
// every other case keeps the kernel's guarantee that nothing here writes.
TEST(WorkerStoreMappingTest, ReadOnlyByDefaultWritableWhenTheGpuNeedsIt) {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = "tiny", .seed = kSeed});
  ASSERT_OK(model);
  const std::string name = absl::StrCat("/tandem-test-", getpid(), "-pin");
  ThreadPool pool(ThreadPoolOptions{.num_threads = 1, .name = "pin-test"});
  auto store = ExpertStore::Create(*(*model)->weights, ExpertStoreOptions{.region_name = name, .pool = &pool});
  ASSERT_OK(store);
  for (const bool writable : {false, true}) {
    SCOPED_TRACE(writable ? "mapped writable" : "mapped read-only");
    auto sources = WorkerExpertSources::Open((*model)->config, {name}, writable);
    ASSERT_OK(sources);
    const std::vector<PinnedHostRegion> regions = (*sources)->regions();
    ASSERT_EQ(regions.size(), 1u);
    absl::StatusOr<bool> got = WritableNow(regions[0].data, regions[0].bytes);
    ASSERT_OK(got);
    EXPECT_EQ(*got, writable);
    // On a discrete GPU in an x86 host: locked only when mapped writable.
    EXPECT_EQ(ChooseHostPinMode(false, *got), writable ? HostPinMode::kReadWrite : HostPinMode::kPageable);
    EXPECT_EQ(ChooseHostPinMode(true, *got), HostPinMode::kReadOnly);
  }
}

}  // namespace
}  // namespace tandem
