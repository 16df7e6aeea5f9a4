// The CUDA expert pool (cuda_expert_pool.h). Host C++20 against the CUDA
// runtime and cuBLAS (the interface uses std::span, which nvcc's C++17 cannot
// see); the kernels are in cuda_expert_kernels.cu. Built only with CUDA
// (gpu_worker/CMakeLists.txt: cuda_*.cc); cuda_expert_pool_stub.cc stands in
// otherwise.
#include "gpu_worker/cuda_expert_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "gpu_worker/cuda_expert_kernels.h"
#include "gpu_worker/cuda_handles.h"

namespace tandem {
namespace {

// A copy that has not finished (or started) in this long is a bug, not a
// slow copy: fail the step rather than hang it.
constexpr auto kReadyTimeout = std::chrono::seconds(60);

std::string KeyName(ExpertKey key) { return absl::StrCat("layer ", key.layer, " expert ", key.expert); }

absl::Status CheckMatrix(const LinearWeight& w, DType dtype, int64_t n, int64_t k, const std::string& name) {
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " has no data"));
  if (w.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is ", std::string(DTypeName(w.dtype)),
                                                   ", the pool's experts are ", std::string(DTypeName(dtype))));
  }
  if (w.n != n || w.k != k) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is [", w.n, ", ", w.k, "], expected [", n, ", ", k, "]"));
  }
  return absl::OkStatus();
}

