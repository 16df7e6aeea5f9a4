// The key/value metadata of a GGUF file, in file order, with typed getters
// whose errors name the file (the `source` given at construction) and key:
//   NotFound         the key is absent
//   InvalidArgument  the key holds another type (or an integer that does
//                    not fit the type asked for)
// Keys are unique and non-empty. Not thread-safe to mutate; const methods
// may be called from any thread.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/gguf/gguf_value.h"

namespace tandem {

class GgufMetadata {
 public:
  explicit GgufMetadata(std::string source = "gguf metadata") : source_(std::move(source)) {}

  // Appends `key`; InvalidArgument if it is empty or already present.
  absl::Status Add(std::string key, GgufValue value);
  // Sets `key`, replacing a present value in place or appending.
  void Set(std::string key, GgufValue value);
  // Removes `key` if present.
  void Erase(absl::string_view key);

  const GgufValue* Find(absl::string_view key) const;
  bool Contains(absl::string_view key) const { return Find(key) != nullptr; }
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, GgufValue>>& entries() const { return entries_; }
  const std::string& source() const { return source_; }

  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  // Any integer type (uint8 .. int64) whose value fits an int64.
  absl::StatusOr<int64_t> GetInteger(absl::string_view key) const;
  // float32 or float64.
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  // An array whose elements are of `element_type`.
  absl::StatusOr<const GgufArray*> GetArray(absl::string_view key, GgufValueType element_type) const;

  bool operator==(const GgufMetadata& other) const { return entries_ == other.entries_; }

 private:
  absl::StatusOr<const GgufValue*> FindOrNotFound(absl::string_view key) const;
  absl::Status WrongType(absl::string_view key, const GgufValue& value, absl::string_view wanted) const;

  std::string source_;
  std::vector<std::pair<std::string, GgufValue>> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // key -> position in entries_
};

}  // namespace tandem
