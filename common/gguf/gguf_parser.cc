#include "common/gguf/gguf_parser.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// Smallest encodings, to bound counts by the bytes that remain: a metadata
// entry is at least a key length, a type and a one-byte value; a tensor info
// a name length, n_dims, type and offset.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;

// `status` with `context: ` put in front of its message.
absl::Status Within(absl::string_view context, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// Reads little-endian fields from the span, never past its end.
class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> bytes) : bytes_(bytes) {}

  uint64_t position() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }
  uint64_t size() const { return bytes_.size(); }

  absl::Status PastEnd(uint64_t needed) const {
    return absl::DataLossError(absl::StrCat(needed, " bytes at byte ", pos_, " run past the end of the file (",
                                            bytes_.size(), " bytes): truncated?"));
  }

  template <typename T>
  absl::StatusOr<T> Read() {
    if (remaining() < sizeof(T)) return PastEnd(sizeof(T));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // Copies `count` elements of T into `out`; the caller has bounded count.
  template <typename T>
  absl::Status ReadInto(uint64_t count, std::vector<T>* out) {
    if (count > remaining() / sizeof(T)) return PastEnd(count * sizeof(T));
    out->resize(count);
    if (count) std::memcpy(out->data(), bytes_.data() + pos_, count * sizeof(T));
    pos_ += count * sizeof(T);
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadString() {
    const uint64_t at = pos_;
    TANDEM_ASSIGN_OR_RETURN(const uint64_t length, Read<uint64_t>());
    if (length > remaining()) {
      return absl::DataLossError(absl::StrCat("string of ", length, " bytes at byte ", at,
                                              " runs past the end of the file (", bytes_.size(), " bytes)"));
    }
    if (length > kGgufMaxStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("string of ", length, " bytes at byte ", at, " is over the ",
                                                     kGgufMaxStringBytes, "-byte limit"));
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), length);
    pos_ += length;
    return s;
  }

 private:
  absl::Span<const uint8_t> bytes_;
  uint64_t pos_ = 0;
};

// Bytes the smallest element of `type` takes in a file.
uint64_t MinEncodedBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kString: return 8;     // the length
    case GgufValueType::kArray: return 4 + 8;  // element type and count
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
  }
  return 1;
}

absl::StatusOr<GgufValueType> ToValueType(uint32_t id) {
  if (id >= kGgufValueTypeCount) {
    return absl::InvalidArgumentError(absl::StrCat("value type ", id, " is not a GGUF type (0-12)"));
  }
  return static_cast<GgufValueType>(id);
}

absl::StatusOr<GgufArray> ReadArray(Reader& r, int depth);

// One element vector of the array's type; strings and arrays one by one,
// naming the element that fails.
template <typename T>
absl::StatusOr<GgufArray> ReadElements(Reader& r, uint64_t count, int depth) {
  std::vector<T> elements;
  if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, GgufArray>) {
    elements.reserve(count);  // bounded by the caller: count * min bytes <= remaining
    for (uint64_t i = 0; i < count; ++i) {
      absl::StatusOr<T> element;
      if constexpr (std::is_same_v<T, std::string>) {
        element = r.ReadString();
      } else {
        element = ReadArray(r, depth + 1);
      }
      if (!element.ok()) return Within(absl::StrCat("element ", i), element.status());
      elements.push_back(*std::move(element));
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    std::vector<uint8_t> raw;
    TANDEM_RETURN_IF_ERROR(r.ReadInto(count, &raw));
    elements.resize(count);
    for (uint64_t i = 0; i < count; ++i) {
      if (raw[i] > 1) {
        return absl::InvalidArgumentError(absl::StrCat("element ", i, ": bool byte ", raw[i], " is neither 0 nor 1"));
      }
      elements[i] = raw[i] == 1;
    }
  } else {
    TANDEM_RETURN_IF_ERROR(r.ReadInto(count, &elements));
  }
  return GgufArray(std::move(elements));
}

