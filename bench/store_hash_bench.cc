// tandem-store-hash-bench: what the expert content hash costs next to the
// copy it rides on (issue 15, item 2). A worker fills its expert store by
// copying row after row into fresh shared memory (first touch: page faults
// and zeroing included) and now hashes each row right after it lands
// (XXH3-64, common/model/expert_content.h). This runs that loop over
// --mb MiB of rows of --row_bytes, on --threads threads, three ways:
//   copy        memcpy per row into a fresh mapping (the store before);
//   copy+hash   the same, each row hashed after its copy (the store now);
//   hash        the hash alone over rows already in memory;
// best of --repeats, one JSON line each, plus the overhead of copy+hash over
// copy in percent. The copies run twice: into fresh pages (as the store
// does: first touch) and into pages touched beforehand (a copy at memory
// speed, the case where the hash weighs most).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/json_lines.h"
#include "common/base/flags_usage.h"
#include "common/base/thread_pool.h"
#include "common/model/expert_content.h"

ABSL_FLAG(int64_t, mb, 1024, "MiB of expert rows to copy");
ABSL_FLAG(int64_t, row_bytes, 8192, "bytes per row (Mixtral bf16 w1/w3 row: 4096 x 2 = 8192)");
ABSL_FLAG(int32_t, threads, 1, "copying threads (a worker uses its node's cores)");
ABSL_FLAG(int32_t, repeats, 3, "runs of each; the best is reported");

namespace tandem {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One pass: every row of `src` into a fresh shared mapping (hash: also
// hashed there), or only hashed in place (copy: false). Returns seconds.
double Pass(const std::vector<uint8_t>& src, int64_t row_bytes, ThreadPool& pool, bool copy, bool hash, bool warm,
            uint64_t* checksum) {
  const int64_t rows = static_cast<int64_t>(src.size()) / row_bytes;
  void* mapping = nullptr;
  if (copy) {
    mapping = mmap(nullptr, src.size(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) return -1;
    if (warm) std::memset(mapping, 1, src.size());  // every page faulted in before the clock starts
  }
  auto* dst = static_cast<uint8_t*>(mapping);
  const int64_t rows_per_task = std::max<int64_t>(1, (int64_t{1} << 20) / row_bytes);  // the store's 1 MiB tasks
  const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
  std::vector<uint64_t> sums(static_cast<size_t>(tasks), 0);
  const auto start = std::chrono::steady_clock::now();
  pool.ParallelFor(tasks, [&](int64_t t, int) {
    uint64_t sum = 0;
    for (int64_t r = t * rows_per_task; r < std::min(rows, (t + 1) * rows_per_task); ++r) {
      const uint8_t* row = src.data() + r * row_bytes;
      if (copy) {
        std::memcpy(dst + r * row_bytes, row, static_cast<size_t>(row_bytes));
        row = dst + r * row_bytes;
      }
      if (hash)
        sum += HashExpertRow(row, static_cast<size_t>(row_bytes), ExpertRowSeed(0, 0, WeightRole::kExpertW1, r, 0));
    }
    sums[static_cast<size_t>(t)] = sum;
  });
  const double seconds = Seconds(start);
  for (uint64_t s : sums) *checksum += s;
  if (mapping != nullptr) munmap(mapping, src.size());
  return seconds;
}

int Run() {
  const int64_t row_bytes = std::max<int64_t>(64, absl::GetFlag(FLAGS_row_bytes));
  const int64_t bytes = std::max<int64_t>(1, absl::GetFlag(FLAGS_mb)) << 20;
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::vector<uint8_t> src(static_cast<size_t>(bytes / row_bytes * row_bytes));
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= src.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(src.data() + i, &v, 8);
  }
  ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "hash-bench"});
  struct Way {
    const char* name;
    bool copy, hash, warm;
  };
  std::map<std::string, double> best_of;
  uint64_t checksum = 0;
  for (const Way& way :
       {Way{"copy", true, false, false}, Way{"copy+hash", true, true, false}, Way{"copy-warm", true, false, true},
        Way{"copy+hash-warm", true, true, true}, Way{"hash", false, true, false}}) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      best = std::min(best, Pass(src, row_bytes, pool, way.copy, way.hash, way.warm, &checksum));
    }
    best_of[way.name] = best;
    EmitJsonLine({{"bench", "store_hash"},
                  {"way", way.name},
                  {"bytes", src.size()},
                  {"row_bytes", row_bytes},
                  {"threads", threads},
                  {"seconds", best},
                  {"gb_per_s", static_cast<double>(src.size()) / 1e9 / best}});
  }
  auto overhead = [&](const char* with, const char* without) {
    return 100.0 * (best_of[with] - best_of[without]) / best_of[without];
  };
  EmitJsonLine({{"bench", "store_hash"},
                {"way", "overhead"},
                {"fresh_pages_percent", overhead("copy+hash", "copy")},
                {"warm_pages_percent", overhead("copy+hash-warm", "copy-warm")},
                {"checksum", checksum}});
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage("The expert content hash's speed against a copy of the same bytes (docs/BENCHMARKS.md).");
  tandem::ParseProgramFlags(argc, argv);
  return tandem::Run();
}
