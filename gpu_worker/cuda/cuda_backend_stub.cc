// CudaBackend in a build without CUDA: Create says so, and nothing else can
// be reached (no object is ever constructed).
#include "gpu_worker/cuda/cuda_backend.h"

namespace tandem {

struct CudaBackend::Impl {};

namespace {
absl::Status NoCuda() {
  return absl::UnimplementedError("the CUDA backend is not available: tandem was built without CUDA");
}
}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const ModelWeights*, const CudaBackendOptions&) {
  return NoCuda();
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaBackend::~CudaBackend() = default;

absl::Status CudaBackend::Embed(std::span<const int32_t>, float*) { return NoCuda(); }
absl::Status CudaBackend::Attention(int, std::span<const SequenceSlice>, int64_t, float*) { return NoCuda(); }
absl::Status CudaBackend::Router(int, int64_t, const float*, float*, float*, int32_t*, float*) { return NoCuda(); }
absl::Status CudaBackend::SharedExpert(int, int64_t, const float*, float*, float*) { return NoCuda(); }
absl::Status CudaBackend::DenseMlp(int, int64_t, float*, float*) { return NoCuda(); }
absl::Status CudaBackend::Combine(int64_t, const float*, const float*, float*) { return NoCuda(); }
absl::Status CudaBackend::Logits(std::span<const int64_t>, const float*, float*) { return NoCuda(); }
std::unique_ptr<KvBlockStorage> CudaBackend::NewKvStorage() { return nullptr; }
absl::StatusOr<std::unique_ptr<KvBlockPool>> CudaBackend::CreateKvPool(const KvCacheOptions&) { return NoCuda(); }
CudaBackendStats CudaBackend::stats() const { return {}; }

}  // namespace tandem
