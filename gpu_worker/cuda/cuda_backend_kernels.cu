// Device code of the CUDA backend; the contracts are in cuda_backend_kernels.h.
// Written for correctness first: each kernel mirrors the CPU reference
// (coordinator/cpu_ops.cc, common/routing.cc) operation by operation, with
// the same f64 sums where the CPU uses them, so that differences stay at
// f32 rounding (plus the bf16 activations of the cuBLAS GEMMs).
//
// Legend: T rows, D hidden, H query heads, Hkv kv heads, hd head_dim,
// E experts, K experts per token, S slices, L layers, B block_size.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <cmath>

#include "gpu_worker/cuda/cuda_backend_kernels.h"
#include "gpu_worker/cuda/cuda_convert.cuh"

namespace tandem {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kAttnWarps = 4;  // decode and prefill blocks: 4 warps
constexpr int kAttnThreads = 32 * kAttnWarps;
constexpr int kHdChunks = kMaxHeadDim / 32;  // per-lane slices of one head vector
static_assert(kPrefillQueryTile % kAttnWarps == 0, "each warp owns the same number of query rows");
constexpr int kRowsPerWarp = kPrefillQueryTile / kAttnWarps;
static_assert(kPrefillKeyTile == 32, "the prefill kernel maps one key of a tile to one lane");

unsigned int GridFor(int64_t n) {
  // Enough blocks to fill the GPU; grid-stride loops cover the rest.
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

using cuda_convert::ToFloat;

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}
__device__ __forceinline__ double WarpSumD(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread
// gets the total. `scratch`: 32 doubles of shared memory, free on entry and
// free again on return.
__device__ double BlockSumD(double v, double* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSumD(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < warps; ++w) total += scratch[w];
  __syncthreads();  // scratch may be reused by the caller's next reduction
  return total;
}

// Address of row `position` of the K cache (V: add value_offset) for one
// slice at one layer: [kv_dim] f32.
__device__ __forceinline__ const float* CacheRow(float* const* block_ptrs, const AttnSlice& slice, const AttnShape& s,
                                                 int64_t kv_dim, int position) {
  const float* block = block_ptrs[slice.table_offset + position / s.block_size];
  return block + (static_cast<int64_t>(s.layer) * s.block_size + position % s.block_size) * kv_dim;
}

// ---- embedding ----

template <typename T>
__global__ void EmbedKernel(const T* __restrict__ table, const int32_t* __restrict__ tokens, int64_t d,
                            float* __restrict__ hidden) {
  const int64_t t = blockIdx.x;
  const T* src = table + static_cast<int64_t>(tokens[t]) * d;
  float* dst = hidden + t * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dst[i] = ToFloat<T>(src[i]);
}

// ---- norms (one block per row) ----

__global__ void NormKernel(const float* __restrict__ x, int64_t d, const float* __restrict__ weight,
                           const float* __restrict__ bias, double eps, float* __restrict__ y) {
  __shared__ double scratch[32];
  const float* xt = x + static_cast<int64_t>(blockIdx.x) * d;
  float* yt = y + static_cast<int64_t>(blockIdx.x) * d;
  if (bias == nullptr) {
    // RMSNorm: x / sqrt(mean(x²) + eps) · w
    double sum_sq = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum_sq += static_cast<double>(xt[i]) * xt[i];
    sum_sq = BlockSumD(sum_sq, scratch);
    const float inv = static_cast<float>(1.0 / sqrt(sum_sq / static_cast<double>(d) + eps));
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yt[i] = xt[i] * inv * weight[i];
  } else {
    // LayerNorm: (x - mean) / sqrt(var + eps) · w + b, biased variance
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) sum += xt[i];
    sum = BlockSumD(sum, scratch);
    const double mean = sum / static_cast<double>(d);
    double var = 0.0;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) var += (xt[i] - mean) * (xt[i] - mean);
    var = BlockSumD(var, scratch);
    const float inv = static_cast<float>(1.0 / sqrt(var / static_cast<double>(d) + eps));
    const float mean_f = static_cast<float>(mean);
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) yt[i] = (xt[i] - mean_f) * inv * weight[i] + bias[i];
  }
}

