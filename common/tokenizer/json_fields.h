// Typed reads of tokenizer.json fields whose errors say where the field is:
// "tokenizer.json: pre_tokenizer.pretokenizers[1].behavior: expected one of
// ...". `where` is the path of the object being read, starting with the
// file. No exceptions: every type is checked before the value is taken.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

using Json = nlohmann::json;

// "where.key".
std::string FieldPath(const std::string& where, std::string_view key);
// "where[index]".
std::string ElementPath(const std::string& where, size_t index);
// InvalidArgument "where: what".
absl::Status JsonError(const std::string& where, std::string_view what);

// The field `key` of `object`, or null when it is absent or JSON null.
const Json* FindField(const Json& object, std::string_view key);

// A string field; InvalidArgument when absent (and no `absent` value is
// given) or not a string.
absl::StatusOr<std::string> ReadString(const Json& object, std::string_view key, const std::string& where,
                                       std::optional<std::string> absent = std::nullopt);
absl::StatusOr<bool> ReadBool(const Json& object, std::string_view key, const std::string& where,
                              std::optional<bool> absent = std::nullopt);
// A non-negative integer no larger than `max`.
absl::StatusOr<uint64_t> ReadUnsigned(const Json& object, std::string_view key, const std::string& where, uint64_t max,
                                      std::optional<uint64_t> absent = std::nullopt);
// A string holding exactly one character (Rust's char fields), as UTF-8.
absl::StatusOr<std::string> ReadChar(const Json& object, std::string_view key, const std::string& where,
                                     std::optional<std::string> absent = std::nullopt);
// The "type" of a component object; InvalidArgument when it is not an object
// or has no string "type".
absl::StatusOr<std::string> ReadType(const Json& object, const std::string& where);

}  // namespace tandem
