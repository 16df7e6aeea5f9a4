// tandem-gpu-bench: Fiddler's Appendix A microbenchmarks (ICLR 2025, Fig. 7)
// on the current machine, for one model shape, plus the PCIe limits and the
// overlap of migrations with compute that the CUDA expert pool relies on.
//
//   weight_copy      one expert's w1, w3, w2 host→GPU ("W copy"): raw
//                    cudaMemcpyAsync from cudaMallocHost memory, from a
//                    cudaHostRegister'd region (the pool's way), from
//                    pageable memory; and through CudaExpertPool::Migrate
//                    (its copy threads and streams) from registered and
//                    from pageable sources.
//   activation_copy  R rows × D f32 host→GPU and GPU→host ("A copy"), from
//                    pinned and from pageable host memory.
//   pcie             peak: a large pinned copy H2D and D2H on one stream,
//                    split over two streams (both copy engines), and both
//                    directions at once.
//   gpu_expert       CudaExpertPool::RunExperts ("GPU N"): one resident
//                    expert at R rows; all experts of a layer with the rows
//                    of N tokens spread top-k over them, grouped GEMMs and
//                    per-expert GEMMs side by side.
//   overlap          migrations queued on the pool's copy streams while
//                    RunExperts computes resident experts on its compute
//                    stream: achieved migration GB/s against the measured
//                    H2D peak, and the fraction of copy time hidden behind
//                    compute.
//   cpu_expert       cpu_worker's ExpertFfn on this host's threads ("CPU N").
//   summary          per row count: CPU vs resident GPU vs GPU with a weight
//                    copy first (Fiddler §3.3's choice), from the above.
//
// Every record is one JSON line carrying "bench", the device, the flags and
// the command line. Times are medians over --repeats after --warmup calls
// (mean, stddev, min beside them; Fiddler reports mean and stddev over the
// 32 layers). Weights are random, of the preset's shape: ONE layer's experts
// in one page-aligned host region (like the CPU worker's store), never the
// whole model.
//
//   tandem-gpu-bench --preset mixtral-8x7b --out gpu.jsonl
//   tandem-gpu-bench --benches pcie,weight_copy --repeats 50
//
// Without CUDA in the build, or without a usable device, it says so on
// stderr ("tandem-gpu-bench: no CUDA device: ...") and exits with status 2:
// a benchmark that measured nothing must not look like success.
//
// Legend: D hidden size, I expert intermediate size, E experts per layer,
// K experts per token, N tokens, R rows of one expert.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "common/base/clock.h"
#include "common/base/dtype.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/model_config.h"
#include "common/model/synthetic_model.h"
#include "cpu_worker/expert_ffn.h"
#include "gpu_worker/cuda/cuda_device.h"
#include "nlohmann/json.hpp"

#if defined(TANDEM_HAVE_CUDA)
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "gpu_worker/cuda/cuda_expert_pool.h"
#include "gpu_worker/cuda/cuda_handles.h"
#endif

ABSL_FLAG(std::string, preset, "mixtral-8x7b", "model shape (common/synthetic_model.h presets)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: bf16, f16 or f32");
ABSL_FLAG(std::string, rows, "1,2,4,8,16,32,64,128,256,512",
          "row counts (R for one expert, N tokens for a layer), comma-separated");
ABSL_FLAG(int, repeats, 20, "timed repeats per measurement (the median is reported)");
ABSL_FLAG(int, warmup, 3, "untimed calls before each measurement");
ABSL_FLAG(int, cpu_repeats, 5, "timed repeats of the CPU expert (slow at large row counts)");
ABSL_FLAG(int, device, 0, "CUDA device index");
ABSL_FLAG(int, threads, 0, "CPU expert threads including the caller; 0 = all available cores");
ABSL_FLAG(std::string, out, "", "write the JSON lines to this file (default: stdout)");
ABSL_FLAG(std::string, benches, "weight_copy,activation_copy,pcie,gpu_expert,overlap,cpu_expert",
          "which measurements to run, comma-separated");
ABSL_FLAG(int64_t, peak_mib, 256, "bytes of one PCIe peak copy, MiB");
ABSL_FLAG(int64_t, overlap_rows, 64, "rows per resident expert of the compute in the overlap bench");

namespace tandem {
namespace {

#if defined(TANDEM_HAVE_CUDA)

using Json = nlohmann::json;

// ---------------------------------------------------------------------------
// Statistics and output.

// {"<prefix>median_us": ..., "<prefix>mean_us": ..., ...}
void PutSummary(Json& line, const std::string& prefix, const Summary& s) {
  line[prefix + "median_us"] = s.median;
  line[prefix + "mean_us"] = s.mean;
  line[prefix + "stddev_us"] = s.stddev;
  line[prefix + "min_us"] = s.min;
}

double GbPerS(double bytes, double us) { return us > 0 ? bytes / us * 1e-3 : 0; }

// One JSON object per line to stdout or --out, each merged with the fields
// every record carries (device, flags, command).
class Output {
 public:
  static absl::StatusOr<Output> Open(const std::string& path, Json base) {
    Output out;
    out.base_ = std::move(base);
    if (!path.empty()) {
      out.file_ = std::fopen(path.c_str(), "w");
      if (out.file_ == nullptr) return absl::InvalidArgumentError(absl::StrCat("--out: cannot open ", path));
      out.owned_ = true;
    }
    return out;
  }
  Output() = default;
  Output(Output&& other) noexcept
      : file_(std::exchange(other.file_, stdout)),
        owned_(std::exchange(other.owned_, false)),
        base_(std::move(other.base_)) {}
  Output& operator=(Output&&) = delete;
  Output(const Output&) = delete;
  ~Output() {
    if (owned_) std::fclose(file_);
  }

