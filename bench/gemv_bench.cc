// One float or quantized Linear at a few x rows (decode's GEMV) from DRAM: the
// weight read rate of the kernel the plan picks, per shape.
//
// Prints one JSON line per (shape, rows): median and best microseconds of
// --reps calls, the weight GB/s at the median, and (with --probe) the
// read-only bandwidth measured just before, so the kernel's share of the
// machine is on the line. Every line is stamped with the CPU, its ISA level
// and the load (bench/json_lines.h); TANDEM_MAX_ISA caps the kernels.
//
// Weights: --copies matrices of N x K, called in turn, so a call never finds
// its weights in the LLC left warm by the previous one. They sit in 2 MiB
// pages as the engine's loaded weights do (HugePageArena; --huge_pages=false
// for 4 KiB ones). Their rows repeat a pool of 64 random rows (quantized:
// real blocks and scales of the type), set up in seconds (the expert bench
// quantizes every row).
// Compare two builds with bench/ab_builds.sh, e.g.
//   bench/ab_builds.sh OLD NEW 3 out.jsonl --dtype q4_K --shapes 4096x14336
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "bench/dtype_flag.h"
#include "bench/json_lines.h"
#include "common/base/clock.h"
#include "common/base/dtype.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/kernels/linear.h"
#include "common/model/gguf_tensor_source.h"  // GgmlFromDType
#include "common/platform/hardware_probe.h"
#include "common/platform/huge_page_arena.h"
#include "common/quant/quantize.h"
#include "common/quant/synthetic_blocks.h"

ABSL_FLAG(std::string, dtype, "q4_K", "bf16, f16, f32 or a ggml block type: q4_0, q8_0, q4_K, q5_K, q6_K");
ABSL_FLAG(std::string, shapes, "14336x4096,4096x14336",
          "N x K of W, comma-separated (Mixtral's gate/up and down projections by default)");
ABSL_FLAG(std::string, rows, "1", "x row counts to time, comma-separated");
ABSL_FLAG(int, copies, 6, "distinct matrices called in turn (their bytes together should exceed the LLC)");
ABSL_FLAG(int, reps, 40, "timed calls per (shape, rows), after one warm-up; the median is reported");
ABSL_FLAG(int, threads, 0, "compute threads including the caller; 0 = all available cores");
ABSL_FLAG(bool, huge_pages, true, "weights in 2 MiB pages (HugePageArena), as the engine loads them");
ABSL_FLAG(bool, probe, true, "measure the read-only bandwidth before each shape");

namespace tandem {
namespace {

struct Shape {
  int64_t n = 0, k = 0;
};

absl::StatusOr<std::vector<Shape>> ParseShapes(const std::string& text) {
  std::vector<Shape> shapes;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    const std::vector<absl::string_view> nk = absl::StrSplit(part, 'x');
    Shape s;
    if (nk.size() != 2 || !absl::SimpleAtoi(nk[0], &s.n) || !absl::SimpleAtoi(nk[1], &s.k) || s.n < 1 || s.k < 1 ||
        s.n > (int64_t{1} << 20) || s.k > (int64_t{1} << 20))
      return absl::InvalidArgumentError(absl::StrCat("--shapes: '", part, "' is not NxK with 1 <= N, K <= 2^20"));
    shapes.push_back(s);
  }
  if (shapes.empty()) return absl::InvalidArgumentError("--shapes names no shape");
  return shapes;
}

// `copies` matrices of n x k, every row one of 64 quantized random rows,
// in `arena` (2 MiB pages) or, when it is null, in `plain` (4 KiB pages).
absl::StatusOr<std::vector<const uint8_t*>> MakeWeights(DType dtype, Shape s, int copies, HugePageArena* arena,
                                                        std::vector<std::vector<uint8_t>>& plain) {
  const int64_t row_bytes = DTypeRowBytes(dtype, s.k);
  constexpr int kPoolRows = 64;
  std::vector<uint8_t> pool(static_cast<size_t>(kPoolRows * row_bytes));
  std::vector<float> row(static_cast<size_t>(s.k));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int p = 0; p < kPoolRows; ++p) {
    for (float& v : row) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      v = static_cast<float>(state >> 40) * (2.0f / 16777216.0f) - 1.0f;
    }
    uint8_t* out = pool.data() + p * row_bytes;
    if (!IsQuantized(dtype)) {
      for (int64_t i = 0; i < s.k; ++i) StoreAsDType(out, dtype, static_cast<size_t>(i), row[static_cast<size_t>(i)]);
      continue;
    }
    const GgmlType type = GgmlFromDType(dtype);
    const absl::Span<uint8_t> blocks(out, static_cast<size_t>(row_bytes));
    // A type tandem only reads: random blocks (common/quant/synthetic_blocks.h).
    TANDEM_RETURN_IF_ERROR(CanQuantize(type) ? QuantizeRow(type, row, blocks)
                                             : SyntheticBlocks(type, static_cast<uint32_t>(p), blocks));
  }
  const auto bytes = static_cast<size_t>(s.n * row_bytes);
  std::vector<const uint8_t*> weights;
  for (int c = 0; c < copies; ++c) {
    uint8_t* w = arena != nullptr ? arena->Allocate(bytes) : plain.emplace_back(bytes).data();
    if (w == nullptr)
      return absl::ResourceExhaustedError(absl::StrCat("cannot map ", bytes, " bytes for copy ", c, " of W"));
    for (int64_t j = 0; j < s.n; ++j)
      std::memcpy(w + j * row_bytes, pool.data() + ((j + c) % kPoolRows) * row_bytes, static_cast<size_t>(row_bytes));
    weights.push_back(w);
  }
  return weights;
}

