// The CUDA expert pool (cuda_expert_pool.h). Host C++20 against the CUDA
// runtime and cuBLAS (the interface uses std::span, which nvcc's C++17 cannot
// see); the kernels are in cuda_expert_kernels.cu. Built only with CUDA
// (gpu_worker/CMakeLists.txt: cuda_*.cc); cuda_expert_pool_stub.cc stands in
// otherwise.
//
// Legend: T rows of one RunExperts call, R rows of one expert, D hidden
// size, I intermediate size, E experts with rows in one call.
#include "gpu_worker/cuda/cuda_expert_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "gpu_worker/cuda/cuda_device.h"
#include "gpu_worker/cuda/cuda_dtype.h"
#include "gpu_worker/cuda/cuda_expert_kernels.h"
#include "gpu_worker/cuda/cuda_handles.h"
#include "gpu_worker/cuda/cuda_quant_kernels.h"
#include "gpu_worker/gpu_pool_types.h"
#include "gpu_worker/pinned_regions.h"

namespace tandem {
namespace {

// cublasGemmGroupedBatchedEx appeared in cuBLAS 12.5; older headers get the
// per-expert path only.
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
constexpr bool kHaveGroupedGemm = true;
#else
constexpr bool kHaveGroupedGemm = false;
#endif

// The host-side arrays of one grouped GEMM call (cuBLAS reads them at the
// call: they are host memory by its contract; only the matrix pointers must
// be on the device). One group per expert.
struct GroupedGemmArgs {
  std::vector<cublasOperation_t> transa, transb;
  std::vector<int> m, n, k, lda, ldb, ldc, group_size;
  std::vector<float> alpha, beta;  // the scale type of CUBLAS_COMPUTE_32F

  void Clear() {
    for (auto* v : {&m, &n, &k, &lda, &ldb, &ldc, &group_size}) v->clear();
    transa.clear();
    transb.clear();
    alpha.clear();
    beta.clear();
  }
  // A group of `problems` GEMMs C = op(A) · op(B) sharing one shape.
  void Add(int rows_m, int cols_n, int inner_k, int ld_a, int ld_b, int ld_c, int problems) {
    // Row-major Y[R, N] = X[R, K] · W[N, K]ᵀ is column-major Yᵀ = W(op T) · Xᵀ(op N).
    transa.push_back(CUBLAS_OP_T);
    transb.push_back(CUBLAS_OP_N);
    m.push_back(rows_m);
    n.push_back(cols_n);
    k.push_back(inner_k);
    lda.push_back(ld_a);
    ldb.push_back(ld_b);
    ldc.push_back(ld_c);
    group_size.push_back(problems);
    alpha.push_back(1.0f);
    beta.push_back(0.0f);
  }
  int groups() const { return static_cast<int>(m.size()); }
};

class CudaExpertPoolImpl final : public CudaExpertPool {
 public:
  CudaExpertPoolImpl(const ModelConfig& config, ExpertSources experts, ExpertLayouts layouts, int num_slots,
                     const CudaExpertPoolOptions& options)
      : CudaExpertPool(kCudaPoolKind, std::move(experts), static_cast<int>(config.num_local_experts),
                       std::move(layouts), num_slots, options.pool.num_staging_buffers),
        device_(options.device),
        poison_(options.poison_freed_buffers),
        quantized_(layout(0).quantized()),
        act_dtype_(quantized_ ? DType::kBF16 : layout(0).w1_dtype),
        issued_(static_cast<size_t>(num_slots + options.pool.num_staging_buffers), false),
        source_pinned_(this->experts().size() * static_cast<size_t>(num_experts()), false) {}

  ~CudaExpertPoolImpl() override {
    StopCopies();
    for (std::thread& t : copy_threads_) {
      if (t.joinable()) t.join();
    }
    // The compute stream may still run a poison fill; let it finish before
    // the buffers go (cudaFree would wait anyway, this makes it explicit).
    if (compute_stream_.get() != nullptr) (void)cudaStreamSynchronize(compute_stream_.get());
  }

  absl::Status Init(const CudaExpertPoolOptions& options);

  absl::Status RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) override;

  absl::StatusOr<std::vector<uint8_t>> ReadHeld(ExpertKey key) override;
  std::vector<HostPinMode> host_pin_modes() const override { return host_pins_; }
  bool grouped_gemm() const override { return grouped_.load(std::memory_order_relaxed); }

 private:
  // One expert of a RunExperts call: its rows in the packed batch and the
  // buffer it computes from.
  struct Run {
    const ExpertWork* entry;
    const ExpertSource* source;  // its matrices' block orders
    int64_t row_offset;
    const uint8_t* data;
    cudaEvent_t ready;
    bool staging;
  };

  // A buffer's device bytes and events; which expert it holds, and in what
  // state, is SlotPool's (same buffer number), whether its copy is issued
  // is issued_'s.
  struct Buffer {
    uint8_t* data = nullptr;  // [buffer_bytes()] device, inside memory_
    CudaEvent start;          // before the copy's first byte (timing)
    CudaEvent ready;          // after its last byte: RunExperts' compute stream waits on it
    CudaEvent
        freed;  // on the compute stream after the buffer's last fill (Init records it too): the next copy waits on it
  };