  void Emit(Json line) const {
    for (auto it = base_.begin(); it != base_.end(); ++it) line[it.key()] = it.value();
    // Flushed per line: a run cut short still leaves whole lines.
    std::fputs((line.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n").c_str(), file_);
    std::fflush(file_);
  }

 private:
  std::FILE* file_ = stdout;
  bool owned_ = false;
  Json base_;
};

// ---------------------------------------------------------------------------
// The measurements.

using Clock = std::chrono::steady_clock;

struct Settings {
  std::string preset;
  DType dtype = DType::kBF16;
  std::vector<int64_t> rows;
  int repeats = 20;
  int warmup = 3;
  int cpu_repeats = 5;
  int device = 0;
  int threads = 0;
  int64_t peak_bytes = 0;
  int64_t overlap_rows = 64;
  std::set<std::string> benches;
  bool Wants(const std::string& name) const { return benches.count(name) > 0; }
};

// One layer's experts in one page-aligned anonymous mapping, each matrix on
// a 4096-byte boundary (as the CPU worker's store lays them out), filled
// with uniform random values of trained-expert spread (~N(0, 0.02²)). Left
// writable: a read-only mapping cannot be page-locked on a GPU without
// cudaDevAttrHostRegisterReadOnlySupported (discrete GPUs in x86 hosts), and
// the registered-copy benches need it locked (gpu_worker/pinned_regions.h).
class LayerRegion {
 public:
  static absl::StatusOr<std::unique_ptr<LayerRegion>> Create(const ModelConfig& config, DType dtype, ThreadPool* pool) {
    auto region = std::unique_ptr<LayerRegion>(new LayerRegion());
    const int64_t d = config.hidden_size, i = config.intermediate_size, e = config.num_local_experts;
    const size_t matrix = static_cast<size_t>(d * i) * DTypeSize(dtype);
    const size_t stride = (matrix + 4095) / 4096 * 4096;
    region->bytes_ = static_cast<size_t>(e) * 3 * stride;
    void* p = mmap(nullptr, region->bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return absl::ResourceExhaustedError(
          absl::StrCat("mmap of ", region->bytes_, " bytes for one layer's experts failed"));
    }
    region->data_ = static_cast<uint8_t*>(p);
    // Chunks of 1 Mi elements, each seeded by its position: deterministic
    // and parallel.
    const int64_t elements = d * i;
    constexpr int64_t kChunk = 1 << 20;
    const int64_t chunks_per_matrix = (elements + kChunk - 1) / kChunk;
    const int64_t matrices = 3 * e;
    const float scale = 0.02f * std::sqrt(3.0f);
    uint8_t* base = region->data_;
    pool->ParallelFor(matrices * chunks_per_matrix, [&](int64_t task, int) {
      const int64_t m = task / chunks_per_matrix, c = task % chunks_per_matrix;
      uint8_t* at = base + static_cast<size_t>(m) * stride;
      uint64_t state = static_cast<uint64_t>(task) * 0x9E3779B97F4A7C15ull + 0xD1B54A32D192ED03ull;
      const int64_t end = std::min(elements, (c + 1) * kChunk);
      for (int64_t j = c * kChunk; j < end; ++j) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        const float v = (2.0f * static_cast<float>(state >> 40) * (1.0f / 16777216.0f) - 1.0f) * scale;
        switch (dtype) {
          case DType::kF32: reinterpret_cast<float*>(at)[j] = v; break;
          case DType::kF16: reinterpret_cast<uint16_t*>(at)[j] = F32ToF16(v); break;
          case DType::kBF16: reinterpret_cast<uint16_t*>(at)[j] = F32ToBf16(v); break;
          default: break;  // block types: --dtype takes float types only (ParseDType)
        }
      }
    });
    for (int64_t x = 0; x < e; ++x) {
      uint8_t* at = base + static_cast<size_t>(x) * 3 * stride;
      ExpertWeights w;
      w.w1 = LinearWeight{at, dtype, i, d};
      w.w3 = LinearWeight{at + stride, dtype, i, d};
      w.w2 = LinearWeight{at + 2 * stride, dtype, d, i};
      region->experts_.push_back(w);
    }
    return region;
  }
  ~LayerRegion() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  LayerRegion(const LayerRegion&) = delete;
  LayerRegion& operator=(const LayerRegion&) = delete;

  const std::vector<ExpertWeights>& experts() const { return experts_; }
  PinnedHostRegion pinned_region() const { return {data_, bytes_}; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  LayerRegion() = default;
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
  std::vector<ExpertWeights> experts_;
};

// Event (GPU timeline) and host (what the caller waits) times of one
// operation, repeated.
struct GpuTimes {
  std::vector<double> event_us, host_us;
};

// Runs `issue` (which queues work on `stream`) warmup + repeats times
// between two events, waiting for each.
absl::StatusOr<GpuTimes> TimeOnStream(cudaStream_t stream, int warmup, int repeats,
                                      const std::function<absl::Status(int rep)>& issue) {
  TANDEM_ASSIGN_OR_RETURN(CudaEvent start, CudaEvent::Create(/*timing=*/true));
  TANDEM_ASSIGN_OR_RETURN(CudaEvent stop, CudaEvent::Create(/*timing=*/true));
  GpuTimes times;
  for (int rep = -warmup; rep < repeats; ++rep) {
    const Clock::time_point host_start = Clock::now();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream));
    TANDEM_RETURN_IF_ERROR(issue(rep));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
    const double host_us = MicrosSince(host_start);
    float ms = 0;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    if (rep >= 0) {
      times.event_us.push_back(static_cast<double>(ms) * 1e3);
      times.host_us.push_back(host_us);
    }
  }
  return times;
}

class Bench {
 public:
  Bench(const Settings& settings, const ModelConfig& config, const Output& out)
      : s_(settings), config_(config), out_(out) {}

  absl::Status Run();

 private:
  int64_t d() const { return config_.hidden_size; }
  int64_t i() const { return config_.intermediate_size; }
  int experts() const { return static_cast<int>(config_.num_local_experts); }
  int top_k() const { return static_cast<int>(std::max<int64_t>(1, config_.num_experts_per_tok)); }
  int64_t max_rows() const { return s_.rows.empty() ? 1 : *std::max_element(s_.rows.begin(), s_.rows.end()); }
  int64_t expert_bytes() const { return 3 * d() * i() * static_cast<int64_t>(DTypeSize(s_.dtype)); }

