#include "gpu_worker/cuda/cuda_handles.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status CudaStatus(cudaError_t err, const char* call) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

absl::Status CublasStatus(cublasStatus_t err, const char* call) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cublasGetStatusName(err), " (", cublasGetStatusString(err), ")");
  if (err == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  const cudaError_t err = cudaMalloc(&buffer.ptr_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
    return CudaStatus(err, absl::StrCat("cudaMalloc(", bytes, " bytes)").c_str());
  }
  buffer.bytes_ = bytes;
  return buffer;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) (void)cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<PinnedHostBuffer> PinnedHostBuffer::Allocate(size_t bytes) {
  PinnedHostBuffer buffer;
  if (bytes == 0) return buffer;
  const cudaError_t err = cudaMallocHost(&buffer.ptr_, bytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(err, absl::StrCat("cudaMallocHost(", bytes, " bytes)").c_str());
  }
  buffer.bytes_ = bytes;
  return buffer;
}

void PinnedHostBuffer::Reset() {
  if (ptr_ != nullptr) (void)cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<HostRegistration> HostRegistration::Register(const void* data, size_t bytes, bool read_only) {
  HostRegistration registration;
  if (data == nullptr || bytes == 0) return absl::InvalidArgumentError("host region to register is empty");
  unsigned int flags = cudaHostRegisterPortable;  // pinned for every context, not only the current one
  if (read_only) flags |= cudaHostRegisterReadOnly;
  void* p = const_cast<void*>(data);  // cudaHostRegister takes void*; the GPU never writes expert weights
  const cudaError_t err = cudaHostRegister(p, bytes, flags);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(
        err, absl::StrCat("cudaHostRegister(", bytes, " bytes, ", read_only ? "read-only" : "read-write", ")").c_str());
  }
  registration.ptr_ = p;
  registration.bytes_ = bytes;
  return registration;
}

void HostRegistration::Reset() {
  if (ptr_ != nullptr) (void)cudaHostUnregister(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<CudaStream> CudaStream::Create(int priority) {
  CudaStream stream;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(&stream.stream_, cudaStreamNonBlocking, priority));
  return stream;
}

void CudaStream::Reset() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

absl::StatusOr<CudaEvent> CudaEvent::Create(bool timing) {
  CudaEvent event;
  const unsigned int flags = cudaEventBlockingSync | (timing ? 0u : cudaEventDisableTiming);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event.event_, flags));
  return event;
}

void CudaEvent::Reset() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
  event_ = nullptr;
}

absl::StatusOr<CublasHandle> CublasHandle::Create() {
  CublasHandle handle;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasCreate(&handle.handle_));
  return handle;
}

void CublasHandle::Reset() {
  if (handle_ != nullptr) (void)cublasDestroy(handle_);
  handle_ = nullptr;
}

void CudaGraph::Reset() {
  if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  graph_ = nullptr;
}

absl::StatusOr<CudaGraphExec> CudaGraphExec::Instantiate(const CudaGraph& graph) {
  CudaGraphExec exec;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec.exec_, graph.get(), 0));
  return exec;
}

void CudaGraphExec::Reset() {
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

}  // namespace tandem