cudaDataType CudaType(DType dtype) {
  switch (dtype) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

KernelDType KernelType(DType dtype) { return static_cast<KernelDType>(static_cast<uint8_t>(dtype)); }

class CudaExpertPoolImpl final : public CudaExpertPool {
 public:
  CudaExpertPoolImpl(const ModelConfig& config, std::vector<std::vector<ExpertWeights>> experts,
                     const ExpertLayout& layout, int num_slots, const CudaExpertPoolOptions& options)
      : experts_(std::move(experts)),
        num_experts_(static_cast<int>(config.num_local_experts)),
        layout_(layout),
        num_slots_(num_slots),
        num_staging_(options.pool.num_staging_buffers),
        device_(options.device),
        poison_(options.poison_freed_buffers),
        epoch_(std::chrono::steady_clock::now()),
        where_(experts_.size() * static_cast<size_t>(num_experts_), -1),
        source_pinned_(experts_.size() * static_cast<size_t>(num_experts_), false) {}

  ~CudaExpertPoolImpl() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : copy_threads_) {
      if (t.joinable()) t.join();
    }
    // The compute stream may still run a poison fill; let it finish before
    // the buffers go (cudaFree would wait anyway, this makes it explicit).
    if (compute_stream_.get() != nullptr) (void)cudaStreamSynchronize(compute_stream_.get());
  }

  absl::Status Init(const CudaExpertPoolOptions& options);

  std::string kind() const override { return kind_; }
  const ExpertLayout& layout() const override { return layout_; }
  int num_layers() const override { return static_cast<int>(experts_.size()); }
  int num_experts() const override { return num_experts_; }
  int num_slots() const override { return num_slots_; }
  int num_staging_buffers() const override { return num_staging_; }

  absl::Status Place(ExpertKey key) override;
  absl::Status Migrate(ExpertKey key, std::optional<ExpertKey> evict) override;
  absl::Status Stage(ExpertKey key) override;
  absl::Status Admit(ExpertKey key, std::optional<ExpertKey> evict) override;
  absl::Status Evict(ExpertKey key) override;
  absl::Status ReleaseStaging() override;

  PoolLocation Find(ExpertKey key) const override;
  bool IsReady(ExpertKey key) const override;
  absl::Status WaitReady(ExpertKey key) override;
  std::vector<PoolSlot> SlotTable() const override;

  absl::Status RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) override;

  std::vector<MigrationRecord> TakeCompletedMigrations() override;
  ExpertPoolStats stats() const override;
  void ResetStats() override;

  absl::StatusOr<std::vector<uint8_t>> ReadHeld(ExpertKey key) override;
  int64_t pageable_copies() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return pageable_copies_;
  }

 private:
  struct Buffer {
    uint8_t* data = nullptr;  // [layout_.buffer_bytes] device, inside memory_
    std::optional<ExpertKey> expert;
    BufferState state = BufferState::kFree;
    bool issued = false;  // the current copy's `ready` is recorded: the GPU can wait on it
    CudaEvent start;      // before the copy's first byte (timing)
    CudaEvent ready;      // after its last byte: RunExperts' compute stream waits on it
    CudaEvent freed;      // after the poison fill: the next copy into the buffer waits on it
  };
  struct CopyTask {
    int buffer = 0;
    ExpertKey expert;
    bool staging = false;
    double queued_at_us = 0;
  };

  absl::Status CheckKey(ExpertKey key, const char* what) const {
    if (key.layer < 0 || key.layer >= num_layers() || key.expert < 0 || key.expert >= num_experts_) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", KeyName(key), " is outside the model (", num_layers(),
                                                     " layers x ", num_experts_, " experts)"));
    }
    return absl::OkStatus();
  }
  size_t Index(ExpertKey key) const {
    return static_cast<size_t>(key.layer) * static_cast<size_t>(num_experts_) + static_cast<size_t>(key.expert);
  }
  bool IsStaging(int position) const { return position >= num_slots_; }
  Buffer& BufferAt(int position) {
    return buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(position)])];
  }
  const Buffer& BufferAt(int position) const {
    return buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(position)])];
  }
  double NowUs() const {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
  }

  absl::StatusOr<int> TakeSlotLocked(std::unique_lock<std::mutex>& lock, std::optional<ExpertKey> evict);
  // Waits (releasing `lock`) until `buffer`'s copy is done.
  absl::Status WaitBufferLocked(std::unique_lock<std::mutex>& lock, int buffer, ExpertKey key);
  // Waits until `buffer`'s copy is issued (its `ready` event recorded).
  absl::Status WaitIssuedLocked(std::unique_lock<std::mutex>& lock, int buffer, ExpertKey key);
  absl::Status EvictPositionLocked(int position);
  void Enqueue(std::unique_lock<std::mutex>& lock, int position, ExpertKey key);
  // Issues w1, w3, w2 host→device into `dst` on `stream`.
  absl::Status IssueCopy(ExpertKey key, uint8_t* dst, cudaStream_t stream);
  absl::Status EnsureScratch(int64_t rows);
  void CopyLoop(int stream_index);

  const std::vector<std::vector<ExpertWeights>> experts_;  // [layer][expert] host source views
  const int num_experts_;
  const ExpertLayout layout_;
  const int num_slots_;
  const int num_staging_;
  const int device_;
  const bool poison_;
  const std::chrono::steady_clock::time_point epoch_;
  std::string kind_ = kCudaPoolKind;

  // CUDA resources (created by Init; destroyed after the copy threads join).
  std::vector<HostRegistration> registrations_;
  DeviceBuffer memory_;  // [(slots + staging) * buffer_bytes] the budget
  CudaStream compute_stream_;
  std::vector<CudaStream> copy_streams_;
  CublasHandle cublas_;
  // Scratch for RunExperts (engine thread only): capacity in rows.
  int64_t scratch_rows_ = 0;
  DeviceBuffer x_f32_;     // [T, D] f32
  DeviceBuffer x_act_;     // [T, D] weights' type
  DeviceBuffer gate_up_;   // [2, T, I] f32: gate rows, then up rows
  DeviceBuffer h_act_;     // [T, I] weights' type
  DeviceBuffer y_f32_;     // [T, D] f32
  PinnedHostBuffer in_host_;   // [T, D] f32
  PinnedHostBuffer out_host_;  // [T, D] f32

  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;  // a copy was issued or finished, or failed
  std::condition_variable work_cv_;   // a copy was queued, or stop
  std::vector<Buffer> buffers_;       // [slots + staging]
  std::vector<int> position_buffer_;  // [slots + staging] position -> buffer
  std::vector<int> where_;            // [L * E] position holding the expert, or -1
  std::vector<bool> source_pinned_;   // [L * E] all three matrices inside a registered region
  std::deque<CopyTask> queue_;
  std::vector<MigrationRecord> completed_;
  ExpertPoolStats stats_;
  int64_t pageable_copies_ = 0;
  absl::Status copy_error_;  // the first failed copy: every later wait returns it
  bool stop_ = false;
  std::vector<std::thread> copy_threads_;
};

