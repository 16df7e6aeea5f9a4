// Expert FFN throughput on the CPU against the machine's own measured limits.
//
// Prints JSON lines: the machine (STREAM triad and read-only GB/s, the peak
// of every instruction the kernels use: AVX2 FMA, AVX-512 FMA, AVX512-BF16
// dot products), how oneDNN handles bf16 here, the FFN at each row count
// under the kernel plan (median us, weight GB/s, GFLOP/s and their ratios to
// the read-only bandwidth and to the peak of the kernel's instruction), and
// every kernel this CPU runs side by side at the --compare_rows counts, with
// the plan those timings make: the data behind the built-in kernel plans.
// Every line is stamped with the CPU, its ISA level and the load
// (bench/json_lines.h). TANDEM_MAX_ISA caps the kernels, as everywhere.
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
#include <cstring>
#include <limits>
#include <map>
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
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/kernels/compute_peak.h"
#include "common/kernels/kernel_plan.h"
#include "common/kernels/linear.h"
#include "common/model/gguf_tensor_source.h"
#include "common/platform/hardware_probe.h"
#include "common/platform/huge_page_arena.h"
#include "common/quant/block_order.h"
#include "common/quant/quantize.h"
#include "common/quant/synthetic_blocks.h"
#include "cpu_worker/expert_ffn.h"
#include "dnnl.hpp"
#include "nlohmann/json.hpp"

ABSL_FLAG(int, threads, 0, "compute threads including the caller; 0 = all available cores");
ABSL_FLAG(int, reps, 5, "timed calls per row count (after one warm-up); the median is reported");
ABSL_FLAG(std::string, rows, "1,2,4,8,16,32,64,128,256,512", "row counts to time, comma-separated");
ABSL_FLAG(std::string, compare_rows, "1,2,4,8,12,16,32,64,128,256,512",
          "row counts at which every kernel this CPU runs is timed");
ABSL_FLAG(std::string, dtype, "bf16",
          "weight dtype: bf16, f16, f32 or a ggml block type (q8_0, q4_0, q4_1, q5_0, q4_K, q5_K, q6_K)");
ABSL_FLAG(int, experts, 2, "distinct experts' weights to rotate through (>= 2 defeats the LLC)");
ABSL_FLAG(int64_t, hidden, 4096, "D, hidden size (Mixtral 8x7B: 4096)");
ABSL_FLAG(int64_t, intermediate, 14336, "I, expert intermediate size (Mixtral 8x7B: 14336)");
ABSL_FLAG(std::string, kernel_plan, "builtin",
          "kernel path per row count for the expert_ffn lines: builtin (for this CPU's ISA) or ROWS:PATH,... "
          "(e.g. 1:stream,16:bf16_dot; paths stream, packed, bf16_dot, onednn, int8_dot)");
ABSL_FLAG(bool, probe, true, "measure bandwidth and compute peaks first");
ABSL_FLAG(std::string, block_order, "ggml",
          "Q4_K/Q6_K blocks: ggml (as GGUF files store them), group_major (the AVX512-VNNI decode GEMV's "
          "order, common/quant/block_order.h) or both, comma-separated: each row count is then timed in each "
          "order in turn (an A/B in one process; repeat a row count in --rows to alternate more)");
ABSL_FLAG(bool, huge_pages, true,
          "weights in 2 MiB-aligned memory advised for transparent huge pages, as the model loads them "
          "(HugePageArena); false: ordinary 4 KiB-page heap memory");