absl::StatusOr<GgufArray> ReadArray(Reader& r, int depth) {
  const uint64_t at = r.position();
  TANDEM_ASSIGN_OR_RETURN(const uint32_t type_id, r.Read<uint32_t>());
  TANDEM_ASSIGN_OR_RETURN(const GgufValueType type, ToValueType(type_id));
  TANDEM_ASSIGN_OR_RETURN(const uint64_t count, r.Read<uint64_t>());
  if (type == GgufValueType::kArray && depth + 1 >= kGgufMaxArrayDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("array at byte ", at, " nests arrays deeper than ", kGgufMaxArrayDepth, " levels"));
  }
  const uint64_t min_bytes = MinEncodedBytes(type);
  if (count > r.remaining() / min_bytes) {
    return absl::DataLossError(absl::StrCat("array of ", count, " ", GgufValueTypeName(type), " at byte ", at,
                                            " needs at least ",
                                            count > UINT64_MAX / min_bytes ? UINT64_MAX : count * min_bytes,
                                            " bytes but the file has ", r.remaining(), " left"));
  }
  if (count > kGgufMaxArrayElements) {
    return absl::InvalidArgumentError(absl::StrCat("array of ", count, " elements at byte ", at, " is over the ",
                                                   kGgufMaxArrayElements, "-element limit"));
  }
  switch (type) {
    case GgufValueType::kUint8: return ReadElements<uint8_t>(r, count, depth);
    case GgufValueType::kInt8: return ReadElements<int8_t>(r, count, depth);
    case GgufValueType::kUint16: return ReadElements<uint16_t>(r, count, depth);
    case GgufValueType::kInt16: return ReadElements<int16_t>(r, count, depth);
    case GgufValueType::kUint32: return ReadElements<uint32_t>(r, count, depth);
    case GgufValueType::kInt32: return ReadElements<int32_t>(r, count, depth);
    case GgufValueType::kFloat32: return ReadElements<float>(r, count, depth);
    case GgufValueType::kBool: return ReadElements<bool>(r, count, depth);
    case GgufValueType::kString: return ReadElements<std::string>(r, count, depth);
    case GgufValueType::kArray: return ReadElements<GgufArray>(r, count, depth);
    case GgufValueType::kUint64: return ReadElements<uint64_t>(r, count, depth);
    case GgufValueType::kInt64: return ReadElements<int64_t>(r, count, depth);
    case GgufValueType::kFloat64: return ReadElements<double>(r, count, depth);
  }
  return absl::InternalError("unreachable value type");
}

absl::StatusOr<GgufValue> ReadValue(Reader& r, GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8: return r.Read<uint8_t>();
    case GgufValueType::kInt8: return r.Read<int8_t>();
    case GgufValueType::kUint16: return r.Read<uint16_t>();
    case GgufValueType::kInt16: return r.Read<int16_t>();
    case GgufValueType::kUint32: return r.Read<uint32_t>();
    case GgufValueType::kInt32: return r.Read<int32_t>();
    case GgufValueType::kFloat32: return r.Read<float>();
    case GgufValueType::kBool: {
      TANDEM_ASSIGN_OR_RETURN(const uint8_t b, r.Read<uint8_t>());
      if (b > 1) return absl::InvalidArgumentError(absl::StrCat("bool byte ", b, " is neither 0 nor 1"));
      return GgufValue(b == 1);
    }
    case GgufValueType::kString: return r.ReadString();
    case GgufValueType::kArray: return ReadArray(r, 0);
    case GgufValueType::kUint64: return r.Read<uint64_t>();
    case GgufValueType::kInt64: return r.Read<int64_t>();
    case GgufValueType::kFloat64: return r.Read<double>();
  }
  return absl::InternalError("unreachable value type");
}