  absl::Status RawWeightCopies();
  absl::Status ActivationCopies();
  absl::Status PciePeak();
  absl::Status PoolWeightCopies(bool pinned);
  absl::Status GpuExperts(bool grouped);
  absl::Status Overlap(CudaExpertPool& pool);
  absl::Status CpuExperts();
  void EmitSummary();

  absl::StatusOr<std::unique_ptr<CudaExpertPool>> MakePool(int slots, int staging, bool pinned, bool grouped);
  // Rows of N tokens routed top-K over the layer's experts, spread evenly:
  // token t goes to experts (t·K + j) mod E, j < K (distinct when K <= E).
  std::vector<int64_t> SpreadRows(int64_t tokens) const;
  Json Record(const std::string& bench) const { return Json{{"bench", bench}}; }

  const Settings& s_;
  const ModelConfig& config_;
  const Output& out_;
  std::unique_ptr<ThreadPool> fill_pool_;
  std::unique_ptr<LayerRegion> region_;
  cudaDeviceProp prop_{};

  // Medians kept for the summary and the overlap's peak.
  double w_copy_us_ = 0;      // registered-source raw copy, the pool's way
  double h2d_peak_gb_s_ = 0;  // best H2D pattern
  std::map<int64_t, double> gpu_one_us_, cpu_us_, a_copy_d2h_us_, a_copy_h2d_us_;
};

absl::Status Bench::Run() {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(s_.device));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop_, s_.device));
  int runtime = 0, driver = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaRuntimeGetVersion(&runtime));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDriverGetVersion(&driver));
  size_t free_bytes = 0, total_bytes = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  char bus[32] = {0};
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus, sizeof(bus), s_.device));
  const int threads = s_.threads > 0 ? s_.threads : AvailableCores();
  fill_pool_ = std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = threads, .name = "gpu-bench"});
  Json machine = Record("machine");
  machine["compute_capability"] = absl::StrCat(prop_.major, ".", prop_.minor);
  machine["multiprocessors"] = prop_.multiProcessorCount;
  machine["memory_bytes"] = static_cast<int64_t>(total_bytes);
  machine["free_memory_bytes"] = static_cast<int64_t>(free_bytes);
  machine["async_copy_engines"] = prop_.asyncEngineCount;
  machine["pci_bus_id"] = bus;
  machine["cuda_runtime"] = runtime;
  machine["cuda_driver"] = driver;
  machine["cublas_header"] = CUBLAS_VERSION;
  machine["host_threads"] = threads;
  machine["hidden"] = d();
  machine["intermediate"] = i();
  machine["experts"] = experts();
  machine["top_k"] = top_k();
  machine["expert_bytes"] = expert_bytes();
  out_.Emit(machine);

  const Clock::time_point fill_start = Clock::now();
  ModelConfig one_layer = config_;
  one_layer.num_hidden_layers = 1;
  TANDEM_ASSIGN_OR_RETURN(region_, LayerRegion::Create(one_layer, s_.dtype, fill_pool_.get()));
  LOG_INFO("tandem-gpu-bench: ", experts(), " experts of ", expert_bytes() / 1e6, " MB generated in ",
           MicrosSince(fill_start) / 1e6, " s");

  // Raw copies first, while the region is not registered (pageable), then
  // registered for their own measurement only; the pools register it again.
  if (s_.Wants("weight_copy")) TANDEM_RETURN_IF_ERROR(RawWeightCopies());
  if (s_.Wants("activation_copy")) TANDEM_RETURN_IF_ERROR(ActivationCopies());
  if (s_.Wants("pcie") || s_.Wants("overlap")) TANDEM_RETURN_IF_ERROR(PciePeak());
  if (s_.Wants("weight_copy")) {
    TANDEM_RETURN_IF_ERROR(PoolWeightCopies(/*pinned=*/false));
    TANDEM_RETURN_IF_ERROR(PoolWeightCopies(/*pinned=*/true));
  }
  if (s_.Wants("gpu_expert") || s_.Wants("overlap")) {
    TANDEM_RETURN_IF_ERROR(GpuExperts(/*grouped=*/true));  // runs Overlap too
    if (s_.Wants("gpu_expert")) TANDEM_RETURN_IF_ERROR(GpuExperts(/*grouped=*/false));
  }
  if (s_.Wants("cpu_expert")) TANDEM_RETURN_IF_ERROR(CpuExperts());
  EmitSummary();
  return absl::OkStatus();
}