// ---- element-wise ----

__global__ void AddBiasKernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % n];
  }
}

__global__ void AddResidualKernel(float* __restrict__ hidden, const float* __restrict__ o,
                                  const float* __restrict__ bias, int64_t d, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // The CPU's Linear adds the bias into o first, then hidden += o.
    hidden[i] += bias != nullptr ? o[i] + bias[i % d] : o[i];
  }
}

__global__ void CombineKernel(float* __restrict__ hidden, const float* __restrict__ weights,
                              const float* __restrict__ expert_out, int64_t k, int64_t d, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / d, j = i % d;
    float h = hidden[i];
    for (int64_t s = 0; s < k; ++s) h += weights[t * k + s] * expert_out[(t * k + s) * d + j];
    hidden[i] = h;
  }
}

// ---- bias + RoPE + KV write (one block per row) ----

__global__ void RopeStoreKvKernel(const AttnSlice* __restrict__ slices, const int32_t* __restrict__ row_slice,
                                  float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                  const float* __restrict__ q_bias, const float* __restrict__ k_bias,
                                  const float* __restrict__ v_bias, const double* __restrict__ inv_freq,
                                  const double* __restrict__ mscale, float* const* __restrict__ block_ptrs,
                                  AttnShape s) {
  __shared__ float cos_s[kMaxHeadDim / 2], sin_s[kMaxHeadDim / 2];
  const int64_t row = blockIdx.x;
  const int slice_index = row_slice[row];
  if (slice_index < 0) return;  // uniform over the block: no thread reaches the barrier below
  const AttnSlice slice = slices[slice_index];
  const int position = slice.start_position + static_cast<int>(row - slice.row_offset);
  const int hd = s.head_dim, half = hd / 2;
  const int64_t q_dim = static_cast<int64_t>(s.heads) * hd, kv_dim = static_cast<int64_t>(s.kv_heads) * hd;

  // cos/sin once per row, as the CPU: angle in f64, (cos · mscale) to f32.
  const double* freq = inv_freq + (slice.long_factors ? half : 0);
  const double ms = mscale[slice.long_factors ? 1 : 0];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double sn, cs;
    sincos(static_cast<double>(position) * freq[i], &sn, &cs);
    cos_s[i] = static_cast<float>(cs * ms);
    sin_s[i] = static_cast<float>(sn * ms);
  }
  __syncthreads();

  // q: each thread owns whole (i, i + half) pairs, so in-place is race-free.
  float* qr = q + row * q_dim;
  for (int idx = threadIdx.x; idx < s.heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const int64_t lo = static_cast<int64_t>(h) * hd + i, hi = lo + half;
    const float a = qr[lo] + (q_bias != nullptr ? q_bias[lo] : 0.0f);
    const float b = qr[hi] + (q_bias != nullptr ? q_bias[hi] : 0.0f);
    qr[lo] = a * cos_s[i] - b * sin_s[i];
    qr[hi] = b * cos_s[i] + a * sin_s[i];
  }

  // k: rotated straight into the cache; v: copied (plus bias).
  float* key_row = const_cast<float*>(CacheRow(block_ptrs, slice, s, kv_dim, position));
  float* value_row = key_row + static_cast<int64_t>(s.num_layers) * s.block_size * kv_dim;
  const float* kr = k + row * kv_dim;
  for (int idx = threadIdx.x; idx < s.kv_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    const int64_t lo = static_cast<int64_t>(h) * hd + i, hi = lo + half;
    const float a = kr[lo] + (k_bias != nullptr ? k_bias[lo] : 0.0f);
    const float b = kr[hi] + (k_bias != nullptr ? k_bias[hi] : 0.0f);
    key_row[lo] = a * cos_s[i] - b * sin_s[i];
    key_row[hi] = b * cos_s[i] + a * sin_s[i];
  }
  const float* vr = v + row * kv_dim;
  for (int64_t j = threadIdx.x; j < kv_dim; j += blockDim.x) {
    value_row[j] = vr[j] + (v_bias != nullptr ? v_bias[j] : 0.0f);
  }
}

