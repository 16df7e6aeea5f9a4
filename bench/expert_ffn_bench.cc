// Expert FFN throughput on the CPU against the machine's own measured limits.
//
// Prints JSON lines: the machine (STREAM triad GB/s, f32 FMA peak GFLOP/s), how
// oneDNN handles bf16 here, the FFN at each row count (median us, weight GB/s,
// GFLOP/s and their ratios to the machine), and every Linear path side by side
// (stream, packed, oneDNN): the data behind LinearOptions::prefill_min_rows
// and prefill_kernel.
//
// Legend: R rows, D hidden size, I intermediate size, E distinct experts.
// Weights: E experts x {W1, W3 [I, D], W2 [D, I]}; at Mixtral width one expert
// is 3 x 4096 x 14336 x 2 B = 352 MB in bf16. Consecutive calls rotate
// through the E experts, so a call never finds its weights in the LLC left
// warm by the previous one (the LLC is 32 MB; one expert alone already
// overflows it, rotation also defeats a larger one).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/base/flags_usage.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "common/base/clock.h"
#include "common/base/dtype.h"
#include "common/platform/hardware_probe.h"
#include "common/kernels/linear.h"
#include "common/base/log.h"
#include "common/base/thread_pool.h"
#include "cpu_worker/expert_ffn.h"
#include "dnnl.hpp"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, threads, 0, "compute threads including the caller; 0 = all available cores");
ABSL_FLAG(int, reps, 5, "timed calls per row count (after one warm-up); the median is reported");
ABSL_FLAG(std::string, rows, "1,2,4,8,16,32,64,128,256,512", "row counts to time, comma-separated");
ABSL_FLAG(std::string, compare_rows, "1,2,4,8,10,12,16,32,512",
          "row counts at which every Linear path (stream, packed, oneDNN) is timed");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: bf16, f16 or f32");
ABSL_FLAG(int, experts, 2, "distinct experts' weights to rotate through (>= 2 defeats the LLC)");
ABSL_FLAG(int64_t, hidden, 4096, "D, hidden size (Mixtral 8x7B: 4096)");
ABSL_FLAG(int64_t, intermediate, 14336, "I, expert intermediate size (Mixtral 8x7B: 14336)");
ABSL_FLAG(int64_t, prefill_min_rows, tandem::LinearOptions{}.prefill_min_rows,
          "rows from which Linear uses its prefill kernel (LinearOptions::prefill_min_rows)");
ABSL_FLAG(std::string, prefill_kernel, "default", "prefill kernel: default, packed or onednn");
ABSL_FLAG(bool, probe, true, "measure triad bandwidth and FMA peak first");

namespace tandem {
namespace {

using Json = nlohmann::json;

// Stored weights of `count` elements, uniform in [-scale, scale], deterministic.
class WeightBuffer {
 public:
  WeightBuffer(DType dtype, int64_t count, uint64_t seed, float scale, ThreadPool* pool)
      : bytes_(static_cast<size_t>(count) * DTypeSize(dtype)) {
    data_.resize((bytes_ + 63) / 64);
    constexpr int64_t kChunk = 1 << 20;
    const int64_t tasks = (count + kChunk - 1) / kChunk;
    pool->ParallelFor(tasks, [&](int64_t task, int) {
      uint64_t state = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(task) * 0xD1B54A32D192ED03ull + 1;
      const int64_t end = std::min(count, (task + 1) * kChunk);
      for (int64_t i = task * kChunk; i < end; ++i) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        const float v = (2.0f * u - 1.0f) * scale;
        StoreAsDType(data(), dtype, static_cast<size_t>(i), v);
      }
    });
  }
  void* data() { return data_.data(); }
  size_t bytes() const { return bytes_; }

