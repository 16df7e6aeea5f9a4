// The values of GGUF metadata: thirteen types, numbered as the file stores
// them, arrays holding one element type each (arrays of arrays included).
// A GgufValue's variant index is its GGUF type id; a GgufArray keeps its
// elements in one typed vector, so a 150k-entry vocabulary costs what the
// strings cost and a caller reads it as a std::vector<std::string>.
// Plain values: copyable, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "absl/strings/string_view.h"

namespace tandem {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
inline constexpr uint32_t kGgufValueTypeCount = 13;

// "uint8", "string", "array", ...; "type N" for ids past the last.
std::string GgufValueTypeName(GgufValueType type);

class GgufArray {
 public:
  // Alternative i is a vector of the type GGUF numbers i.
  using Elements = std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>, std::vector<int16_t>,
                                std::vector<uint32_t>, std::vector<int32_t>, std::vector<float>, std::vector<bool>,
                                std::vector<std::string>, std::vector<GgufArray>, std::vector<uint64_t>,
                                std::vector<int64_t>, std::vector<double>>;

  GgufArray() = default;  // an empty uint8 array
  template <typename T>
  explicit GgufArray(std::vector<T> elements) : elements_(std::move(elements)) {}
  explicit GgufArray(Elements elements) : elements_(std::move(elements)) {}

  GgufValueType element_type() const { return static_cast<GgufValueType>(elements_.index()); }
  size_t size() const;
  // The elements when they are of type T, else null.
  template <typename T>
  const std::vector<T>* As() const {
    return std::get_if<std::vector<T>>(&elements_);
  }
  const Elements& elements() const { return elements_; }
  bool operator==(const GgufArray& other) const { return elements_ == other.elements_; }

 private:
  Elements elements_;
};

class GgufValue {
 public:
  // Alternative i is the type GGUF numbers i.
  using Storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
                               GgufArray, uint64_t, int64_t, double>;

  GgufValue() = default;  // uint8 0
  // One constructor per GGUF type; a value of another C++ type must be cast
  // to the exact type meant (5 is ambiguous, uint32_t{5} is not).
  GgufValue(uint8_t v) : storage_(v) {}
  GgufValue(int8_t v) : storage_(v) {}
  GgufValue(uint16_t v) : storage_(v) {}
  GgufValue(int16_t v) : storage_(v) {}
  GgufValue(uint32_t v) : storage_(v) {}
  GgufValue(int32_t v) : storage_(v) {}
  GgufValue(float v) : storage_(v) {}
  GgufValue(bool v) : storage_(v) {}
  GgufValue(std::string v) : storage_(std::move(v)) {}
  GgufValue(const char* v) : storage_(std::string(v)) {}  // not bool
  GgufValue(GgufArray v) : storage_(std::move(v)) {}
  GgufValue(uint64_t v) : storage_(v) {}
  GgufValue(int64_t v) : storage_(v) {}
  GgufValue(double v) : storage_(v) {}

  GgufValueType type() const { return static_cast<GgufValueType>(storage_.index()); }
  template <typename T>
  const T* As() const {
    return std::get_if<T>(&storage_);
  }
  const Storage& storage() const { return storage_; }
  // The value as int64 when it is an integer of any width that fits.
  bool AsInt64(int64_t* out) const;
  // The value as double when it is a float32 or float64.
  bool AsDouble(double* out) const;
  // Short human-readable form for errors and logs; long arrays are cut.
  std::string DebugString() const;
  bool operator==(const GgufValue& other) const { return storage_ == other.storage_; }

 private:
  Storage storage_;
};

static_assert(std::is_same_v<std::variant_alternative_t<9, GgufValue::Storage>, GgufArray>);
static_assert(std::is_same_v<std::variant_alternative_t<12, GgufValue::Storage>, double>);
static_assert(std::variant_size_v<GgufValue::Storage> == kGgufValueTypeCount);
static_assert(std::variant_size_v<GgufArray::Elements> == kGgufValueTypeCount);

}  // namespace tandem