absl::Status Bench::RawWeightCopies() {
  CudaStream stream;
  TANDEM_ASSIGN_OR_RETURN(stream, CudaStream::Create());
  const ExpertWeights& first = region_->experts()[0];
  const size_t matrix = static_cast<size_t>(d() * i()) * DTypeSize(s_.dtype);
  DeviceBuffer dst;
  TANDEM_ASSIGN_OR_RETURN(dst, DeviceBuffer::Allocate(3 * matrix));
  // Three copies per expert, as the pool's copy does (w1, w3, w2).
  auto copy = [&](const void* w1, const void* w3, const void* w2) -> absl::Status {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst.bytes(), w1, matrix, cudaMemcpyHostToDevice, stream.get()));
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.bytes() + matrix, w3, matrix, cudaMemcpyHostToDevice, stream.get()));
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst.bytes() + 2 * matrix, w2, matrix, cudaMemcpyHostToDevice, stream.get()));
    return absl::OkStatus();
  };
  // Each repeat copies the next expert (different host memory each time, as
  // Fiddler's 32 layers do).
  auto rotating = [&](int rep) {
    const ExpertWeights& w = region_->experts()[static_cast<size_t>((rep + s_.warmup) % experts())];
    return copy(w.w1.data, w.w3.data, w.w2.data);
  };
  auto emit = [&](const std::string& source, const GpuTimes& t) {
    const Summary event = Summarise(t.event_us), host = Summarise(t.host_us);
    Json line = Record("weight_copy");
    line["source"] = source;
    line["bytes"] = expert_bytes();
    PutSummary(line, "", event);
    PutSummary(line, "host_", host);
    line["gb_s"] = GbPerS(static_cast<double>(expert_bytes()), event.median);
    line["timing"] = "events around the three cudaMemcpyAsync; host_* adds the launch and the wait";
    out_.Emit(line);
    return event.median;
  };

  {
    TANDEM_ASSIGN_OR_RETURN(GpuTimes t, TimeOnStream(stream.get(), s_.warmup, s_.repeats, rotating));
    emit("pageable", t);
  }
  {
    PinnedHostBuffer pinned;
    TANDEM_ASSIGN_OR_RETURN(pinned, PinnedHostBuffer::Allocate(3 * matrix));
    auto* p = static_cast<uint8_t*>(pinned.get());
    std::memcpy(p, first.w1.data, matrix);
    std::memcpy(p + matrix, first.w3.data, matrix);
    std::memcpy(p + 2 * matrix, first.w2.data, matrix);
    TANDEM_ASSIGN_OR_RETURN(GpuTimes t, TimeOnStream(stream.get(), s_.warmup, s_.repeats,
                                                     [&](int) { return copy(p, p + matrix, p + 2 * matrix); }));
    emit("pinned_malloc_host", t);
  }
  {
    // As the pool registers it (ChooseHostPinMode on a writable mapping).
    TANDEM_ASSIGN_OR_RETURN(const bool read_only, HostRegisterReadOnlySupported(s_.device));
    HostRegistration registration;
    TANDEM_ASSIGN_OR_RETURN(registration, HostRegistration::Register(region_->data(), region_->bytes(), read_only));
    TANDEM_ASSIGN_OR_RETURN(GpuTimes t, TimeOnStream(stream.get(), s_.warmup, s_.repeats, rotating));
    w_copy_us_ = emit("pinned_registered", t);
  }
  return absl::OkStatus();
}

