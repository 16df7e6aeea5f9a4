// Element-wise activations of the FFNs (routed experts, the shared expert).
#pragma once

#include <cstdint>

namespace tandem {

// gate[j] = silu(gate[j]) * up[j] = gate * up / (1 + exp(-gate)), in place
// (SwiGLU's hidden activation), 8 lanes at a time (AVX2 + FMA baseline).
void SiluMul(float* gate, const float* up, int64_t count);

}  // namespace tandem
