#include "common/kernels/linear_quantized.h"

#include <immintrin.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/kernels/linear_isa.h"
#include "common/quant/block_formats.h"
#include "common/quant/block_order.h"
#include "common/quant/k_quants.h"
#include "common/quant/legacy_quants.h"
#include "common/quant/nonlinear_quants.h"

namespace tandem {
namespace {

constexpr int kMaxBlock = 256;  // values in the largest block (K-quants)
constexpr int kStreamRows = 8;  // x rows per pass over a W row

using BlockDecoder = void (*)(const uint8_t* block, float* y);

// The reference decoder of one block of `dtype` (null for float types). A
// group-major block goes back to ggml's order first: slow (a scalar bit
// shuffle per value), but these f32-activation paths are not the ones a
// VNNI machine, which is where weights take that order, plans to run.
BlockDecoder DecoderOf(DType dtype, BlockOrder order) {
  if (order == BlockOrder::kGroupMajor) {
    switch (dtype) {
      case DType::kQ4_K:
        return [](const uint8_t* block, float* y) {
          uint8_t ggml[sizeof(BlockQ4_K)];
          GroupMajorBlockToGgml(GgmlType::kQ4_K, block, ggml);
          DequantizeBlockQ4_K(ggml, y);
        };
      case DType::kQ6_K:
        return [](const uint8_t* block, float* y) {
          uint8_t ggml[sizeof(BlockQ6_K)];
          GroupMajorBlockToGgml(GgmlType::kQ6_K, block, ggml);
          DequantizeBlockQ6_K(ggml, y);
        };
      default: return nullptr;
    }
  }
  switch (dtype) {
    case DType::kQ8_0: return DequantizeBlockQ8_0;
    case DType::kQ4_0: return DequantizeBlockQ4_0;
    case DType::kQ4_1: return DequantizeBlockQ4_1;
    case DType::kQ5_0: return DequantizeBlockQ5_0;
    case DType::kQ4_K: return DequantizeBlockQ4_K;
    case DType::kQ5_K: return DequantizeBlockQ5_K;
    case DType::kQ6_K: return DequantizeBlockQ6_K;
    case DType::kQ5_1: return DequantizeBlockQ5_1;
    case DType::kQ3_K: return DequantizeBlockQ3_K;
    case DType::kQ2_K: return DequantizeBlockQ2_K;
    case DType::kIQ4_NL: return DequantizeBlockIQ4_NL;
    case DType::kIQ4_XS: return DequantizeBlockIQ4_XS;
    default: return nullptr;
  }
}

absl::Status NoDecoder(const LinearWeight& w) {
  return absl::InvalidArgumentError(
      absl::StrCat("quantized linear kernel: no block decoder for ", std::string(DTypeName(w.dtype)), " weights"));
}

float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[r, j] = x[r, :] . W[j, :] for rows [r0, r0 + rows), rows <= kStreamRows,
// decoding W row j block by block.
void StreamRow(const uint8_t* row, BlockDecoder decode, int64_t block, int64_t block_bytes, int64_t k, const float* x,
               int64_t ldx, int rows, float* out) {
  alignas(32) float values[kMaxBlock];
  __m256 acc[kStreamRows];
  for (int r = 0; r < rows; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t k0 = 0; k0 < k; k0 += block) {
    decode(row + (k0 / block) * block_bytes, values);
    for (int64_t t = 0; t < block; t += 8) {
      const __m256 w = _mm256_load_ps(values + t);
      for (int r = 0; r < rows; ++r) acc[r] = _mm256_fmadd_ps(_mm256_loadu_ps(x + r * ldx + k0 + t), w, acc[r]);
    }
  }
  for (int r = 0; r < rows; ++r) out[r] = HorizontalSum(acc[r]);
}

// Panels of `panel` features over all of K, as the ISA's packed GEMM reads
// them: packed[p][kk * panel + jj] = W[n_begin + p * panel + jj, kk], zero
// past n_end. `row` is scratch for one decoded W row ([K] f32).
void DecodePanels(const LinearWeight& w, BlockDecoder decode, int64_t panel, int64_t n_begin, int64_t n_end, float* row,
                  float* packed) {
  const int64_t k = w.k, block = DTypeBlockSize(w.dtype), block_bytes = DTypeBlockBytes(w.dtype);
  const int64_t row_bytes = w.row_bytes();
  const int64_t panels = (n_end - n_begin + panel - 1) / panel;
  for (int64_t p = 0; p < panels; ++p) {
    float* out = packed + p * panel * k;
    for (int64_t jj = 0; jj < panel; ++jj) {
      const int64_t j = n_begin + p * panel + jj;
      if (j >= n_end) {
        for (int64_t kk = 0; kk < k; ++kk) out[kk * panel + jj] = 0.0f;
        continue;
      }
      const uint8_t* src = static_cast<const uint8_t*>(w.data) + j * row_bytes;
      for (int64_t b = 0; b < k / block; ++b) decode(src + b * block_bytes, row + b * block);
      for (int64_t kk = 0; kk < k; ++kk) out[kk * panel + jj] = row[kk];
    }
  }
}

int64_t PackedScratchBytes(const LinearWeight& w, int64_t features, int64_t panel) {
  const int64_t panels = (features + panel - 1) / panel;
  return (panels * panel * w.k + w.k) * static_cast<int64_t>(sizeof(float));
}

template <int64_t kPanel, void (*kMultiply)(const LinearSliceArgs&, int64_t, const float*)>
absl::Status PackedSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  const BlockDecoder decode = DecoderOf(w.dtype, w.order);
  if (decode == nullptr) return NoDecoder(w);
  float* packed = static_cast<float*>(scratch);
  const int64_t panels = (a.n_end - a.n_begin + kPanel - 1) / kPanel;
  float* row = packed + panels * kPanel * w.k;
  DecodePanels(w, decode, kPanel, a.n_begin, a.n_end, row, packed);
  kMultiply(a, w.k, packed);
  return absl::OkStatus();
}

}  // namespace

