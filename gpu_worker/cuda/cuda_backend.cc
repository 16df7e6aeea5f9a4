// CudaBackend: host side. Every call follows the same pattern on the
// backend's one stream: host inputs → pinned staging (memcpy) → device
// (cudaMemcpyAsync) → kernels and cuBLAS → pinned staging → wait for the
// stream → caller's buffers. Nothing else synchronises the device.
//
// Legend: T rows in the batch, D hidden, Hq = H·hd, Hkv = Hkv·hd (kv_dim),
// E experts, K experts per token, V vocab, S slices, P block-table entries.
#include "gpu_worker/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/dtype.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/model/rope_frequencies.h"
#include "gpu_worker/cuda/cuda_backend_kernels.h"
#include "gpu_worker/cuda/cuda_dtype.h"
#include "gpu_worker/cuda/cuda_handles.h"

namespace tandem {
namespace {

// cuBLAS workspace, set explicitly so that graph capture never makes cuBLAS
// allocate (32 MiB: NVIDIA's recommendation for Hopper).
constexpr size_t kCublasWorkspaceBytes = 32u << 20;
// Graphs kept before the cache is cleared (one per layer × decode shape).
constexpr size_t kMaxGraphs = 4096;

// A linear layer's weight on the device: [n, k] row-major, as stored.
struct DeviceLinear {
  const void* data = nullptr;
  DType dtype = DType::kBF16;
  int64_t n = 0, k = 0;
};

struct DeviceNorm {
  const float* weight = nullptr;  // [D] f32
  const float* bias = nullptr;    // [D] f32 for LayerNorm; null: RMSNorm
};

struct DeviceLayer {
  DeviceNorm input_norm, post_attention_norm;
  DeviceLinear q, k, v, o;
  DeviceLinear router;            // [E, D] widened to f32 (see cuda_backend.h)
  const float* q_bias = nullptr;  // [Hq] f32 or null
  const float* k_bias = nullptr;  // [Hkv] f32 or null
  const float* v_bias = nullptr;  // [Hkv] f32 or null
  const float* o_bias = nullptr;  // [D] f32 or null
};

// Block memory in device memory for a KvBlockPool; copies on the backend's
// stream so that a copy-on-write is ordered before the next kernel reading
// the block. Engine thread only, like the pool.
class CudaKvBlockStorage final : public KvBlockStorage {
 public:
  CudaKvBlockStorage(const void* owner, int device, cudaStream_t stream)
      : owner_(owner), device_(device), stream_(stream) {}

  absl::StatusOr<float*> AllocateChunk(int64_t bytes) override {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(static_cast<size_t>(bytes));
    if (!buffer.ok()) return buffer.status();
    // Zero-filled like the host storage (no row is read before it is written,
    // but a bug then reads zeros, not garbage).
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(buffer->get(), 0, static_cast<size_t>(bytes), stream_));
    chunks_.push_back(std::move(*buffer));
    return static_cast<float*>(chunks_.back().get());
  }

  absl::Status CopyBlock(const float* src, float* dst, int64_t bytes) override {
    TANDEM_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream_));
    return absl::OkStatus();
  }

  bool host_accessible() const override { return false; }
  const void* owner() const { return owner_; }

 private:
  const void* owner_;  // the backend's Impl: Attention accepts only its own storage
  int device_;
  cudaStream_t stream_;  // borrowed from the backend
  std::vector<DeviceBuffer> chunks_;
};

// Byte offsets of the attention metadata in its pinned/device buffers:
// slices [S] AttnSlice | row_slice [T] int32 | block_ptrs [P] float* |
// tiles [N] int2. Fixed for a fixed (S, T, P, N), which is what lets a
// captured graph's H2D copy stay valid.
struct MetaLayout {
  size_t slices = 0, row_slice = 0, block_ptrs = 0, tiles = 0, bytes = 0;
  static MetaLayout For(int64_t num_slices, int64_t rows, int64_t ptrs, int64_t tiles) {
    MetaLayout m;
    m.slices = 0;
    m.row_slice = m.slices + sizeof(AttnSlice) * static_cast<size_t>(num_slices);
    m.block_ptrs = (m.row_slice + sizeof(int32_t) * static_cast<size_t>(rows) + 7) / 8 * 8;
    m.tiles = m.block_ptrs + sizeof(float*) * static_cast<size_t>(ptrs);
    m.bytes = m.tiles + sizeof(int2) * static_cast<size_t>(tiles);
    return m;
  }
};

// Smallest power of two >= n, at least 16: the block-table bucket of a
// decode graph (so a graph serves many steps as sequences grow).
int64_t Bucket(int64_t n) {
  int64_t b = 16;
  while (b < n) b *= 2;
  return b;
}

// Shapes the kernels support (cuda_backend_kernels.h).
absl::Status CheckSupportedShape(const ModelConfig& c) {
  if (c.head_dim <= 0 || c.head_dim > kMaxHeadDim || c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", c.head_dim, " unsupported (even, <= ", kMaxHeadDim, ")"));
  }
  if (c.num_key_value_heads <= 0 || c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError("num_attention_heads must be a multiple of num_key_value_heads");
  }
  if (c.num_local_experts > kMaxRouterExperts || c.num_experts_per_tok > kMaxExpertsPerToken ||
      c.num_experts_per_tok > c.num_local_experts || c.num_experts_per_tok <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("router shape E=", c.num_local_experts, " K=", c.num_experts_per_tok,
                                                   " unsupported (E <= ", kMaxRouterExperts,
                                                   ", K <= ", kMaxExpertsPerToken, ")"));
  }
  if (c.router_kind() == RouterKind::kSparseMixer && c.num_experts_per_tok != 2) {
    return absl::InvalidArgumentError("the sparsemixer router is top-2");
  }
  // Not yet on the GPU: run such a model with the CPU backend.
  if (c.mla()) {
    return absl::UnimplementedError(absl::StrCat(c.architecture_name,
                                                 ": the CUDA backend has no multi-head latent attention yet; use "
                                                 "the CPU backend"));
  }
  if (c.qk_norm()) {
    return absl::UnimplementedError(absl::StrCat(c.architecture_name,
                                                 ": the CUDA backend has no QK norm yet; use the CPU backend"));
  }
  if (!c.norm_topk_prob) {
    return absl::UnimplementedError("norm_topk_prob false: the CUDA router renormalises its top-k; use the CPU backend");
  }
  if (c.shared_expert() || (c.attention_bias && !c.o_proj_bias())) {
    return absl::UnimplementedError(absl::StrCat(c.architecture_name,
                                                 ": the CUDA backend has no shared expert and no q/k/v-only biases "
                                                 "yet; use the CPU backend"));
  }
  if (c.router_kind() == RouterKind::kSigmoidGroupedTopK || c.rope_dim() != c.head_dim) {
    return absl::UnimplementedError(absl::StrCat(c.architecture_name,
                                                 ": the CUDA backend has no sigmoid grouped router and no partial "
                                                 "RoPE yet; use the CPU backend"));
  }
  if (!c.dense_layers.empty()) {
    return absl::UnimplementedError(absl::StrCat(c.architecture_name, ": the CUDA backend has no dense MLP layers (",
                                                 c.dense_layers.size(), " in this model) yet; use the CPU backend"));
  }
  if (c.sliding_window && (*c.sliding_window <= 0 || *c.sliding_window > std::numeric_limits<int32_t>::max())) {
    return absl::InvalidArgumentError(absl::StrCat("sliding_window ", *c.sliding_window, " unsupported"));
  }
  return absl::OkStatus();
}