absl::StatusOr<uint32_t> ReadVersion(Reader& r) {
  if (r.size() < 4) {
    return absl::DataLossError(absl::StrCat("only ", r.size(), " bytes: too short for a GGUF header"));
  }
  TANDEM_ASSIGN_OR_RETURN(const uint32_t magic, r.Read<uint32_t>());
  if (magic != kGgufMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("not a GGUF file: it starts with bytes %02x %02x %02x %02x, expected \"GGUF\" (47 47 55 46)",
                        magic & 0xff, (magic >> 8) & 0xff, (magic >> 16) & 0xff, magic >> 24));
  }
  TANDEM_ASSIGN_OR_RETURN(const uint32_t version, r.Read<uint32_t>());
  if (version == 2 || version == 3) return version;
  if (version == 1) return absl::InvalidArgumentError("GGUF version 1 is not supported (only versions 2 and 3)");
  if ((version & 0xffff) == 0 && __builtin_bswap32(version) <= kGgufVersion) {
    return absl::InvalidArgumentError(absl::StrCat("big-endian GGUF (version ", __builtin_bswap32(version),
                                                   " byte-swapped) is not supported: only little-endian files"));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported GGUF version ", version, " (only versions 2 and 3)"));
}

absl::StatusOr<GgufMetadata> ReadMetadata(Reader& r, uint64_t count, absl::string_view file_name) {
  GgufMetadata metadata{std::string(file_name)};
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<std::string> key = r.ReadString();
    if (!key.ok()) return Within(absl::StrCat("metadata key #", i), key.status());
    if (key->empty()) return absl::InvalidArgumentError(absl::StrCat("metadata key #", i, " is empty"));
    const std::string context = absl::StrCat("metadata key \"", *key, "\"");
    if (metadata.Contains(*key)) return absl::InvalidArgumentError(absl::StrCat(context, " appears twice"));
    absl::StatusOr<uint32_t> type_id = r.Read<uint32_t>();
    if (!type_id.ok()) return Within(context, type_id.status());
    absl::StatusOr<GgufValueType> type = ToValueType(*type_id);
    if (!type.ok()) return Within(context, type.status());
    absl::StatusOr<GgufValue> value = ReadValue(r, *type);
    if (!value.ok()) return Within(context, value.status());
    TANDEM_RETURN_IF_ERROR(metadata.Add(*std::move(key), *std::move(value)));
  }
  return metadata;
}

absl::StatusOr<GgufTensorInfo> ReadTensorInfo(Reader& r) {
  GgufTensorInfo info;
  TANDEM_ASSIGN_OR_RETURN(const uint32_t n_dims, r.Read<uint32_t>());
  if (n_dims > kGgufMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(n_dims, " dimensions, more than ggml's ", kGgufMaxDims));
  }
  for (uint32_t d = 0; d < n_dims; ++d) {
    TANDEM_ASSIGN_OR_RETURN(const uint64_t dim, r.Read<uint64_t>());
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", d, " is ", dim, ", over 2^63 - 1"));
    }
    info.dims.push_back(static_cast<int64_t>(dim));
  }
  TANDEM_ASSIGN_OR_RETURN(const uint32_t type_id, r.Read<uint32_t>());
  TANDEM_ASSIGN_OR_RETURN(info.type, GgmlTypeFromId(type_id));
  TANDEM_ASSIGN_OR_RETURN(info.offset, r.Read<uint64_t>());
  TANDEM_ASSIGN_OR_RETURN(info.size_bytes, GgmlTensorBytes(info.type, info.dims));
  return info;
}

absl::StatusOr<std::vector<GgufTensorInfo>> ReadTensorInfos(Reader& r, uint64_t count) {
  std::vector<GgufTensorInfo> tensors;
  tensors.reserve(count);  // bounded by the caller against the bytes left
  absl::flat_hash_map<std::string, size_t> seen;
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<std::string> name = r.ReadString();
    if (!name.ok()) return Within(absl::StrCat("tensor #", i, " name"), name.status());
    if (name->empty()) return absl::InvalidArgumentError(absl::StrCat("tensor #", i, " has an empty name"));
    const std::string context = absl::StrCat("tensor \"", *name, "\"");
    if (!seen.emplace(*name, i).second) return absl::InvalidArgumentError(absl::StrCat(context, " appears twice"));
    absl::StatusOr<GgufTensorInfo> info = ReadTensorInfo(r);
    if (!info.ok()) return Within(context, info.status());
    info->name = *std::move(name);
    tensors.push_back(*std::move(info));
  }
  return tensors;
}