  absl::Status EnterDevice() override {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return absl::OkStatus();
  }
  absl::Status CopyNowLocked(int buffer, ExpertKey key) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex());
  void OnQueuedLocked(int buffer) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) {
    issued_[static_cast<size_t>(buffer)] = false;
  }
  absl::Status OnFreedLocked(int buffer) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex());

  // Page-locks options.host_regions (registrations_, host_pins_) and marks
  // the experts that lie wholly inside them (source_pinned_).
  absl::Status RegisterHostRegions(const std::vector<PinnedHostRegion>& regions);
  // Waits until `buffer`'s copy is issued (its `ready` event recorded).
  absl::Status WaitIssuedLocked(int buffer, ExpertKey key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex());
  // Issues w1, w3, w2 host→device into `dst` on `stream`.
  absl::Status IssueCopy(ExpertKey key, uint8_t* dst, cudaStream_t stream);
  // Init's steps.
  absl::StatusOr<cudaDeviceProp> OpenDevice();
  absl::StatusOr<size_t> AllocateBuffers();
  absl::Status CreateStreams(int num_streams);
  absl::Status PoisonBuffers(size_t pool_bytes);
  absl::Status EnsureScratch(int64_t rows);
  absl::Status EnsurePointerScratch(int64_t experts);
  absl::Status EnsureDequantScratch();
  // RunExperts' steps: the buffers once their copies are issued, then the FFN.
  absl::StatusOr<std::vector<Run>> IssuedRuns(int layer, std::span<const ExpertWork> work);
  absl::Status Compute(const std::vector<Run>& runs, int64_t t, int layer);
  // Block-quantized experts (layer `layer`'s layout): per expert, the decode
  // GEMV for up to kQuantGemvMaxRows rows, else its matrices dequantized to
  // bf16 scratch and cuBLAS GEMMs; gate/up into gate_up_, down into y_f32_.
  absl::Status ComputeQuantized(const std::vector<Run>& runs, int64_t t, const ExpertLayout& l);
  void FillGroupedPointers(const std::vector<Run>& runs, int64_t t);
  // The FFN of `runs` (x_act_ filled, T = `t` rows) into y_f32_, on the
  // compute stream. The grouped path answers false, having queued nothing
  // that writes an output, when cuBLAS refuses the grouped GEMM (the caller
  // then runs the per-expert path).
  absl::StatusOr<bool> ComputeGrouped(const std::vector<Run>& runs, int64_t t);
  absl::Status GateUpPerExpert(const std::vector<Run>& runs, int64_t t);
  absl::Status DownPerExpert(const std::vector<Run>& runs, int64_t t);
  // cuBLAS answered NOT_SUPPORTED for `what`: per-expert GEMMs from now on.
  void DisableGrouped(const char* what);
  void CopyLoop(int stream_index) ABSL_LOCKS_EXCLUDED(mutex());

  const int device_;
  const bool poison_;
  // Block-quantized experts (CheckGpuPoolLayouts: then every matrix is).
  // Float experts are of one type throughout, so every layer's layout is
  // layer 0's and the float paths below read layout(0).
  const bool quantized_;
  const DType act_dtype_;  // activations' type for the GEMMs: the float weights' type, bf16 for quantized ones

  // CUDA resources (created by Init; destroyed after the copy threads join).
  std::vector<HostRegistration> registrations_;
  std::vector<HostPinMode> host_pins_;  // [options.host_regions]; set by Init, then read-only
  DeviceBuffer memory_;                 // [(slots + staging) * buffer_bytes] the budget
  CudaStream compute_stream_;
  std::vector<CudaStream> copy_streams_;
  CublasHandle cublas_;
  // Scratch for RunExperts (engine thread only): capacity in rows.
  int64_t scratch_rows_ = 0;
  DeviceBuffer x_f32_;    // [T, D] f32
  DeviceBuffer x_act_;    // [T, D] weights' type
  DeviceBuffer gate_up_;  // [2, T, I] f32: gate rows, then up rows
  DeviceBuffer h_act_;    // [T, I] weights' type
  DeviceBuffer y_f32_;    // [T, D] f32
  DeviceBuffer y_act_;    // [T, D] weights' type: the grouped down GEMM's output
  // Quantized experts at more than kQuantGemvMaxRows rows: one expert's
  // w1, w3 [I, D] and w2 [D, I] decoded to bf16 (outside the budget, like
  // the activations' scratch; allocated at the first such call).
  DeviceBuffer dequant_;
  PinnedHostBuffer in_host_;   // [T, D] f32
  PinnedHostBuffer out_host_;  // [T, D] f32
  // Grouped GEMM (engine thread only, but grouped_ is read by any thread).
  std::atomic<bool> grouped_{false};
  int64_t pointer_capacity_ = 0;    // experts the pointer arrays hold
  PinnedHostBuffer pointers_host_;  // [9 × capacity] void*: built here, copied up per call
  DeviceBuffer pointers_device_;    // [9 × capacity] void*: what cuBLAS reads
  GroupedGemmArgs gate_up_args_, down_args_;

  std::vector<Buffer> buffers_;  // [slots + staging] by buffer number; sized by Init, never resized
  // [slots + staging] by buffer number: the current copy's `ready` is
  // recorded, so the GPU can wait on it.
  std::vector<bool> issued_ ABSL_GUARDED_BY(mutex());
  std::vector<bool> source_pinned_;  // [L * E] all three matrices inside a registered region; set by Init
  std::vector<std::thread> copy_threads_;
};

absl::Status CudaExpertPoolImpl::Init(const CudaExpertPoolOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(const cudaDeviceProp prop, OpenDevice());
  SetKind(absl::StrCat(kCudaPoolKind, " on ", prop.name));
  TANDEM_ASSIGN_OR_RETURN(const size_t pool_bytes, AllocateBuffers());
  const int num_streams = std::max(1, options.num_copy_streams);
  TANDEM_RETURN_IF_ERROR(CreateStreams(num_streams));
  TANDEM_RETURN_IF_ERROR(PoisonBuffers(pool_bytes));
  TANDEM_RETURN_IF_ERROR(RegisterHostRegions(options.host_regions));
  const int64_t pageable = std::count(source_pinned_.begin(), source_pinned_.end(), false);
  if (options.max_rows > 0) TANDEM_RETURN_IF_ERROR(EnsureScratch(options.max_rows));
  // cuBLAS wants the grouped GEMMs' matrix pointers 16-byte aligned for
  // 16-bit types. Buffers are (cudaMalloc: 256 B; matrices in a pool buffer:
  // 4096 B), so every row start is when a row of D and of I elements is a
  // multiple of 16 bytes (Mixtral: 8192 and 28672 B).
  const size_t elt = DTypeSize(act_dtype_);
  const bool aligned = (static_cast<size_t>(layout(0).hidden_size) * elt) % 16 == 0 &&
                       (static_cast<size_t>(layout(0).intermediate_size) * elt) % 16 == 0;
  // Quantized experts have no grouped GEMM: cuBLAS takes no block types.
  grouped_ = kHaveGroupedGemm && options.grouped_gemm && aligned && !quantized_;
  if (grouped_) TANDEM_RETURN_IF_ERROR(EnsurePointerScratch(num_experts()));

  for (int s = 0; s < num_streams; ++s) copy_threads_.emplace_back([this, s] { CopyLoop(s); });
  LOG_INFO(kind(), ": ", num_slots(), " slots + ", num_staging_buffers(), " staging buffers of ",
           absl::StrFormat("%.2f MB", buffer_bytes() / 1e6), " (", absl::StrFormat("%.2f GB", pool_bytes / 1e9),
           ") on device ", device_, "; ", num_streams, " copy streams (the GPU has ", prop.asyncEngineCount,
           " copy engines); ", registrations_.size(), " of ", options.host_regions.size(), " host regions page-locked",
           pageable > 0 ? absl::StrCat("; ", pageable, " experts' weights are in pageable memory (slower copies)") : "",
           poison_ ? "; freed buffers are poisoned" : "", "; experts ", layout(0).DTypeNames(),
           quantized_ ? absl::StrCat(" kept as blocks: decode GEMV up to ", kQuantGemvMaxRows,
                                     " rows, dequantized to bf16 + per-expert GEMMs above")
           : grouped_
               ? "; grouped GEMMs"
               : (!options.grouped_gemm ? "; per-expert GEMMs (asked for)"
                                        : (!kHaveGroupedGemm ? "; per-expert GEMMs (cuBLAS < 12.5)"
                                                             : "; per-expert GEMMs (rows not 16-byte aligned)")));
  return absl::OkStatus();
}

