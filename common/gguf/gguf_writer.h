// Writes a GGUF file tensor by tensor, so a model larger than memory is
// converted holding one tensor (or one chunk of one) at a time. Create
// writes the header, with every tensor's offset laid out up front (in
// order, aligned, as ggml writes and requires); Write appends bytes of the
// tensor now due; Finish pads the data section, syncs and renames the file
// into place. Until Finish the bytes live in `path`.partial, removed if the
// writer is destroyed unfinished, so a crash or error never leaves a
// truncated file under the final name.
//
// Metadata may hold any GGUF value; note that ggml's reader refuses arrays
// of arrays, so files meant for llama.cpp should have none.
// Owns the file descriptor; one thread drives a writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_file.h"
#include "common/gguf/gguf_serializer.h"

namespace tandem {

class GgufWriter {
 public:
  // InvalidArgument for bad specs or alignment (gguf_serializer.h); the
  // errno status naming the file when it cannot be created or written.
  static absl::StatusOr<std::unique_ptr<GgufWriter>> Create(const std::filesystem::path& path,
                                                            const GgufMetadata& metadata,
                                                            absl::Span<const GgufTensorSpec> tensors);
  ~GgufWriter();
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Appends `bytes` to tensor `name`, which must be the tensor now due (the
  // first not yet complete); a tensor may come in several calls. Exceeding
  // its size or naming another tensor is a FailedPrecondition naming both.
  absl::Status Write(absl::string_view name, absl::Span<const uint8_t> bytes);
  // FailedPrecondition naming the first incomplete tensor if any is short.
  absl::Status Finish();

  // The tensor now due; null when all are complete.
  const GgufTensorInfo* next_tensor() const;
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Progress: bytes written so far of the total the finished file will have.
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t total_bytes() const { return total_bytes_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  GgufWriter(std::filesystem::path path, std::filesystem::path partial_path, int fd,
             std::vector<GgufTensorInfo> tensors, uint64_t alignment, uint64_t total_bytes);
  absl::Status WriteAll(const void* data, size_t size);
  absl::Status PadTo(uint64_t file_offset);
  // Moves past every complete tensor from the one now due, padding each.
  absl::Status AdvancePastComplete();

  std::filesystem::path path_;
  std::filesystem::path partial_path_;
  int fd_;
  std::vector<GgufTensorInfo> tensors_;
  uint64_t alignment_;
  uint64_t total_bytes_;
  uint64_t data_offset_ = 0;  // where the data section starts in the file
  uint64_t bytes_written_ = 0;
  size_t current_ = 0;         // index of the tensor now due
  uint64_t current_done_ = 0;  // bytes of it written
  bool finished_ = false;
  absl::Status failed_;  // the first write error; later calls return it
};

}  // namespace tandem