absl::Status CudaExpertPoolImpl::Init(const CudaExpertPoolOptions& options) {
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(kCudaPoolKind, ": no usable CUDA device: ",
                                               count_err != cudaSuccess ? cudaGetErrorString(count_err)
                                                                        : "the driver reports 0 devices"));
  }
  if (device_ < 0 || device_ >= count) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device_, " out of range [0, ", count, ")"));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  cudaDeviceProp prop;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, device_));
  kind_ = absl::StrCat(kCudaPoolKind, " on ", prop.name);
  stats_.kind = kind_;

  const int total = num_slots_ + num_staging_;
  const size_t pool_bytes = static_cast<size_t>(total) * static_cast<size_t>(layout_.buffer_bytes);
  size_t free_bytes = 0, total_bytes = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (pool_bytes > free_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s: %d slots + %d staging buffers need %.2f GB, device %d has %.2f GB free of %.2f GB", kCudaPoolKind,
        num_slots_, num_staging_, pool_bytes / 1e9, device_, free_bytes / 1e9, total_bytes / 1e9));
  }
  TANDEM_ASSIGN_OR_RETURN(memory_, DeviceBuffer::Allocate(pool_bytes));
  buffers_.resize(static_cast<size_t>(total));
  for (int b = 0; b < total; ++b) {
    Buffer& buffer = buffers_[static_cast<size_t>(b)];
    buffer.data = memory_.bytes() + static_cast<size_t>(b) * static_cast<size_t>(layout_.buffer_bytes);
    TANDEM_ASSIGN_OR_RETURN(buffer.start, CudaEvent::Create(/*timing=*/true));
    TANDEM_ASSIGN_OR_RETURN(buffer.ready, CudaEvent::Create(/*timing=*/true));
    TANDEM_ASSIGN_OR_RETURN(buffer.freed, CudaEvent::Create(/*timing=*/false));
    position_buffer_.push_back(b);
  }
  if (poison_ && pool_bytes > 0) {
    // Never-written buffers read as NaN too.
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(memory_.get(), 0xFF, pool_bytes));
  }

  // Compute at the highest priority: a layer's experts should not queue
  // behind copies' bookkeeping kernels (there are none today; cheap insurance).
  int least = 0, greatest = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  TANDEM_ASSIGN_OR_RETURN(compute_stream_, CudaStream::Create(greatest));
  const int num_streams = std::max(1, options.num_copy_streams);
  for (int s = 0; s < num_streams; ++s) {
    TANDEM_ASSIGN_OR_RETURN(CudaStream stream, CudaStream::Create(least));
    copy_streams_.push_back(std::move(stream));
  }
  TANDEM_ASSIGN_OR_RETURN(cublas_, CublasHandle::Create());
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas_.get(), compute_stream_.get()));

  for (const PinnedHostRegion& region : options.host_regions) {
    TANDEM_ASSIGN_OR_RETURN(HostRegistration registration,
                            HostRegistration::Register(region.data, region.bytes, region.read_only));
    registrations_.push_back(std::move(registration));
  }
  int64_t pageable = 0;
  for (size_t l = 0; l < experts_.size(); ++l) {
    for (size_t e = 0; e < experts_[l].size(); ++e) {
      const ExpertWeights& w = experts_[l][e];
      const size_t bytes = static_cast<size_t>(layout_.matrix_bytes);
      bool pinned = true;
      for (const LinearWeight* m : {&w.w1, &w.w3, &w.w2}) {
        pinned &= std::any_of(registrations_.begin(), registrations_.end(),
                              [&](const HostRegistration& r) { return r.Contains(m->data, bytes); });
      }
      source_pinned_[l * static_cast<size_t>(num_experts_) + e] = pinned;
      pageable += !pinned;
    }
  }
  if (options.max_rows > 0) TANDEM_RETURN_IF_ERROR(EnsureScratch(options.max_rows));

  for (int s = 0; s < num_streams; ++s) copy_threads_.emplace_back([this, s] { CopyLoop(s); });
  LOG_INFO(kind_, ": ", num_slots_, " slots + ", num_staging_, " staging buffers of ",
           absl::StrFormat("%.2f MB", layout_.buffer_bytes / 1e6), " (", absl::StrFormat("%.2f GB", pool_bytes / 1e9),
           ") on device ", device_, "; ", num_streams, " copy streams (the GPU has ", prop.asyncEngineCount,
           " copy engines); ", registrations_.size(), " host regions registered",
           pageable > 0 ? absl::StrCat("; ", pageable, " experts' weights are in pageable memory (slower copies)") : "",
           poison_ ? "; freed buffers are poisoned" : "");
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::EnsureScratch(int64_t rows) {
  if (rows <= scratch_rows_) return absl::OkStatus();
  // Grow to a power of two so a slowly growing batch reallocates rarely:
  // cudaFree synchronises the device, which steady state must not do.
  int64_t capacity = 64;
  while (capacity < rows) capacity *= 2;
  const size_t d = static_cast<size_t>(layout_.hidden_size), i = static_cast<size_t>(layout_.intermediate_size);
  const size_t n = static_cast<size_t>(capacity), elt = DTypeSize(layout_.dtype);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()));
  TANDEM_ASSIGN_OR_RETURN(x_f32_, DeviceBuffer::Allocate(n * d * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(x_act_, DeviceBuffer::Allocate(n * d * elt));
  TANDEM_ASSIGN_OR_RETURN(gate_up_, DeviceBuffer::Allocate(2 * n * i * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(h_act_, DeviceBuffer::Allocate(n * i * elt));
  TANDEM_ASSIGN_OR_RETURN(y_f32_, DeviceBuffer::Allocate(n * d * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(in_host_, PinnedHostBuffer::Allocate(n * d * sizeof(float)));
  TANDEM_ASSIGN_OR_RETURN(out_host_, PinnedHostBuffer::Allocate(n * d * sizeof(float)));
  scratch_rows_ = capacity;
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::WaitBufferLocked(std::unique_lock<std::mutex>& lock, int buffer, ExpertKey key) {
  const bool done = ready_cv_.wait_for(lock, kReadyTimeout, [&] {
    return buffers_[static_cast<size_t>(buffer)].state != BufferState::kCopying || !copy_error_.ok();
  });
  if (!copy_error_.ok()) return copy_error_;
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(kind_, ": the copy of ", KeyName(key), " did not finish in ",
                                                    std::chrono::seconds(kReadyTimeout).count(), " s"));
  }
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::WaitIssuedLocked(std::unique_lock<std::mutex>& lock, int buffer, ExpertKey key) {
  const bool done = ready_cv_.wait_for(lock, kReadyTimeout, [&] {
    const Buffer& b = buffers_[static_cast<size_t>(buffer)];
    return b.issued || b.state != BufferState::kCopying || !copy_error_.ok();
  });
  if (!copy_error_.ok()) return copy_error_;
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(kind_, ": the copy of ", KeyName(key), " did not start in ",
                                                    std::chrono::seconds(kReadyTimeout).count(), " s"));
  }
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::EvictPositionLocked(int position) {
  Buffer& buffer = BufferAt(position);
  if (buffer.expert) where_[Index(*buffer.expert)] = -1;
  buffer.expert.reset();
  buffer.state = BufferState::kFree;
  buffer.issued = false;
  if (poison_) {
    // On the compute stream: after every computation already queued that
    // read the buffer; the next copy into it waits for `freed` on the GPU.
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(buffer.data, 0xFF, static_cast<size_t>(layout_.buffer_bytes), compute_stream_.get()));
    TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(buffer.freed.get(), compute_stream_.get()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CudaExpertPoolImpl::TakeSlotLocked(std::unique_lock<std::mutex>& lock,
                                                        std::optional<ExpertKey> evict) {
  if (evict) {
    TANDEM_RETURN_IF_ERROR(CheckKey(*evict, "evict"));
    const int position = where_[Index(*evict)];
    if (position < 0 || IsStaging(position)) {
      return absl::FailedPreconditionError(absl::StrCat("evict: ", KeyName(*evict), " holds no slot"));
    }
    TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, position_buffer_[static_cast<size_t>(position)], *evict));
    TANDEM_RETURN_IF_ERROR(EvictPositionLocked(position));
    ++stats_.evictions;
    return position;
  }
  for (int s = 0; s < num_slots_; ++s) {
    if (!BufferAt(s).expert) return s;
  }
  return absl::ResourceExhaustedError(absl::StrCat(kind_, ": all ", num_slots_, " slots are taken"));
}

void CudaExpertPoolImpl::Enqueue(std::unique_lock<std::mutex>& lock, int position, ExpertKey key) {
  const int b = position_buffer_[static_cast<size_t>(position)];
  Buffer& buffer = buffers_[static_cast<size_t>(b)];
  buffer.expert = key;
  buffer.state = BufferState::kCopying;
  buffer.issued = false;
  where_[Index(key)] = position;
  queue_.push_back({b, key, IsStaging(position), NowUs()});
  ++stats_.migrations_started;
  if (IsStaging(position)) ++stats_.staging_copies;
  lock.unlock();
  work_cv_.notify_one();
}

absl::Status CudaExpertPoolImpl::IssueCopy(ExpertKey key, uint8_t* dst, cudaStream_t stream) {
  const ExpertWeights& src = experts_[static_cast<size_t>(key.layer)][static_cast<size_t>(key.expert)];
  const size_t bytes = static_cast<size_t>(layout_.matrix_bytes);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + layout_.w1_offset, src.w1.data, bytes, cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + layout_.w3_offset, src.w3.data, bytes, cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst + layout_.w2_offset, src.w2.data, bytes, cudaMemcpyHostToDevice, stream));
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::Place(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "place"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::unique_lock<std::mutex> lock(mutex_);
  if (where_[Index(key)] >= 0) return absl::FailedPreconditionError(absl::StrCat("place: ", KeyName(key), " is already held"));
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(lock, std::nullopt));
  Buffer& buffer = BufferAt(position);
  // Synchronous, on the compute stream (after any poison fill of the buffer):
  // start-up placement, not steady state.
  TANDEM_RETURN_IF_ERROR(IssueCopy(key, buffer.data, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()));
  buffer.expert = key;
  buffer.state = BufferState::kReady;
  buffer.issued = true;  // its `ready` event, if ever recorded, is complete
  where_[Index(key)] = position;
  ++stats_.placements;
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::Migrate(ExpertKey key, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "migrate"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::unique_lock<std::mutex> lock(mutex_);
  if (where_[Index(key)] >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("migrate: ", KeyName(key), " is already held"));
  }
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(lock, evict));
  Enqueue(lock, position, key);
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::Stage(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "stage"));
  std::unique_lock<std::mutex> lock(mutex_);
  if (where_[Index(key)] >= 0) return absl::FailedPreconditionError(absl::StrCat("stage: ", KeyName(key), " is already held"));
  for (int j = 0; j < num_staging_; ++j) {
    const int position = num_slots_ + j;
    if (!BufferAt(position).expert) {
      Enqueue(lock, position, key);
      return absl::OkStatus();
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(kind_, ": all ", num_staging_, " staging buffers are taken (stage ", KeyName(key), ")"));
}

absl::Status CudaExpertPoolImpl::Admit(ExpertKey key, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "admit"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::unique_lock<std::mutex> lock(mutex_);
  const int staged = where_[Index(key)];
  if (staged < 0 || !IsStaging(staged)) {
    return absl::FailedPreconditionError(absl::StrCat("admit: ", KeyName(key), " is not in a staging buffer"));
  }
  TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, position_buffer_[static_cast<size_t>(staged)], key));
  TANDEM_ASSIGN_OR_RETURN(const int slot, TakeSlotLocked(lock, evict));
  // No copy: the slot takes the staging buffer (and its events), the staging
  // position the slot's (now free) buffer.
  std::swap(position_buffer_[static_cast<size_t>(slot)], position_buffer_[static_cast<size_t>(staged)]);
  where_[Index(key)] = slot;
  ++stats_.admissions;
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::Evict(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "evict"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::unique_lock<std::mutex> lock(mutex_);
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(lock, key));
  (void)position;
  return absl::OkStatus();
}