// ---- decode attention: one block per (slice, query head) ----

__global__ void __launch_bounds__(kAttnThreads)
    AttentionDecodeKernel(const AttnSlice* __restrict__ slices, const float* __restrict__ q,
                          float* const* __restrict__ block_ptrs, AttnShape s, float* __restrict__ out) {
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float m_s[kAttnWarps], l_s[kAttnWarps];
  __shared__ float acc_s[kAttnWarps][kMaxHeadDim];
  const AttnSlice slice = slices[blockIdx.x];
  const int h = blockIdx.y;
  const int hd = s.head_dim;
  const int kvh = h / (s.heads / s.kv_heads);
  const int64_t q_dim = static_cast<int64_t>(s.heads) * hd, kv_dim = static_cast<int64_t>(s.kv_heads) * hd;
  const int64_t value_offset = static_cast<int64_t>(s.num_layers) * s.block_size * kv_dim;
  const int position = slice.start_position;  // the one new row
  const int first = s.window > 0 ? max(0, position - s.window + 1) : 0;
  const int64_t row = slice.row_offset;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;

  for (int i = threadIdx.x; i < hd; i += blockDim.x) q_s[i] = q[row * q_dim + static_cast<int64_t>(h) * hd + i];
  __syncthreads();

  // Each warp streams keys first + warp, first + warp + 4, ...: lanes split
  // the head dimension, the running max/sum are per warp (same in all lanes).
  float m = -INFINITY, l = 0.0f;
  float acc[kHdChunks];
#pragma unroll
  for (int c = 0; c < kHdChunks; ++c) acc[c] = 0.0f;
  for (int j = first + warp; j <= position; j += kAttnWarps) {
    const float* key = CacheRow(block_ptrs, slice, s, kv_dim, j) + static_cast<int64_t>(kvh) * hd;
    const float* value = key + value_offset;
    float dot = 0.0f;
#pragma unroll
    for (int c = 0; c < kHdChunks; ++c) {
      const int i = lane + 32 * c;
      if (i < hd) dot += q_s[i] * key[i];
    }
    const float score = WarpSum(dot) * s.scale;
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);  // m = -inf at the first key: 0
    const float p = expf(score - m_new);
    l = l * correction + p;
#pragma unroll
    for (int c = 0; c < kHdChunks; ++c) {
      const int i = lane + 32 * c;
      if (i < hd) acc[c] = acc[c] * correction + p * value[i];
    }
    m = m_new;
  }

  // Merge the warps' partial softmaxes.
#pragma unroll
  for (int c = 0; c < kHdChunks; ++c) {
    const int i = lane + 32 * c;
    if (i < hd) acc_s[warp][i] = acc[c];
  }
  if (lane == 0) {
    m_s[warp] = m;
    l_s[warp] = l;
  }
  __syncthreads();
  float m_all = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) m_all = fmaxf(m_all, m_s[w]);
  for (int i = threadIdx.x; i < hd; i += blockDim.x) {
    float num = 0.0f, den = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      if (m_s[w] == -INFINITY) continue;  // a warp that saw no key
      const float f = expf(m_s[w] - m_all);
      num += acc_s[w][i] * f;
      den += l_s[w] * f;
    }
    out[row * q_dim + static_cast<int64_t>(h) * hd + i] = num / den;
  }
}

// ---- prefill attention: one block per (query tile of a slice, query head) ----
// Shared memory (dynamic, PrefillAttentionSharedBytes): q_s
// [kPrefillQueryTile, hd], then kv_s, which holds one key tile
// [kPrefillKeyTile, hd + 1] (padded: lane j reads key j's row,
// conflict-free) while it is scored, then the same tile's values
// [kPrefillKeyTile, hd] while they are summed. Keys and values taking turns
// in one buffer keeps head_dim 256 at 48.1 KB, within sm_75's 64 KB
// (separate buffers took 80.1 KB).

