#include "common/gguf/gguf_checkpoint.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// The "-%05d-of-%05d" numbering takes at least five digits.
constexpr int64_t kMaxSplitCount = 99999;

std::string SplitSuffix(int index, int count) { return absl::StrFormat("-%05d-of-%05d.gguf", index + 1, count); }

// split.no and split.count of one file; count 1 and no 0 when absent.
struct SplitPosition {
  int64_t no = 0;
  int64_t count = 1;
};

absl::StatusOr<SplitPosition> ReadSplitPosition(const GgufMetadata& metadata) {
  SplitPosition position;
  if (metadata.Contains(kGgufSplitCountKey)) {
    TANDEM_ASSIGN_OR_RETURN(position.count, metadata.GetInteger(kGgufSplitCountKey));
    if (position.count < 1 || position.count > kMaxSplitCount) {
      return absl::InvalidArgumentError(absl::StrCat(metadata.source(), ": metadata key \"", kGgufSplitCountKey,
                                                     "\" is ", position.count, ", not in 1..", kMaxSplitCount));
    }
  }
  if (metadata.Contains(kGgufSplitNoKey)) {
    TANDEM_ASSIGN_OR_RETURN(position.no, metadata.GetInteger(kGgufSplitNoKey));
    if (position.no < 0 || position.no >= position.count) {
      return absl::InvalidArgumentError(absl::StrCat(metadata.source(), ": metadata key \"", kGgufSplitNoKey, "\" is ",
                                                     position.no, ", not in 0..", position.count - 1));
    }
  }
  return position;
}

// The prefix of a split set's file names, from the first file's path.
absl::StatusOr<std::string> SplitPrefix(const std::string& path, const SplitPosition& position) {
  const std::string suffix = SplitSuffix(static_cast<int>(position.no), static_cast<int>(position.count));
  if (!absl::EndsWith(path, suffix)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": its metadata says it is file ", position.no + 1, " of a ",
                                                   position.count, "-file split set, but its name does not end in ",
                                                   suffix, ", so the other files cannot be found"));
  }
  std::string prefix = path.substr(0, path.size() - suffix.size());
  if (position.no != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is file ", position.no + 1, " of a ", position.count,
                                                   "-file split set: open the first file, ",
                                                   GgufSplitPath(prefix, 0, static_cast<int>(position.count))));
  }
  return prefix;
}

// gguf-split writes split.tensors.count into every file of a set; where
// two files carry it, they must agree.
absl::Status SameTensorsCount(const GgufMetadata& first, const GgufMetadata& other) {
  if (!first.Contains(kGgufSplitTensorsCountKey) || !other.Contains(kGgufSplitTensorsCountKey)) {
    return absl::OkStatus();
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t a, first.GetInteger(kGgufSplitTensorsCountKey));
  TANDEM_ASSIGN_OR_RETURN(const int64_t b, other.GetInteger(kGgufSplitTensorsCountKey));
  if (a == b) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(other.source(), ": metadata key \"", kGgufSplitTensorsCountKey,
                                                 "\" is ", b, " but the first file of the set says ", a));
}

}  // namespace

std::string GgufSplitPath(absl::string_view prefix, int index, int count) {
  return absl::StrCat(prefix, SplitSuffix(index, count));
}

absl::StatusOr<std::unique_ptr<GgufCheckpoint>> GgufCheckpoint::Open(const std::filesystem::path& path) {
  std::unique_ptr<GgufCheckpoint> checkpoint(new GgufCheckpoint());
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufMappedFile> first, GgufMappedFile::Open(path));
  TANDEM_ASSIGN_OR_RETURN(const SplitPosition position, ReadSplitPosition(first->gguf().metadata()));
  checkpoint->files_.push_back(std::move(first));
  if (position.count > 1 || position.no != 0) {
    TANDEM_ASSIGN_OR_RETURN(const std::string prefix, SplitPrefix(path.string(), position));
    for (int i = 1; i < position.count; ++i) {
      const std::string split_path = GgufSplitPath(prefix, i, static_cast<int>(position.count));
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufMappedFile> file, GgufMappedFile::Open(split_path));
      TANDEM_ASSIGN_OR_RETURN(const SplitPosition other, ReadSplitPosition(file->gguf().metadata()));
      if (other.no != i || other.count != position.count) {
        return absl::InvalidArgumentError(absl::StrCat(
            split_path, ": metadata says it is file ", other.no + 1, " of ", other.count, " (keys \"", kGgufSplitNoKey,
            "\", \"", kGgufSplitCountKey, "\"), but its name makes it file ", i + 1, " of ", position.count));
      }
      TANDEM_RETURN_IF_ERROR(SameTensorsCount(checkpoint->files_.front()->gguf().metadata(), file->gguf().metadata()));
      checkpoint->files_.push_back(std::move(file));
    }
  }
  TANDEM_RETURN_IF_ERROR(checkpoint->Index());
  return checkpoint;
}

absl::Status GgufCheckpoint::Index() {
  for (const std::unique_ptr<GgufMappedFile>& file : files_) {
    for (const GgufTensorInfo& info : file->gguf().tensors()) {
      auto [it, inserted] = index_.emplace(info.name, tensors_.size());
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", info.name, "\" is in both ",
                                                       tensors_[it->second].file->path().string(), " and ",
                                                       file->path().string()));
      }
      tensors_.push_back({.info = &info, .file = file.get(), .data = file->TensorData(info)});
    }
  }
  const GgufMetadata& first = metadata();
  if (first.Contains(kGgufSplitTensorsCountKey)) {
    TANDEM_ASSIGN_OR_RETURN(const int64_t expected, first.GetInteger(kGgufSplitTensorsCountKey));
    if (expected != static_cast<int64_t>(tensors_.size())) {
      return absl::InvalidArgumentError(absl::StrCat(first.source(), ": metadata key \"", kGgufSplitTensorsCountKey,
                                                     "\" is ", expected, " but the ", files_.size(), " files hold ",
                                                     tensors_.size(), " tensors"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GgufTensor> GgufCheckpoint::Get(absl::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return absl::NotFoundError(absl::StrCat(Describe(), ": no tensor \"", name, "\""));
  return tensors_[it->second];
}

std::string GgufCheckpoint::Describe() const {
  const std::string first = files_.front()->path().string();
  return files_.size() > 1 ? absl::StrCat(first, " (", files_.size(), " files)") : first;
}

}  // namespace tandem