absl::Status CudaExpertPoolImpl::ReleaseStaging() {
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::unique_lock<std::mutex> lock(mutex_);
  for (int j = 0; j < num_staging_; ++j) {
    const int position = num_slots_ + j;
    const int b = position_buffer_[static_cast<size_t>(position)];
    if (!buffers_[static_cast<size_t>(b)].expert) continue;
    TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, b, *buffers_[static_cast<size_t>(b)].expert));
    TANDEM_RETURN_IF_ERROR(EvictPositionLocked(position));
  }
  return absl::OkStatus();
}

PoolLocation CudaExpertPoolImpl::Find(ExpertKey key) const {
  PoolLocation location;
  if (!CheckKey(key, "find").ok()) return location;
  std::lock_guard<std::mutex> lock(mutex_);
  const int position = where_[Index(key)];
  if (position < 0) return location;
  location.held = true;
  location.staging = IsStaging(position);
  location.index = location.staging ? position - num_slots_ : position;
  location.state = BufferAt(position).state;
  return location;
}

bool CudaExpertPoolImpl::IsReady(ExpertKey key) const {
  const PoolLocation location = Find(key);
  return location.held && location.state == BufferState::kReady;
}

absl::Status CudaExpertPoolImpl::WaitReady(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "wait"));
  std::unique_lock<std::mutex> lock(mutex_);
  const int position = where_[Index(key)];
  if (position < 0) return absl::FailedPreconditionError(absl::StrCat("wait: the pool does not hold ", KeyName(key)));
  return WaitBufferLocked(lock, position_buffer_[static_cast<size_t>(position)], key);
}

