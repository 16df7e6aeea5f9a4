#include "common/gguf/gguf_serializer.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

uint64_t AlignUp(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

template <typename T>
void Put(std::string* out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out->append(bytes, sizeof(T));
}

void PutString(std::string* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

void PutArray(std::string* out, const GgufArray& array);

template <typename T>
void PutElement(std::string* out, const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    PutString(out, v);
  } else if constexpr (std::is_same_v<T, GgufArray>) {
    PutArray(out, v);
  } else if constexpr (std::is_same_v<T, bool>) {
    Put<uint8_t>(out, v ? 1 : 0);
  } else {
    Put<T>(out, v);
  }
}

void PutArray(std::string* out, const GgufArray& array) {
  Put<uint32_t>(out, static_cast<uint32_t>(array.element_type()));
  Put<uint64_t>(out, array.size());
  std::visit(
      [out](const auto& elements) {
        for (size_t i = 0; i < elements.size(); ++i) {
          const typename std::decay_t<decltype(elements)>::value_type element = elements[i];
          PutElement(out, element);
        }
      },
      array.elements());
}

}  // namespace

absl::StatusOr<std::vector<GgufTensorInfo>> LayOutGgufTensors(absl::Span<const GgufTensorSpec> specs,
                                                              uint64_t alignment) {
  std::vector<GgufTensorInfo> infos;
  infos.reserve(specs.size());
  absl::flat_hash_set<std::string> names;
  uint64_t offset = 0;
  for (const GgufTensorSpec& spec : specs) {
    const std::string context = absl::StrCat("tensor \"", spec.name, "\"");
    if (spec.name.empty()) return absl::InvalidArgumentError(absl::StrCat("tensor #", infos.size(), " has no name"));
    if (spec.name.size() >= kGgufMaxTensorNameBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          context, ": name of ", spec.name.size(), " bytes; ggml readers take at most ", kGgufMaxTensorNameBytes - 1));
    }
    if (!names.insert(spec.name).second) return absl::InvalidArgumentError(absl::StrCat(context, " appears twice"));
    if (spec.dims.size() > static_cast<size_t>(kGgufMaxDims)) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": ", spec.dims.size(), " dimensions, more than ggml's ", kGgufMaxDims));
    }
    absl::StatusOr<uint64_t> bytes = GgmlTensorBytes(spec.type, spec.dims);
    if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat(context, ": ", bytes.status().message()));
    infos.push_back({.name = spec.name, .dims = spec.dims, .type = spec.type, .offset = offset, .size_bytes = *bytes});
    if (__builtin_add_overflow(offset, AlignUp(*bytes, alignment), &offset)) {
      return absl::InvalidArgumentError(absl::StrCat(context, ": the data section overflows 64 bits"));
    }
  }
  return infos;
}

uint64_t GgufDataSectionBytes(absl::Span<const GgufTensorInfo> tensors, uint64_t alignment) {
  uint64_t end = 0;
  for (const GgufTensorInfo& t : tensors) end = std::max(end, AlignUp(t.offset + t.size_bytes, alignment));
  return end;
}

absl::StatusOr<std::string> SerializeGgufHeader(const GgufMetadata& metadata,
                                                absl::Span<const GgufTensorInfo> tensors) {
  TANDEM_ASSIGN_OR_RETURN(const uint64_t alignment, GgufAlignment(metadata));
  std::string out;
  Put<uint32_t>(&out, kGgufMagic);
  Put<uint32_t>(&out, kGgufVersion);
  Put<uint64_t>(&out, tensors.size());
  Put<uint64_t>(&out, metadata.size());
  for (const auto& [key, value] : metadata.entries()) {
    PutString(&out, key);
    Put<uint32_t>(&out, static_cast<uint32_t>(value.type()));
    std::visit([&out](const auto& v) { PutElement(&out, v); }, value.storage());
  }
  for (const GgufTensorInfo& t : tensors) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&out, static_cast<uint64_t>(d));
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, t.offset);
  }
  out.resize(AlignUp(out.size(), alignment), '\0');
  return out;
}

}  // namespace tandem
