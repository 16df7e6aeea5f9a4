// The other direction of gguf_parser.h: tensor layout and header bytes, as
// pure functions, shared by the streaming writer and by tests that build
// files in memory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"

namespace tandem {

// Tensor names of this many bytes or more are refused: ggml's reader keeps
// names in a 64-byte buffer (GGML_MAX_NAME) and rejects longer ones.
inline constexpr size_t kGgufMaxTensorNameBytes = 64;

// One tensor to write; the layout assigns its offset.
struct GgufTensorSpec {
  std::string name;
  std::vector<int64_t> dims;  // ggml order, dims[0] the row length
  GgmlType type = GgmlType::kF32;
};

// Lays the tensors out as ggml's writer does (and its reader requires): in
// order, each at the first multiple of `alignment` after the previous one's
// end. InvalidArgument naming the tensor for an empty, too long or repeated
// name, more than 4 dims, a row that is not whole blocks or a size overflow.
absl::StatusOr<std::vector<GgufTensorInfo>> LayOutGgufTensors(absl::Span<const GgufTensorSpec> specs,
                                                              uint64_t alignment);

// Bytes of the data section: the last tensor's end padded to `alignment`.
uint64_t GgufDataSectionBytes(absl::Span<const GgufTensorInfo> tensors, uint64_t alignment);

// The file up to the data section: magic, version 3, counts, metadata,
// tensor infos, zero padding to a multiple of the metadata's alignment.
absl::StatusOr<std::string> SerializeGgufHeader(const GgufMetadata& metadata, absl::Span<const GgufTensorInfo> tensors);

}  // namespace tandem