std::vector<PoolSlot> CudaExpertPoolImpl::SlotTable() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<PoolSlot> table;
  for (int p = 0; p < num_slots_ + num_staging_; ++p) {
    const Buffer& buffer = BufferAt(p);
    table.push_back({IsStaging(p) ? p - num_slots_ : p, IsStaging(p), buffer.expert, buffer.state});
  }
  return table;
}

absl::StatusOr<std::vector<uint8_t>> CudaExpertPoolImpl::ReadHeld(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "read held"));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const uint8_t* data = nullptr;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    const int position = where_[Index(key)];
    if (position < 0) return absl::FailedPreconditionError(absl::StrCat("the pool does not hold ", KeyName(key)));
    TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, position_buffer_[static_cast<size_t>(position)], key));
    data = BufferAt(position).data;
  }
  std::vector<uint8_t> out(static_cast<size_t>(layout_.copy_bytes));
  const size_t bytes = static_cast<size_t>(layout_.matrix_bytes);
  // On the compute stream: ordered after any poison fill queued there.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data(), data + layout_.w1_offset, bytes, cudaMemcpyDeviceToHost, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data() + bytes, data + layout_.w3_offset, bytes, cudaMemcpyDeviceToHost, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(out.data() + 2 * bytes, data + layout_.w2_offset, bytes, cudaMemcpyDeviceToHost, compute_stream_.get()));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(compute_stream_.get()));
  return out;
}