absl::Status Bench::ActivationCopies() {
  CudaStream stream;
  TANDEM_ASSIGN_OR_RETURN(stream, CudaStream::Create());
  const size_t max_bytes = static_cast<size_t>(max_rows() * d()) * sizeof(float);
  PinnedHostBuffer pinned;
  TANDEM_ASSIGN_OR_RETURN(pinned, PinnedHostBuffer::Allocate(max_bytes));
  std::vector<float> pageable(static_cast<size_t>(max_rows() * d()), 0.5f);
  std::memset(pinned.get(), 0, max_bytes);
  DeviceBuffer device;
  TANDEM_ASSIGN_OR_RETURN(device, DeviceBuffer::Allocate(max_bytes));
  for (int64_t rows : s_.rows) {
    const size_t bytes = static_cast<size_t>(rows * d()) * sizeof(float);
    for (const bool to_device : {true, false}) {
      for (const bool is_pinned : {true, false}) {
        void* host = is_pinned ? pinned.get() : static_cast<void*>(pageable.data());
        TANDEM_ASSIGN_OR_RETURN(
            GpuTimes t, TimeOnStream(stream.get(), s_.warmup, s_.repeats, [&](int) {
              TANDEM_CUDA_RETURN_IF_ERROR(
                  to_device ? cudaMemcpyAsync(device.get(), host, bytes, cudaMemcpyHostToDevice, stream.get())
                            : cudaMemcpyAsync(host, device.get(), bytes, cudaMemcpyDeviceToHost, stream.get()));
              return absl::OkStatus();
            }));
        const Summary event = Summarise(t.event_us), host_s = Summarise(t.host_us);
        Json line = Record("activation_copy");
        line["direction"] = to_device ? "h2d" : "d2h";
        line["memory"] = is_pinned ? "pinned" : "pageable";
        line["rows"] = rows;
        line["bytes"] = static_cast<int64_t>(bytes);
        PutSummary(line, "", event);
        PutSummary(line, "host_", host_s);
        line["gb_s"] = GbPerS(static_cast<double>(bytes), event.median);
        out_.Emit(line);
        if (is_pinned) (to_device ? a_copy_h2d_us_ : a_copy_d2h_us_)[rows] = host_s.median;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Bench::PciePeak() {
  const size_t bytes = static_cast<size_t>(s_.peak_bytes);
  const size_t half = bytes / 2;
  CudaStream a, b;
  TANDEM_ASSIGN_OR_RETURN(a, CudaStream::Create());
  TANDEM_ASSIGN_OR_RETURN(b, CudaStream::Create());
  PinnedHostBuffer h_src, h_dst;
  TANDEM_ASSIGN_OR_RETURN(h_src, PinnedHostBuffer::Allocate(bytes));
  TANDEM_ASSIGN_OR_RETURN(h_dst, PinnedHostBuffer::Allocate(bytes));
  std::memset(h_src.get(), 1, bytes);  // touch: first-touch faults must not land in a timed copy
  std::memset(h_dst.get(), 0, bytes);
  DeviceBuffer d_a, d_b;
  TANDEM_ASSIGN_OR_RETURN(d_a, DeviceBuffer::Allocate(bytes));
  TANDEM_ASSIGN_OR_RETURN(d_b, DeviceBuffer::Allocate(bytes));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(d_b.get(), 0, bytes));
  CudaEvent start, stop_a, stop_b;
  TANDEM_ASSIGN_OR_RETURN(start, CudaEvent::Create(true));
  TANDEM_ASSIGN_OR_RETURN(stop_a, CudaEvent::Create(true));
  TANDEM_ASSIGN_OR_RETURN(stop_b, CudaEvent::Create(true));
  auto* src = static_cast<uint8_t*>(h_src.get());
  auto* dst = static_cast<uint8_t*>(h_dst.get());

  enum class Pattern { kH2d1, kD2h1, kH2d2, kD2h2, kBidir };
  const std::vector<std::pair<Pattern, const char*>> patterns = {{Pattern::kH2d1, "h2d_1stream"},
                                                                 {Pattern::kD2h1, "d2h_1stream"},
                                                                 {Pattern::kH2d2, "h2d_2streams"},
                                                                 {Pattern::kD2h2, "d2h_2streams"},
                                                                 {Pattern::kBidir, "bidirectional"}};
  for (const auto& [pattern, name] : patterns) {
    std::vector<double> makespan_us, a_us, b_us;
    for (int rep = -s_.warmup; rep < s_.repeats; ++rep) {
      // Stream b starts with stream a: both wait on `start`.
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), a.get()));
      TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(b.get(), start.get(), 0));
      switch (pattern) {
        case Pattern::kH2d1:
          TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_a.get(), src, bytes, cudaMemcpyHostToDevice, a.get()));
          break;
        case Pattern::kD2h1:
          TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, d_b.get(), bytes, cudaMemcpyDeviceToHost, a.get()));
          break;
        case Pattern::kH2d2:
          TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_a.get(), src, half, cudaMemcpyHostToDevice, a.get()));
          TANDEM_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(d_a.bytes() + half, src + half, bytes - half, cudaMemcpyHostToDevice, b.get()));
          break;
        case Pattern::kD2h2:
          TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, d_b.get(), half, cudaMemcpyDeviceToHost, a.get()));
          TANDEM_CUDA_RETURN_IF_ERROR(
              cudaMemcpyAsync(dst + half, d_b.bytes() + half, bytes - half, cudaMemcpyDeviceToHost, b.get()));
          break;
        case Pattern::kBidir:
          TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_a.get(), src, bytes, cudaMemcpyHostToDevice, a.get()));
          TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, d_b.get(), bytes, cudaMemcpyDeviceToHost, b.get()));
          break;
      }
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_a.get(), a.get()));
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_b.get(), b.get()));
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_a.get()));
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_b.get()));
      float ms_a = 0, ms_b = 0;
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms_a, start.get(), stop_a.get()));
      TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms_b, start.get(), stop_b.get()));
      if (rep >= 0) {
        a_us.push_back(ms_a * 1e3);
        b_us.push_back(ms_b * 1e3);
        makespan_us.push_back(std::max(ms_a, ms_b) * 1e3);
      }
    }
    const Summary m = Summarise(makespan_us);
    const bool bidir = pattern == Pattern::kBidir;
    const double moved = static_cast<double>(bidir ? 2 * bytes : bytes);
    Json line = Record("pcie");
    line["pattern"] = name;
    line["bytes"] = static_cast<int64_t>(moved);
    line["streams"] = pattern == Pattern::kH2d1 || pattern == Pattern::kD2h1 ? 1 : 2;
    PutSummary(line, "", m);
    line["gb_s"] = GbPerS(moved, m.median);
    line["best_gb_s"] = GbPerS(moved, m.min);
    if (bidir) {
      line["h2d_gb_s"] = GbPerS(static_cast<double>(bytes), Summarise(a_us).median);
      line["d2h_gb_s"] = GbPerS(static_cast<double>(bytes), Summarise(b_us).median);
    }
    out_.Emit(line);
    if (pattern == Pattern::kH2d1 || pattern == Pattern::kH2d2) {
      h2d_peak_gb_s_ = std::max(h2d_peak_gb_s_, GbPerS(moved, m.median));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaExpertPool>> Bench::MakePool(int slots, int staging, bool pinned, bool grouped) {
  CudaExpertPoolOptions options;
  options.pool.num_slots = slots;
  options.pool.num_staging_buffers = staging;
  options.device = s_.device;
  options.num_copy_streams = 2;
  options.poison_freed_buffers = false;  // timing, not checking
  options.grouped_gemm = grouped;
  if (pinned) options.host_regions.push_back(region_->pinned_region());
  int64_t rows = max_rows() * top_k();
  rows = std::max(rows, static_cast<int64_t>(experts() / 2) * s_.overlap_rows);
  options.max_rows = rows;
  ModelConfig one_layer = config_;
  one_layer.num_hidden_layers = 1;
  return CudaExpertPool::Create(one_layer, {region_->experts()}, options);
}

absl::Status Bench::PoolWeightCopies(bool pinned) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CudaExpertPool> pool, MakePool(1, 1, pinned, true));
  std::vector<double> host_us, copy_us, queued_us;
  for (int rep = -s_.warmup; rep < s_.repeats; ++rep) {
    const ExpertKey key{0, (rep + s_.warmup) % experts()};
    const Clock::time_point start = Clock::now();
    TANDEM_RETURN_IF_ERROR(pool->Migrate(key, std::nullopt));
    TANDEM_RETURN_IF_ERROR(pool->WaitReady(key));
    const double us = MicrosSince(start);
    const std::vector<MigrationRecord> done = pool->TakeCompletedMigrations();
    if (done.size() != 1)
      return absl::InternalError(absl::StrCat("expected one completed migration, got ", done.size()));
    TANDEM_RETURN_IF_ERROR(pool->Evict(key));
    if (rep < 0) continue;
    host_us.push_back(us);
    copy_us.push_back(done[0].copy_us);
    queued_us.push_back(done[0].queued_us);
  }
  const Summary copy = Summarise(copy_us), host = Summarise(host_us);
  Json line = Record("weight_copy");
  line["source"] = pinned ? "pool_migrate_registered" : "pool_migrate_pageable";
  line["bytes"] = expert_bytes();
  PutSummary(line, "", copy);
  PutSummary(line, "host_", host);
  line["queued_median_us"] = Summarise(queued_us).median;
  line["gb_s"] = GbPerS(static_cast<double>(expert_bytes()), copy.median);
  line["pageable_copies"] = pool->stats().pageable_copies;
  line["timing"] = "the pool's copy events (MigrationRecord::copy_us); host_* is Migrate → WaitReady";
  out_.Emit(line);
  return absl::OkStatus();
}

std::vector<int64_t> Bench::SpreadRows(int64_t tokens) const {
  std::vector<int64_t> rows(static_cast<size_t>(experts()), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < top_k(); ++j) ++rows[static_cast<size_t>((t * top_k() + j) % experts())];
  }
  return rows;
}