absl::Status QuantizedStreamSlice(const LinearWeight& w, const LinearSliceArgs& a, void*) {
  const BlockDecoder decode = DecoderOf(w.dtype, w.order);
  if (decode == nullptr) return NoDecoder(w);
  const int64_t block = DTypeBlockSize(w.dtype), block_bytes = DTypeBlockBytes(w.dtype);
  const int64_t row_bytes = w.row_bytes();
  float out[kStreamRows];
  for (int64_t j = a.n_begin; j < a.n_end; ++j) {
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + j * row_bytes;
    const float bias = a.bias != nullptr ? a.bias[j] : 0.0f;
    for (int64_t r0 = 0; r0 < a.m; r0 += kStreamRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kStreamRows, a.m - r0));
      StreamRow(row, decode, block, block_bytes, w.k, a.x + r0 * a.ldx, a.ldx, rows, out);
      for (int r = 0; r < rows; ++r) a.y[(r0 + r) * a.ldy + j] = out[r] + bias;
    }
  }
  return absl::OkStatus();
}

int64_t QuantizedAvx2PackedScratchBytes(const LinearWeight& w, int64_t, int64_t features) {
  return PackedScratchBytes(w, features, isa::kAvx2Panel);
}
absl::Status QuantizedAvx2PackedSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  return PackedSlice<isa::kAvx2Panel, isa::Avx2MultiplyPanels>(w, a, scratch);
}
int64_t QuantizedAvx512PackedScratchBytes(const LinearWeight& w, int64_t, int64_t features) {
  return PackedScratchBytes(w, features, isa::kAvx512Panel);
}
absl::Status QuantizedAvx512PackedSlice(const LinearWeight& w, const LinearSliceArgs& a, void* scratch) {
  return PackedSlice<isa::kAvx512Panel, isa::Avx512MultiplyPanels>(w, a, scratch);
}

}  // namespace tandem