// One Attention call's batch, as CheckAttentionBatch found it: the KV
// caches' block size, the block-table entries and prefill query tiles it
// needs, and whether every slice is one token (a decode step).
struct AttnBatch {
  int64_t block_size = 0;
  int64_t num_ptrs = 0;
  int64_t num_tiles = 0;
  bool decode = true;
};

}  // namespace

struct CudaBackend::Impl {
  explicit Impl(const ModelWeights* w, const CudaBackendOptions& o) : weights(w), config(w->config), options(o) {}

  // Init's steps, after CheckSupportedShape.
  absl::Status Init();
  absl::Status OpenDevice();
  // InvalidArgument when a kernel's needs at this model's shape exceed the
  // device's limits (shared memory per block).
  absl::Status CheckDeviceFitsKernels();
  absl::Status UploadWeights();
  absl::Status UploadRope();
  absl::StatusOr<const void*> Upload(const void* host, size_t bytes);
  absl::StatusOr<const float*> UploadFloats(const std::vector<float>& values);
  absl::StatusOr<DeviceLinear> UploadLinear(const LinearWeight& w, bool widen_to_f32);
  absl::StatusOr<DeviceNorm> UploadNorm(const NormWeights& norm);

  absl::Status EnsureRows(int64_t rows);
  absl::Status EnsureMeta(size_t bytes);
  // y[m, n] = x[m, k] · Wᵀ (f32 in, converted to W's type, f32 out).
  absl::Status Linear(const DeviceLinear& w, const float* x, int64_t m, float* y);
  absl::Status EnqueueAttention(int layer, int64_t rows, int64_t num_slices, bool decode, int64_t num_tiles,
                                int64_t block_size, const MetaLayout& layout);
  absl::Status Sync() { return CudaStatus(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize"); }
  absl::Status H2D(void* dst, const void* src, size_t bytes) {
    stats.h2d_bytes += static_cast<int64_t>(bytes);
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream.get()), "cudaMemcpyAsync H2D");
  }
  absl::Status D2H(void* dst, const void* src, size_t bytes) {
    stats.d2h_bytes += static_cast<int64_t>(bytes);
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream.get()), "cudaMemcpyAsync D2H");
  }
  absl::Status SetDevice() { return CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"); }

  absl::Status Embed(std::span<const int32_t> tokens, float* hidden);
  absl::Status Attention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows, float* hidden);
  // Attention's steps, around EnqueueAttention.
  using GraphKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t>;  // (layer, T, S, P bucket, B)
  absl::StatusOr<AttnBatch> CheckAttentionBatch(std::span<const SequenceSlice> slices, int64_t num_rows) const;
  void WriteAttentionMeta(std::span<const SequenceSlice> slices, int64_t num_rows, const AttnBatch& batch,
                          int64_t ptr_capacity, const MetaLayout& layout);
  absl::Status LaunchDecodeGraph(const GraphKey& key, const MetaLayout& layout, size_t hidden_bytes);
  absl::Status Router(int layer, int64_t num_rows, const float* hidden, float* moe_input, float* router_logits,
                      int32_t* experts, float* weights);
  absl::Status Combine(int64_t num_rows, const float* weights, const float* expert_out, float* hidden);
  absl::Status Logits(std::span<const int64_t> rows, const float* hidden, float* logits);

  const ModelWeights* weights;
  const ModelConfig& config;
  CudaBackendOptions options;
  CudaBackendStats stats;

  CudaStream stream;
  CublasHandle cublas;
  DeviceBuffer cublas_workspace;

  // Dense weights on the device (one buffer per tensor; tied tensors once).
  std::vector<DeviceBuffer> weight_buffers;
  std::unordered_map<const void*, const void*> uploaded;  // host → device
  const void* embed = nullptr;                            // [V, D], embed_dtype
  DType embed_dtype = DType::kBF16;
  std::vector<DeviceLayer> layers;  // [L]
  DeviceNorm final_norm;
  DeviceLinear lm_head;                 // [V, D]
  const float* lm_head_bias = nullptr;  // [V] f32 or null
  DeviceBuffer rope;                    // inv_freq [2, hd/2] f64 (short, long), then mscale [2] f64
  int64_t rope_original_max = 0;        // 0: no longrope

  // Run buffers, sized for rows_capacity rows (device unless noted).
  int64_t rows_capacity = 0;
  DeviceBuffer hidden;           // [T, D] f32
  DeviceBuffer normed;           // [T, D] f32
  DeviceBuffer act;              // [T, max(D, Hq)] activations in the weights' type
  DeviceBuffer q_buf, attn_buf;  // [T, Hq] f32
  DeviceBuffer k_buf, v_buf;     // [T, Hkv] f32
  DeviceBuffer o_buf;            // [T, D] f32
  DeviceBuffer router_logits;    // [T, E] f32
  DeviceBuffer experts;          // [T, K] int32
  DeviceBuffer route_weights;    // [T, K] f32
  DeviceBuffer expert_out;       // [T·K, D] f32
  DeviceBuffer tokens;           // [T] int32
  DeviceBuffer logits;           // [T, V] f32
  PinnedHostBuffer in;           // host staging in: max over calls of their inputs
  PinnedHostBuffer out;          // host staging out
  PinnedHostBuffer meta_host;    // MetaLayout, host side
  DeviceBuffer meta;             // MetaLayout, device side

  // Decode-attention graphs by (layer, T, S, P bucket, B).
  std::map<GraphKey, CudaGraphExec> graphs;
};