absl::Status CudaExpertPoolImpl::RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(kind_, ": layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  int64_t total_rows = 0;
  for (const ExpertWork& entry : work) {
    const ExpertKey key{layer, entry.expert};
    TANDEM_RETURN_IF_ERROR(CheckKey(key, "run"));
    if (entry.num_rows < 0 || (entry.num_rows > 0 && (entry.input == nullptr || entry.output == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrCat(kind_, ": ", KeyName(key), " has ", entry.num_rows, " rows and a null input or output"));
    }
    if (!Find(key).held) {
      return absl::FailedPreconditionError(absl::StrCat(kind_, ": asked to run ", KeyName(key), ", which it does not hold"));
    }
    total_rows += entry.num_rows;
  }
  PoolRunTiming local;
  if (total_rows == 0) {
    if (timing != nullptr) *timing = local;
    return absl::OkStatus();
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  TANDEM_RETURN_IF_ERROR(EnsureScratch(total_rows));
  const int64_t d = layout_.hidden_size, i = layout_.intermediate_size, t = total_rows;
  const size_t elt = DTypeSize(layout_.dtype);
  const cudaStream_t stream = compute_stream_.get();

  // Which buffer each expert computes from, once its copy is issued (so the
  // GPU has an event to wait on). The host waits only for the copy threads
  // to reach the copy, never for the copy itself.
  struct Run {
    const ExpertWork* entry;
    int64_t row_offset;
    const uint8_t* data;
    cudaEvent_t ready;
    bool staging;
  };
  std::vector<Run> runs;
  const auto wait_start = std::chrono::steady_clock::now();
  {
    std::unique_lock<std::mutex> lock(mutex_);
    int64_t offset = 0;
    for (const ExpertWork& entry : work) {
      if (entry.num_rows == 0) continue;
      const ExpertKey key{layer, entry.expert};
      const int position = where_[Index(key)];
      const int b = position_buffer_[static_cast<size_t>(position)];
      TANDEM_RETURN_IF_ERROR(WaitIssuedLocked(lock, b, key));
      const Buffer& buffer = buffers_[static_cast<size_t>(b)];
      runs.push_back({&entry, offset, buffer.data, buffer.ready.get(), IsStaging(position)});
      offset += entry.num_rows;
    }
  }
  const auto compute_start = std::chrono::steady_clock::now();
  local.wait_us = std::chrono::duration<double, std::micro>(compute_start - wait_start).count();

  // x: the experts' rows, packed [T, D] f32 → device → weights' type.
  float* in_host = static_cast<float*>(in_host_.get());
  for (const Run& run : runs) {
    std::memcpy(in_host + run.row_offset * d, run.entry->input,
                static_cast<size_t>(run.entry->num_rows * d) * sizeof(float));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(x_f32_.get(), in_host, static_cast<size_t>(t * d) * sizeof(float), cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_RETURN_IF_ERROR(
      LaunchConvertF32(static_cast<const float*>(x_f32_.get()), x_act_.get(), KernelType(layout_.dtype), t * d, stream));

  // Row-major Y[R, N] = X[R, K] · W[N, K]ᵀ is column-major Yᵀ[N, R] = W · Xᵀ:
  // cuBLAS sees W as a K×N column-major matrix (op T) and X as K×R (op N).
  const cudaDataType w_type = CudaType(layout_.dtype);
  const float one = 1.0f, zero = 0.0f;
  float* gate = static_cast<float*>(gate_up_.get());  // [T, I]
  float* up = gate + t * i;                           // [T, I]
  for (const Run& run : runs) {
    // The GPU (not the host) waits for this expert's copy, and only for it.
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, run.ready, 0));
    const int rows = static_cast<int>(run.entry->num_rows);
    // gate and up in one call: batch 0 reads w1 and writes gate, batch 1
    // reads w3 (w3_offset further on) and writes up (T·I further on).
    TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(i), rows, static_cast<int>(d), &one,
        run.data + layout_.w1_offset, w_type, static_cast<int>(d),
        static_cast<long long>((layout_.w3_offset - layout_.w1_offset) / static_cast<int64_t>(elt)),
        static_cast<const uint8_t*>(x_act_.get()) + static_cast<size_t>(run.row_offset * d) * elt, w_type,
        static_cast<int>(d), 0, &zero, gate + run.row_offset * i, CUDA_R_32F, static_cast<int>(i),
        static_cast<long long>(t * i), 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchSiluMul(gate, up, h_act_.get(), KernelType(layout_.dtype), t * i, stream));
  float* y = static_cast<float*>(y_f32_.get());  // [T, D]
  for (const Run& run : runs) {
    const int rows = static_cast<int>(run.entry->num_rows);
    TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
        cublas_.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(d), rows, static_cast<int>(i), &one,
        run.data + layout_.w2_offset, w_type, static_cast<int>(i),
        static_cast<const uint8_t*>(h_act_.get()) + static_cast<size_t>(run.row_offset * i) * elt, w_type,
        static_cast<int>(i), &zero, y + run.row_offset * d, CUDA_R_32F, static_cast<int>(d), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
  }
  float* out_host = static_cast<float*>(out_host_.get());
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(out_host, y, static_cast<size_t>(t * d) * sizeof(float), cudaMemcpyDeviceToHost, stream));
  // This stream only: copies on the copy streams keep running.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  for (const Run& run : runs) {
    std::memcpy(run.entry->output, out_host + run.row_offset * d,
                static_cast<size_t>(run.entry->num_rows * d) * sizeof(float));
    ++(run.staging ? local.staging_runs : local.slot_runs);
  }
  local.compute_us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - compute_start).count();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.wait_us += local.wait_us;
    stats_.compute_us += local.compute_us;
    stats_.slot_runs += local.slot_runs;
    stats_.staging_runs += local.staging_runs;
  }
  if (timing != nullptr) *timing = local;
  return absl::OkStatus();
}

