// Blocks of any quantized type tandem reads, for benchmarks and tests of
// the types it does not write (Q3_K, Q2_K, IQ4_NL, IQ4_XS): random level,
// sub-block scale and min bytes, every f16 super-block scale a small
// finite value, so every level and scale occurs and the decoded values are
// finite. Not a quantization of anything. Stateless; any thread.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/quant/ggml_type.h"

namespace tandem {

// Fills `out` (whole blocks of `type`) from `seed`; InvalidArgument for a
// type tandem does not decode or a size that is not whole blocks.
absl::Status SyntheticBlocks(GgmlType type, uint32_t seed, absl::Span<uint8_t> out);

}  // namespace tandem