// The device (checked to exist), made current; its properties.
absl::StatusOr<cudaDeviceProp> CudaExpertPoolImpl::OpenDevice() {
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat(kCudaPoolKind, ": no usable CUDA device: ",
                     count_err != cudaSuccess ? cudaGetErrorString(count_err) : "the driver reports 0 devices"));
  }
  if (device_ < 0 || device_ >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device_, " out of range [0, ", count, ")"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaDeviceProp prop;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  return prop;
}

// The slots and staging buffers in one allocation (checked against the
// device's free memory), each with its events.
// Returns the bytes allocated.
absl::StatusOr<size_t> CudaExpertPoolImpl::AllocateBuffers() {
  const int total = num_slots() + num_staging_buffers();
  const size_t pool_bytes = static_cast<size_t>(total) * static_cast<size_t>(buffer_bytes());
  size_t free_bytes = 0, total_bytes = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (pool_bytes > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: %d slots + %d staging buffers need %.2f GB, device %d has %.2f GB free of %.2f GB", kCudaPoolKind,
        num_slots(), num_staging_buffers(), pool_bytes / 1e9, device_, free_bytes / 1e9, total_bytes / 1e9));
  }
  TANDEM_ASSIGN_OR_RETURN(memory_, DeviceBuffer::Allocate(pool_bytes));
  buffers_.resize(static_cast<size_t>(total));
  for (int b = 0; b < total; ++b) {
    Buffer& buffer = buffers_[static_cast<size_t>(b)];
    buffer.data = memory_.bytes() + static_cast<size_t>(b) * static_cast<size_t>(buffer_bytes());
    TANDEM_ASSIGN_OR_RETURN(buffer.start, CudaEvent::Create(/*timing=*/true));
    TANDEM_ASSIGN_OR_RETURN(buffer.ready, CudaEvent::Create(/*timing=*/true));
    TANDEM_ASSIGN_OR_RETURN(buffer.freed, CudaEvent::Create(/*timing=*/false));
  }
  return pool_bytes;
}

// Compute at the highest priority: a layer's experts should not queue
// behind copies' bookkeeping kernels (there are none today; cheap
// insurance). cuBLAS on the compute stream.
absl::Status CudaExpertPoolImpl::CreateStreams(int num_streams) {
  int least = 0, greatest = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TANDEM_ASSIGN_OR_RETURN(compute_stream_, CudaStream::Create(greatest));
  for (int s = 0; s < num_streams; ++s) {
    TANDEM_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(least));
    copy_streams_.push_back(std::move(stream));
  }
  TANDEM_ASSIGN_OR_RETURN(cublas_, CublasHandle::Create());
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_.get(), compute_stream_.get()));
  return absl::OkStatus();
}

// Never-written buffers read as NaN too. On the compute stream, like every
// later fill: the streams are non-blocking, so a fill on the legacy default
// stream would be ordered before nothing. Each buffer's `freed` event is
// recorded after it, so the first copy into any buffer (on a copy stream)
// waits for the fill on the GPU, as every later copy waits for the fill of
// its buffer's last free; placements run on the compute stream.
absl::Status CudaExpertPoolImpl::PoisonBuffers(size_t pool_bytes) {
  if (poison_ && pool_bytes > 0) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(memory_.get(), 0xFF, pool_bytes, compute_stream_.get()));
  }
  for (Buffer& buffer : buffers_) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(buffer.freed.get(), compute_stream_.get()));
  }
  return absl::OkStatus();
}