static_assert(PrefillAttentionSharedBytes(kMaxHeadDim) <= kMinOptInSharedBytesPerBlock,
              "the prefill tiles must fit the smallest targeted GPU's shared memory (sm_75: 64 KB per block)");

// The prefill kernel's steps. Its query tile [num_q rows of head h] into
// q_s [kPrefillQueryTile, hd], zero past num_q.
__device__ __forceinline__ void LoadQueryTile(const float* __restrict__ q, int64_t row0, int num_q, int64_t q_dim,
                                              int h, int hd, float* q_s) {
  for (int idx = threadIdx.x; idx < kPrefillQueryTile * hd; idx += blockDim.x) {
    const int r = idx / hd, i = idx % hd;
    q_s[idx] = r < num_q ? q[(row0 + r) * q_dim + static_cast<int64_t>(h) * hd + i] : 0.0f;
  }
}

// Rows [tile_start, tile_start + kPrefillKeyTile) of KV head kvh's keys
// (values: `value_offset` floats further on in the cache) into kv_s, row j
// at kv_s + j * ld, zero past pos_last (never visible, see ScoreKeyTile).
__device__ __forceinline__ void LoadKvTile(float* const* __restrict__ block_ptrs, const AttnSlice& slice,
                                           const AttnShape& s, int64_t kv_dim, int64_t value_offset, int kvh,
                                           int tile_start, int pos_last, int ld, float* kv_s) {
  const int hd = s.head_dim;
  for (int idx = threadIdx.x; idx < kPrefillKeyTile * hd; idx += blockDim.x) {
    const int j = idx / hd, i = idx % hd;
    const int kp = tile_start + j;
    kv_s[j * ld + i] =
        kp <= pos_last ? CacheRow(block_ptrs, slice, s, kv_dim, kp)[value_offset + static_cast<int64_t>(kvh) * hd + i]
                       : 0.0f;
  }
}

// Online softmax over one key tile: lane j scores key tile_start + j against
// each of the warp's rows; each row's running max m, sum l and accumulator
// are rescaled now, its probabilities kept in p[rr] (lane j's for key j) for
// the value pass.
struct PrefillRows {
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kHdChunks], p[kRowsPerWarp];
};
__device__ __forceinline__ void ScoreKeyTile(const float* q_s, const float* k_s, const AttnShape& s, int num_q,
                                             int pos0, int tile_start, PrefillRows& rows) {
  const int hd = s.head_dim;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int kp = tile_start + lane;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    rows.p[rr] = 0.0f;
    const int r = warp * kRowsPerWarp + rr;
    if (r >= num_q) continue;  // uniform over the warp; no barrier inside
    const int qp = pos0 + r;
    const int first = s.window > 0 ? max(0, qp - s.window + 1) : 0;
    const bool valid = kp <= qp && kp >= first;  // causal, window; kp <= qp <= pos_last
    float score = -INFINITY;
    if (valid) {
      const float* qrow = q_s + r * hd;
      const float* krow = k_s + lane * (hd + 1);
      float dot = 0.0f;
      for (int i = 0; i < hd; ++i) dot += qrow[i] * krow[i];
      score = dot * s.scale;
    }
    const float tile_max = WarpMax(score);
    if (tile_max == -INFINITY) continue;  // no key of this tile is visible to row r: p stays 0
    const float m_new = fmaxf(rows.m[rr], tile_max);
    const float correction = expf(rows.m[rr] - m_new);
    rows.p[rr] = valid ? expf(score - m_new) : 0.0f;
    rows.l[rr] = rows.l[rr] * correction + WarpSum(rows.p[rr]);
#pragma unroll
    for (int c = 0; c < kHdChunks; ++c) rows.acc[rr][c] *= correction;
    rows.m[rr] = m_new;
  }
}

