#include "common/quant/nonlinear_quants.h"

#include <cstring>

#include "common/quant/block_formats.h"
#include "common/quant/half.h"

namespace tandem {

void DequantizeBlockIQ4_NL(const uint8_t* block, float* y) {
  BlockIQ4_NL b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  constexpr int kHalf = kIQ4_NLBlockSize / 2;
  for (int j = 0; j < kHalf; ++j) {
    y[j] = d * kIq4NlValues[b.qs[j] & 0x0f];
    y[kHalf + j] = d * kIq4NlValues[b.qs[j] >> 4];
  }
}

int UnpackIQ4XSScale(uint16_t scales_h, const uint8_t* scales_l, int j) {
  return ((scales_l[j / 2] >> (4 * (j % 2))) & 0x0f) | (((scales_h >> (2 * j)) & 3) << 4);
}

void DequantizeBlockIQ4_XS(const uint8_t* block, float* y) {
  BlockIQ4_XS b;
  std::memcpy(&b, block, sizeof(b));
  const float d = GgmlF16ToF32(b.d);
  for (int j = 0; j < kKBlockSize / 32; ++j) {
    const float dl = d * static_cast<float>(UnpackIQ4XSScale(b.scales_h, b.scales_l, j) - 32);
    const uint8_t* qs = b.qs + 16 * j;
    for (int l = 0; l < 16; ++l) {
      y[32 * j + l] = dl * kIq4NlValues[qs[l] & 0x0f];
      y[32 * j + 16 + l] = dl * kIq4NlValues[qs[l] >> 4];
    }
  }
}

}  // namespace tandem