absl::Status Bench::GpuExperts(bool grouped) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<CudaExpertPool> pool, MakePool(experts(), 1, true, grouped));
  for (int e = 0; e < experts(); ++e) TANDEM_RETURN_IF_ERROR(pool->Place({0, e}));
  const int64_t capacity = std::max(max_rows() * top_k(), static_cast<int64_t>(experts() / 2) * s_.overlap_rows);
  std::vector<float> x(static_cast<size_t>(capacity * d())), y(x.size());
  for (size_t j = 0; j < x.size(); ++j) x[j] = std::sin(0.37f * static_cast<float>(j));

  auto time_runs = [&](const std::function<std::vector<ExpertWork>(int rep)>& make, std::vector<double>* host_us,
                       std::vector<double>* compute_us) -> absl::Status {
    for (int rep = -s_.warmup; rep < s_.repeats; ++rep) {
      const std::vector<ExpertWork> work = make(rep);
      PoolRunTiming timing;
      const Clock::time_point start = Clock::now();
      TANDEM_RETURN_IF_ERROR(pool->RunExperts(0, work, &timing));
      const double us = MicrosSince(start);
      if (!std::isfinite(y[0])) return absl::InternalError("the GPU expert produced a non-finite output");
      if (rep < 0) continue;
      host_us->push_back(us);
      compute_us->push_back(timing.compute_us);
    }
    return absl::OkStatus();
  };

  if (s_.Wants("gpu_expert")) {
    const char* path = grouped ? "grouped" : "per_expert";
    // One resident expert at R rows (Fiddler's "GPU N"); the grouped and
    // per-expert paths are the same GEMMs here, so only the grouped pool
    // reports it.
    if (grouped) {
      for (int64_t rows : s_.rows) {
        std::vector<double> host_us, compute_us;
        TANDEM_RETURN_IF_ERROR(time_runs(
            [&](int rep) {
              return std::vector<ExpertWork>{{(rep + s_.warmup) % experts(), rows, x.data(), y.data()}};
            },
            &host_us, &compute_us));
        const Summary host = Summarise(host_us);
        const double flops = 2.0 * 3.0 * static_cast<double>(rows) * static_cast<double>(d() * i());
        Json line = Record("gpu_expert");
        line["mode"] = "one_expert";
        line["rows"] = rows;
        line["experts"] = 1;
        PutSummary(line, "", host);
        line["compute_median_us"] = Summarise(compute_us).median;
        line["weight_gb_s"] = GbPerS(static_cast<double>(expert_bytes()), host.median);
        line["tflops"] = flops / (host.median * 1e-6) / 1e12;
        line["grouped_gemm"] = pool->grouped_gemm();
        line["timing"] = "RunExperts wall time: rows packed and copied up, FFN, outputs copied back, one sync";
        out_.Emit(line);
        gpu_one_us_[rows] = host.median;
      }
    }
    // The whole layer: N tokens' rows spread top-K over the E experts.
    for (int64_t tokens : s_.rows) {
      const std::vector<int64_t> rows = SpreadRows(tokens);
      std::vector<ExpertWork> work;
      int64_t offset = 0;
      for (int e = 0; e < experts(); ++e) {
        work.push_back({e, rows[static_cast<size_t>(e)], x.data() + offset * d(), y.data() + offset * d()});
        offset += rows[static_cast<size_t>(e)];
      }
      std::vector<double> host_us, compute_us;
      TANDEM_RETURN_IF_ERROR(time_runs([&](int) { return work; }, &host_us, &compute_us));
      const Summary host = Summarise(host_us);
      const int used = static_cast<int>(std::count_if(rows.begin(), rows.end(), [](int64_t r) { return r > 0; }));
      Json line = Record("gpu_layer");
      line["path"] = path;
      line["grouped_gemm"] = pool->grouped_gemm();
      line["tokens"] = tokens;
      line["top_k"] = top_k();
      line["rows_total"] = offset;
      line["experts_used"] = used;
      line["rows_per_expert"] = rows;
      PutSummary(line, "", host);
      line["compute_median_us"] = Summarise(compute_us).median;
      line["weight_gb_s"] = GbPerS(static_cast<double>(expert_bytes()) * used, host.median);
      out_.Emit(line);
    }
  }
  if (grouped && s_.Wants("overlap")) TANDEM_RETURN_IF_ERROR(Overlap(*pool));
  return absl::OkStatus();
}

// Length of [a0, a1) covered by the union of `intervals` (sorted, disjoint).
double Covered(double a0, double a1, const std::vector<std::pair<double, double>>& intervals) {
  double covered = 0;
  for (const auto& [b0, b1] : intervals) covered += std::max(0.0, std::min(a1, b1) - std::max(a0, b0));
  return covered;
}