namespace tandem {
namespace {

using Json = nlohmann::json;

// Stored weights [rows, cols], uniform in [-scale, scale], deterministic;
// a quantized dtype gets each row of those values quantized (ggml's blocks).
// From `arena` when given (where the model keeps its weights), else from
// the heap: the pages matter as much as the kernel (docs/BENCHMARKS.md).
class WeightBuffer {
 public:
  WeightBuffer(DType dtype, int64_t rows, int64_t cols, uint64_t seed, float scale, HugePageArena* arena,
               ThreadPool* pool)
      : bytes_(static_cast<size_t>(rows * DTypeRowBytes(dtype, cols))) {
    if (arena != nullptr) data_ = arena->Allocate(bytes_);
    if (data_ == nullptr) {
      heap_.resize((bytes_ + 63) / 64);
      data_ = heap_.data();
    }
    const int64_t row_bytes = DTypeRowBytes(dtype, cols);
    const int64_t rows_per_task = std::max<int64_t>(1, (int64_t{1} << 20) / cols);
    const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
    pool->ParallelFor(tasks, [&](int64_t task, int) {
      uint64_t state = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(task) * 0xD1B54A32D192ED03ull + 1;
      std::vector<float> row(static_cast<size_t>(cols));
      const int64_t end = std::min(rows, (task + 1) * rows_per_task);
      for (int64_t r = task * rows_per_task; r < end; ++r) {
        for (int64_t i = 0; i < cols; ++i) {
          state ^= state << 13;
          state ^= state >> 7;
          state ^= state << 17;
          const float u = static_cast<float>(state >> 40) * (1.0f / 16777216.0f);  // [0, 1)
          row[static_cast<size_t>(i)] = (2.0f * u - 1.0f) * scale;
        }
        uint8_t* out = reinterpret_cast<uint8_t*>(data()) + r * row_bytes;
        if (IsQuantized(dtype)) {
          // Finite values (or, for a type tandem only reads, random blocks)
          // of a valid row length: cannot fail.
          const GgmlType type = GgmlFromDType(dtype);
          const absl::Span<uint8_t> blocks(out, static_cast<size_t>(row_bytes));
          (void)(CanQuantize(type) ? QuantizeRow(type, row, blocks)
                                   : SyntheticBlocks(type, static_cast<uint32_t>(seed * 131 + r), blocks));
        } else {
          for (int64_t i = 0; i < cols; ++i) StoreAsDType(out, dtype, static_cast<size_t>(i), row[i]);
        }
      }
    });
  }
  // A copy of `source`'s bytes, placed as the constructor above places them.
  WeightBuffer(const WeightBuffer& source, HugePageArena* arena) : bytes_(source.bytes_) {
    if (arena != nullptr) data_ = arena->Allocate(bytes_);
    if (data_ == nullptr) {
      heap_.resize((bytes_ + 63) / 64);
      data_ = heap_.data();
    }
    std::memcpy(data_, source.data_, bytes_);
  }
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }
  bool in_heap() const { return !heap_.empty(); }  // the arena was not asked, or could not map it