absl::StatusOr<const void*> CudaBackend::Impl::Upload(const void* host, size_t bytes) {
  if (host == nullptr || bytes == 0) return nullptr;
  if (auto it = uploaded.find(host); it != uploaded.end()) return it->second;  // tied lm_head = embed_tokens
  absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(bytes);
  if (!buffer.ok()) return buffer.status();
  // Create-time only: a plain synchronous copy (Init ends with one device
  // synchronisation, which also covers pageable-copy staging).
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer->get(), host, bytes, cudaMemcpyHostToDevice));
  const void* device = buffer->get();
  weight_buffers.push_back(std::move(*buffer));
  uploaded.emplace(host, device);
  stats.weight_bytes += static_cast<int64_t>(bytes);
  return device;
}

absl::StatusOr<const float*> CudaBackend::Impl::UploadFloats(const std::vector<float>& values) {
  if (values.empty()) return nullptr;
  absl::StatusOr<const void*> p = Upload(values.data(), values.size() * sizeof(float));
  if (!p.ok()) return p.status();
  return static_cast<const float*>(*p);
}

absl::StatusOr<DeviceLinear> CudaBackend::Impl::UploadLinear(const LinearWeight& w, bool widen_to_f32) {
  TANDEM_RETURN_IF_ERROR(
      RequireFloatDType(w.dtype, absl::StrCat("a [", w.n, ", ", w.k, "] dense weight"), "the CUDA backend"));
  DeviceLinear d{.data = nullptr, .dtype = w.dtype, .n = w.n, .k = w.k};
  if (w.n > std::numeric_limits<int>::max() || w.k > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a [", w.n, ", ", w.k, "] weight is too large for cuBLAS's int sizes"));
  }
  const size_t count = static_cast<size_t>(w.n) * static_cast<size_t>(w.k);
  if (widen_to_f32 && w.dtype != DType::kF32) {
    std::vector<float> wide(count);
    for (size_t i = 0; i < count; ++i) wide[i] = LoadAsF32(w.data, w.dtype, i);
    absl::StatusOr<DeviceBuffer> buffer = DeviceBuffer::Allocate(count * sizeof(float));
    if (!buffer.ok()) return buffer.status();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(buffer->get(), wide.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    d.data = buffer->get();
    d.dtype = DType::kF32;
    stats.weight_bytes += static_cast<int64_t>(count * sizeof(float));
    weight_buffers.push_back(std::move(*buffer));
    return d;
  }
  absl::StatusOr<const void*> p = Upload(w.data, count * DTypeSize(w.dtype));
  if (!p.ok()) return p.status();
  d.data = *p;
  return d;
}

absl::StatusOr<DeviceNorm> CudaBackend::Impl::UploadNorm(const NormWeights& norm) {
  DeviceNorm d;
  TANDEM_ASSIGN_OR_RETURN(d.weight, UploadFloats(norm.weight));
  TANDEM_ASSIGN_OR_RETURN(d.bias, UploadFloats(norm.bias));
  if (static_cast<int64_t>(norm.weight.size()) != config.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("norm weight has ", norm.weight.size(), " entries, hidden size is ", config.hidden_size));
  }
  const bool layer_norm = config.norm_kind() == NormKind::kLayerNorm;
  if (layer_norm != (d.bias != nullptr)) {
    return absl::InvalidArgumentError(layer_norm ? "LayerNorm without a bias" : "RMSNorm with a bias");
  }
  return d;
}

absl::Status CudaBackend::Impl::CheckDeviceFitsKernels() {
  // The prefill tiles need shared memory by head_dim: within every targeted
  // GPU's limit up to kMaxHeadDim (checked at compile time), but a GPU this
  // binary was not built for could have less: say so now, not at the first
  // prefill.
  int shared_optin = 0;
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, options.device));
  const size_t need = PrefillAttentionSharedBytes(static_cast<int>(config.head_dim));
  if (need > static_cast<size_t>(shared_optin)) {
    cudaDeviceProp prop;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options.device));
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim ", config.head_dim, ": prefill attention needs ", need, " bytes of shared memory per block, and ",
        prop.name, " (sm_", prop.major, prop.minor, ", CUDA device ", options.device, ") allows ", shared_optin,
        " (see docs/gpu.md for the supported GPUs)"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Init() {
  TANDEM_RETURN_IF_ERROR(CheckSupportedShape(config));
  TANDEM_RETURN_IF_ERROR(OpenDevice());
  TANDEM_RETURN_IF_ERROR(UploadWeights());
  TANDEM_RETURN_IF_ERROR(UploadRope());
  TANDEM_RETURN_IF_ERROR(EnsureRows(std::max<int64_t>(1, options.max_rows)));
  // Create only: every upload has landed before the first call.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

// The device, the stream, cuBLAS on it and cuBLAS's workspace.
absl::Status CudaBackend::Impl::OpenDevice() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("no CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(err), " (",
                                               cudaGetErrorString(err), ")"));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device: cudaGetDeviceCount found none");
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " found)"));
  }
  TANDEM_RETURN_IF_ERROR(SetDevice());
  TANDEM_RETURN_IF_ERROR(CheckDeviceFitsKernels());
  TANDEM_ASSIGN_OR_RETURN(stream, CudaStream::Create());
  TANDEM_ASSIGN_OR_RETURN(cublas, CublasHandle::Create());
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetStream(cublas.get(), stream.get()));
  TANDEM_ASSIGN_OR_RETURN(cublas_workspace, DeviceBuffer::Allocate(kCublasWorkspaceBytes));
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasSetWorkspace(cublas.get(), cublas_workspace.get(), kCublasWorkspaceBytes));
  return absl::OkStatus();
}

