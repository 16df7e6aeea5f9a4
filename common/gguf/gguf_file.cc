#include "common/gguf/gguf_file.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<uint64_t> GgufAlignment(const GgufMetadata& metadata) {
  const GgufValue* value = metadata.Find(kGgufAlignmentKey);
  if (value == nullptr) return kGgufDefaultAlignment;
  const uint32_t* alignment = value->As<uint32_t>();
  if (alignment == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("metadata key \"", kGgufAlignmentKey, "\" is ",
                                                   GgufValueTypeName(value->type()), ", expected uint32"));
  }
  if (*alignment == 0 || (*alignment & (*alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata key \"", kGgufAlignmentKey, "\" is ", *alignment, ", not a power of two"));
  }
  return *alignment;
}

GgufFile::GgufFile(std::string file_name, uint32_t version, GgufMetadata metadata, std::vector<GgufTensorInfo> tensors,
                   uint64_t alignment, uint64_t data_offset)
    : file_name_(std::move(file_name)),
      version_(version),
      metadata_(std::move(metadata)),
      tensors_(std::move(tensors)),
      alignment_(alignment),
      data_offset_(data_offset) {
  for (size_t i = 0; i < tensors_.size(); ++i) tensor_index_.emplace(tensors_[i].name, i);
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace tandem