absl::Status Bench::Overlap(CudaExpertPool& pool) {
  // The first half of the experts stay resident and compute; the second
  // half are evicted and migrated back in each round.
  const int half = experts() / 2;
  if (half < 1) return absl::OkStatus();
  std::vector<ExpertKey> movers;
  for (int e = half; e < experts(); ++e) movers.push_back({0, e});
  for (const ExpertKey& key : movers) TANDEM_RETURN_IF_ERROR(pool.Evict(key));
  const int64_t rows = s_.overlap_rows;
  std::vector<float> x(static_cast<size_t>(half * rows * d())), y(x.size());
  for (size_t j = 0; j < x.size(); ++j) x[j] = std::cos(0.11f * static_cast<float>(j));
  std::vector<ExpertWork> work;
  for (int e = 0; e < half; ++e) work.push_back({e, rows, x.data() + e * rows * d(), y.data() + e * rows * d()});

  // Compute alone.
  std::vector<double> alone_us;
  for (int rep = -s_.warmup; rep < s_.repeats; ++rep) {
    const Clock::time_point start = Clock::now();
    TANDEM_RETURN_IF_ERROR(pool.RunExperts(0, work, nullptr));
    if (rep >= 0) alone_us.push_back(MicrosSince(start));
  }
  const Summary alone = Summarise(alone_us);
  const double round_bytes = static_cast<double>(expert_bytes()) * static_cast<double>(movers.size());

  // One round: queue every mover's migration, then (if `compute`) run the
  // resident experts back to back until every copy has landed. Copy
  // intervals come from the pool's records: issue = queue time + queued_us,
  // end = issue + copy_us (event-timed); compute intervals from host clocks
  // around RunExperts. Both on this process's steady clock.
  struct Round {
    double gb_s = 0, hidden = 0, mean_call_us = 0;
    int64_t calls = 0;
  };
  auto run_round = [&](bool compute) -> absl::StatusOr<Round> {
    const Clock::time_point epoch = Clock::now();
    std::map<int, double> queued_at;
    for (const ExpertKey& key : movers) {
      queued_at[key.expert] = MicrosSince(epoch);
      TANDEM_RETURN_IF_ERROR(pool.Migrate(key, std::nullopt));
    }
    std::vector<std::pair<double, double>> calls;
    if (compute) {
      auto all_ready = [&] {
        return std::all_of(movers.begin(), movers.end(), [&](const ExpertKey& k) { return pool.IsReady(k); });
      };
      while (!all_ready()) {
        const double start = MicrosSince(epoch);
        TANDEM_RETURN_IF_ERROR(pool.RunExperts(0, work, nullptr));
        calls.emplace_back(start, MicrosSince(epoch));
      }
    }
    for (const ExpertKey& key : movers) TANDEM_RETURN_IF_ERROR(pool.WaitReady(key));
    const std::vector<MigrationRecord> done = pool.TakeCompletedMigrations();
    if (done.size() != movers.size()) {
      return absl::InternalError(absl::StrCat("expected ", movers.size(), " migrations, got ", done.size()));
    }
    double first = 1e300, last = 0, copy_total = 0, hidden = 0;
    for (const MigrationRecord& m : done) {
      const double begin = queued_at[m.expert.expert] + m.queued_us, end = begin + m.copy_us;
      first = std::min(first, begin);
      last = std::max(last, end);
      copy_total += m.copy_us;
      hidden += Covered(begin, end, calls);
    }
    for (const ExpertKey& key : movers) TANDEM_RETURN_IF_ERROR(pool.Evict(key));
    Round r;
    r.gb_s = GbPerS(round_bytes, last - first);
    r.hidden = copy_total > 0 ? hidden / copy_total : 0;
    r.calls = static_cast<int64_t>(calls.size());
    double sum = 0;
    for (const auto& [a, b] : calls) sum += b - a;
    r.mean_call_us = calls.empty() ? 0 : sum / static_cast<double>(calls.size());
    return r;
  };

  std::vector<double> alone_gb_s, overlapped_gb_s, hidden, call_us, calls;
  for (int rep = -s_.warmup; rep < s_.repeats; ++rep) {
    TANDEM_ASSIGN_OR_RETURN(const Round copy_only, run_round(false));
    TANDEM_ASSIGN_OR_RETURN(const Round both, run_round(true));
    if (rep < 0) continue;
    alone_gb_s.push_back(copy_only.gb_s);
    overlapped_gb_s.push_back(both.gb_s);
    hidden.push_back(both.hidden);
    if (both.calls > 0) call_us.push_back(both.mean_call_us);
    calls.push_back(static_cast<double>(both.calls));
  }
  // Put the evicted experts back for whoever runs next.
  for (const ExpertKey& key : movers) TANDEM_RETURN_IF_ERROR(pool.Place(key));

  const double overlapped = Summarise(overlapped_gb_s).median;
  const double compute_overlapped = Summarise(call_us).median;
  Json line = Record("migration_overlap");
  line["copy_streams"] = 2;
  line["experts_migrated_per_round"] = static_cast<int64_t>(movers.size());
  line["bytes_per_round"] = round_bytes;
  line["resident_experts_computing"] = half;
  line["rows_per_expert"] = rows;
  line["rounds"] = s_.repeats;
  line["copy_alone_gb_s"] = Summarise(alone_gb_s).median;
  line["copy_overlapped_gb_s"] = overlapped;
  line["h2d_peak_gb_s"] = h2d_peak_gb_s_;
  line["fraction_of_peak"] = h2d_peak_gb_s_ > 0 ? overlapped / h2d_peak_gb_s_ : 0;
  line["hidden_fraction"] = Summarise(hidden).median;
  line["hidden_fraction_min"] = Summarise(hidden).min;
  line["compute_alone_us"] = alone.median;
  line["compute_overlapped_us"] = compute_overlapped;
  line["compute_slowdown"] = alone.median > 0 ? compute_overlapped / alone.median : 0;
  line["compute_calls_per_round"] = Summarise(calls).median;
  line["grouped_gemm"] = pool.grouped_gemm();
  line["note"] =
      "hidden_fraction = copy time overlapped by RunExperts calls / total copy time; copy intervals from the pool's "
      "copy events, compute intervals from host clocks around RunExperts (activation copies included)";
  out_.Emit(line);
  return absl::OkStatus();
}

absl::Status Bench::CpuExperts() {
  ExpertFfn ffn(fill_pool_.get());
  std::vector<float> x(static_cast<size_t>(max_rows() * d())), y(x.size());
  for (size_t j = 0; j < x.size(); ++j) x[j] = std::sin(0.37f * static_cast<float>(j));
  const int repeats = std::max(1, s_.cpu_repeats);
  size_t next = 0;
  for (int64_t rows : s_.rows) {
    std::vector<double> us;
    // One warm-up; each call on the next expert so the LLC never holds its
    // weights from the previous call.
    for (int rep = -1; rep < repeats; ++rep) {
      const ExpertWeights& w = region_->experts()[next++ % region_->experts().size()];
      const Clock::time_point start = Clock::now();
      TANDEM_RETURN_IF_ERROR(ffn.Run(w, x.data(), rows, y.data()));
      if (rep >= 0) us.push_back(MicrosSince(start));
    }
    const Summary s = Summarise(us);
    Json line = Record("cpu_expert");
    line["rows"] = rows;
    line["threads"] = fill_pool_->num_threads();
    PutSummary(line, "", s);
    line["weight_gb_s"] = GbPerS(static_cast<double>(expert_bytes()), s.median);
    line["gflops"] = 2.0 * 3.0 * static_cast<double>(rows) * static_cast<double>(d() * i()) / (s.median * 1e-6) / 1e9;
    out_.Emit(line);
    cpu_us_[rows] = s.median;
  }
  return absl::OkStatus();
}