// Dense weights, once.
absl::Status CudaBackend::Impl::UploadWeights() {
  const TensorView& table = weights->embed_tokens;
  TANDEM_RETURN_IF_ERROR(RequireFloatDType(table.dtype, table.name, "the CUDA backend"));
  TANDEM_ASSIGN_OR_RETURN(embed, Upload(table.data, table.size_bytes));
  embed_dtype = table.dtype;
  for (const LayerWeights& lw : weights->layers) {
    DeviceLayer d;
    TANDEM_ASSIGN_OR_RETURN(d.input_norm, UploadNorm(lw.input_norm));
    TANDEM_ASSIGN_OR_RETURN(d.post_attention_norm, UploadNorm(lw.post_attention_norm));
    TANDEM_ASSIGN_OR_RETURN(d.q, UploadLinear(lw.q_proj, false));
    TANDEM_ASSIGN_OR_RETURN(d.k, UploadLinear(lw.k_proj, false));
    TANDEM_ASSIGN_OR_RETURN(d.v, UploadLinear(lw.v_proj, false));
    TANDEM_ASSIGN_OR_RETURN(d.o, UploadLinear(lw.o_proj, false));
    TANDEM_ASSIGN_OR_RETURN(d.router, UploadLinear(lw.router, true));
    TANDEM_ASSIGN_OR_RETURN(d.q_bias, UploadFloats(lw.q_bias));
    TANDEM_ASSIGN_OR_RETURN(d.k_bias, UploadFloats(lw.k_bias));
    TANDEM_ASSIGN_OR_RETURN(d.v_bias, UploadFloats(lw.v_bias));
    TANDEM_ASSIGN_OR_RETURN(d.o_bias, UploadFloats(lw.o_bias));
    layers.push_back(d);
  }
  TANDEM_ASSIGN_OR_RETURN(final_norm, UploadNorm(weights->final_norm));
  TANDEM_ASSIGN_OR_RETURN(lm_head, UploadLinear(weights->lm_head, false));
  TANDEM_ASSIGN_OR_RETURN(lm_head_bias, UploadFloats(weights->lm_head_bias));
  return absl::OkStatus();
}

