// A model in GGUF: one file, or a split set as llama.cpp's gguf-split writes
// it (PREFIX-00001-of-0000N.gguf ... PREFIX-0000N-of-0000N.gguf, each with
// split.no (0-based), split.count, and in the first split.tensors.count).
// Open takes the single file or the first of a set, maps every file and
// checks the set is whole and consistent; errors name the file and key:
//   NotFound         a missing file of the set
//   InvalidArgument  the name of a split file does not fit its split
//                    metadata (including being handed a later file of the
//                    set), split.no/split.count/split.tensors.count disagree
//                    between files, the files hold other than
//                    split.tensors.count tensors, or one tensor name is in
//                    two files
// plus GgufMappedFile's errors for each file. The metadata is the first
// file's (the others carry only the split keys). Owns the mapped files;
// immutable after Open, so any thread may call const methods.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/gguf/gguf_mapped_file.h"

namespace tandem {

inline constexpr char kGgufSplitNoKey[] = "split.no";
inline constexpr char kGgufSplitCountKey[] = "split.count";
inline constexpr char kGgufSplitTensorsCountKey[] = "split.tensors.count";

// The name of file `index` (0-based) of a `count`-file split set with `prefix`:
// PREFIX-00001-of-00003.gguf for index 0, count 3 (llama.cpp's llama_split_path).
std::string GgufSplitPath(absl::string_view prefix, int index, int count);

struct GgufTensor {
  const GgufTensorInfo* info;
  const GgufMappedFile* file;
  absl::Span<const uint8_t> data;
};

class GgufCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<GgufCheckpoint>> Open(const std::filesystem::path& path);

  const GgufMetadata& metadata() const { return files_.front()->gguf().metadata(); }
  // NotFound naming the tensor and the checkpoint.
  absl::StatusOr<GgufTensor> Get(absl::string_view name) const;
  // Every tensor, file by file in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<GgufMappedFile>>& files() const { return files_; }
  // The path given to Open, with " (N files)" for a split set.
  std::string Describe() const;

 private:
  GgufCheckpoint() = default;
  absl::Status Index();

  std::vector<std::unique_ptr<GgufMappedFile>> files_;
  std::vector<GgufTensor> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> position in tensors_
};

}  // namespace tandem