 private:
  struct alignas(64) Line {
    char bytes[64];
  };
  size_t bytes_;
  void* data_ = nullptr;
  std::vector<Line> heap_;
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

// Does oneDNN 2.x on this CPU have a bf16 matmul? On AVX2-only CPUs it does
// not; on AVX512-BF16 ones it is brgemm ("brg:avx512_core_bf16").
Json ProbeOneDnn(int64_t k) {
  Json line = {{"kind", "onednn"}};
  const dnnl::version_t* version = dnnl::version();
  line["version"] =
      std::to_string(version->major) + "." + std::to_string(version->minor) + "." + std::to_string(version->patch);
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

// The peaks of every instruction the kernels use that this process may run.
absl::StatusOr<Json> MeasurePeaks(ThreadPool* pool, std::map<PeakInstruction, double>* peaks) {
  Json out = Json::object();
  for (PeakInstruction instruction : {PeakInstruction::kAvx2Fma, PeakInstruction::kAvx512Fma, PeakInstruction::kBf16Dot,
                                      PeakInstruction::kVnniDot, PeakInstruction::kAmxBf16}) {
    if (PeakInstructionIsa(instruction) > ActiveIsa()) continue;
    TANDEM_ASSIGN_OR_RETURN(const ComputePeak peak, MeasureComputePeak(instruction, pool));
    (*peaks)[instruction] = peak.gflops;
    out[PeakInstructionName(instruction)] = peak.gflops;
  }
  return out;
}

absl::Status Main() {
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : AvailableCores();
  const int reps = std::max(absl::GetFlag(FLAGS_reps), 1);
  const int64_t hidden = absl::GetFlag(FLAGS_hidden);
  const int64_t intermediate = absl::GetFlag(FLAGS_intermediate);
  const int num_experts = std::max(absl::GetFlag(FLAGS_experts), 1);
  const std::string dtype_flag = absl::GetFlag(FLAGS_dtype);
  TANDEM_ASSIGN_OR_RETURN(const DType dtype, ParseDtypeFlag(dtype_flag));
  const std::vector<int64_t> row_counts = ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_rows));
  const std::vector<int64_t> compare_rows = ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_compare_rows));
  KernelPlan plan = BuiltInKernelPlan();
  if (absl::GetFlag(FLAGS_kernel_plan) != "builtin") {
    auto parsed = KernelPlan::Parse(absl::GetFlag(FLAGS_kernel_plan), "--kernel_plan");
    if (!parsed.ok()) return absl::InvalidArgumentError(absl::StrCat("--kernel_plan: ", parsed.status().message()));
    plan = *parsed;
  }
  LinearOptions options{.plan = &plan};
  SetBenchStamp("kernel_plan", plan.Spec());

  ThreadPool pool(ThreadPoolOptions{.num_threads = threads, .name = "bench"});

  double triad_gb_s = 0, read_gb_s = 0;
  std::map<PeakInstruction, double> peaks;
  if (absl::GetFlag(FLAGS_probe)) {
    auto bandwidth = MeasureMemoryBandwidth(&pool);
    if (!bandwidth.ok()) return bandwidth.status();
    TANDEM_ASSIGN_OR_RETURN(Json peak_json, MeasurePeaks(&pool, &peaks));
    triad_gb_s = bandwidth->triad_gb_s;
    read_gb_s = bandwidth->read_gb_s;
    EmitJsonLine({{"kind", "machine"},
                  {"threads", threads},
                  {"triad_gb_s", bandwidth->triad_gb_s},
                  {"triad_with_write_allocate_gb_s", bandwidth->triad_with_write_allocate_gb_s},
                  {"read_only_gb_s", bandwidth->read_gb_s},
                  {"read_one_stream_gb_s", bandwidth->read_one_stream_gb_s},
                  {"read_four_streams_gb_s", bandwidth->read_four_streams_gb_s},
                  {"triad_array_bytes", bandwidth->array_bytes},
                  {"llc_bytes", bandwidth->llc_bytes},
                  {"peak_gflops", peak_json},
                  {"note",
                   "triad counts 3x4 B/element as STREAM does; ordinary stores also read a[] "
                   "(write-allocate), so DRAM moved 4/3 of that. Peaks: register-only loops of the instruction "
                   "(bf16 dot: 64 flops per vdpbf16ps zmm). Best of reps for all."}});
  }
  EmitJsonLine(ProbeOneDnn(hidden));

  const int64_t matrix = hidden * intermediate;
  const double weight_bytes =
      3.0 * static_cast<double>(matrix / hidden) * static_cast<double>(DTypeRowBytes(dtype, hidden));
  // Hugging Face init and trained Mixtral experts are ~N(0, 0.02^2): uniform
  // of the same spread keeps activations in a realistic range.
  const float scale = 0.02f * std::sqrt(3.0f);
  const std::string block_order = absl::GetFlag(FLAGS_block_order);
  std::vector<BlockOrder> orders;
  for (absl::string_view name : absl::StrSplit(block_order, ',')) {
    if (name != "ggml" && name != "group_major") {
      return absl::InvalidArgumentError(absl::StrCat("--block_order ", name, ": ggml or group_major"));
    }
    orders.push_back(name == "ggml" ? BlockOrder::kGgml : BlockOrder::kGroupMajor);
  }
  const bool group_major = std::find(orders.begin(), orders.end(), BlockOrder::kGroupMajor) != orders.end();
  if (group_major && !HasGroupMajorOrder(GgmlFromDType(dtype))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--block_order group_major: ", dtype_flag, " has no group-major order (q4_K and q6_K do)"));
  }
  HugePageArena arena;
  HugePageArena* weight_arena = absl::GetFlag(FLAGS_huge_pages) ? &arena : nullptr;
  // One set of experts per order: the group-major ones are converted copies.
  std::vector<WeightBuffer> buffers;
  std::vector<std::vector<ExpertFfnWeights>> experts_by_order(orders.size());
  buffers.reserve(3 * static_cast<size_t>(num_experts) * orders.size());
  for (int e = 0; e < num_experts; ++e) {
    const size_t first = buffers.size();
    buffers.emplace_back(dtype, intermediate, hidden, 3 * e + 1, scale, weight_arena, &pool);
    buffers.emplace_back(dtype, intermediate, hidden, 3 * e + 2, scale, weight_arena, &pool);
    buffers.emplace_back(dtype, hidden, intermediate, 3 * e + 3, scale, weight_arena, &pool);
    for (size_t o = 0; o < orders.size(); ++o) {
      size_t at = first;
      if (o > 0) {
        at = buffers.size();
        for (size_t m = 0; m < 3; ++m) buffers.emplace_back(buffers[first + m], weight_arena);
      }
      if (orders[o] == BlockOrder::kGroupMajor) {
        for (size_t m = 0; m < 3; ++m) {
          WeightBuffer& b = buffers[at + m];
          TANDEM_RETURN_IF_ERROR(
              ToGroupMajorOrder(GgmlFromDType(dtype), absl::MakeSpan(static_cast<uint8_t*>(b.data()), b.bytes())));
        }
      }
      ExpertFfnWeights weights;
      weights.w1 = {buffers[at].data(), dtype, intermediate, hidden};
      weights.w3 = {buffers[at + 1].data(), dtype, intermediate, hidden};
      weights.w2 = {buffers[at + 2].data(), dtype, hidden, intermediate};
      weights.w1.order = weights.w2.order = weights.w3.order = orders[o];
      experts_by_order[o].push_back(weights);
    }
  }
  const std::vector<ExpertFfnWeights>& experts = experts_by_order.front();
  int64_t max_rows = 1;
  for (int64_t r : row_counts) max_rows = std::max(max_rows, r);
  for (int64_t r : compare_rows) max_rows = std::max(max_rows, r);
  std::vector<float> x(static_cast<size_t>(max_rows * hidden)), y(static_cast<size_t>(max_rows * hidden));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * static_cast<float>(i));
  // Where the weights ended up, not only what was asked for.
  const bool weights_in_arena =
      std::none_of(buffers.begin(), buffers.end(), [](const WeightBuffer& b) { return b.in_heap(); });
  EmitJsonLine({{"kind", "config"},
                {"dtype", dtype_flag},
                {"hidden", hidden},
                {"intermediate", intermediate},
                {"experts_rotated", num_experts},
                {"huge_pages", weights_in_arena},
                {"block_order", block_order},
                {"weight_bytes_per_expert", weight_bytes},
                {"weight_bytes_total", weight_bytes * num_experts},
                {"threads", threads},
                {"reps", reps},
                {"kernel_plan", plan.Spec()},
                {"kernels", DescribeKernelChoice(dtype, options)}});

  // One line of figures for `kernel` at `rows` from a timing.
  auto figures = [&](const LinearKernel& kernel, int64_t rows, const Timing& t, const std::string& prefix, Json* line) {
    const double seconds = t.median_us * 1e-6;
    const double gb_s = weight_bytes / seconds / 1e9;
    const double gflops = 2.0 * 3.0 * static_cast<double>(rows) * static_cast<double>(matrix) / seconds / 1e9;
    (*line)[prefix + "median_us"] = t.median_us;
    (*line)[prefix + "weight_gb_s"] = gb_s;
    (*line)[prefix + "gflops"] = gflops;
    if (read_gb_s > 0) (*line)[prefix + "read_bandwidth_ratio"] = gb_s / read_gb_s;
    const PeakInstruction instruction = PeakInstructionOf(kernel);
    if (peaks.count(instruction) != 0) (*line)[prefix + "peak_ratio"] = gflops / peaks[instruction];
    (*line)[prefix + "peak_instruction"] = PeakInstructionName(instruction);
  };

  ExpertFfn ffn(&pool, options);
  size_t next_expert = 0;
  for (int64_t rows : row_counts) {
    for (size_t o = 0; o < orders.size(); ++o) {
      auto timing = TimeFfn(ffn, experts_by_order[o], x.data(), rows, y.data(), reps, next_expert);
      if (!timing.ok()) return timing.status();
      const LinearKernel& kernel = ChooseLinearKernel(rows, dtype, options);
      Json line = {{"kind", "expert_ffn"},  {"rows", rows},
                   {"dtype", dtype_flag},   {"block_order", orders[o] == BlockOrder::kGgml ? "ggml" : "group_major"},
                   {"kernel", kernel.name}, {"best_us", timing->best_us}};
      // Medians are the headline; the best call is beside them because the
      // machine may be shared (another tenant's burst only ever slows a call).
      figures(kernel, rows, *timing, "", &line);
      if (triad_gb_s > 0) line["triad_ratio"] = weight_bytes / (timing->median_us * 1e-6) / 1e9 / triad_gb_s;
      EmitJsonLine(line);
    }
  }

  // Every kernel at the same row counts, and the plan they make: at each
  // count the fastest, switching only for a >= 3% gain (as calibration does).
  std::vector<KernelPlanStep> steps;
  for (int64_t rows : compare_rows) {
    Json line = {{"kind", "kernel_compare"}, {"rows", rows}, {"dtype", dtype_flag}};
    double best_us = std::numeric_limits<double>::max();
    std::map<KernelPath, double> path_us;
    const LinearKernel* fastest = nullptr;
    for (const LinearKernel& kernel : AllLinearKernels()) {
      if (kernel.dtype != dtype || kernel.isa > ActiveIsa()) continue;
      // Only the variants of each path at its best ISA level (the one a plan
      // would run and its same-level references: the int8_dot tile beside
      // the fused kernel) and the one f32-activation layers run on it (the
      // AVX-512 stream beside the bf16 stream).
      if (FindLinearKernel(dtype, kernel.path, ActiveIsa())->isa != kernel.isa &&
          FindExactLinearKernel(dtype, kernel.path, ActiveIsa()) != &kernel)
        continue;
      LinearOptions kernel_options{.kernel = &kernel};
      ExpertFfn kernel_ffn(&pool, kernel_options);
      auto timing = TimeFfn(kernel_ffn, experts, x.data(), rows, y.data(), reps, next_expert);
      if (!timing.ok()) return timing.status();
      figures(kernel, rows, *timing, std::string(kernel.name) + "_", &line);
      path_us[kernel.path] = timing->median_us;
      if (timing->median_us < best_us) {
        best_us = timing->median_us;
        fastest = &kernel;
      }
    }
    if (fastest == nullptr) continue;
    line["fastest"] = fastest->name;
    KernelPath winner = fastest->path;
    if (!steps.empty() && best_us > 0.97 * path_us[steps.back().path]) winner = steps.back().path;
    if (steps.empty() || steps.back().path != winner) steps.push_back({steps.empty() ? 1 : rows, winner});
    EmitJsonLine(line);
  }
  if (!steps.empty()) {
    TANDEM_ASSIGN_OR_RETURN(const KernelPlan measured, KernelPlan::Create(steps, "tandem-expert-ffn-bench"));
    EmitJsonLine({{"kind", "measured_plan"},
                  {"plan", measured.Spec()},
                  {"kernels", DescribeKernelChoice(dtype, LinearOptions{.plan = &measured})},
                  {"note",
                   "the fastest kernel at each compared row count, switching only for a >= 3% gain; "
                   "give it to --kernel_plan"}});
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage("Expert FFN throughput on the CPU against the machine's own measured limits.");
  tandem::ParseProgramFlags(argc, argv);
  const absl::Status status = tandem::Main();
  if (!status.ok()) {
    LOG_ERROR("expert_ffn_bench: ", status.ToString());
    return 1;
  }
  return 0;
}