// RoPE tables from the frequencies RotaryEmbedding uses (f64).
absl::Status CudaBackend::Impl::UploadRope() {
  const ModelConfig& c = config;
  const int64_t half = c.head_dim / 2;
  std::vector<double> table_rope(static_cast<size_t>(2 * half + 2));
  const RopeFrequencies short_set = ComputeRopeFrequencies(c, /*long_factors=*/false);
  const RopeFrequencies long_set = ComputeRopeFrequencies(c, /*long_factors=*/true);
  if (static_cast<int64_t>(short_set.inv_freq.size()) != half || static_cast<int64_t>(long_set.inv_freq.size()) != half)
    return absl::InvalidArgumentError("RoPE frequencies are not head_dim / 2");
  for (int64_t i = 0; i < half; ++i) {
    table_rope[static_cast<size_t>(i)] = short_set.inv_freq[static_cast<size_t>(i)];
    table_rope[static_cast<size_t>(half + i)] = long_set.inv_freq[static_cast<size_t>(i)];
  }
  table_rope[static_cast<size_t>(2 * half)] = short_set.mscale;
  table_rope[static_cast<size_t>(2 * half + 1)] = long_set.mscale;
  if (c.rope_scaling.type == "longrope") {
    if (static_cast<int64_t>(c.rope_scaling.short_factor.size()) < half ||
        static_cast<int64_t>(c.rope_scaling.long_factor.size()) < half) {
      return absl::InvalidArgumentError("longrope factors shorter than head_dim / 2");
    }
    rope_original_max = c.rope_scaling.original_max_position_embeddings;
  }
  TANDEM_ASSIGN_OR_RETURN(rope, DeviceBuffer::Allocate(table_rope.size() * sizeof(double)));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(rope.get(), table_rope.data(), table_rope.size() * sizeof(double), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::EnsureRows(int64_t rows) {
  if (rows <= rows_capacity) return absl::OkStatus();
  const int64_t cap = std::max(rows, 2 * rows_capacity);
  graphs.clear();  // they hold the old buffers' addresses
  const size_t f = sizeof(float), n = static_cast<size_t>(cap);
  const size_t d = static_cast<size_t>(config.hidden_size), hq = static_cast<size_t>(config.q_dim()),
               hkv = static_cast<size_t>(config.kv_dim()), e = static_cast<size_t>(config.num_local_experts),
               k = static_cast<size_t>(config.num_experts_per_tok), vocab = static_cast<size_t>(config.vocab_size);
  // Release first so that growing does not need old + new at once.
  for (DeviceBuffer* b : {&hidden, &normed, &act, &q_buf, &attn_buf, &k_buf, &v_buf, &o_buf, &router_logits, &experts,
                          &route_weights, &expert_out, &tokens, &logits}) {
    b->Reset();
  }
  in.Reset();
  out.Reset();
  rows_capacity = 0;
  TANDEM_ASSIGN_OR_RETURN(hidden, DeviceBuffer::Allocate(n * d * f));
  TANDEM_ASSIGN_OR_RETURN(normed, DeviceBuffer::Allocate(n * d * f));
  TANDEM_ASSIGN_OR_RETURN(act, DeviceBuffer::Allocate(n * std::max(d, hq) * f));
  TANDEM_ASSIGN_OR_RETURN(q_buf, DeviceBuffer::Allocate(n * hq * f));
  TANDEM_ASSIGN_OR_RETURN(attn_buf, DeviceBuffer::Allocate(n * hq * f));
  TANDEM_ASSIGN_OR_RETURN(k_buf, DeviceBuffer::Allocate(n * hkv * f));
  TANDEM_ASSIGN_OR_RETURN(v_buf, DeviceBuffer::Allocate(n * hkv * f));
  TANDEM_ASSIGN_OR_RETURN(o_buf, DeviceBuffer::Allocate(n * d * f));
  TANDEM_ASSIGN_OR_RETURN(router_logits, DeviceBuffer::Allocate(n * e * f));
  TANDEM_ASSIGN_OR_RETURN(experts, DeviceBuffer::Allocate(n * k * sizeof(int32_t)));
  TANDEM_ASSIGN_OR_RETURN(route_weights, DeviceBuffer::Allocate(n * k * f));
  TANDEM_ASSIGN_OR_RETURN(expert_out, DeviceBuffer::Allocate(n * k * d * f));
  TANDEM_ASSIGN_OR_RETURN(tokens, DeviceBuffer::Allocate(n * sizeof(int32_t)));
  TANDEM_ASSIGN_OR_RETURN(logits, DeviceBuffer::Allocate(n * vocab * f));
  // In: Combine's hidden + weights + expert_out is the largest input.
  TANDEM_ASSIGN_OR_RETURN(in, PinnedHostBuffer::Allocate(n * (d + k + k * d) * f));
  // Out: the larger of Logits' [T, V] and Router's four outputs.
  TANDEM_ASSIGN_OR_RETURN(out, PinnedHostBuffer::Allocate(n * std::max(vocab, d + e + 2 * k) * f));
  rows_capacity = cap;
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::EnsureMeta(size_t bytes) {
  if (bytes <= meta.size() && bytes <= meta_host.size()) return absl::OkStatus();
  const size_t size = std::max(bytes, 2 * meta.size());
  graphs.clear();
  meta.Reset();
  meta_host.Reset();
  TANDEM_ASSIGN_OR_RETURN(meta, DeviceBuffer::Allocate(size));
  TANDEM_ASSIGN_OR_RETURN(meta_host, PinnedHostBuffer::Allocate(size));
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Linear(const DeviceLinear& w, const float* x, int64_t m, float* y) {
  if (m <= 0) return absl::OkStatus();
  const void* a = x;
  if (w.dtype != DType::kF32) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchConvertF32(x, act.get(), ToKernelDType(w.dtype), m * w.k, stream.get()));
    a = act.get();
  }
  // Row-major y[m, n] = x[m, k] · W[n, k]ᵀ is column-major yᵀ[n, m] =
  // W (stored [k, n] column-major, so op T) · xᵀ ([k, m] column-major, op N).
  const float alpha = 1.0f, beta = 0.0f;
  TANDEM_CUBLAS_RETURN_IF_ERROR(cublasGemmEx(
      cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.n), static_cast<int>(m), static_cast<int>(w.k), &alpha,
      w.data, CudaDataType(w.dtype), static_cast<int>(w.k), a, CudaDataType(w.dtype), static_cast<int>(w.k), &beta, y,
      CUDA_R_32F, static_cast<int>(w.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Embed(std::span<const int32_t> ids, float* out_hidden) {
  const int64_t d = config.hidden_size, n = static_cast<int64_t>(ids.size());
  for (size_t t = 0; t < ids.size(); ++t) {
    if (ids[t] < 0 || ids[t] >= config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[t], " at position ", t,
                                                     " is outside the vocabulary [0, ", config.vocab_size, ")"));
    }
  }
  if (n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(SetDevice());
  TANDEM_RETURN_IF_ERROR(EnsureRows(n));
  std::memcpy(in.get(), ids.data(), ids.size_bytes());
  TANDEM_RETURN_IF_ERROR(H2D(tokens.get(), in.get(), ids.size_bytes()));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchEmbed(embed, ToKernelDType(embed_dtype), static_cast<const int32_t*>(tokens.get()),
                                          n, d, static_cast<float*>(hidden.get()), stream.get()));
  const size_t bytes = static_cast<size_t>(n * d) * sizeof(float);
  TANDEM_RETURN_IF_ERROR(D2H(out.get(), hidden.get(), bytes));
  TANDEM_RETURN_IF_ERROR(Sync());
  std::memcpy(out_hidden, out.get(), bytes);
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::EnqueueAttention(int layer, int64_t rows, int64_t num_slices, bool decode,
                                                 int64_t num_tiles, int64_t block_size, const MetaLayout& layout) {
  const DeviceLayer& lw = layers[static_cast<size_t>(layer)];
  const int64_t d = config.hidden_size, half = config.head_dim / 2;
  cudaStream_t s = stream.get();
  auto* meta_bytes = meta.bytes();
  const auto* slices_d = reinterpret_cast<const AttnSlice*>(meta_bytes + layout.slices);
  const auto* row_slice_d = reinterpret_cast<const int32_t*>(meta_bytes + layout.row_slice);
  auto* const* ptrs_d = reinterpret_cast<float* const*>(meta_bytes + layout.block_ptrs);
  const auto* tiles_d = reinterpret_cast<const int2*>(meta_bytes + layout.tiles);
  const auto* inv_freq = static_cast<const double*>(rope.get());
  const double* mscale = inv_freq + 2 * half;
  auto* h = static_cast<float*>(hidden.get());
  auto* x = static_cast<float*>(normed.get());
  auto* qb = static_cast<float*>(q_buf.get());
  auto* kb = static_cast<float*>(k_buf.get());
  auto* vb = static_cast<float*>(v_buf.get());
  auto* ab = static_cast<float*>(attn_buf.get());
  auto* ob = static_cast<float*>(o_buf.get());
  const size_t hidden_bytes = static_cast<size_t>(rows * d) * sizeof(float);

  AttnShape shape{};
  shape.heads = static_cast<int32_t>(config.num_attention_heads);
  shape.kv_heads = static_cast<int32_t>(config.num_key_value_heads);
  shape.head_dim = static_cast<int32_t>(config.head_dim);
  shape.num_layers = static_cast<int32_t>(config.num_hidden_layers);
  shape.block_size = static_cast<int32_t>(block_size);
  shape.layer = layer;
  shape.window = config.sliding_window ? static_cast<int32_t>(*config.sliding_window) : 0;
  shape.scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));

  TANDEM_RETURN_IF_ERROR(H2D(meta.get(), meta_host.get(), layout.bytes));
  TANDEM_RETURN_IF_ERROR(H2D(h, in.get(), hidden_bytes));
  TANDEM_CUDA_RETURN_IF_ERROR(
      LaunchNorm(h, rows, d, lw.input_norm.weight, lw.input_norm.bias, config.rms_norm_eps, x, s));
  TANDEM_RETURN_IF_ERROR(Linear(lw.q, x, rows, qb));
  TANDEM_RETURN_IF_ERROR(Linear(lw.k, x, rows, kb));
  TANDEM_RETURN_IF_ERROR(Linear(lw.v, x, rows, vb));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchRopeStoreKv(slices_d, row_slice_d, rows, qb, kb, vb, lw.q_bias, lw.k_bias,
                                                lw.v_bias, inv_freq, mscale, ptrs_d, shape, s));
  if (decode) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchAttentionDecode(slices_d, num_slices, qb, ptrs_d, shape, ab, s));
  } else {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchAttentionPrefill(slices_d, tiles_d, num_tiles, qb, ptrs_d, shape, ab, s));
  }
  TANDEM_RETURN_IF_ERROR(Linear(lw.o, ab, rows, ob));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchAddResidual(h, ob, lw.o_bias, rows, d, s));
  TANDEM_RETURN_IF_ERROR(D2H(out.get(), h, hidden_bytes));
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Attention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows,
                                          float* io_hidden) {
  if (layer < 0 || layer >= static_cast<int>(layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (num_rows <= 0) return absl::OkStatus();
  if (slices.empty()) return absl::InvalidArgumentError("attention over rows without slices");
  TANDEM_ASSIGN_OR_RETURN(const AttnBatch batch, CheckAttentionBatch(slices, num_rows));
  const int64_t num_slices = static_cast<int64_t>(slices.size());
  const bool use_graph = batch.decode && options.decode_graphs;
  const int64_t ptr_capacity = use_graph ? Bucket(batch.num_ptrs) : batch.num_ptrs;
  const MetaLayout layout = MetaLayout::For(num_slices, num_rows, ptr_capacity, batch.decode ? 0 : batch.num_tiles);
  TANDEM_RETURN_IF_ERROR(SetDevice());
  TANDEM_RETURN_IF_ERROR(EnsureRows(num_rows));
  TANDEM_RETURN_IF_ERROR(EnsureMeta(layout.bytes));
  WriteAttentionMeta(slices, num_rows, batch, ptr_capacity, layout);
  const size_t hidden_bytes = static_cast<size_t>(num_rows * config.hidden_size) * sizeof(float);
  std::memcpy(in.get(), io_hidden, hidden_bytes);
  if (use_graph) {
    const auto key = std::make_tuple(layer, num_rows, num_slices, ptr_capacity, batch.block_size);
    TANDEM_RETURN_IF_ERROR(LaunchDecodeGraph(key, layout, hidden_bytes));
  } else {
    TANDEM_RETURN_IF_ERROR(
        EnqueueAttention(layer, num_rows, num_slices, batch.decode, batch.num_tiles, batch.block_size, layout));
  }
  TANDEM_RETURN_IF_ERROR(Sync());
  std::memcpy(io_hidden, out.get(), hidden_bytes);
  return absl::OkStatus();
}

// Validates the batch (every slice's KV cache this backend's, of the
// model's shape, one block size, room for the slice's positions) and sizes
// its metadata.
absl::StatusOr<AttnBatch> CudaBackend::Impl::CheckAttentionBatch(std::span<const SequenceSlice> slices,
                                                                 int64_t num_rows) const {
  AttnBatch batch;
  int64_t& block_size = batch.block_size;
  for (const SequenceSlice& sl : slices) {
    if (sl.kv == nullptr) return absl::InvalidArgumentError("slice without a KV cache");
    const KvBlockPool* pool = sl.kv->pool();
    const auto* storage = dynamic_cast<const CudaKvBlockStorage*>(pool->storage());
    if (storage == nullptr || storage->owner() != this) {
      return absl::FailedPreconditionError(
          "the CUDA backend attends only over KV caches in its own device memory: create the KvBlockPool with "
          "CudaBackend::CreateKvPool (or NewKvStorage)");
    }
    const KvCacheOptions& po = pool->options();
    if (po.num_layers != config.num_hidden_layers || po.kv_dim != config.kv_dim()) {
      return absl::FailedPreconditionError(absl::StrCat("KV cache of ", po.num_layers, " layers × kv_dim ", po.kv_dim,
                                                        " does not fit the model (", config.num_hidden_layers, " × ",
                                                        config.kv_dim(), ")"));
    }
    if (block_size == 0) block_size = po.block_size;
    if (po.block_size != block_size) return absl::InvalidArgumentError("slices from pools of different block sizes");
    if (sl.num_tokens <= 0 || sl.start_position < 0 || sl.row_offset < 0 || sl.row_offset + sl.num_tokens > num_rows) {
      return absl::InvalidArgumentError(absl::StrCat("slice rows [", sl.row_offset, ", ", sl.row_offset + sl.num_tokens,
                                                     ") at position ", sl.start_position, " outside the batch of ",
                                                     num_rows, " rows"));
    }
    const int64_t end = sl.start_position + sl.num_tokens;
    if (end > std::numeric_limits<int32_t>::max()) return absl::InvalidArgumentError("position beyond 2^31");
    const int64_t needed = (end + block_size - 1) / block_size;
    if (static_cast<int64_t>(sl.kv->blocks().size()) < needed) {
      return absl::FailedPreconditionError(absl::StrCat("KV cache has room for ", sl.kv->blocks().size() * block_size,
                                                        " positions, the slice writes up to ", end));
    }
    batch.num_ptrs += needed;
    batch.num_tiles += (sl.num_tokens + kPrefillQueryTile - 1) / kPrefillQueryTile;
    batch.decode = batch.decode && sl.num_tokens == 1;
  }
  if (batch.num_ptrs > std::numeric_limits<int32_t>::max()) return absl::InvalidArgumentError("block table too large");
  return batch;
}

// Metadata into pinned memory (the previous call has synchronised, so the
// buffer is free): the slices, each row's slice, the block table (padded to
// ptr_capacity) and, for a prefill, the query tiles.
void CudaBackend::Impl::WriteAttentionMeta(std::span<const SequenceSlice> slices, int64_t num_rows,
                                           const AttnBatch& batch, int64_t ptr_capacity, const MetaLayout& layout) {
  uint8_t* m = static_cast<uint8_t*>(meta_host.get());
  auto* slices_h = reinterpret_cast<AttnSlice*>(m + layout.slices);
  auto* row_slice_h = reinterpret_cast<int32_t*>(m + layout.row_slice);
  auto* ptrs_h = reinterpret_cast<float**>(m + layout.block_ptrs);
  auto* tiles_h = reinterpret_cast<int2*>(m + layout.tiles);
  std::fill(row_slice_h, row_slice_h + num_rows, -1);
  int64_t next_ptr = 0, next_tile = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(slices.size()); ++i) {
    const SequenceSlice& sl = slices[static_cast<size_t>(i)];
    KvBlockPool* pool = sl.kv->pool();
    const int64_t end = sl.start_position + sl.num_tokens;
    const int64_t needed = (end + batch.block_size - 1) / batch.block_size;
    AttnSlice a{};
    a.start_position = static_cast<int32_t>(sl.start_position);
    a.num_tokens = static_cast<int32_t>(sl.num_tokens);
    a.row_offset = static_cast<int32_t>(sl.row_offset);
    a.table_offset = static_cast<int32_t>(next_ptr);
    // RotaryEmbedding::UseLongFactors(end - 1): chosen per forward call.
    a.long_factors = rope_original_max > 0 && end > rope_original_max ? 1 : 0;
    slices_h[i] = a;
    const std::vector<int32_t>& table = sl.kv->blocks();
    for (int64_t b = 0; b < needed; ++b) ptrs_h[next_ptr++] = pool->BlockData(table[static_cast<size_t>(b)]);
    for (int64_t r = 0; r < sl.num_tokens; ++r) row_slice_h[sl.row_offset + r] = static_cast<int32_t>(i);
    if (!batch.decode) {
      for (int64_t y = 0; y < sl.num_tokens; y += kPrefillQueryTile) {
        tiles_h[next_tile++] = make_int2(static_cast<int>(i), static_cast<int>(y));
      }
    }
  }
  for (; next_ptr < ptr_capacity; ++next_ptr) ptrs_h[next_ptr] = nullptr;  // bucket padding, never read
}

// A decode step's attention as a CUDA graph: captured the first time its
// (layer, T, S, P bucket, B) is seen, launched again after.
absl::Status CudaBackend::Impl::LaunchDecodeGraph(const GraphKey& key, const MetaLayout& layout, size_t hidden_bytes) {
  const auto [layer, num_rows, num_slices, ptr_capacity, block_size] = key;
  auto it = graphs.find(key);
  if (it == graphs.end()) {
    if (graphs.size() >= kMaxGraphs) graphs.clear();
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    const absl::Status enqueued = EnqueueAttention(layer, num_rows, num_slices, /*decode=*/true, 0, block_size, layout);
    cudaGraph_t captured = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream.get(), &captured);
    CudaGraph graph(captured);
    TANDEM_RETURN_IF_ERROR(enqueued);
    TANDEM_CUDA_RETURN_IF_ERROR(ended);
    absl::StatusOr<CudaGraphExec> exec = CudaGraphExec::Instantiate(graph);
    if (!exec.ok()) return exec.status();
    it = graphs.emplace(key, std::move(*exec)).first;
    ++stats.graphs_captured;
  } else {
    ++stats.graph_launches;
    // The captured copies count as transfers too.
    stats.h2d_bytes += static_cast<int64_t>(layout.bytes + hidden_bytes);
    stats.d2h_bytes += static_cast<int64_t>(hidden_bytes);
  }
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(it->second.get(), stream.get()));
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Router(int layer, int64_t num_rows, const float* in_hidden, float* moe_input,
                                       float* logits_out, int32_t* experts_out, float* weights_out) {
  if (layer < 0 || layer >= static_cast<int>(layers.size())) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (num_rows <= 0) return absl::OkStatus();
  const DeviceLayer& lw = layers[static_cast<size_t>(layer)];
  const int64_t d = config.hidden_size, e = config.num_local_experts, k = config.num_experts_per_tok;
  TANDEM_RETURN_IF_ERROR(SetDevice());
  TANDEM_RETURN_IF_ERROR(EnsureRows(num_rows));
  cudaStream_t s = stream.get();
  auto* h = static_cast<float*>(hidden.get());
  auto* x = static_cast<float*>(normed.get());
  auto* lg = static_cast<float*>(router_logits.get());
  auto* ex = static_cast<int32_t*>(experts.get());
  auto* wt = static_cast<float*>(route_weights.get());
  const size_t hidden_bytes = static_cast<size_t>(num_rows * d) * sizeof(float);
  std::memcpy(in.get(), in_hidden, hidden_bytes);
  TANDEM_RETURN_IF_ERROR(H2D(h, in.get(), hidden_bytes));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchNorm(h, num_rows, d, lw.post_attention_norm.weight, lw.post_attention_norm.bias,
                                         config.rms_norm_eps, x, s));
  TANDEM_RETURN_IF_ERROR(Linear(lw.router, x, num_rows, lg));
  if (config.router_kind() == RouterKind::kSparseMixer) {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchRouteSparseMixer(lg, num_rows, e, config.router_jitter_noise, ex, wt, s));
  } else {
    TANDEM_CUDA_RETURN_IF_ERROR(LaunchRouteSoftmaxTopK(lg, num_rows, e, k, ex, wt, s));
  }
  // Out staging: moe_input [T, D] | logits [T, E] | experts [T, K] | weights [T, K].
  uint8_t* o8 = static_cast<uint8_t*>(out.get());
  const size_t logits_bytes = static_cast<size_t>(num_rows * e) * sizeof(float);
  const size_t route_bytes = static_cast<size_t>(num_rows * k) * 4;
  TANDEM_RETURN_IF_ERROR(D2H(o8, x, hidden_bytes));
  TANDEM_RETURN_IF_ERROR(D2H(o8 + hidden_bytes, lg, logits_bytes));
  TANDEM_RETURN_IF_ERROR(D2H(o8 + hidden_bytes + logits_bytes, ex, route_bytes));
  TANDEM_RETURN_IF_ERROR(D2H(o8 + hidden_bytes + logits_bytes + route_bytes, wt, route_bytes));
  TANDEM_RETURN_IF_ERROR(Sync());
  std::memcpy(moe_input, o8, hidden_bytes);
  std::memcpy(logits_out, o8 + hidden_bytes, logits_bytes);
  std::memcpy(experts_out, o8 + hidden_bytes + logits_bytes, route_bytes);
  std::memcpy(weights_out, o8 + hidden_bytes + logits_bytes + route_bytes, route_bytes);
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Combine(int64_t num_rows, const float* in_weights, const float* in_expert_out,
                                        float* io_hidden) {
  if (num_rows <= 0) return absl::OkStatus();
  const int64_t d = config.hidden_size, k = config.num_experts_per_tok;
  TANDEM_RETURN_IF_ERROR(SetDevice());
  TANDEM_RETURN_IF_ERROR(EnsureRows(num_rows));
  // In staging: hidden [T, D] | weights [T, K] | expert_out [T·K, D].
  const size_t hidden_bytes = static_cast<size_t>(num_rows * d) * sizeof(float);
  const size_t weight_bytes = static_cast<size_t>(num_rows * k) * sizeof(float);
  const size_t expert_bytes = static_cast<size_t>(num_rows * k * d) * sizeof(float);
  uint8_t* i8 = static_cast<uint8_t*>(in.get());
  std::memcpy(i8, io_hidden, hidden_bytes);
  std::memcpy(i8 + hidden_bytes, in_weights, weight_bytes);
  std::memcpy(i8 + hidden_bytes + weight_bytes, in_expert_out, expert_bytes);
  auto* h = static_cast<float*>(hidden.get());
  TANDEM_RETURN_IF_ERROR(H2D(h, i8, hidden_bytes));
  TANDEM_RETURN_IF_ERROR(H2D(route_weights.get(), i8 + hidden_bytes, weight_bytes));
  TANDEM_RETURN_IF_ERROR(H2D(expert_out.get(), i8 + hidden_bytes + weight_bytes, expert_bytes));
  TANDEM_CUDA_RETURN_IF_ERROR(LaunchCombine(h, static_cast<const float*>(route_weights.get()),
                                            static_cast<const float*>(expert_out.get()), num_rows, k, d, stream.get()));
  TANDEM_RETURN_IF_ERROR(D2H(out.get(), h, hidden_bytes));
  TANDEM_RETURN_IF_ERROR(Sync());
  std::memcpy(io_hidden, out.get(), hidden_bytes);
  return absl::OkStatus();
}