// Page-locks each of `regions` as the device and the mapping allow (or
// leaves it pageable, logged), then marks each expert whose three matrices
// all lie inside a locked one (source_pinned_).
absl::Status CudaExpertPoolImpl::RegisterHostRegions(const std::vector<PinnedHostRegion>& regions) {
  bool read_only_supported = false;
  std::string memory_map;
  if (!regions.empty()) {
    TANDEM_ASSIGN_OR_RETURN(read_only_supported, HostRegisterReadOnlySupported(device_));
    absl::StatusOr<std::string> map = ReadSelfMemoryMap();
    if (map.ok()) {
      memory_map = std::move(*map);
    } else {
      LOG_WARNING(kind(), ": ", map.status().message(), "; trying to page-lock every host region as writable");
    }
  }
  for (const PinnedHostRegion& region : regions) {
    // Unknown protection (no memory map): try; a refusal leaves it pageable.
    bool writable = true;
    if (!memory_map.empty()) {
      TANDEM_ASSIGN_OR_RETURN(writable, RangeWritableInPlace(memory_map, region.data, region.bytes));
    }
    HostPinMode mode = ChooseHostPinMode(read_only_supported, writable);
    const std::string what = absl::StrFormat("host region of %.1f MB at %p", region.bytes / 1e6, region.data);
    if (mode == HostPinMode::kPageable) {
      LOG_WARNING(kind(), ": ", what,
                  " stays pageable (copies from it are slower): the device cannot page-lock a "
                  "read-only mapping (cudaDevAttrHostRegisterReadOnlySupported is 0) and this one is not writable");
    } else {
      absl::StatusOr<HostRegistration> registration =
          HostRegistration::Register(region.data, region.bytes, mode == HostPinMode::kReadOnly);
      if (registration.ok()) {
        registrations_.push_back(std::move(*registration));
      } else {
        LOG_WARNING(kind(), ": ", what,
                    " stays pageable (copies from it are slower): ", registration.status().message());
        mode = HostPinMode::kPageable;
      }
    }
    host_pins_.push_back(mode);
  }
  for (size_t l = 0; l < experts().size(); ++l) {
    for (size_t e = 0; e < experts()[l].size(); ++e) {
      const ExpertSource& w = experts()[l][e];
      bool pinned = true;
      for (const auto& [pieces, dtype] :
           {std::pair{&w.w1, w.w1_dtype}, std::pair{&w.w3, w.w3_dtype}, std::pair{&w.w2, w.w2_dtype}}) {
        for (const MatrixPiece& piece : *pieces) {
          pinned &= std::any_of(registrations_.begin(), registrations_.end(), [&](const HostRegistration& r) {
            return r.Contains(piece.data, piece.SpanBytes(dtype));
          });
        }
      }
      source_pinned_[l * static_cast<size_t>(num_experts()) + e] = pinned;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::EnsureScratch(int64_t rows) {
  if (rows <= scratch_rows_) return absl::OkStatus();
  // Grow to a power of two so a slowly growing batch reallocates rarely:
  // cudaFree synchronises the device, which steady state must not do.
  int64_t capacity = 64;
  while (capacity < rows) capacity *= 2;
  const size_t d = static_cast<size_t>(layout(0).hidden_size), i = static_cast<size_t>(layout(0).intermediate_size);
  const size_t n = static_cast<size_t>(capacity), elt = DTypeSize(act_dtype_);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()));
  TANDEM_ASSIGN_OR_RETURN(x_f32_, DeviceBuffer::Allocate(n * d * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(x_act_, DeviceBuffer::Allocate(n * d * elt));
  TANDEM_ASSIGN_OR_RETURN(gate_up_, DeviceBuffer::Allocate(2 * n * i * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(h_act_, DeviceBuffer::Allocate(n * i * elt));
  TANDEM_ASSIGN_OR_RETURN(y_f32_, DeviceBuffer::Allocate(n * d * sizeof(float)));
  // f32 weights: the grouped down GEMM writes y_f32_ directly.
  if (act_dtype_ != DType::kF32 && !quantized_) {
    TANDEM_ASSIGN_OR_RETURN(y_act_, DeviceBuffer::Allocate(n * d * elt));
  }
  TANDEM_ASSIGN_OR_RETURN(in_host_, PinnedHostBuffer::Allocate(n * d * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(out_host_, PinnedHostBuffer::Allocate(n * d * sizeof(float)));
  scratch_rows_ = capacity;
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::EnsurePointerScratch(int64_t experts) {
  if (experts <= pointer_capacity_) return absl::OkStatus();
  int64_t capacity = std::max<int64_t>(8, num_experts());
  while (capacity < experts) capacity *= 2;
  // The previous call's pointer copy must be done before its buffers go
  // (RunExperts ends with this same synchronisation; cheap insurance).
  if (compute_stream_.get() != nullptr) TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()));
  const size_t bytes = 9 * static_cast<size_t>(capacity) * sizeof(void*);
  TANDEM_ASSIGN_OR_RETURN(pointers_host_, PinnedHostBuffer::Allocate(bytes));
  TANDEM_ASSIGN_OR_RETURN(pointers_device_, DeviceBuffer::Allocate(bytes));
  pointer_capacity_ = capacity;
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::EnsureDequantScratch() {
  if (dequant_.get() != nullptr) return absl::OkStatus();
  const size_t d = static_cast<size_t>(layout(0).hidden_size), i = static_cast<size_t>(layout(0).intermediate_size);
  TANDEM_ASSIGN_OR_RETURN(dequant_, DeviceBuffer::Allocate(3 * d * i * DTypeSize(DType::kBF16)));
  LOG_INFO(kind(), ": ", absl::StrFormat("%.1f MB", dequant_.size() / 1e6),
           " of bf16 scratch for quantized experts' batched GEMMs (outside the slot budget)");
  return absl::OkStatus();
}

void CudaExpertPoolImpl::DisableGrouped(const char* what) {
  grouped_ = false;
  LOG_WARNING(kind(), ": cuBLAS answered NOT_SUPPORTED for the grouped GEMM (", what, ", ", layout(0).DTypeNames(),
              "): per-expert GEMMs from now on");
}

absl::Status CudaExpertPoolImpl::WaitIssuedLocked(int buffer, ExpertKey key) {
  return WaitLocked(key, "start", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex()) {
    return issued_[static_cast<size_t>(buffer)] || StateLocked(buffer) != BufferState::kCopying;
  });
}

absl::Status CudaExpertPoolImpl::OnFreedLocked(int b) {
  Buffer& buffer = buffers_[static_cast<size_t>(b)];
  issued_[static_cast<size_t>(b)] = false;
  if (poison_) {
    // On the compute stream: after every computation already queued that
    // read the buffer; the next copy into it waits for `freed` on the GPU.
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(buffer.data, 0xFF, static_cast<size_t>(buffer_bytes()), compute_stream_.get()));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(buffer.freed.get(), compute_stream_.get()));
  }
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::IssueCopy(ExpertKey key, uint8_t* dst, cudaStream_t stream) {
  const ExpertSource& src = source(key);
  const ExpertLayout& l = layout(key.layer);
  // One copy per piece: a whole matrix (the model's own weights) or a
  // worker's slice of it; column slices (w2 under the split division) are
  // strided on both sides, which cudaMemcpy2DAsync does in one DMA. Block
  // types are copied as stored: a piece's row is whole blocks, its bytes
  // DTypeRowBytes of its values.
  auto copy = [&](const std::vector<MatrixPiece>& pieces, DType dtype, int64_t k, uint8_t* matrix) -> absl::Status {
    const size_t row_bytes = static_cast<size_t>(DTypeRowBytes(dtype, k));
    for (const MatrixPiece& p : pieces) {
      uint8_t* out = matrix + PieceOffsetBytes(p, dtype, k);
      const size_t piece_row = static_cast<size_t>(DTypeRowBytes(dtype, p.cols));
      if (p.col0 == 0 && p.cols == k && p.pitch == k) {
        TANDEM_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(out, p.data, static_cast<size_t>(p.rows) * piece_row, cudaMemcpyHostToDevice, stream));
      } else {
        TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(out, row_bytes, p.data,
                                                      static_cast<size_t>(DTypeRowBytes(dtype, p.pitch)), piece_row,
                                                      static_cast<size_t>(p.rows), cudaMemcpyHostToDevice, stream));
      }
    }
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(copy(src.w1, l.w1_dtype, l.hidden_size, dst + l.w1_offset));
  TANDEM_RETURN_IF_ERROR(copy(src.w3, l.w3_dtype, l.hidden_size, dst + l.w3_offset));
  TANDEM_RETURN_IF_ERROR(copy(src.w2, l.w2_dtype, l.intermediate_size, dst + l.w2_offset));
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::CopyNowLocked(int b, ExpertKey key) {
  Buffer& buffer = buffers_[static_cast<size_t>(b)];
  // On the compute stream (after any poison fill of the buffer): start-up
  // placement, not steady state.
  TANDEM_RETURN_IF_ERROR(IssueCopy(key, buffer.data, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()));
  if (!source_pinned_[Index(key)]) CountPageableCopyLocked();
  issued_[static_cast<size_t>(b)] = true;  // its `ready` event, if ever recorded, is complete
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint8_t>> CudaExpertPoolImpl::ReadHeld(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "read held"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const uint8_t* data = nullptr;
  {
    absl::MutexLock lock(&mutex());
    TANDEM_ASSIGN_OR_RETURN(const int b, WaitHeldLocked(key));
    data = buffers_[static_cast<size_t>(b)].data;
  }
  const ExpertLayout& l = layout(key.layer);
  std::vector<uint8_t> out(static_cast<size_t>(l.copy_bytes));
  const size_t b1 = static_cast<size_t>(l.w1_bytes), b3 = static_cast<size_t>(l.w3_bytes),
               b2 = static_cast<size_t>(l.w2_bytes);
  // On the compute stream: ordered after any poison fill queued there.
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data(), data + l.w1_offset, b1, cudaMemcpyDeviceToHost, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data() + b1, data + l.w3_offset, b3, cudaMemcpyDeviceToHost, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out.data() + b1 + b3, data + l.w2_offset, b2, cudaMemcpyDeviceToHost, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()));
  return out;
}

absl::Status CudaExpertPoolImpl::RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) {
  TANDEM_ASSIGN_OR_RETURN(const int64_t total_rows, CheckWork(layer, work));
  PoolRunTiming local;
  if (total_rows == 0) {
    if (timing != nullptr) *timing = local;
    return absl::OkStatus();
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  TANDEM_RETURN_IF_ERROR(EnsureScratch(total_rows));
  const int64_t d = layout(layer).hidden_size, t = total_rows;
  const auto wait_start = std::chrono::steady_clock::now();
  TANDEM_ASSIGN_OR_RETURN(const std::vector<Run> runs, IssuedRuns(layer, work));
  const auto compute_start = std::chrono::steady_clock::now();
  local.wait_us = MicrosBetween(wait_start, compute_start);

  const absl::Status computed = Compute(runs, t, layer);
  // This stream only: copies on the copy streams keep running. It also
  // completes this call's copies from pinned host memory (rows, matrix
  // pointers), so the next call may rewrite in_host_ and pointers_host_ —
  // on failure too, before the error goes back.
  const absl::Status synced = CudaStatus(cudaStreamSynchronize(compute_stream_.get()), "cudaStreamSynchronize");
  TANDEM_RETURN_IF_ERROR(computed);
  TANDEM_RETURN_IF_ERROR(synced);
  const float* out_host = static_cast<const float*>(out_host_.get());
  for (const Run& run : runs) {
    std::memcpy(run.entry->output, out_host + run.row_offset * d,
                static_cast<size_t>(run.entry->num_rows * d) * sizeof(float));
    ++(run.staging ? local.staging_runs : local.slot_runs);
  }
  local.compute_us = MicrosSince(compute_start);
  RecordRun(local);
  if (timing != nullptr) *timing = local;
  return absl::OkStatus();
}

// Which buffer each expert computes from, once its copy is issued (so the
// GPU has an event to wait on). The host waits only for the copy threads
// to reach the copy, never for the copy itself.
absl::StatusOr<std::vector<CudaExpertPoolImpl::Run>> CudaExpertPoolImpl::IssuedRuns(int layer,
                                                                                    std::span<const ExpertWork> work) {
  std::vector<Run> runs;
  absl::MutexLock lock(&mutex());
  int64_t offset = 0;
  for (const ExpertWork& entry : work) {
    if (entry.num_rows == 0) continue;
    if (entry.num_rows > INT_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(kind(), ": ", entry.num_rows, " rows for one expert exceed cuBLAS's int"));
    }
    const ExpertKey key{layer, entry.expert};
    const int position = PositionLocked(key);
    const int b = BufferAtLocked(position);
    TANDEM_RETURN_IF_ERROR(WaitIssuedLocked(b, key));
    const Buffer& buffer = buffers_[static_cast<size_t>(b)];
    runs.push_back({&entry, &source(key), offset, buffer.data, buffer.ready.get(), IsStaging(position)});
    offset += entry.num_rows;
  }
  return runs;
}

// The FFN of `runs` (T = `t` rows) into out_host_, queued on the compute
// stream. x: the experts' rows, packed [T, D] f32 → device → weights' type.
// The rows lie in separate host arrays: packing them here into pinned memory
// is the gather, and one DMA carries them all (a device gather kernel would
// need them on the device first).
absl::Status CudaExpertPoolImpl::Compute(const std::vector<Run>& runs, int64_t t, int layer) {
  const int64_t d = layout(layer).hidden_size, i = layout(layer).intermediate_size;
  const cudaStream_t stream = compute_stream_.get();
  float* in_host = static_cast<float*>(in_host_.get());
  float* out_host = static_cast<float*>(out_host_.get());
  for (const Run& run : runs) {
    std::memcpy(in_host + run.row_offset * d, run.entry->input,
                static_cast<size_t>(run.entry->num_rows * d) * sizeof(float));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(x_f32_.get(), in_host, static_cast<size_t>(t * d) * sizeof(float),
                                              cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchConvertF32(static_cast<const float*>(x_f32_.get()), x_act_.get(),
                                               ToKernelDType(act_dtype_), t * d, stream));
  bool done = false;
  if (quantized_) {
    TANDEM_RETURN_IF_ERROR(ComputeQuantized(runs, t, layout(layer)));
    done = true;
  } else if (grouped_.load(std::memory_order_relaxed)) {
    TANDEM_ASSIGN_OR_RETURN(done, ComputeGrouped(runs, t));
  }
  if (!done) {
    TANDEM_RETURN_IF_ERROR(GateUpPerExpert(runs, t));
    float* gate = static_cast<float*>(gate_up_.get());  // [T, I]
    TANDEM_CUDA_RETURN_IF_ERROR(
        LaunchSiluMul(gate, gate + t * i, h_act_.get(), ToKernelDType(act_dtype_), t * i, stream));
    TANDEM_RETURN_IF_ERROR(DownPerExpert(runs, t));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out_host, y_f32_.get(), static_cast<size_t>(t * d) * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream));
  return absl::OkStatus();
}

// Block-quantized experts, one at a time on the compute stream (the GPU
// waits for each expert's copy only). A decode-sized expert (rows <=
// kQuantGemvMaxRows) reads its blocks once in the decode GEMV, from the f32
// rows (gate/up) and the bf16 h (down); a larger one has its matrices
// dequantized to bf16 scratch and runs the bf16 GEMMs the float path runs,
// so the decode cost is paid once per matrix. One scratch for every
// expert: the stream orders each expert's use after the previous one's.
absl::Status CudaExpertPoolImpl::ComputeQuantized(const std::vector<Run>& runs, int64_t t, const ExpertLayout& l) {
  const cudaStream_t stream = compute_stream_.get();
  const int64_t d = l.hidden_size, i = l.intermediate_size;
  const float one = 1.0f, zero = 0.0f;
  const float* x_f32 = static_cast<const float*>(x_f32_.get());       // [T, D]
  const uint8_t* x_bf16 = static_cast<const uint8_t*>(x_act_.get());  // [T, D] bf16
  float* gate = static_cast<float*>(gate_up_.get());                  // [T, I] f32
  float* up = gate + t * i;                                           // [T, I] f32
  const uint8_t* h_bf16 = static_cast<const uint8_t*>(h_act_.get());  // [T, I] bf16
  float* y = static_cast<float*>(y_f32_.get());                       // [T, D] f32
  const size_t bf16 = DTypeSize(DType::kBF16);
  bool batched = false;
  for (const Run& run : runs) batched |= run.entry->num_rows > kQuantGemvMaxRows;
  if (batched) TANDEM_RETURN_IF_ERROR(EnsureDequantScratch());
  uint8_t* deq_w1 = dequant_.bytes();                                                              // [I, D] bf16
  uint8_t* deq_w2 = deq_w1 == nullptr ? nullptr : deq_w1 + 2 * static_cast<size_t>(i * d) * bf16;  // [D, I] bf16

  for (const Run& run : runs) {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, run.ready, 0));
    const int rows = static_cast<int>(run.entry->num_rows);
    const int64_t at = run.row_offset;
    if (rows <= kQuantGemvMaxRows) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          LaunchQuantGemv(run.data + l.w1_offset, ToKernelQuantType(l.w1_dtype, run.source->w1_order), i, d,
                          x_f32 + at * d, KernelDType::kF32, d, rows, gate + at * i, i, stream));
      TANDEM_CUDA_RETURN_IF_ERROR(LaunchQuantGemv(run.data + l.w3_offset,
                                                  ToKernelQuantType(l.w3_dtype, run.source->w3_order), i, d,
                                                  x_f32 + at * d, KernelDType::kF32, d, rows, up + at * i, i, stream));
      continue;
    }
    // w1 and w3 decoded next to each other: gate and up in one strided-batched GEMM.
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchDequantize(run.data + l.w1_offset,
                                                 ToKernelQuantType(l.w1_dtype, run.source->w1_order), i, d, deq_w1,
                                                 KernelDType::kBF16, stream));
    TANDEM_CUDA_RETURN_IF_ERROR(
        LaunchDequantize(run.data + l.w3_offset, ToKernelQuantType(l.w3_dtype, run.source->w3_order), i, d,
                         deq_w1 + static_cast<size_t>(i * d) * bf16, KernelDType::kBF16, stream));
    TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(i), rows, static_cast<int>(d), &one, deq_w1,
        CUDA_R_16BF, static_cast<int>(d), static_cast<long long>(i * d), x_bf16 + static_cast<size_t>(at * d) * bf16,
        CUDA_R_16BF, static_cast<int>(d), 0, &zero, gate + at * i, CUDA_R_32F, static_cast<int>(i),
        static_cast<long long>(t * i), 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchSiluMul(gate, up, h_act_.get(), KernelDType::kBF16, t * i, stream));
  for (const Run& run : runs) {
    const int rows = static_cast<int>(run.entry->num_rows);
    const int64_t at = run.row_offset;
    if (rows <= kQuantGemvMaxRows) {
      TANDEM_CUDA_RETURN_IF_ERROR(LaunchQuantGemv(
          run.data + l.w2_offset, ToKernelQuantType(l.w2_dtype, run.source->w2_order), d, i,
          h_bf16 + static_cast<size_t>(at * i) * bf16, KernelDType::kBF16, i, rows, y + at * d, d, stream));
      continue;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchDequantize(run.data + l.w2_offset,
                                                 ToKernelQuantType(l.w2_dtype, run.source->w2_order), d, i, deq_w2,
                                                 KernelDType::kBF16, stream));
    TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
        cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(d), rows, static_cast<int>(i), &one, deq_w2,
        CUDA_R_16BF, static_cast<int>(i), h_bf16 + static_cast<size_t>(at * i) * bf16, CUDA_R_16BF, static_cast<int>(i),
        &zero, y + at * d, CUDA_R_32F, static_cast<int>(d), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return absl::OkStatus();
}