std::vector<MigrationRecord> CudaExpertPoolImpl::TakeCompletedMigrations() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MigrationRecord> out;
  out.swap(completed_);
  return out;
}

ExpertPoolStats CudaExpertPoolImpl::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpertPoolStats s = stats_;
  s.num_slots = num_slots_;
  s.num_staging_buffers = num_staging_;
  s.expert_bytes = layout_.copy_bytes;
  s.used_slots = 0;
  for (int p = 0; p < num_slots_; ++p) s.used_slots += BufferAt(p).expert.has_value();
  return s;
}

void CudaExpertPoolImpl::ResetStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = ExpertPoolStats{};
  stats_.kind = kind_;
}

void CudaExpertPoolImpl::CopyLoop(int stream_index) {
  pthread_setname_np(pthread_self(), absl::StrCat("pool-copy", stream_index).c_str());
  const cudaStream_t stream = copy_streams_[static_cast<size_t>(stream_index)].get();
  absl::Status status = CudaStatus(cudaSetDevice(device_), "cudaSetDevice");
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and every queued copy taken
    const CopyTask task = queue_.front();
    queue_.pop_front();
    // The buffer is kCopying: nobody else touches its bytes or events until
    // it is ready (frees wait for that), and buffers_ never reallocates.
    Buffer& buffer = buffers_[static_cast<size_t>(task.buffer)];
    const bool pinned = source_pinned_[Index(task.expert)];
    lock.unlock();
    const double issue_us = NowUs();
    if (status.ok()) status = CudaStatus(cudaStreamWaitEvent(stream, buffer.freed.get(), 0), "cudaStreamWaitEvent");
    if (status.ok()) status = CudaStatus(cudaEventRecord(buffer.start.get(), stream), "cudaEventRecord");
    if (status.ok()) status = IssueCopy(task.expert, buffer.data, stream);
    if (status.ok()) status = CudaStatus(cudaEventRecord(buffer.ready.get(), stream), "cudaEventRecord");
    if (status.ok()) {
      lock.lock();
      buffer.issued = true;
      lock.unlock();
      ready_cv_.notify_all();
    }
    // This thread (only) sleeps until its copy lands; the other stream's
    // thread keeps its copy engine busy meanwhile.
    if (status.ok()) status = CudaStatus(cudaEventSynchronize(buffer.ready.get()), "cudaEventSynchronize");
    float copy_ms = 0;
    if (status.ok()) {
      status = CudaStatus(cudaEventElapsedTime(&copy_ms, buffer.start.get(), buffer.ready.get()), "cudaEventElapsedTime");
    }
    lock.lock();
    if (!status.ok()) {
      if (copy_error_.ok()) {
        copy_error_ = absl::Status(status.code(), absl::StrCat(kind_, ": copy of ", KeyName(task.expert), " failed: ",
                                                               status.message()));
        LOG_ERROR(copy_error_.ToString());
      }
      ready_cv_.notify_all();
      continue;  // drain the queue; every wait returns copy_error_
    }
    buffer.state = BufferState::kReady;
    const double copy_us = static_cast<double>(copy_ms) * 1e3;
    ++stats_.migrations_completed;
    stats_.bytes_copied += layout_.copy_bytes;
    stats_.copy_us += copy_us;
    pageable_copies_ += !pinned;
    completed_.push_back({task.expert, task.staging, layout_.copy_bytes, issue_us - task.queued_at_us, copy_us});
    ready_cv_.notify_all();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaExpertPool>> CudaExpertPool::Create(const ModelConfig& config,
                                                                       std::vector<std::vector<ExpertWeights>> experts,
                                                                       const CudaExpertPoolOptions& options) {
  if (experts.empty() || experts[0].empty()) return absl::InvalidArgumentError("experts: the model has no experts");
  if (static_cast<int64_t>(experts.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("experts has ", experts.size(), " layers, the config ", config.num_hidden_layers));
  }
  const DType dtype = experts[0][0].w1.dtype;
  TANDEM_ASSIGN_OR_RETURN(ExpertLayout layout, ExpertLayout::ForModel(config, dtype));
  const int64_t d = layout.hidden_size, i = layout.intermediate_size;
  for (size_t l = 0; l < experts.size(); ++l) {
    if (static_cast<int64_t>(experts[l].size()) != config.num_local_experts) {
      return absl::InvalidArgumentError(absl::StrCat("experts[", l, "] has ", experts[l].size(),
                                                     " experts, the config ", config.num_local_experts));
    }
    for (size_t e = 0; e < experts[l].size(); ++e) {
      const std::string name = absl::StrCat("experts[", l, "][", e, "]");
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w1, dtype, i, d, name + ".w1"));
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w3, dtype, i, d, name + ".w3"));
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w2, dtype, d, i, name + ".w2"));
    }
  }
  if (d > (1 << 30) || i > (1 << 30)) return absl::InvalidArgumentError("hidden/intermediate size too large for cuBLAS int dims");
  TANDEM_ASSIGN_OR_RETURN(const int num_slots, options.pool.SlotCount(layout));
  auto pool = std::make_unique<CudaExpertPoolImpl>(config, std::move(experts), layout, num_slots, options);
  TANDEM_RETURN_IF_ERROR(pool->Init(options));
  return std::unique_ptr<CudaExpertPool>(std::move(pool));
}

}  // namespace tandem
