#include "common/gguf/gguf_value.h"

#include <limits>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

constexpr const char* kTypeNames[kGgufValueTypeCount] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                                         "int32",  "float32", "bool",   "string", "array",
                                                         "uint64", "int64",   "float64"};
// Arrays longer than this show their first elements and a count.
constexpr size_t kDebugElements = 8;

template <typename T>
std::string ScalarString(const T& v) {
  if constexpr (std::is_same_v<T, std::string>) {
    return absl::StrCat("\"", v.size() > 64 ? v.substr(0, 64) + "..." : v, "\"");
  } else if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
    return absl::StrCat(static_cast<int>(v));
  } else {
    return absl::StrCat(v);
  }
}

std::string ArrayString(const GgufArray& array);

template <typename T>
std::string ElementString(const T& v) {
  if constexpr (std::is_same_v<T, GgufArray>) {
    return ArrayString(v);
  } else {
    return ScalarString(v);
  }
}

std::string ArrayString(const GgufArray& array) {
  return std::visit(
      [](const auto& elements) {
        std::string out = "[";
        for (size_t i = 0; i < elements.size() && i < kDebugElements; ++i) {
          // vector<bool>'s proxy: copy to the element type.
          const typename std::decay_t<decltype(elements)>::value_type element = elements[i];
          absl::StrAppend(&out, i ? ", " : "", ElementString(element));
        }
        if (elements.size() > kDebugElements) absl::StrAppend(&out, ", ... (", elements.size(), " elements)");
        return out + "]";
      },
      array.elements());
}

}  // namespace

std::string GgufValueTypeName(GgufValueType type) {
  const uint32_t id = static_cast<uint32_t>(type);
  return id < kGgufValueTypeCount ? kTypeNames[id] : absl::StrCat("type ", id);
}

size_t GgufArray::size() const {
  return std::visit([](const auto& elements) { return elements.size(); }, elements_);
}

bool GgufValue::AsInt64(int64_t* out) const {
  return std::visit(
      [out](const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_same_v<T, uint64_t>) {
            if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
          }
          *out = static_cast<int64_t>(v);
          return true;
        } else {
          return false;
        }
      },
      storage_);
}

bool GgufValue::AsDouble(double* out) const {
  if (const float* f = As<float>()) {
    *out = *f;
    return true;
  }
  if (const double* d = As<double>()) {
    *out = *d;
    return true;
  }
  return false;
}

std::string GgufValue::DebugString() const {
  return std::visit([](const auto& v) { return ElementString(v); }, storage_);
}

}  // namespace tandem
