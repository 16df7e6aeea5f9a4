// Decode GEMV and dequantization for the CUDA pool's block-quantized
// experts (cuda_quant_kernels.h). Each format is a struct with its block's
// value count and bytes and a device function decoding value i of a block,
// written from the layouts in common/quant/block_formats.h and the K-quant
// packing in common/quant/k_quants.h; the kernels are templates over it.
//
// Legend: n output rows of a weight matrix, k its inputs (values per row).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gpu_worker/cuda/cuda_convert.cuh"
#include "gpu_worker/cuda/cuda_quant_kernels.h"

namespace tandem {
namespace {

using cuda_convert::FromFloat;
using cuda_convert::ToFloat;

// Little-endian f16 at byte `at` of a block (blocks are memcpy'd structs on
// the host; here two bytes at an even offset).
__device__ __forceinline__ float F16At(const uint8_t* b, int at) {
  const unsigned short bits = static_cast<unsigned short>(b[at] | (b[at + 1] << 8));
  return __half2float(__ushort_as_half(bits));
}

// Q8_0: {f16 d; int8 qs[32]}: d · qs[i].
struct Q8_0 {
  static constexpr int kValues = 32, kBytes = 34;
  __device__ static float Value(const uint8_t* b, int i) { return F16At(b, 0) * static_cast<int8_t>(b[2 + i]); }
};

// The 4-bit value i of a 32-value block whose 16 nibble bytes start at qs:
// low nibbles hold values 0..15, high nibbles 16..31.
__device__ __forceinline__ int Nibble32(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }

// Q4_0: {f16 d; qs[16]}: d · (nibble - 8).
struct Q4_0 {
  static constexpr int kValues = 32, kBytes = 18;
  __device__ static float Value(const uint8_t* b, int i) { return F16At(b, 0) * (Nibble32(b + 2, i) - 8); }
};

// Q4_1: {f16 d; f16 m; qs[16]}: d · nibble + m.
struct Q4_1 {
  static constexpr int kValues = 32, kBytes = 20;
  __device__ static float Value(const uint8_t* b, int i) { return F16At(b, 0) * Nibble32(b + 4, i) + F16At(b, 2); }
};

// Q5_0: {f16 d; qh[4] (bit i: value i's fifth bit); qs[16]}: d · (q - 16).
struct Q5_0 {
  static constexpr int kValues = 32, kBytes = 22;
  __device__ static float Value(const uint8_t* b, int i) {
    const int high = (b[2 + i / 8] >> (i % 8)) & 1;
    return F16At(b, 0) * ((Nibble32(b + 6, i) | (high << 4)) - 16);
  }
};

// Q4_K/Q5_K's packed 6-bit scale and min of sub-block j (0..7) from
// scales[12]: j < 4 in the low six bits of scales[j] and scales[j + 4];
// j >= 4 low four bits in the nibbles of scales[j + 4], top two bits in
// bits 6-7 of scales[j - 4] (scale) and scales[j] (min).
__device__ __forceinline__ void KScaleMin(const uint8_t* scales, int j, int* scale, int* min) {
  if (j < 4) {
    *scale = scales[j] & 63;
    *min = scales[j + 4] & 63;
  } else {
    *scale = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
    *min = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Q4_K: {f16 d; f16 dmin; scales[12]; qs[128]}. Value i lies in 64-value
// chunk c = i / 64, whose 32 bytes qs[32c ..] hold values 64c .. 64c+31 in
// their low nibbles and 64c+32 .. 64c+63 in their high ones; sub-block
// 2c (low) or 2c+1 (high): d·scale·q - dmin·min.
struct Q4_K {
  static constexpr int kValues = 256, kBytes = 144;
  __device__ static float Value(const uint8_t* b, int i) {
    const int chunk = i / 64, high = (i % 64) / 32, l = i % 32;
    const uint8_t byte = b[16 + 32 * chunk + l];
    const int q = high ? byte >> 4 : byte & 15;
    int scale, min;
    KScaleMin(b + 4, 2 * chunk + high, &scale, &min);
    return F16At(b, 0) * scale * q - F16At(b, 2) * min;
  }
};

// Q5_K: {f16 d; f16 dmin; scales[12]; qh[32]; qs[128]}: as Q4_K plus a
// fifth bit, bit 2c (low half) or 2c+1 (high half) of qh[l].
struct Q5_K {
  static constexpr int kValues = 256, kBytes = 176;
  __device__ static float Value(const uint8_t* b, int i) {
    const int chunk = i / 64, high = (i % 64) / 32, l = i % 32;
    const uint8_t byte = b[48 + 32 * chunk + l];
    const int fifth = (b[16 + l] >> (2 * chunk + high)) & 1;
    const int q = (high ? byte >> 4 : byte & 15) | (fifth << 4);
    int scale, min;
    KScaleMin(b + 4, 2 * chunk + high, &scale, &min);
    return F16At(b, 0) * scale * q - F16At(b, 2) * min;
  }
};

// Q6_K: {ql[128]; qh[64]; int8 scales[16]; f16 d}. Value i = 128h + 32s + l
// (half h, quarter s, l < 32): its low four bits are the low (s < 2) or
// high (s >= 2) nibble of ql[64h + l + 32(s & 1)], its top two bits bits
// 2s, 2s+1 of qh[32h + l]; d · scales[i / 16] · (q - 32).
struct Q6_K {
  static constexpr int kValues = 256, kBytes = 210;
  __device__ static float Value(const uint8_t* b, int i) {
    const int h = i / 128, s = (i % 128) / 32, l = i % 32;
    const uint8_t low_byte = b[64 * h + l + 32 * (s & 1)];
    const int low = s < 2 ? low_byte & 15 : low_byte >> 4;
    const int top = (b[128 + 32 * h + l] >> (2 * s)) & 3;
    const int scale = static_cast<int8_t>(b[192 + i / 16]);
    return F16At(b, 208) * scale * ((low | (top << 4)) - 32);
  }
};

// The same blocks in group-major order (common/quant/block_order.h):
// value i = 16l + 4s + j (group l, step s, j < 4) has its four low bits in
// qs/ql byte 64(s / 2) + 4l + j, low nibble for even s; Q6_K's two high bits
// are bits 2s, 2s + 1 of qh byte 4l + j. Scales, mins and d stay in place.
struct Q4_KGroupMajor {
  static constexpr int kValues = 256, kBytes = 144;
  __device__ static float Value(const uint8_t* b, int i) {
    const int l = i / 16, s = (i % 16) / 4, j = i % 4;
    const uint8_t byte = b[16 + 64 * (s / 2) + 4 * l + j];
    const int q = (s & 1) ? byte >> 4 : byte & 15;
    int scale, min;
    KScaleMin(b + 4, i / 32, &scale, &min);
    return F16At(b, 0) * scale * q - F16At(b, 2) * min;
  }
};

struct Q6_KGroupMajor {
  static constexpr int kValues = 256, kBytes = 210;
  __device__ static float Value(const uint8_t* b, int i) {
    const int l = i / 16, s = (i % 16) / 4, j = i % 4;
    const uint8_t low_byte = b[64 * (s / 2) + 4 * l + j];
    const int low = (s & 1) ? low_byte >> 4 : low_byte & 15;
    const int top = (b[128 + 4 * l + j] >> (2 * s)) & 3;
    const int scale = static_cast<int8_t>(b[192 + i / 16]);
    return F16At(b, 208) * scale * ((low | (top << 4)) - 32);
  }
};

// Value c of row j of a [n, k] matrix of format F.
template <typename F>
__device__ __forceinline__ float MatrixValue(const uint8_t* w, int64_t row_bytes, int64_t j, int64_t c) {
  return F::Value(w + j * row_bytes + (c / F::kValues) * F::kBytes, static_cast<int>(c % F::kValues));
}

__device__ __forceinline__ float LoadX(const void* x, KernelDType dtype, int64_t i) {
  return dtype == KernelDType::kBF16 ? ToFloat(static_cast<const __nv_bfloat16*>(x)[i])
                                     : static_cast<const float*>(x)[i];
}

constexpr int kGemvWarps = 8;  // output rows per block of the GEMV

// One warp per output row j; lane t decodes values t, t+32, ... of the row
// and multiplies each into every input row's accumulator.
template <typename F>
__global__ void QuantGemvKernel(const uint8_t* __restrict__ w, int64_t n, int64_t k, const void* __restrict__ x,
                                KernelDType x_dtype, int64_t ldx, int rows, float* __restrict__ y, int64_t ldy) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (j >= n) return;  // whole warps leave together: the shuffles below see full warps
  const int64_t row_bytes = k / F::kValues * F::kBytes;
  float acc[kQuantGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kQuantGemvMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t c = lane; c < k; c += 32) {
    const float v = MatrixValue<F>(w, row_bytes, j, c);
#pragma unroll
    for (int r = 0; r < kQuantGemvMaxRows; ++r) {
      if (r < rows) acc[r] += v * LoadX(x, x_dtype, r * ldx + c);
    }
  }
#pragma unroll
  for (int r = 0; r < kQuantGemvMaxRows; ++r) {
    if (r >= rows) break;
    float s = acc[r];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
    if (lane == 0) y[r * ldy + j] = s;
  }
}

template <typename F, typename T>
__global__ void DequantizeKernel(const uint8_t* __restrict__ w, int64_t n, int64_t k, T* __restrict__ out) {
  const int64_t row_bytes = k / F::kValues * F::kBytes;
  const int64_t total = n * k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = FromFloat<T>(MatrixValue<F>(w, row_bytes, i / k, i % k));
  }
}

template <typename F>
cudaError_t Gemv(const void* w, int64_t n, int64_t k, const void* x, KernelDType x_dtype, int64_t ldx, int rows,
                 float* y, int64_t ldy, cudaStream_t stream) {
  const unsigned int blocks = static_cast<unsigned int>((n + kGemvWarps - 1) / kGemvWarps);
  QuantGemvKernel<F>
      <<<blocks, 32 * kGemvWarps, 0, stream>>>(static_cast<const uint8_t*>(w), n, k, x, x_dtype, ldx, rows, y, ldy);
  return cudaGetLastError();
}

template <typename F>
cudaError_t Dequantize(const void* w, int64_t n, int64_t k, void* out, KernelDType out_dtype, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t total = n * k;
  const int64_t want = (total + kThreads - 1) / kThreads;
  const unsigned int blocks = static_cast<unsigned int>(want < 8192 ? want : 8192);  // grid-stride covers the rest
  const auto* bytes = static_cast<const uint8_t*>(w);
  if (out_dtype == KernelDType::kBF16) {
    DequantizeKernel<F><<<blocks, kThreads, 0, stream>>>(bytes, n, k, static_cast<__nv_bfloat16*>(out));
  } else if (out_dtype == KernelDType::kF32) {
    DequantizeKernel<F><<<blocks, kThreads, 0, stream>>>(bytes, n, k, static_cast<float*>(out));
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchQuantGemv(const void* w, KernelQuantType type, int64_t n, int64_t k, const void* x,
                            KernelDType x_dtype, int64_t ldx, int rows, float* y, int64_t ldy, cudaStream_t stream) {
  if (n <= 0 || rows <= 0) return cudaSuccess;
  if (rows > kQuantGemvMaxRows || (x_dtype != KernelDType::kF32 && x_dtype != KernelDType::kBF16)) {
    return cudaErrorInvalidValue;
  }
#define TANDEM_GEMV_CALL(F) Gemv<F>(w, n, k, x, x_dtype, ldx, rows, y, ldy, stream)
  switch (type) {
    case KernelQuantType::kQ8_0: return TANDEM_GEMV_CALL(Q8_0);
    case KernelQuantType::kQ4_0: return TANDEM_GEMV_CALL(Q4_0);
    case KernelQuantType::kQ4_1: return TANDEM_GEMV_CALL(Q4_1);
    case KernelQuantType::kQ5_0: return TANDEM_GEMV_CALL(Q5_0);
    case KernelQuantType::kQ4_K: return TANDEM_GEMV_CALL(Q4_K);
    case KernelQuantType::kQ5_K: return TANDEM_GEMV_CALL(Q5_K);
    case KernelQuantType::kQ6_K: return TANDEM_GEMV_CALL(Q6_K);
    case KernelQuantType::kQ4_KGroupMajor: return TANDEM_GEMV_CALL(Q4_KGroupMajor);
    case KernelQuantType::kQ6_KGroupMajor: return TANDEM_GEMV_CALL(Q6_KGroupMajor);
  }
#undef TANDEM_GEMV_CALL
  return cudaErrorInvalidValue;
}

cudaError_t LaunchDequantize(const void* w, KernelQuantType type, int64_t n, int64_t k, void* out,
                             KernelDType out_dtype, cudaStream_t stream) {
  if (n <= 0 || k <= 0) return cudaSuccess;
#define TANDEM_DEQUANTIZE_CALL(F) Dequantize<F>(w, n, k, out, out_dtype, stream)
  switch (type) {
    case KernelQuantType::kQ8_0: return TANDEM_DEQUANTIZE_CALL(Q8_0);
    case KernelQuantType::kQ4_0: return TANDEM_DEQUANTIZE_CALL(Q4_0);
    case KernelQuantType::kQ4_1: return TANDEM_DEQUANTIZE_CALL(Q4_1);
    case KernelQuantType::kQ5_0: return TANDEM_DEQUANTIZE_CALL(Q5_0);
    case KernelQuantType::kQ4_K: return TANDEM_DEQUANTIZE_CALL(Q4_K);
    case KernelQuantType::kQ5_K: return TANDEM_DEQUANTIZE_CALL(Q5_K);
    case KernelQuantType::kQ6_K: return TANDEM_DEQUANTIZE_CALL(Q6_K);
    case KernelQuantType::kQ4_KGroupMajor: return TANDEM_DEQUANTIZE_CALL(Q4_KGroupMajor);
    case KernelQuantType::kQ6_KGroupMajor: return TANDEM_DEQUANTIZE_CALL(Q6_KGroupMajor);
  }
#undef TANDEM_DEQUANTIZE_CALL
  return cudaErrorInvalidValue;
}

}  // namespace tandem
