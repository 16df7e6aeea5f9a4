// The 32-value block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1): one block per call,
// `x`/`y` 32 floats, `block` the format's bytes (block_formats.h). The
// quantizers reproduce ggml's reference quantizers (quantize_row_*_ref, what
// llama-quantize uses without an importance matrix) bit for bit on finite
// input:
//   Q8_0  d = amax / 127, q = round-half-away(x / d)
//   Q4_0  d = -max / 8 (max: the value of largest magnitude, so it maps to
//         -8 exactly), q = min(15, trunc(x / d + 8.5))
//   Q4_1  d = (max - min) / 15, m = min, q = min(15, trunc((x - min) / d + 0.5))
//   Q5_0  d = -max / 16, q = min(31, trunc(x / d + 16.5))
//   Q5_1  d = (max - min) / 31, m = min, q = trunc((x - min) / d + 0.5)
// Scales are computed in f32 and stored as f16; the levels use the f32 scale.
#pragma once

#include <cstdint>

namespace tandem {

void QuantizeBlockQ8_0(const float* x, uint8_t* block);
void QuantizeBlockQ4_0(const float* x, uint8_t* block);
void QuantizeBlockQ4_1(const float* x, uint8_t* block);
void QuantizeBlockQ5_0(const float* x, uint8_t* block);
void QuantizeBlockQ5_1(const float* x, uint8_t* block);

void DequantizeBlockQ8_0(const uint8_t* block, float* y);
void DequantizeBlockQ4_0(const uint8_t* block, float* y);
void DequantizeBlockQ4_1(const uint8_t* block, float* y);
void DequantizeBlockQ5_0(const uint8_t* block, float* y);
void DequantizeBlockQ5_1(const uint8_t* block, float* y);

}  // namespace tandem
