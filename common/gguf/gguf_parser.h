// A GGUF parser that is a pure function over bytes, for mmap'd files and
// fuzzers alike (layout in gguf_file.h). Every count, length and offset is
// checked against the bytes that remain before anything is allocated;
// nothing is read past the span; nested arrays are limited in depth. Errors
// name the file and the key, tensor or field, and the byte offset:
//   DataLoss         something runs past the end of the bytes: a truncated
//                    header, a string or array longer than what remains, a
//                    count of entries that cannot fit, tensor data past the end
//   InvalidArgument  malformed content: bad magic, unsupported or big-endian
//                    version, unknown value or tensor type, empty or
//                    duplicate key or tensor name, bad general.alignment, too
//                    many dims, a row length that is not whole blocks, a
//                    shape whose size overflows, a misaligned or overlapping
//                    tensor offset, arrays nested too deep
// Tensor data itself is not read: the caller maps it at data_offset() + offset.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"

namespace tandem {

// Arrays of arrays deeper than this are refused (real files have none).
inline constexpr int kGgufMaxArrayDepth = 4;
// Limits ggml's reader applies too.
inline constexpr uint64_t kGgufMaxStringBytes = uint64_t{1} << 30;
inline constexpr uint64_t kGgufMaxArrayElements = uint64_t{1} << 30;

// `file_name` is only for messages.
absl::StatusOr<GgufFile> ParseGguf(absl::Span<const uint8_t> bytes, absl::string_view file_name);

}  // namespace tandem