void Bench::EmitSummary() {
  // Fiddler §3.3: run an expert where it finishes first — on the CPU
  // (activations cross twice), resident on the GPU, or on the GPU after
  // copying its weights.
  for (int64_t rows : s_.rows) {
    Json line = Record("summary");
    line["rows"] = rows;
    const bool has_cpu = cpu_us_.count(rows) > 0, has_gpu = gpu_one_us_.count(rows) > 0;
    if (has_cpu) line["cpu_us"] = cpu_us_[rows];
    if (a_copy_d2h_us_.count(rows) > 0 && a_copy_h2d_us_.count(rows) > 0) {
      line["activation_round_trip_us"] = a_copy_d2h_us_[rows] + a_copy_h2d_us_[rows];
    }
    if (has_gpu) line["gpu_resident_us"] = gpu_one_us_[rows];
    if (has_gpu && w_copy_us_ > 0) line["gpu_after_weight_copy_us"] = w_copy_us_ + gpu_one_us_[rows];
    if (has_cpu && has_gpu && w_copy_us_ > 0) {
      line["faster_for_a_missing_expert"] = cpu_us_[rows] < w_copy_us_ + gpu_one_us_[rows] ? "cpu" : "gpu";
    }
    if (line.size() > 2) out_.Emit(line);
  }
}

absl::Status RunBench(const Settings& settings, const Output& out) {
  SyntheticModelSpec spec;
  spec.preset = settings.preset;
  spec.dtype = settings.dtype;
  TANDEM_ASSIGN_OR_RETURN(const ModelConfig config, SyntheticConfig(spec));
  if (config.num_local_experts < 1 || config.hidden_size < 1 || config.intermediate_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--preset ", settings.preset, " has no experts' shape"));
  }
  Bench bench(settings, config, out);
  return bench.Run();
}

#endif  // TANDEM_HAVE_CUDA

int Main(int argc, char** argv) {
  // The command as given, program name without its directory.
  std::vector<std::string> words = {"tandem-gpu-bench"};
  for (int a = 1; a < argc; ++a) words.emplace_back(argv[a]);
  const std::string command = absl::StrJoin(words, " ");
  tandem::SetProgramUsage("tandem-gpu-bench: Fiddler's Appendix A microbenchmarks (ICLR 2025, Fig. 7) on this GPU.");
  tandem::ParseProgramFlags(argc, argv);

  // First: is there anything to measure on? Both builds answer through
  // ListCudaDevices (the no-CUDA build's says the build lacks CUDA).
  absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  const int device = absl::GetFlag(FLAGS_device);
  if (!devices.ok()) {
    std::fprintf(stderr, "tandem-gpu-bench: no CUDA device: %s\n", std::string(devices.status().message()).c_str());
    return 2;
  }
  if (device < 0 || device >= static_cast<int>(devices->size())) {
    std::fprintf(stderr, "tandem-gpu-bench: no CUDA device: --device %d, but %zu device(s) visible\n", device,
                 devices->size());
    return 2;
  }
#if defined(TANDEM_HAVE_CUDA)
  Settings settings;
  settings.preset = absl::GetFlag(FLAGS_preset);
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    std::fprintf(stderr, "tandem-gpu-bench: --dtype: %s\n", std::string(dtype.status().message()).c_str());
    return 1;
  }
  settings.dtype = *dtype;
  settings.rows = ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_rows));
  settings.repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  settings.warmup = std::max(0, absl::GetFlag(FLAGS_warmup));
  settings.cpu_repeats = std::max(1, absl::GetFlag(FLAGS_cpu_repeats));
  settings.device = device;
  settings.threads = absl::GetFlag(FLAGS_threads);
  settings.peak_bytes = std::max<int64_t>(1, absl::GetFlag(FLAGS_peak_mib)) << 20;
  settings.overlap_rows = std::max<int64_t>(1, absl::GetFlag(FLAGS_overlap_rows));
  const std::set<std::string> known = {"weight_copy", "activation_copy", "pcie", "gpu_expert", "overlap", "cpu_expert"};
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_benches), ',', absl::SkipEmpty())) {
    if (known.count(std::string(name)) == 0) {
      std::fprintf(stderr, "tandem-gpu-bench: --benches: unknown '%s' (known: %s)\n", std::string(name).c_str(),
                   absl::StrJoin(known, ",").c_str());
      return 1;
    }
    settings.benches.insert(std::string(name));
  }
  const CudaDeviceInfo& info = (*devices)[static_cast<size_t>(device)];
  const Json base = {{"device", info.name},
                     {"device_index", device},
                     {"command", command},
                     {"flags",
                      {{"preset", settings.preset},
                       {"dtype", absl::GetFlag(FLAGS_dtype)},
                       {"rows", absl::GetFlag(FLAGS_rows)},
                       {"repeats", settings.repeats},
                       {"warmup", settings.warmup},
                       {"cpu_repeats", settings.cpu_repeats},
                       {"device", device},
                       {"threads", settings.threads},
                       {"benches", absl::GetFlag(FLAGS_benches)},
                       {"peak_mib", absl::GetFlag(FLAGS_peak_mib)},
                       {"overlap_rows", settings.overlap_rows}}}};
  absl::StatusOr<Output> out = Output::Open(absl::GetFlag(FLAGS_out), base);
  if (!out.ok()) {
    std::fprintf(stderr, "tandem-gpu-bench: %s\n", std::string(out.status().message()).c_str());
    return 1;
  }
  const absl::Status status = RunBench(settings, *out);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-gpu-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
#else
  // Unreachable: the no-CUDA ListCudaDevices always fails. Kept so the
  // answer stays right if that ever changes.
  std::fprintf(stderr, "tandem-gpu-bench: no CUDA device: this build has no CUDA support\n");
  return 2;
#endif
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
