// One GGUF file mapped read-only and parsed (gguf_parser.h): the header as
// a GgufFile and each tensor's bytes as a span into the mapping, valid while
// the object lives. Immutable after Open: any thread may call const methods.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/scoped_fd.h"
#include "common/base/thread_pool.h"
#include "common/gguf/gguf_file.h"

namespace tandem {

class GgufMappedFile {
 public:
  // NotFound for a missing file, the errno status for one that cannot be
  // opened or mapped, and ParseGguf's errors (naming the path) for bad content.
  static absl::StatusOr<std::unique_ptr<GgufMappedFile>> Open(const std::filesystem::path& path);
  ~GgufMappedFile();
  GgufMappedFile(const GgufMappedFile&) = delete;
  GgufMappedFile& operator=(const GgufMappedFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const GgufFile& gguf() const { return *gguf_; }
  absl::Span<const uint8_t> bytes() const { return {static_cast<const uint8_t*>(mapping_), mapping_bytes_}; }
  // The bytes of `tensor`, one of gguf().tensors() (the parser checked they
  // lie inside the file).
  absl::Span<const uint8_t> TensorData(const GgufTensorInfo& tensor) const;
  // Copies `range`, a span of bytes(), from the file into `out` with pread
  // over `pool` (ReadMappedRange: never through the mapping; errors name the
  // path and offset). Any thread.
  absl::Status ReadInto(absl::Span<const uint8_t> range, uint8_t* out, ThreadPool* pool = nullptr) const;

 private:
  GgufMappedFile() = default;
  std::filesystem::path path_;
  ScopedFd fd_;  // kept open for ReadInto
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::optional<GgufFile> gguf_;
};

}  // namespace tandem