// acc += p · V for the warp's rows, the tile's values in v_s [kPrefillKeyTile, hd].
__device__ __forceinline__ void AccumulateValueTile(const float* v_s, int hd, int num_q, PrefillRows& rows) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= num_q) continue;  // uniform over the warp
    for (int j = 0; j < kPrefillKeyTile; ++j) {
      const float pj = __shfl_sync(kFullMask, rows.p[rr], j);  // 0 for keys row r does not see
#pragma unroll
      for (int c = 0; c < kHdChunks; ++c) {
        const int i = lane + 32 * c;
        if (i < hd) rows.acc[rr][c] += pj * v_s[j * hd + i];
      }
    }
  }
}

// The warp's rows of the tile: acc / l into out.
__device__ __forceinline__ void WriteWarpRows(const float (&l)[kRowsPerWarp],
                                              const float (&acc)[kRowsPerWarp][kHdChunks], int64_t row0, int num_q,
                                              int64_t q_dim, int h, int hd, float* __restrict__ out) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr;
    if (r >= num_q) continue;
    // l > 0: the row's own position is always visible.
    const float inv_l = 1.0f / l[rr];
#pragma unroll
    for (int c = 0; c < kHdChunks; ++c) {
      const int i = lane + 32 * c;
      if (i < hd) out[(row0 + r) * q_dim + static_cast<int64_t>(h) * hd + i] = acc[rr][c] * inv_l;
    }
  }
}

__global__ void __launch_bounds__(kAttnThreads)
    AttentionPrefillKernel(const AttnSlice* __restrict__ slices, const int2* __restrict__ tiles,
                           const float* __restrict__ q, float* const* __restrict__ block_ptrs, AttnShape s,
                           float* __restrict__ out) {
  extern __shared__ float smem[];
  const int hd = s.head_dim;
  float* q_s = smem;                           // [16, hd]
  float* kv_s = q_s + kPrefillQueryTile * hd;  // [32, hd + 1] keys, then [32, hd] values
  const int2 tile = tiles[blockIdx.x];
  const AttnSlice slice = slices[tile.x];
  const int h = blockIdx.y;
  const int kvh = h / (s.heads / s.kv_heads);
  const int64_t q_dim = static_cast<int64_t>(s.heads) * hd, kv_dim = static_cast<int64_t>(s.kv_heads) * hd;
  const int64_t value_offset = static_cast<int64_t>(s.num_layers) * s.block_size * kv_dim;

  const int num_q = min(kPrefillQueryTile, slice.num_tokens - tile.y);   // rows in this tile, >= 1
  const int64_t row0 = static_cast<int64_t>(slice.row_offset) + tile.y;  // batch row of local row 0
  const int pos0 = slice.start_position + tile.y;                        // its position
  const int pos_last = pos0 + num_q - 1;
  const int key_begin = s.window > 0 ? max(0, pos0 - s.window + 1) : 0;

  LoadQueryTile(q, row0, num_q, q_dim, h, hd, q_s);
  PrefillRows rows;
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    rows.m[rr] = -INFINITY;
    rows.l[rr] = 0.0f;
#pragma unroll
    for (int c = 0; c < kHdChunks; ++c) rows.acc[rr][c] = 0.0f;
  }

  for (int tile_start = key_begin; tile_start <= pos_last; tile_start += kPrefillKeyTile) {
    __syncthreads();  // q_s written (first pass) / the previous tile's values consumed
    LoadKvTile(block_ptrs, slice, s, kv_dim, 0, kvh, tile_start, pos_last, hd + 1, kv_s);
    __syncthreads();
    ScoreKeyTile(q_s, kv_s, s, num_q, pos0, tile_start, rows);
    __syncthreads();  // every warp has scored: the values may take the buffer
    LoadKvTile(block_ptrs, slice, s, kv_dim, value_offset, kvh, tile_start, pos_last, hd, kv_s);
    __syncthreads();
    AccumulateValueTile(kv_s, hd, num_q, rows);
  }

  WriteWarpRows(rows.l, rows.acc, row0, num_q, q_dim, h, hd, out);
}

// ---- routers (one thread per row) ----