// Matrix pointers, 9E in one array: gate/up A [2E] (w1, w3 per expert),
// B [2E] (the expert's rows, twice), C [2E] (its gate rows, its up rows);
// down A [E] (w2), B [E] (its h rows), C [E] (its output rows), into
// pointers_host_; and the groups' shapes into gate_up_args_ and down_args_.
// gate/up/h are in the weights' type (cuBLAS's grouped GEMM has no bf16 → f32).
void CudaExpertPoolImpl::FillGroupedPointers(const std::vector<Run>& runs, int64_t t) {
  const ExpertLayout& l = layout(0);
  const int64_t d = l.hidden_size, i = l.intermediate_size;
  const size_t elt = DTypeSize(act_dtype_);
  const int64_t e = static_cast<int64_t>(runs.size());
  uint8_t* x = x_act_.bytes();
  uint8_t* gate = gate_up_.bytes();                                          // [T, I] weights' type
  uint8_t* up = gate + static_cast<size_t>(t * i) * elt;                     // [T, I] weights' type
  uint8_t* h = h_act_.bytes();                                               // [T, I] weights' type
  uint8_t* y = act_dtype_ == DType::kF32 ? y_f32_.bytes() : y_act_.bytes();  // [T, D] weights' type
  void** p = static_cast<void**>(pointers_host_.get());
  void** gu_a = p;
  void** gu_b = p + 2 * e;
  void** gu_c = p + 4 * e;
  void** dn_a = p + 6 * e;
  void** dn_b = p + 7 * e;
  void** dn_c = p + 8 * e;
  gate_up_args_.Clear();
  down_args_.Clear();
  for (int64_t r = 0; r < e; ++r) {
    const Run& run = runs[static_cast<size_t>(r)];
    const int rows = static_cast<int>(run.entry->num_rows);
    const size_t x_at = static_cast<size_t>(run.row_offset * d) * elt;
    const size_t h_at = static_cast<size_t>(run.row_offset * i) * elt;
    // The weights are read only; cuBLAS's arrays are of const void*.
    gu_a[2 * r] = const_cast<uint8_t*>(run.data + l.w1_offset);
    gu_a[2 * r + 1] = const_cast<uint8_t*>(run.data + l.w3_offset);
    gu_b[2 * r] = gu_b[2 * r + 1] = x + x_at;
    gu_c[2 * r] = gate + h_at;
    gu_c[2 * r + 1] = up + h_at;
    dn_a[r] = const_cast<uint8_t*>(run.data + l.w2_offset);
    dn_b[r] = h + h_at;
    dn_c[r] = y + x_at;
    gate_up_args_.Add(static_cast<int>(i), rows, static_cast<int>(d), static_cast<int>(d), static_cast<int>(d),
                      static_cast<int>(i), 2);
    down_args_.Add(static_cast<int>(d), rows, static_cast<int>(i), static_cast<int>(i), static_cast<int>(i),
                   static_cast<int>(d), 1);
  }
}