// Every tensor aligned, inside the data section, and clear of the others.
absl::Status CheckTensorPlacement(const std::vector<GgufTensorInfo>& tensors, uint64_t alignment, uint64_t data_offset,
                                  uint64_t file_size) {
  if (tensors.empty()) return absl::OkStatus();
  if (data_offset > file_size) {
    return absl::DataLossError(absl::StrCat("the data section would start at byte ", data_offset,
                                            ", past the end of the file (", file_size, " bytes): truncated?"));
  }
  const uint64_t data_bytes = file_size - data_offset;
  for (const GgufTensorInfo& t : tensors) {
    if (t.offset % alignment != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": offset ", t.offset,
                                                     " is not a multiple of the alignment ", alignment));
    }
    if (t.offset > data_bytes || t.size_bytes > data_bytes - t.offset) {
      return absl::DataLossError(absl::StrCat("tensor \"", t.name, "\": its ", t.size_bytes, " bytes at offset ",
                                              t.offset, " run past the end of the data section (", data_bytes,
                                              " bytes from byte ", data_offset, "): truncated?"));
    }
  }
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tensors[a].offset < tensors[b].offset; });
  const GgufTensorInfo* previous = nullptr;
  for (size_t i : order) {
    const GgufTensorInfo& t = tensors[i];
    if (t.size_bytes == 0) continue;
    if (previous != nullptr && previous->offset + previous->size_bytes > t.offset) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\" at offset ", t.offset,
                                                     " overlaps tensor \"", previous->name, "\" (offset ",
                                                     previous->offset, ", ", previous->size_bytes, " bytes)"));
    }
    previous = &t;
  }
  return absl::OkStatus();
}

absl::StatusOr<GgufFile> Parse(absl::Span<const uint8_t> bytes, absl::string_view file_name) {
  Reader r(bytes);
  TANDEM_ASSIGN_OR_RETURN(const uint32_t version, ReadVersion(r));
  absl::StatusOr<uint64_t> tensor_count = r.Read<uint64_t>();
  if (!tensor_count.ok()) return Within("tensor count", tensor_count.status());
  absl::StatusOr<uint64_t> kv_count = r.Read<uint64_t>();
  if (!kv_count.ok()) return Within("metadata count", kv_count.status());
  if (*kv_count > r.remaining() / kMinKvBytes || *tensor_count > r.remaining() / kMinTensorInfoBytes ||
      *kv_count * kMinKvBytes + *tensor_count * kMinTensorInfoBytes > r.remaining()) {
    return absl::DataLossError(absl::StrCat("the header lists ", *kv_count, " metadata entries and ", *tensor_count,
                                            " tensors, more than the ", r.remaining(),
                                            " bytes after it can hold: truncated or corrupt"));
  }
  TANDEM_ASSIGN_OR_RETURN(GgufMetadata metadata, ReadMetadata(r, *kv_count, file_name));
  TANDEM_ASSIGN_OR_RETURN(const uint64_t alignment, GgufAlignment(metadata));
  TANDEM_ASSIGN_OR_RETURN(std::vector<GgufTensorInfo> tensors, ReadTensorInfos(r, *tensor_count));
  const uint64_t data_offset = (r.position() + alignment - 1) / alignment * alignment;
  TANDEM_RETURN_IF_ERROR(CheckTensorPlacement(tensors, alignment, data_offset, r.size()));
  return GgufFile(std::string(file_name), version, std::move(metadata), std::move(tensors), alignment, data_offset);
}

}  // namespace

absl::StatusOr<GgufFile> ParseGguf(absl::Span<const uint8_t> bytes, absl::string_view file_name) {
  absl::StatusOr<GgufFile> file = Parse(bytes, file_name);
  if (!file.ok()) return Within(file_name, file.status());
  return file;
}

}  // namespace tandem