absl::Status CudaBackend::Impl::Logits(std::span<const int64_t> rows, const float* in_hidden, float* logits_out) {
  const int64_t d = config.hidden_size, vocab = config.vocab_size, n = static_cast<int64_t>(rows.size());
  if (n == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(SetDevice());
  TANDEM_RETURN_IF_ERROR(EnsureRows(n));
  // Only the rows asked for cross to the device.
  auto* staged = static_cast<float*>(in.get());  // [n, D]
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[static_cast<size_t>(i)];
    if (row < 0) return absl::InvalidArgumentError(absl::StrCat("logits row ", row));
    std::memcpy(staged + i * d, in_hidden + row * d, static_cast<size_t>(d) * sizeof(float));
  }
  const size_t hidden_bytes = static_cast<size_t>(n * d) * sizeof(float);
  const size_t logits_bytes = static_cast<size_t>(n * vocab) * sizeof(float);
  auto* h = static_cast<float*>(hidden.get());
  auto* x = static_cast<float*>(normed.get());
  auto* lg = static_cast<float*>(logits.get());
  TANDEM_RETURN_IF_ERROR(H2D(h, staged, hidden_bytes));
  TANDEM_CUDA_RETURN_IF_ERROR(
      LaunchNorm(h, n, d, final_norm.weight, final_norm.bias, config.rms_norm_eps, x, stream.get()));
  TANDEM_RETURN_IF_ERROR(Linear(lm_head, x, n, lg));
  if (lm_head_bias != nullptr) TANDEM_CUDA_RETURN_IF_ERROR(LaunchAddBias(lg, lm_head_bias, n, vocab, stream.get()));
  TANDEM_RETURN_IF_ERROR(D2H(out.get(), lg, logits_bytes));
  TANDEM_RETURN_IF_ERROR(Sync());
  std::memcpy(logits_out, out.get(), logits_bytes);
  return absl::OkStatus();
}