absl::StatusOr<bool> CudaExpertPoolImpl::ComputeGrouped(const std::vector<Run>& runs, int64_t t) {
#if defined(CUBLAS_VERSION) && CUBLAS_VERSION >= 120500
  const cudaStream_t stream = compute_stream_.get();
  const ExpertLayout& l = layout(0);
  const int64_t d = l.hidden_size, i = l.intermediate_size;
  const size_t elt = DTypeSize(act_dtype_);
  const int64_t e = static_cast<int64_t>(runs.size());
  TANDEM_RETURN_IF_ERROR(EnsurePointerScratch(e));

  // The GPU (not the host) waits for every expert's copy, and only for
  // those: the grouped GEMM reads them all.
  for (const Run& run : runs) TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, run.ready, 0));
  FillGroupedPointers(runs, t);
  uint8_t* gate = gate_up_.bytes();                       // [T, I] weights' type
  uint8_t* up = gate + static_cast<size_t>(t * i) * elt;  // [T, I] weights' type
  uint8_t* h = h_act_.bytes();                            // [T, I] weights' type
  const bool f32 = act_dtype_ == DType::kF32;
  uint8_t* y = f32 ? y_f32_.bytes() : y_act_.bytes();  // [T, D] weights' type
  // Ordered before the GEMMs on this stream; pointers_host_ is not touched
  // again until RunExperts' final synchronisation.
  void** dev = static_cast<void**>(pointers_device_.get());
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dev, pointers_host_.get(), 9 * static_cast<size_t>(e) * sizeof(void*),
                                              cudaMemcpyHostToDevice, stream));

  const cudaDataType w_type = CudaDataType(act_dtype_);
  const GroupedGemmArgs& gu = gate_up_args_;
  const cublasStatus_t gate_up_status =
      cublasGemmGroupedBatchedEx(cublas_.get(), gu.transa.data(), gu.transb.data(), gu.m.data(), gu.n.data(),
                                 gu.k.data(), gu.alpha.data(), reinterpret_cast<const void* const*>(dev), w_type,
                                 gu.lda.data(), reinterpret_cast<const void* const*>(dev + 2 * e), w_type,
                                 gu.ldb.data(), gu.beta.data(), reinterpret_cast<void* const*>(dev + 4 * e), w_type,
                                 gu.ldc.data(), gu.groups(), gu.group_size.data(), CUBLAS_COMPUTE_32F);
  if (gate_up_status == CUBLAS_STATUS_NOT_SUPPORTED) {
    DisableGrouped("gate/up");
    return false;  // nothing queued writes gate/up/y: the per-expert path starts afresh
  }
  TANDEM_RETURN_IF_ERROR(CublasStatus(gate_up_status, "cublasGemmGroupedBatchedEx (gate/up)"));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchSiluMulSameType(gate, up, h, ToKernelDType(act_dtype_), t * i, stream));

  const GroupedGemmArgs& dn = down_args_;
  const cublasStatus_t down_status =
      cublasGemmGroupedBatchedEx(cublas_.get(), dn.transa.data(), dn.transb.data(), dn.m.data(), dn.n.data(),
                                 dn.k.data(), dn.alpha.data(), reinterpret_cast<const void* const*>(dev + 6 * e),
                                 w_type, dn.lda.data(), reinterpret_cast<const void* const*>(dev + 7 * e), w_type,
                                 dn.ldb.data(), dn.beta.data(), reinterpret_cast<void* const*>(dev + 8 * e), w_type,
                                 dn.ldc.data(), dn.groups(), dn.group_size.data(), CUBLAS_COMPUTE_32F);
  if (down_status == CUBLAS_STATUS_NOT_SUPPORTED) {
    // h is in the weights' type on both paths: the per-expert down GEMMs
    // take over from here, writing y_f32_ themselves.
    DisableGrouped("down");
    TANDEM_RETURN_IF_ERROR(DownPerExpert(runs, t));
    return true;
  }
  TANDEM_RETURN_IF_ERROR(CublasStatus(down_status, "cublasGemmGroupedBatchedEx (down)"));
  if (!f32)
    TANDEM_CUDA_RETURN_IF_ERROR(
        LaunchConvertToF32(y, ToKernelDType(act_dtype_), static_cast<float*>(y_f32_.get()), t * d, stream));
  return true;
