// The CUDA backend's own kernels (the linear layers are cuBLAS): embedding
// gather, RMSNorm/LayerNorm, bias + RoPE + KV-cache write, attention over the
// block KV cache (a decode kernel and a flash-style prefill kernel), the
// routers and the expert combine. Each launches on `stream` and returns the
// launch's error (cudaGetLastError); asynchronous failures surface at the
// next synchronisation. Every pointer is device memory unless it says host.
//
// Legend: T rows in the batch, D hidden, H query heads, Hkv kv heads,
// hd head_dim, E experts, K experts per token, V vocab, S slices,
// L layers, B block_size (positions per KV block).
//
// Shapes and ranges supported (callers check them; see CudaBackend::Create):
//   T < 2^31, D <= 2^20, hd even and <= kMaxHeadDim (256), H % Hkv == 0,
//   E <= kMaxRouterExperts (1024), K <= kMaxExpertsPerToken (16), positions
//   < 2^31. Element types of the embedding table: f32, f16, bf16.
//
// KV cache layout (coordinator/kv_cache.h): one block is [2, L, B, kv_dim]
// f32 (K then V); the key of position p of a slice at layer l is at
//   block_ptrs[slice.table_offset + p / B] + (l * B + p % B) * kv_dim
// and its value at the same offset plus L * B * kv_dim.
//
// C++17 on purpose: included by the .cu (nvcc compiles device code as C++17
// here) and by the C++20 backend; no common/dtype.h, no <span>.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu_worker/cuda/cuda_expert_kernels.h"  // KernelDType, LaunchConvertF32