__global__ void RouteSoftmaxTopKKernel(const float* __restrict__ logits, int64_t rows, int64_t num_experts, int64_t k,
                                       int32_t* __restrict__ experts, float* __restrict__ weights) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows) return;
  const float* lg = logits + t * num_experts;
  int32_t chosen[kMaxExpertsPerToken];
  for (int64_t slot = 0; slot < k; ++slot) {
    int32_t best = -1;
    for (int64_t e = 0; e < num_experts; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < slot; ++j) taken |= chosen[j] == e;
      if (!taken && (best < 0 || lg[e] > lg[best])) best = static_cast<int32_t>(e);
    }
    chosen[slot] = best;
  }
  // As routing.cc: exp in f32 (std::exp of a float), the sum in f64.
  const float max_logit = lg[chosen[0]];
  float w[kMaxExpertsPerToken];
  double sum = 0.0;
  for (int64_t slot = 0; slot < k; ++slot) {
    w[slot] = expf(lg[chosen[slot]] - max_logit);
    sum += w[slot];
  }
  for (int64_t slot = 0; slot < k; ++slot) {
    experts[t * k + slot] = chosen[slot];
    weights[t * k + slot] = static_cast<float>(w[slot] / sum);
  }
}

// routing.cc's BandWeight, same types step by step.
__device__ float BandWeight(const float* scores, int64_t num_experts, int32_t chosen, int32_t excluded, float threshold,
                            double jitter_eps) {
  double sum = 0.0;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (e == excluded) continue;
    const float factor = fmaxf(fabsf(scores[e]), threshold);
    const bool masked = (threshold - scores[e]) / factor > 2.0 * jitter_eps;
    if (!masked) sum += exp(static_cast<double>(scores[e]) - threshold);
  }
  return static_cast<float>(exp(static_cast<double>(scores[chosen]) - threshold) / sum);
}

__global__ void RouteSparseMixerKernel(const float* __restrict__ logits, int64_t rows, int64_t num_experts,
                                       double jitter_eps, int32_t* __restrict__ experts, float* __restrict__ weights) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= rows) return;
  const float* scores = logits + t * num_experts;
  int32_t first = 0;
  for (int64_t e = 1; e < num_experts; ++e) {
    if (scores[e] > scores[first]) first = static_cast<int32_t>(e);
  }
  int32_t second = -1;
  for (int64_t e = 0; e < num_experts; ++e) {
    if (e != first && (second < 0 || scores[e] > scores[second])) second = static_cast<int32_t>(e);
  }
  experts[t * 2] = first;
  weights[t * 2] = BandWeight(scores, num_experts, first, -1, scores[first], jitter_eps);
  experts[t * 2 + 1] = second;
  weights[t * 2 + 1] = BandWeight(scores, num_experts, second, first, scores[second], jitter_eps);
}

}  // namespace

cudaError_t LaunchEmbed(const void* table, KernelDType dtype, const int32_t* tokens, int64_t rows, int64_t d,
                        float* hidden, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const unsigned int grid = static_cast<unsigned int>(rows);
  switch (dtype) {
    case KernelDType::kF32:
      EmbedKernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(table), tokens, d, hidden);
      break;
    case KernelDType::kF16:
      EmbedKernel<<<grid, kThreads, 0, stream>>>(static_cast<const __half*>(table), tokens, d, hidden);
      break;
    case KernelDType::kBF16:
      EmbedKernel<<<grid, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(table), tokens, d, hidden);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t LaunchNorm(const float* x, int64_t rows, int64_t d, const float* weight, const float* bias, double eps,
                       float* y, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  NormKernel<<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(x, d, weight, bias, eps, y);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, const float* bias, int64_t rows, int64_t n, cudaStream_t stream) {
  const int64_t total = rows * n;
  if (total <= 0) return cudaSuccess;
  AddBiasKernel<<<GridFor(total), kThreads, 0, stream>>>(y, bias, n, total);
  return cudaGetLastError();
}