// ---- CudaBackend ----

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const ModelWeights* weights,
                                                                 const CudaBackendOptions& options) {
  if (weights == nullptr) return absl::InvalidArgumentError("CudaBackend without weights");
  auto impl = std::make_unique<Impl>(weights, options);
  TANDEM_RETURN_IF_ERROR(impl->Init());
  LOG_INFO("CUDA backend on device ", options.device, ": ",
           absl::StrFormat("%.1f MB", static_cast<double>(impl->stats.weight_bytes) / 1e6),
           " of dense weights copied to the device (experts excluded); decode graphs ",
           options.decode_graphs ? "on" : "off");
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  // Every call ends synchronised; this only guards a call that failed
  // half-way with work still queued.
  if (impl_ != nullptr && impl_->stream.get() != nullptr) {
    (void)cudaSetDevice(impl_->options.device);
    (void)cudaStreamSynchronize(impl_->stream.get());
  }
}

absl::Status CudaBackend::Embed(std::span<const int32_t> tokens, float* hidden) { return impl_->Embed(tokens, hidden); }

absl::Status CudaBackend::Attention(int layer, std::span<const SequenceSlice> slices, int64_t num_rows, float* hidden) {
  return impl_->Attention(layer, slices, num_rows, hidden);
}

absl::Status CudaBackend::Router(int layer, int64_t num_rows, const float* hidden, float* moe_input,
                                 float* router_logits, int32_t* experts, float* weights) {
  return impl_->Router(layer, num_rows, hidden, moe_input, router_logits, experts, weights);
}