namespace tandem {

constexpr int kMaxHeadDim = 256;
constexpr int kMaxRouterExperts = 1024;
constexpr int kMaxExpertsPerToken = 16;

// One sequence's run of rows in the batch, as the attention kernels see it
// (host fills it, one H2D copy per call). 32 bytes, no padding.
struct AttnSlice {
  int32_t start_position;  // position of the slice's first new row
  int32_t num_tokens;      // new rows (>= 1)
  int32_t row_offset;      // first row in the batch
  int32_t table_offset;    // first entry of this slice's block table in block_ptrs
  int32_t long_factors;    // 1: longrope long factors for this forward, else short
  int32_t pad0, pad1, pad2;
};

// The geometry every attention kernel needs.
struct AttnShape {
  int32_t heads;       // H
  int32_t kv_heads;    // Hkv
  int32_t head_dim;    // hd
  int32_t num_layers;  // L
  int32_t block_size;  // B
  int32_t layer;       // the layer being run
  int32_t window;      // sliding window (keys in (p - window, p]); 0: none
  float scale;         // 1 / sqrt(hd)
};

// hidden[t, :] = table[tokens[t], :] widened to f32.    table: [V, D] of
// `dtype`; tokens [T] (already range-checked); hidden [T, D] f32.
cudaError_t LaunchEmbed(const void* table, KernelDType dtype, const int32_t* tokens, int64_t rows, int64_t d,
                        float* hidden, cudaStream_t stream);

// y = RMSNorm(x) · weight (bias null) or LayerNorm(x) · weight + bias
// (bias non-null), eps as given; sums in f64 as the CPU does.
// x, y: [T, D] f32 (may not alias); weight, bias: [D] f32.
cudaError_t LaunchNorm(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, double eps,
                       float* y, cudaStream_t stream);

// y[t, j] += bias[j]                                    y: [T, N] f32, bias [N] f32
cudaError_t LaunchAddBias(float* y, const float* bias, int64_t rows, int64_t n, cudaStream_t stream);

// hidden[t, j] += o[t, j] (+ bias[j] when bias is non-null)   [T, D] f32
cudaError_t LaunchAddResidual(float* hidden, const float* o, const float* bias, int64_t rows, int64_t d,
                              cudaStream_t stream);

// For every row of every slice: q, k, v += their biases (each may be null),
// q and k rotated by RoPE at the row's position (rotate_half pairs
// (i, i + hd/2); angle = position · inv_freq[i] in f64, cos/sin · mscale,
// the long or short table by slice.long_factors), then k and v written to
// the slice's block in the cache at (shape.layer, position).
// row_slice: [T] int32, the slice of each row (-1: row belongs to none).
// q: [T, H·hd] f32 (in place); k, v: [T, Hkv·hd] f32 (read only: the
// rotated k goes to the cache only).
// inv_freq: [2, hd/2] f64 (short, long); mscale: [2] f64 (short, long).
cudaError_t LaunchRopeStoreKv(const AttnSlice* slices, const int32_t* row_slice, int64_t rows, float* q, const float* k,
                              const float* v, const float* q_bias, const float* k_bias, const float* v_bias,
                              const double* inv_freq, const double* mscale, float* const* block_ptrs,
                              const AttnShape& shape, cudaStream_t stream);

// Decode: every slice has exactly one new row (num_rows == S); row r =
// slices[r].row_offset attends, per query head, to its cached keys
// [first, position] (first = 0 or position - window + 1), GQA head
// h / (H / Hkv). One block per (slice, head), online softmax in f32.
// q, out: [T, H·hd] f32.
cudaError_t LaunchAttentionDecode(const AttnSlice* slices, int64_t num_slices, const float* q,
                                  const float* const* block_ptrs, const AttnShape& shape, float* out,
                                  cudaStream_t stream);

// Prefill (any slices, any number of rows each): flash-style. A block takes
// kPrefillQueryTile consecutive rows of one slice and one query head,
// streams the slice's cached keys/values (prior positions and this call's
// new ones, which LaunchRopeStoreKv has already written) through shared
// memory kPrefillKeyTile at a time with an online softmax; no score matrix
// reaches global memory. tiles: [num_tiles] int2 (x: slice, y: first row
// of the tile within the slice), host-built.
constexpr int kPrefillQueryTile = 16;
constexpr int kPrefillKeyTile = 32;
// The prefill kernel's dynamic shared memory at head_dim `hd`: the query
// tile [16, hd] and one key tile [32, hd + 1] (the tile's values reuse it)
// of f32; 48.1 KB at hd 256.
constexpr size_t PrefillAttentionSharedBytes(int hd) {
  return sizeof(float) * (static_cast<size_t>(kPrefillQueryTile) * static_cast<size_t>(hd) +
                          static_cast<size_t>(kPrefillKeyTile) * (static_cast<size_t>(hd) + 1));
}
// The smallest opt-in shared memory per block of the GPUs the build targets
// (sm_75: 64 KB; sm_80 163 KB, sm_86/89 99 KB, sm_90 227 KB). The kernel's
// need at kMaxHeadDim is checked against it at compile time, and against
// the device's own cudaDevAttrMaxSharedMemoryPerBlockOptin at Create.
constexpr size_t kMinOptInSharedBytesPerBlock = 64 * 1024;
cudaError_t LaunchAttentionPrefill(const AttnSlice* slices, const int2* tiles, int64_t num_tiles, const float* q,
                                   const float* const* block_ptrs, const AttnShape& shape, float* out,
                                   cudaStream_t stream);

// Routers, one thread per row, the same arithmetic and tie-breaking as
// common/routing.cc: softmax_topk (Mixtral: top-K by repeated argmax, lower
// index wins ties, softmax over the chosen K in f64) or sparsemixer
// (PhiMoE top-2 with the jitter band; K must be 2).
// logits: [T, E] f32; experts: [T, K] int32; weights: [T, K] f32.
cudaError_t LaunchRouteSoftmaxTopK(const float* logits, int64_t rows, int64_t num_experts, int64_t k, int32_t* experts,
                                   float* weights, cudaStream_t stream);
cudaError_t LaunchRouteSparseMixer(const float* logits, int64_t rows, int64_t num_experts, double jitter_eps,
                                   int32_t* experts, float* weights, cudaStream_t stream);

// hidden[t, :] += Σ_k weights[t, k] · expert_out[t·K + k, :] (k in order)
// hidden: [T, D] f32; weights: [T, K] f32; expert_out: [T·K, D] f32.
cudaError_t LaunchCombine(float* hidden, const float* weights, const float* expert_out, int64_t rows, int64_t k,
                          int64_t d, cudaStream_t stream);

}  // namespace tandem