cudaError_t LaunchAddResidual(float* hidden, const float* o, const float* bias, int64_t rows, int64_t d,
                              cudaStream_t stream) {
  const int64_t total = rows * d;
  if (total <= 0) return cudaSuccess;
  AddResidualKernel<<<GridFor(total), kThreads, 0, stream>>>(hidden, o, bias, d, total);
  return cudaGetLastError();
}

cudaError_t LaunchRopeStoreKv(const AttnSlice* slices, const int32_t* row_slice, int64_t rows, float* q, const float* k,
                              const float* v, const float* q_bias, const float* k_bias, const float* v_bias,
                              const double* inv_freq, const double* mscale, float* const* block_ptrs,
                              const AttnShape& shape, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim || shape.head_dim % 2 != 0) return cudaErrorInvalidValue;
  RopeStoreKvKernel<<<static_cast<unsigned int>(rows), 128, 0, stream>>>(slices, row_slice, q, k, v, q_bias, k_bias,
                                                                         v_bias, inv_freq, mscale, block_ptrs, shape);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionDecode(const AttnSlice* slices, int64_t num_slices, const float* q,
                                  const float* const* block_ptrs, const AttnShape& shape, float* out,
                                  cudaStream_t stream) {
  if (num_slices <= 0) return cudaSuccess;
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim || shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned int>(num_slices), static_cast<unsigned int>(shape.heads));
  AttentionDecodeKernel<<<grid, kAttnThreads, 0, stream>>>(slices, q, const_cast<float* const*>(block_ptrs), shape,
                                                           out);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionPrefill(const AttnSlice* slices, const int2* tiles, int64_t num_tiles, const float* q,
                                   const float* const* block_ptrs, const AttnShape& shape, float* out,
                                   cudaStream_t stream) {
  if (num_tiles <= 0) return cudaSuccess;
  if (shape.head_dim <= 0 || shape.head_dim > kMaxHeadDim || shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  const size_t shared = PrefillAttentionSharedBytes(shape.head_dim);
  if (shared > 48 * 1024) {
    // Above the default 48 KB a kernel must opt in (only hd 256 here; the
    // backend checked the device's limit at Create).
    const cudaError_t err = cudaFuncSetAttribute(AttentionPrefillKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(shared));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned int>(num_tiles), static_cast<unsigned int>(shape.heads));
  AttentionPrefillKernel<<<grid, kAttnThreads, shared, stream>>>(slices, tiles, q,
                                                                 const_cast<float* const*>(block_ptrs), shape, out);
  return cudaGetLastError();
}

cudaError_t LaunchRouteSoftmaxTopK(const float* logits, int64_t rows, int64_t num_experts, int64_t k, int32_t* experts,
                                   float* weights, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (k <= 0 || k > kMaxExpertsPerToken || k > num_experts) return cudaErrorInvalidValue;
  const unsigned int grid = static_cast<unsigned int>((rows + 127) / 128);
  RouteSoftmaxTopKKernel<<<grid, 128, 0, stream>>>(logits, rows, num_experts, k, experts, weights);
  return cudaGetLastError();
}

cudaError_t LaunchRouteSparseMixer(const float* logits, int64_t rows, int64_t num_experts, double jitter_eps,
                                   int32_t* experts, float* weights, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (num_experts < 2) return cudaErrorInvalidValue;
  const unsigned int grid = static_cast<unsigned int>((rows + 127) / 128);
  RouteSparseMixerKernel<<<grid, 128, 0, stream>>>(logits, rows, num_experts, jitter_eps, experts, weights);
  return cudaGetLastError();
}

cudaError_t LaunchCombine(float* hidden, const float* weights, const float* expert_out, int64_t rows, int64_t k,
                          int64_t d, cudaStream_t stream) {
  const int64_t total = rows * d;
  if (total <= 0) return cudaSuccess;
  CombineKernel<<<GridFor(total), kThreads, 0, stream>>>(hidden, weights, expert_out, k, d, total);
  return cudaGetLastError();
}

}  // namespace tandem