absl::Status CudaBackend::SharedExpert(int layer, int64_t, const float*, float*, float*) {
  // Validate refuses models with a shared expert before any layer runs.
  return absl::FailedPreconditionError(absl::StrCat("layer ", layer, ": the CUDA backend has no shared expert"));
}

absl::Status CudaBackend::DenseMlp(int layer, int64_t, float*, float*) {
  // Validate refuses models with dense layers before any layer runs.
  return absl::FailedPreconditionError(absl::StrCat("layer ", layer, ": the CUDA backend has no dense MLP layers"));
}

absl::Status CudaBackend::Combine(int64_t num_rows, const float* weights, const float* expert_out, float* hidden) {
  return impl_->Combine(num_rows, weights, expert_out, hidden);
}

absl::Status CudaBackend::Logits(std::span<const int64_t> rows, const float* hidden, float* logits) {
  return impl_->Logits(rows, hidden, logits);
}

std::unique_ptr<KvBlockStorage> CudaBackend::NewKvStorage() {
  return std::make_unique<CudaKvBlockStorage>(impl_.get(), impl_->options.device, impl_->stream.get());
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> CudaBackend::CreateKvPool(const KvCacheOptions& options) {
  return KvBlockPool::Create(options, NewKvStorage());
}

CudaBackendStats CudaBackend::stats() const { return impl_->stats; }

}  // namespace tandem