absl::Status RunShape(DType dtype, Shape s, const std::vector<int64_t>& row_counts, ThreadPool& pool) {
  const int copies = std::max(absl::GetFlag(FLAGS_copies), 1);
  HugePageArena arena;
  std::vector<std::vector<uint8_t>> plain;
  TANDEM_ASSIGN_OR_RETURN(const std::vector<const uint8_t*> weights,
                          MakeWeights(dtype, s, copies, absl::GetFlag(FLAGS_huge_pages) ? &arena : nullptr, plain));
  double read_gb_s = 0;
  if (absl::GetFlag(FLAGS_probe)) {
    TANDEM_ASSIGN_OR_RETURN(const MemoryBandwidth bw, MeasureMemoryBandwidth(&pool, {.reps = 3}));
    read_gb_s = bw.read_gb_s;
  }
  const int64_t bytes = s.n * DTypeRowBytes(dtype, s.k);
  size_t next = 0;
  for (const int64_t rows : row_counts) {
    std::vector<float> x(static_cast<size_t>(rows * s.k)), y(static_cast<size_t>(rows * s.n));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int64_t>(i * 7919 % 2001) - 1000) / 1000;
    std::vector<double> us;
    for (int rep = -1; rep < std::max(absl::GetFlag(FLAGS_reps), 1); ++rep) {
      const LinearWeight w{weights[next++ % weights.size()], dtype, s.n, s.k};
      const auto start = std::chrono::steady_clock::now();
      TANDEM_RETURN_IF_ERROR(Linear(x.data(), rows, w, nullptr, y.data(), &pool));
      if (rep >= 0) us.push_back(MicrosSince(start));
    }
    const double median = Median(us), gb_s = static_cast<double>(bytes) / median / 1e3;
    nlohmann::json line = {{"bench", "gemv"},
                           {"dtype", std::string(DTypeName(dtype))},
                           {"n", s.n},
                           {"k", s.k},
                           {"rows", rows},
                           {"kernel", ChooseLinearKernel(rows, dtype, {}).name},
                           {"threads", pool.num_threads()},
                           {"copies", copies},
                           {"huge_pages", absl::GetFlag(FLAGS_huge_pages)},
                           {"weight_bytes", bytes},
                           {"median_us", median},
                           {"best_us", *std::min_element(us.begin(), us.end())},
                           {"weight_gb_s", gb_s}};
    if (read_gb_s > 0) {
      line["read_only_gb_s"] = read_gb_s;
      line["read_bandwidth_ratio"] = gb_s / read_gb_s;
    }
    EmitJsonLine(line);
  }
  return absl::OkStatus();
}

absl::Status Main() {
  TANDEM_ASSIGN_OR_RETURN(const DType dtype, ParseDtypeFlag(absl::GetFlag(FLAGS_dtype)));
  TANDEM_ASSIGN_OR_RETURN(const std::vector<Shape> shapes, ParseShapes(absl::GetFlag(FLAGS_shapes)));
  const std::vector<int64_t> rows = ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_rows));
  if (rows.empty()) return absl::InvalidArgumentError("--rows names no row count");
  for (const Shape& s : shapes)
    if (s.k % DTypeBlockSize(dtype) != 0)
      return absl::InvalidArgumentError(absl::StrCat("--shapes: K = ", s.k, " is not whole ",
                                                     DTypeBlockSize(dtype), "-value blocks of ",
                                                     absl::GetFlag(FLAGS_dtype)));
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : AvailableCores();
  ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "gemv-bench"});
  for (const Shape& s : shapes) TANDEM_RETURN_IF_ERROR(RunShape(dtype, s, rows, pool));
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = tandem::Main();
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-gemv-bench: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
