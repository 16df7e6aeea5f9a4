// Safetensors files over mmap: one file, or a sharded checkpoint described by
// model.safetensors.index.json. Every header is validated before any tensor is
// handed out (header length, JSON, dtype, shape x element size == byte range,
// ranges inside the file, no overlaps); every failure names the file and,
// where there is one, the tensor. Status codes:
//   DataLoss         the file is shorter than its own header says (under 8
//                    bytes, header length past the end, a tensor's range past
//                    the end of the data section): a truncated copy.
//   InvalidArgument  malformed content: an absurd header length (> 100 MB),
//                    bad JSON, a key given twice in one object (header or
//                    index), wrong field types, unsupported dtype, negative
//                    dimension, shape x element size != byte range, overlaps,
//                    an index whose shard lacks a tensor, a tensor in two
//                    files, a shard name that is not a plain file name in the
//                    folder ("..", "/", absolute), a shard that is a symlink
//                    out of the folder (except into a Hugging Face hub
//                    cache's blobs/), a shard that is not a regular file.
//   NotFound         a missing file, shard, directory or tensor.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {...}, "<name>": {"dtype": "BF16", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// then the data section; offsets are relative to the data section.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/base/scoped_fd.h"
#include "common/base/tensor_view.h"
#include "common/base/thread_pool.h"
#include "common/platform/huge_page_arena.h"

namespace tandem {

// One mmap'd safetensors file. Owns the mapping; views stay valid while it lives.
// Immutable after Open: any thread may call its const methods.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // NotFound naming the file and tensor when absent.
  absl::StatusOr<TensorView> Get(const std::string& name) const;
  // Whether `p` points into this file's mapping.
  bool Holds(const void* p) const;
  // Copies `range`, a span of the mapping (a tensor's bytes), from the file
  // into `out` with pread over `pool` (ReadMappedRange: never through the
  // mapping; errors name the path and offset). Any thread.
  absl::Status ReadInto(absl::Span<const uint8_t> range, uint8_t* out, ThreadPool* pool = nullptr) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  ScopedFd fd_;  // kept open for ReadInto
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Where a model's tensors come from: an abstraction so that weights generated
// in memory (synthetic full-size models) and weights read from disk look alike.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  // NotFound (naming the tensor and the source) when absent.
  virtual absl::StatusOr<TensorView> Get(const std::string& name) const = 0;
  // The type the tensor has in the file, which Get's view may not keep (a
  // GGUF block type dequantized at load): what a model's identity hashes.
  virtual absl::StatusOr<DType> StoredDType(const std::string& name) const {
    absl::StatusOr<TensorView> view = Get(name);
    if (!view.ok()) return view.status();
    return view->dtype;
  }
  virtual std::vector<std::string> Names() const = 0;
  // Human-readable origin for error messages, e.g. the model directory.
  virtual std::string Describe() const = 0;
};

// All tensors of a model directory: model.safetensors.index.json if present
// (every listed shard must exist and hold the tensors the index says), else
// every *.safetensors file in the directory. A tensor named in two files is an
// error. Owns the files.
class SafetensorsCheckpoint : public TensorSource {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::filesystem::path& model_dir);

  absl::StatusOr<TensorView> Get(const std::string& name) const override;
  std::vector<std::string> Names() const override;
  std::string Describe() const override { return dir_.string(); }
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }

  // Copies the tensors named in `names` out of the files (ReadInto, over
  // `pool`) into anonymous memory advised for 2 MiB pages that it owns
  // (HugePageArena), in order, while the copies fit in `budget_bytes`; from
  // then on Get serves the copies, and the rest stay views of the mappings.
  // Names it does not hold are skipped (LoadModelWeights names what is
  // missing). Decode streams every weight once per token, and from the
  // page cache's 4 KiB pages that cost Mixtral bf16 decode ~30% on the Zen 5
  // VM. Call before handing out views; not thread-safe.
  absl::Status CopyToMemory(const std::vector<std::string>& names, int64_t budget_bytes, ThreadPool* pool);
  int64_t copied_bytes() const { return copied_bytes_; }
  int64_t left_mapped_bytes() const { return left_mapped_bytes_; }  // over the budget
  const HugePageArena& arena() const { return arena_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, TensorView> tensors_;
  HugePageArena arena_;  // the copies
  int64_t copied_bytes_ = 0, left_mapped_bytes_ = 0;
};

// A tensor to be written: `data` holds num_elements * DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;
};

// Writes one safetensors file (tensors in the given order, 8-byte aligned
// header as the reference implementation does) to a temporary name, then
// renames it. InvalidArgument naming the tensor when its data size does not
// match its shape and dtype, or a name is repeated.
absl::Status WriteSafetensors(const std::filesystem::path& path, const std::vector<const TensorToWrite*>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into `num_shards` files named
// model-0000i-of-0000N.safetensors plus model.safetensors.index.json
// ({"metadata": {"total_size": bytes}, "weight_map": {name: file}}), split in
// order into shards of roughly equal bytes, none empty (so num_shards must not
// exceed the number of tensors). num_shards == 1 writes a single
// model.safetensors and removes any stale index. Every file is written to a
// temporary name and renamed, the index last.
absl::Status WriteSafetensorsCheckpoint(const std::filesystem::path& model_dir,
                                        const std::vector<const TensorToWrite*>& tensors, int num_shards);

}  // namespace tandem
