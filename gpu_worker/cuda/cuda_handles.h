// RAII owners for the CUDA and cuBLAS handles the GPU expert pool uses, and
// the conversion of their return codes into absl::Status (Internal naming
// the call and CUDA's reason; ResourceExhausted for out-of-memory). Every
// owner is move-only and releases its handle in its destructor; the
// destructors ignore errors (there is nobody to tell, and a failing release
// at teardown must not abort).
//
// Host C++ only (CUDA runtime API, no kernels): includable from C++17 .cu
// files and C++20 .cc files alike. Built only with CUDA. Each object may be
// used from any thread the CUDA runtime allows (streams and events are
// thread-safe handles); ownership itself is not shared.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// OK for cudaSuccess, else an error naming `call` (e.g. "cudaMemcpyAsync").
absl::Status CudaStatus(cudaError_t err, const char* call);
absl::Status CublasStatus(cublasStatus_t err, const char* call);

#define TANDEM_CUDA_RETURN_IF_ERROR(expr)                                        \
  do {                                                                           \
    ::absl::Status tandem_cuda_status_tmp = ::tandem::CudaStatus((expr), #expr); \
    if (!tandem_cuda_status_tmp.ok()) return tandem_cuda_status_tmp;             \
  } while (0)
#define TANDEM_CUBLAS_RETURN_IF_ERROR(expr)                                        \
  do {                                                                             \
    ::absl::Status tandem_cuda_status_tmp = ::tandem::CublasStatus((expr), #expr); \
    if (!tandem_cuda_status_tmp.ok()) return tandem_cuda_status_tmp;               \
  } while (0)

// Device memory from cudaMalloc (plain allocations, never managed memory).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  uint8_t* bytes() const { return static_cast<uint8_t*>(ptr_); }
  size_t size() const { return bytes_; }
  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory from cudaMallocHost (for activations in and out:
// DMA from it is asynchronous).
class PinnedHostBuffer {
 public:
  PinnedHostBuffer() = default;
  static absl::StatusOr<PinnedHostBuffer> Allocate(size_t bytes);
  ~PinnedHostBuffer() { Reset(); }
  PinnedHostBuffer(PinnedHostBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedHostBuffer& operator=(PinnedHostBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;

  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }
  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Existing host memory (the model's expert weights, or a CPU worker's
// shared-memory store) page-locked in place with cudaHostRegister, so that
// copies from it are DMA without a second host copy. The memory must
// outlive the registration.
class HostRegistration {
 public:
  HostRegistration() = default;
  // `read_only`: with cudaHostRegisterReadOnly (the device must support it:
  // cudaDevAttrHostRegisterReadOnlySupported); without it the mapping must
  // be writable, as pinning takes write access (pinned_regions.h,
  // ChooseHostPinMode, decides). Internal naming the call and CUDA's reason
  // when the driver refuses; nothing is then registered.
  static absl::StatusOr<HostRegistration> Register(const void* data, size_t bytes, bool read_only);
  ~HostRegistration() { Reset(); }
  HostRegistration(HostRegistration&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  HostRegistration& operator=(HostRegistration&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;

  const void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  bool Contains(const void* p, size_t n) const {
    const auto* b = static_cast<const uint8_t*>(ptr_);
    const auto* q = static_cast<const uint8_t*>(p);
    return ptr_ != nullptr && q >= b && q + n <= b + bytes_;
  }
  void Reset();

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A non-blocking stream (no implicit synchronisation with the legacy
// default stream, so nothing else on the device stalls it).
class CudaStream {
 public:
  CudaStream() = default;
  // `priority`: lower is higher priority (cudaDeviceGetStreamPriorityRange).
  static absl::StatusOr<CudaStream> Create(int priority = 0);
  ~CudaStream() { Reset(); }
  CudaStream(CudaStream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  CudaStream& operator=(CudaStream&& other) noexcept {
    if (this != &other) {
      Reset();
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  cudaStream_t get() const { return stream_; }
  void Reset();

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() = default;
  // `timing`: the event can be used with cudaEventElapsedTime. Host waits
  // on it block (sleep) rather than spin either way.
  static absl::StatusOr<CudaEvent> Create(bool timing);
  ~CudaEvent() { Reset(); }
  CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& other) noexcept {
    if (this != &other) {
      Reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t get() const { return event_; }
  void Reset();

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle() = default;
  static absl::StatusOr<CublasHandle> Create();
  ~CublasHandle() { Reset(); }
  CublasHandle(CublasHandle&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  CublasHandle& operator=(CublasHandle&& other) noexcept {
    if (this != &other) {
      Reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }
  void Reset();

 private:
  cublasHandle_t handle_ = nullptr;
};

// A captured CUDA graph (cudaStreamEndCapture's result); destroyed with
// cudaGraphDestroy. Only needed until it is instantiated.
class CudaGraph {
 public:
  CudaGraph() = default;
  // Takes ownership of `graph` (may be null).
  explicit CudaGraph(cudaGraph_t graph) : graph_(graph) {}
  ~CudaGraph() { Reset(); }
  CudaGraph(CudaGraph&& other) noexcept : graph_(std::exchange(other.graph_, nullptr)) {}
  CudaGraph& operator=(CudaGraph&& other) noexcept {
    if (this != &other) {
      Reset();
      graph_ = std::exchange(other.graph_, nullptr);
    }
    return *this;
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  cudaGraph_t get() const { return graph_; }
  void Reset();

 private:
  cudaGraph_t graph_ = nullptr;
};

// An instantiated graph, launchable with cudaGraphLaunch; destroyed with
// cudaGraphExecDestroy.
class CudaGraphExec {
 public:
  CudaGraphExec() = default;
  static absl::StatusOr<CudaGraphExec> Instantiate(const CudaGraph& graph);
  ~CudaGraphExec() { Reset(); }
  CudaGraphExec(CudaGraphExec&& other) noexcept : exec_(std::exchange(other.exec_, nullptr)) {}
  CudaGraphExec& operator=(CudaGraphExec&& other) noexcept {
    if (this != &other) {
      Reset();
      exec_ = std::exchange(other.exec_, nullptr);
    }
    return *this;
  }
  CudaGraphExec(const CudaGraphExec&) = delete;
  CudaGraphExec& operator=(const CudaGraphExec&) = delete;

  cudaGraphExec_t get() const { return exec_; }
  void Reset();

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace tandem
