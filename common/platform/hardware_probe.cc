#include "common/platform/hardware_probe.h"

#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/clock.h"

namespace tandem {
namespace {

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

AlignedFloats AllocateFloats(int64_t count) {
  const size_t bytes = (static_cast<size_t>(count) * sizeof(float) + 4095) / 4096 * 4096;
  return AlignedFloats(static_cast<float*>(std::aligned_alloc(4096, bytes)));
}

// Runs fn(begin, end) over [0, count) in chunks of `chunk` on the pool.
template <typename Fn>
void ParallelChunks(ThreadPool* pool, int64_t count, int64_t chunk, const Fn& fn) {
  const int64_t tasks = (count + chunk - 1) / chunk;
  auto task_fn = [&](int64_t task, int) { fn(task * chunk, std::min(count, (task + 1) * chunk)); };
  if (pool == nullptr) {
    for (int64_t t = 0; t < tasks; ++t) task_fn(t, 0);
  } else {
    pool->ParallelFor(tasks, task_fn);
  }
}

}  // namespace

int64_t AvailableMemoryBytes() {
  // Line by line: some /proc/meminfo lines (HugePages_Total) have no unit,
  // and a token stream would misread every key after them.
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    // absl::string_view: Debian's abseil has its own, not std's.
    constexpr absl::string_view kKey = "MemAvailable:";
    if (!absl::StartsWith(line, kKey)) continue;
    absl::string_view value = absl::StripAsciiWhitespace(absl::string_view(line).substr(kKey.size()));
    if (absl::ConsumeSuffix(&value, "kB")) value = absl::StripTrailingAsciiWhitespace(value);
    int64_t kib = 0;
    if (absl::SimpleAtoi(value, &kib) && kib >= 0) return kib * 1024;
  }
  // No MemAvailable (kernels before 3.14, some containers): free pages only,
  // which leaves out the page cache the kernel could drop, so it errs low.
  const long free_pages = sysconf(_SC_AVPHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (free_pages > 0 && page_size > 0) return static_cast<int64_t>(free_pages) * page_size;
  return -1;
}

int64_t LastLevelCacheBytes() {
  // sysfs says what this CPU's L3 slice is; glibc's sysconf on AMD may report
  // the whole package's L3 (256 MB on the test VM vs the 32 MB lscpu shows).
  for (int index = 3; index >= 0; --index) {
    std::ifstream size_file(absl::StrCat("/sys/devices/system/cpu/cpu0/cache/index", index, "/size"));
    std::string text;
    if (!(size_file >> text) || text.empty()) continue;
    int64_t scale = 1;
    if (text.back() == 'K') scale = 1 << 10;
    if (text.back() == 'M') scale = 1 << 20;
    if (scale != 1) text.pop_back();
    int64_t value = 0;
    if (absl::SimpleAtoi(text, &value) && value > 0) return value * scale;
  }
  const long from_sysconf = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return from_sysconf > 0 ? from_sysconf : 0;
}

absl::StatusOr<MemoryBandwidth> MeasureMemoryBandwidth(ThreadPool* pool, const MemoryBandwidthOptions& options) {
  const int64_t llc = LastLevelCacheBytes();
  int64_t array_bytes = options.array_bytes;
  if (array_bytes <= 0) array_bytes = std::max<int64_t>(4 * llc, int64_t{256} << 20);
  const int64_t n = array_bytes / static_cast<int64_t>(sizeof(float)) / 8 * 8;
  if (n < 8) return absl::InvalidArgumentError(absl::StrCat("triad arrays of ", array_bytes, " bytes"));
  AlignedFloats a = AllocateFloats(n), b = AllocateFloats(n), c = AllocateFloats(n);
  if (!a || !b || !c)
    return absl::ResourceExhaustedError(absl::StrCat("no memory for 3 triad arrays of ", array_bytes, " bytes"));

  // 1 MB chunks: small enough for the task counter to balance the threads,
  // large enough that its cost is invisible. Initialising with the same split
  // touches the pages from the threads that will stream them.
  constexpr int64_t kChunk = (1 << 20) / sizeof(float);
  ParallelChunks(pool, n, kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      a[i] = 0.0f;
      b[i] = 1.0f;
      c[i] = 2.0f;
    }
  });

  float* pa = a.get();
  const float* pb = b.get();
  const float* pc = c.get();
  const __m256 scalar = _mm256_set1_ps(3.0f);
  double best_s = 1e30;
  const int reps = std::max(options.reps, 1);
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    ParallelChunks(pool, n, kChunk, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; i += 8)
        _mm256_store_ps(pa + i, _mm256_fmadd_ps(scalar, _mm256_load_ps(pc + i), _mm256_load_ps(pb + i)));
    });
    best_s = std::min(best_s, SecondsSince(start));
  }
  if (pa[n - 1] != 7.0f) return absl::InternalError("triad produced a wrong result");

  // Two read patterns, alternating rep by rep, each with four accumulators
  // to hide the add latency (partial sums land in `sums` so the loads
  // cannot be optimised away): each thread's chunk front to back, and the
  // chunk as four quarters read side by side. One stream per core left a
  // shared Zen 4 host's DRAM ~20% idle (21-38 GB/s against 26-47 for four
  // streams, alternating in one run), and the engines' decode read above
  // that figure; four streams per core is what the faster of them sees.
  std::vector<float> sums(static_cast<size_t>((n + kChunk - 1) / kChunk));
  double best_one_stream_s = 1e30, best_four_streams_s = 1e30;
  for (int rep = 0; rep < 2 * reps; ++rep) {
    const bool four = rep % 2 == 1;
    const auto start = std::chrono::steady_clock::now();
    ParallelChunks(pool, n, kChunk, [&](int64_t begin, int64_t end) {
      __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
      if (four) {
        const int64_t q = (end - begin) / 4 / 8 * 8;
        for (int64_t i = begin; i + 8 <= begin + q; i += 8) {
          s0 = _mm256_add_ps(s0, _mm256_load_ps(pb + i));
          s1 = _mm256_add_ps(s1, _mm256_load_ps(pb + i + q));
          s2 = _mm256_add_ps(s2, _mm256_load_ps(pb + i + 2 * q));
          s3 = _mm256_add_ps(s3, _mm256_load_ps(pb + i + 3 * q));
        }
      } else {
        for (int64_t i = begin; i + 32 <= end; i += 32) {
          s0 = _mm256_add_ps(s0, _mm256_load_ps(pb + i));
          s1 = _mm256_add_ps(s1, _mm256_load_ps(pb + i + 8));
          s2 = _mm256_add_ps(s2, _mm256_load_ps(pb + i + 16));
          s3 = _mm256_add_ps(s3, _mm256_load_ps(pb + i + 24));
        }
      }
      const __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, s);
      sums[begin / kChunk] = lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
    });
    double& best = four ? best_four_streams_s : best_one_stream_s;
    best = std::min(best, SecondsSince(start));
  }
  if (!(sums[0] > 0)) return absl::InternalError("read stream produced a wrong result");

  MemoryBandwidth result;
  result.triad_gb_s = 3.0 * sizeof(float) * static_cast<double>(n) / best_s / 1e9;
  result.triad_with_write_allocate_gb_s = 4.0 * sizeof(float) * static_cast<double>(n) / best_s / 1e9;
  result.read_one_stream_gb_s = sizeof(float) * static_cast<double>(n) / best_one_stream_s / 1e9;
  result.read_four_streams_gb_s = sizeof(float) * static_cast<double>(n) / best_four_streams_s / 1e9;
  result.read_gb_s = std::max(result.read_one_stream_gb_s, result.read_four_streams_gb_s);
  result.threads = pool == nullptr ? 1 : pool->num_threads();
  result.array_bytes = n * static_cast<int64_t>(sizeof(float));
  result.llc_bytes = llc;
  result.reps = reps;
  return result;
}

}  // namespace tandem
