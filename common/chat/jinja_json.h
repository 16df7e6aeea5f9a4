// JSON in and out of template values: request JSON (messages, tools) becomes
// values in the order the client wrote it, and `tojson` writes values the way
// Python's json.dumps does (what transformers' tojson filter calls), byte for
// byte. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/chat/jinja_value.h"

namespace tandem::jinja {

// Objects keep their key order: parse requests with nlohmann::ordered_json
// so a tool schema renders as the client wrote it (nlohmann::json sorts keys).
// InvalidArgument when arrays and objects nest deeper than `max_depth`
// (the walk is recursive).
absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& json, int max_depth);
absl::StatusOr<Value> FromJson(const nlohmann::json& json, int max_depth);

// json.dumps(value, ensure_ascii, indent, separators, sort_keys).
struct JsonDumpOptions {
  bool ensure_ascii = false;                  // transformers' default: non-ASCII stays as is
  std::optional<std::string> indent;          // None: one line; else this per level (indent=4: 4 spaces)
  std::optional<std::string> item_separator;  // default ", " (or "," when indenting)
  std::optional<std::string> key_separator;   // default ": "
  bool sort_keys = false;
  // ResourceExhausted once the text passes this (checked while writing).
  size_t max_bytes = SIZE_MAX;
};
// InvalidArgument "Object of type Undefined is not JSON serializable" for
// undefined, namespaces and callables (as Python's TypeError says).
absl::StatusOr<std::string> DumpJson(const Value& value, const JsonDumpOptions& options);

}  // namespace tandem::jinja
