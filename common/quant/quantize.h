// Row-level encode and decode between f32 and the ggml tensor types tandem
// supports: the scalar reference that faster kernels are checked against and
// that the GGUF loader and quantizer use directly.
//
//   decode: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K,
//           Q3_K, Q2_K, IQ4_NL, IQ4_XS
//   encode: the same but Q3_K, Q2_K, IQ4_NL and IQ4_XS; the quantized types
//           bit-identical to ggml's reference quantizers (legacy_quants.h,
//           k_quants.h)
//
// Rows are whole blocks: a length that is not a multiple of the type's block
// size, a destination of the wrong size, or an unsupported type is an
// InvalidArgument naming the type and the sizes; the caller adds the tensor.
// Stateless: any thread may call these.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/quant/ggml_type.h"

namespace tandem {

bool CanDequantize(GgmlType type);
bool CanQuantize(GgmlType type);
// "f32, f16, ..." for error messages that list what tandem runs.
std::string SupportedDequantizeTypes();

// Decodes `src` (whole blocks of `type`) into `dst`, which must hold exactly
// the number of values those blocks encode.
absl::Status DequantizeRow(GgmlType type, absl::Span<const uint8_t> src, absl::Span<float> dst);

// Encodes `src` (a length that is a multiple of the block size) into `dst`,
// which must be exactly GgmlRowBytes(type, src.size()) bytes. A non-finite
// value is an InvalidArgument naming its index: a NaN or infinity in a
// checkpoint is damage to report, not something to round.
absl::Status QuantizeRow(GgmlType type, absl::Span<const float> src, absl::Span<uint8_t> dst);

}  // namespace tandem