 private:
  struct alignas(64) Line {
    char bytes[64];
  };
  size_t bytes_;
  std::vector<Line> data_;
};

struct Timing {
  double median_us = 0;
  double best_us = 0;
};

// Times `reps` FFN calls after one warm-up, each call on the next expert.
absl::StatusOr<Timing> TimeFfn(ExpertFfn& ffn, const std::vector<ExpertFfnWeights>& experts, const float* x,
                               int64_t rows, float* y, int reps, size_t& next_expert) {
  std::vector<double> us;
  for (int rep = -1; rep < reps; ++rep) {
    const ExpertFfnWeights& weights = experts[next_expert++ % experts.size()];
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = ffn.Run(weights, x, rows, y);
    const double elapsed = MicrosSince(start);
    if (!status.ok()) return status;
    if (!std::isfinite(y[0])) return absl::InternalError("expert FFN produced a non-finite output");
    if (rep >= 0) us.push_back(elapsed);
  }
  return Timing{Median(us), *std::min_element(us.begin(), us.end())};
}

// Does oneDNN 2.x on this CPU have a bf16 matmul (the prefill path would use
// it instead of widening tiles to f32)? On AVX2-only CPUs it does not.
Json ProbeOneDnn(int64_t k) {
  Json line = {{"kind", "onednn"}};
  const dnnl::version_t* version = dnnl::version();
  line["version"] = std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
                    std::to_string(version->patch);
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  auto try_matmul = [&](dt src, dt weights) -> std::string {
    try {
      dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      dnnl::matmul::desc desc(dnnl::memory::desc({512, k}, src, tag::ab),
                              dnnl::memory::desc({k, 256}, weights, tag::ba),
                              dnnl::memory::desc({512, 256}, dt::f32, tag::ab));
      dnnl::matmul::primitive_desc pd(desc, engine);
      return pd.impl_info_str();
    } catch (const dnnl::error& e) {
      return std::string("unsupported: ") + e.what();
    }
  };
  line["f32_matmul_impl"] = try_matmul(dt::f32, dt::f32);
  line["bf16_matmul_impl"] = try_matmul(dt::bf16, dt::bf16);
  line["f32_src_bf16_weights_impl"] = try_matmul(dt::f32, dt::bf16);
  return line;
}

absl::Status Main() {
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : AvailableCores();
  const int reps = std::max(absl::GetFlag(FLAGS_reps), 1);
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  const int64_t intermediate = absl::GetFlag(FLAGS_intermediate);
  const int num_experts = std::max(absl::GetFlag(FLAGS_experts), 1);
  const std::string dtype_flag = absl::GetFlag(FLAGS_dtype);
  DType dtype;
  if (dtype_flag == "bf16") {
    dtype = DType::kBF16;
  } else if (dtype_flag == "f16") {
    dtype = DType::kF16;
  } else if (dtype_flag == "f32") {
    dtype = DType::kF32;
  } else {
    return absl::InvalidArgumentError("--dtype must be bf16, f16 or f32");
  }
  const std::vector<int64_t> row_counts = ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_rows));
  const std::vector<int64_t> compare_rows = ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_compare_rows));
  LinearOptions options;
  options.prefill_min_rows = absl::GetFlag(FLAGS_prefill_min_rows);
  const std::string prefill_flag = absl::GetFlag(FLAGS_prefill_kernel);
  if (prefill_flag == "packed") {
    options.prefill_kernel = PrefillKernel::kAvx2Packed;
  } else if (prefill_flag == "onednn") {
    options.prefill_kernel = PrefillKernel::kOneDnn;
  } else if (prefill_flag != "default") {
    return absl::InvalidArgumentError("--prefill_kernel must be default, packed or onednn");
  }

  ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "bench"});

  double triad_gb_s = 0, read_gb_s = 0, fma_gflops = 0;
  if (absl::GetFlag(FLAGS_probe)) {
    auto bandwidth = MeasureMemoryBandwidth(&pool);
    if (!bandwidth.ok()) return bandwidth.status();
    auto peak = MeasureF32FmaPeak(&pool);
    if (!peak.ok()) return peak.status();
    triad_gb_s = bandwidth->triad_gb_s;
    read_gb_s = bandwidth->read_gb_s;
    fma_gflops = peak->gflops;
    EmitJsonLine({{"kind", "machine"},
          {"threads", threads},
          {"triad_gb_s", bandwidth->triad_gb_s},
          {"triad_with_write_allocate_gb_s", bandwidth->triad_with_write_allocate_gb_s},
          {"read_only_gb_s", bandwidth->read_gb_s},
          {"triad_array_bytes", bandwidth->array_bytes},
          {"llc_bytes", bandwidth->llc_bytes},
          {"f32_fma_peak_gflops", peak->gflops},
          {"note",
           "triad counts 3x4 B/element as STREAM does; ordinary stores also read a[] "
           "(write-allocate), so DRAM moved 4/3 of that. Best of reps for both."}});
  }
  EmitJsonLine(ProbeOneDnn(hidden));

  const int64_t matrix = hidden * intermediate;
  const double weight_bytes = 3.0 * static_cast<double>(matrix) * static_cast<double>(DTypeSize(dtype));
  // Hugging Face init and trained Mixtral experts are ~N(0, 0.02^2): uniform
  // of the same spread keeps activations in a realistic range.
  const float scale = 0.02f * std::sqrt(3.0f);
  std::vector<WeightBuffer> buffers;
  std::vector<ExpertFfnWeights> experts;
  buffers.reserve(3 * static_cast<size_t>(num_experts));
  for (int e = 0; e < num_experts; ++e) {
    for (int m = 0; m < 3; ++m) buffers.emplace_back(dtype, matrix, 3 * e + m + 1, scale, &pool);
    ExpertFfnWeights weights;
    weights.w1 = {buffers[3 * e].data(), dtype, intermediate, hidden};
    weights.w3 = {buffers[3 * e + 1].data(), dtype, intermediate, hidden};
    weights.w2 = {buffers[3 * e + 2].data(), dtype, hidden, intermediate};
    experts.push_back(weights);
  }
  int64_t max_rows = 1;
  for (int64_t r : row_counts) max_rows = std::max(max_rows, r);
  for (int64_t r : compare_rows) max_rows = std::max(max_rows, r);
  std::vector<float> x(static_cast<size_t>(max_rows * hidden)), y(static_cast<size_t>(max_rows * hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  EmitJsonLine({{"kind", "config"},
        {"dtype", dtype_flag},
        {"hidden", hidden},
        {"intermediate", intermediate},
        {"experts_rotated", num_experts},
        {"weight_bytes_per_expert", weight_bytes},
        {"weight_bytes_total", weight_bytes * num_experts},
        {"threads", threads},
        {"reps", reps},
        {"prefill_min_rows", options.prefill_min_rows}});

  ExpertFfn ffn(&pool, options);
  size_t next_expert = 0;
  for (int64_t rows : row_counts) {
    auto timing = TimeFfn(ffn, experts, x.data(), rows, y.data(), reps, next_expert);
    if (!timing.ok()) return timing.status();
    const double seconds = timing->median_us * 1e-6;
    const double gb_s = weight_bytes / seconds / 1e9;
    const double gflops = 2.0 * 3.0 * static_cast<double>(rows) * static_cast<double>(matrix) / seconds / 1e9;
    Json line = {{"kind", "expert_ffn"},
                 {"rows", rows},
                 {"dtype", dtype_flag},
                 {"path", LinearPathName(ChooseLinearPath(rows, options))},
                 {"median_us", timing->median_us},
                 {"best_us", timing->best_us},
                 {"weight_gb_s", gb_s},
                 {"gflops", gflops}};
    // Medians are the headline; the best call is beside them because the
    // machine may be shared (another tenant's burst only ever slows a call).
    const double best_gb_s = weight_bytes / (timing->best_us * 1e-6) / 1e9;
    const double best_gflops = gflops * timing->median_us / timing->best_us;
    if (triad_gb_s > 0) {
      line["bandwidth_ratio"] = gb_s / triad_gb_s;  // the target's yardstick
      line["best_bandwidth_ratio"] = best_gb_s / triad_gb_s;
    }
    if (read_gb_s > 0) line["read_bandwidth_ratio"] = gb_s / read_gb_s;
    if (fma_gflops > 0) {
      line["peak_ratio"] = gflops / fma_gflops;
      line["best_peak_ratio"] = best_gflops / fma_gflops;
    }
    EmitJsonLine(line);
  }

  // Every path at the same row counts. Small counts: where the stream kernel
  // hands over to the prefill kernel (the data behind prefill_min_rows).
  // Large counts: the packed AVX2 kernel against oneDNN.
  auto time_path = [&](LinearPath path, int64_t rows) -> absl::StatusOr<Timing> {
    LinearOptions path_options = options;
    path_options.prefill_min_rows = path == LinearPath::kAvx2Stream ? std::numeric_limits<int64_t>::max() : 1;
    path_options.prefill_kernel =
        path == LinearPath::kOneDnn ? PrefillKernel::kOneDnn : PrefillKernel::kAvx2Packed;
    ExpertFfn path_ffn(&pool, path_options);
    return TimeFfn(path_ffn, experts, x.data(), rows, y.data(), reps, next_expert);
  };
  const LinearPath prefill_path = ChooseLinearPath(std::numeric_limits<int64_t>::max(), options);
  int64_t crossover = 0;
  for (int64_t rows : compare_rows) {
    Json line = {{"kind", "path_compare"}, {"rows", rows}};
    double best_us = std::numeric_limits<double>::max();
    double stream_us = 0, prefill_us = 0;
    for (LinearPath path : {LinearPath::kAvx2Stream, LinearPath::kAvx2Packed, LinearPath::kOneDnn}) {
      auto timing = time_path(path, rows);
      if (!timing.ok()) return timing.status();
      const std::string name(LinearPathName(path));
      line[name + "_median_us"] = timing->median_us;
      line[name + "_weight_gb_s"] = weight_bytes / (timing->median_us * 1e-6) / 1e9;
      line[name + "_gflops"] = 2.0 * 3.0 * static_cast<double>(rows) * static_cast<double>(matrix) /
                               (timing->median_us * 1e-6) / 1e9;
      if (timing->median_us < best_us) {
        best_us = timing->median_us;
        line["fastest"] = name;
      }
      if (path == LinearPath::kAvx2Stream) stream_us = timing->median_us;
      if (path == prefill_path) prefill_us = timing->median_us;
    }
    // The first compared row count from which the prefill kernel stays ahead.
    if (prefill_us < stream_us && crossover == 0) crossover = rows;
    if (prefill_us >= stream_us) crossover = 0;
    EmitJsonLine(line);
  }
  if (!compare_rows.empty())
    EmitJsonLine({{"kind", "threshold"},
          {"prefill_path", LinearPathName(prefill_path)},
          {"prefill_min_rows", options.prefill_min_rows},
          {"measured_crossover_rows", crossover},
          {"note",
           "crossover = first compared row count from which the prefill path stays faster than "
           "the stream kernel (0: never)"}});
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage("Expert FFN throughput on the CPU against the machine's own measured limits.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = tandem::Main();
  if (!status.ok()) {
    LOG_ERROR("expert_ffn_bench: ", status.ToString());
    return 1;
  }
  return 0;
}
