// What a GGUF file's header says: metadata, tensor infos and where the data
// section starts. Produced by ParseGguf (gguf_parser.h), which has checked
// every field against the file; immutable after that, so any thread may read it.
//
// Layout (little-endian; GGUF v2 and v3 are the same for little-endian files):
//   "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x  (string key | u32 value type | value)
//   tensor_count x (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml type | u64 offset)
//   padding to `general.alignment` (default 32)
//   data section: tensor bytes at their offsets, each offset a multiple of the alignment
// where a string is u64 length + bytes and an array value is u32 element
// type | u64 count | elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/gguf/gguf_metadata.h"
#include "common/quant/ggml_type.h"

namespace tandem {

inline constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kGgufVersion = 3;         // what the writer writes
inline constexpr uint64_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;  // ggml's GGML_MAX_DIMS
inline constexpr char kGgufAlignmentKey[] = "general.alignment";

struct GgufTensorInfo {
  std::string name;
  // ggml order: dims[0] is the row length (contiguous), dims[1] the number
  // of rows, ... A HF weight of shape [out, in] is dims {in, out}.
  std::vector<int64_t> dims;
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;      // from the start of the data section
  uint64_t size_bytes = 0;  // GgmlTensorBytes(type, dims)

  bool operator==(const GgufTensorInfo&) const = default;
};

// The alignment `metadata` asks for: general.alignment (which must be a
// uint32 power of two; InvalidArgument naming the key otherwise) or 32.
absl::StatusOr<uint64_t> GgufAlignment(const GgufMetadata& metadata);

class GgufFile {
 public:
  GgufFile(std::string file_name, uint32_t version, GgufMetadata metadata, std::vector<GgufTensorInfo> tensors,
           uint64_t alignment, uint64_t data_offset);

  const std::string& file_name() const { return file_name_; }
  uint32_t version() const { return version_; }
  const GgufMetadata& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Null when absent.
  const GgufTensorInfo* FindTensor(absl::string_view name) const;
  uint64_t alignment() const { return alignment_; }
  // Absolute offset of the data section in the file.
  uint64_t data_offset() const { return data_offset_; }

 private:
  std::string file_name_;
  uint32_t version_;
  GgufMetadata metadata_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
  uint64_t alignment_;
  uint64_t data_offset_;
};

}  // namespace tandem