#else
  (void)runs;
  (void)t;
  return false;
#endif
}

absl::Status CudaExpertPoolImpl::GateUpPerExpert(const std::vector<Run>& runs, int64_t t) {
  const cudaStream_t stream = compute_stream_.get();
  const int64_t d = layout(0).hidden_size, i = layout(0).intermediate_size;
  const size_t elt = DTypeSize(act_dtype_);
  // Row-major Y[R, N] = X[R, K] · W[N, K]ᵀ is column-major Yᵀ[N, R] = W · Xᵀ:
  // cuBLAS sees W as a K×N column-major matrix (op T) and X as K×R (op N).
  const cudaDataType w_type = CudaDataType(act_dtype_);
  const float one = 1.0f, zero = 0.0f;
  float* gate = static_cast<float*>(gate_up_.get());  // [T, I] f32
  for (const Run& run : runs) {
    // The GPU (not the host) waits for this expert's copy, and only for it:
    // the first experts compute while later ones' copies land.
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, run.ready, 0));
    const int rows = static_cast<int>(run.entry->num_rows);
    // gate and up in one call: batch 0 reads w1 and writes gate, batch 1
    // reads w3 (w3_offset further on) and writes up (T·I further on).
    TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(i), rows, static_cast<int>(d), &one,
        run.data + layout(0).w1_offset, w_type, static_cast<int>(d),
        static_cast<long long>((layout(0).w3_offset - layout(0).w1_offset) / static_cast<int64_t>(elt)),
        static_cast<const uint8_t*>(x_act_.get()) + static_cast<size_t>(run.row_offset * d) * elt, w_type,
        static_cast<int>(d), 0, &zero, gate + run.row_offset * i, CUDA_R_32F, static_cast<int>(i),
        static_cast<long long>(t * i), 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::DownPerExpert(const std::vector<Run>& runs, int64_t t) {
  (void)t;
  const int64_t d = layout(0).hidden_size, i = layout(0).intermediate_size;
  const size_t elt = DTypeSize(act_dtype_);
  const cudaDataType w_type = CudaDataType(act_dtype_);
  const float one = 1.0f, zero = 0.0f;
  float* y = static_cast<float*>(y_f32_.get());  // [T, D]
  for (const Run& run : runs) {
    const int rows = static_cast<int>(run.entry->num_rows);
    TANDEM_CUBLAS_RETURN_IF_ERROR(
        cublasGemmEx(cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(d), rows, static_cast<int>(i), &one,
                     run.data + layout(0).w2_offset, w_type, static_cast<int>(i),
                     static_cast<const uint8_t*>(h_act_.get()) + static_cast<size_t>(run.row_offset * i) * elt, w_type,
                     static_cast<int>(i), &zero, y + run.row_offset * d, CUDA_R_32F, static_cast<int>(d),
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  return absl::OkStatus();
}

void CudaExpertPoolImpl::CopyLoop(int stream_index) {
  pthread_setname_np(pthread_self(), absl::StrCat("pool-copy", stream_index).c_str());
  const cudaStream_t stream = copy_streams_[static_cast<size_t>(stream_index)].get();
  absl::Status status = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  mutex().Lock();
  while (std::optional<CopyTask> task = NextCopyLocked()) {
    // The buffer is kCopying: nobody else touches its bytes or events until
    // it is ready (frees wait for that), and buffers_ never reallocates.
    Buffer& buffer = buffers_[static_cast<size_t>(task->buffer)];
    const bool pinned = source_pinned_[Index(task->expert)];
    mutex().Unlock();
    const double issue_us = NowUs();
    if (status.ok()) status = CudaStatus(cudaStreamWaitEvent(stream, buffer.freed.get(), 0), "cudaStreamWaitEvent");
    if (status.ok()) status = CudaStatus(cudaEventRecord(buffer.start.get(), stream), "cudaEventRecord");
    if (status.ok()) status = IssueCopy(task->expert, buffer.data, stream);
    if (status.ok()) status = CudaStatus(cudaEventRecord(buffer.ready.get(), stream), "cudaEventRecord");
    if (status.ok()) {
      {
        absl::MutexLock lock(&mutex());
        issued_[static_cast<size_t>(task->buffer)] = true;
      }
      NotifyReady();
    }
    // This thread (only) sleeps until its copy lands; the other stream's
    // thread keeps its copy engine busy meanwhile.
    if (status.ok()) status = CudaStatus(cudaEventSynchronize(buffer.ready.get()), "cudaEventSynchronize");
    float copy_ms = 0;
    if (status.ok()) {
      status =
          CudaStatus(cudaEventElapsedTime(&copy_ms, buffer.start.get(), buffer.ready.get()), "cudaEventElapsedTime");
    }
    mutex().Lock();
    if (!status.ok()) {
      CopyFailedLocked(task->expert, status);
      continue;  // drain the queue; every wait returns the first failure
    }
    if (!pinned) CountPageableCopyLocked();
    CopyDoneLocked(*task, issue_us, static_cast<double>(copy_ms) * 1e3);
  }
  mutex().Unlock();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaExpertPool>> CudaExpertPool::Create(const ModelConfig& config, ExpertSources experts,
                                                                       const CudaExpertPoolOptions& options) {
  TANDEM_ASSIGN_OR_RETURN(ExpertLayouts layouts, CheckExpertSources(config, experts));
  TANDEM_RETURN_IF_ERROR(CheckGpuPoolLayouts(layouts));
  const int64_t d = layouts[0].hidden_size, i = layouts[0].intermediate_size;
  if (d > (1 << 30) || i > (1 << 30))
    return absl::InvalidArgumentError("hidden/intermediate size too large for cuBLAS int dims");
  // Slots sized by the experts as stored: quantized blocks fit more slots
  // in the same budget.
  TANDEM_ASSIGN_OR_RETURN(const int num_slots, options.pool.SlotCount(MaxBufferBytes(layouts)));
  auto pool = std::make_unique<CudaExpertPoolImpl>(config, std::move(experts), std::move(layouts), num_slots, options);
  TANDEM_RETURN_IF_ERROR(pool->Init(options));
  return std::unique_ptr<CudaExpertPool>(std::move(pool));
}

}  // namespace tandem
