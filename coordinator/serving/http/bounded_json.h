// JSON from an untrusted peer, with its size bounded while it is parsed:
// nesting depth, the number of values, and keys per object are counted as
// the parser meets them (nlohmann's SAX interface), so a body of 100,000
// `[` is refused at the 65th without building anything, and no tree deeper
// than max_depth ever exists for a recursive copy or destructor to overflow
// the stack on. The tree that is built costs at most about
// values * kBytesPerValue + the body's own bytes; ParsedJson says how much.
//
// Pure: no state; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"

namespace tandem {

struct JsonLimits {
  int max_depth = 64;              // arrays and objects inside each other
  int64_t max_values = 1 << 18;    // every scalar, array and object counts one
  int64_t max_object_keys = 4096;  // keys of one object (ordered_json looks keys up linearly)
};

// The estimated heap cost of one value of the tree beyond its string bytes
// (the value, its slot in its parent's vector, container headers).
inline constexpr int64_t kJsonBytesPerValue = 64;

struct ParsedJson {
  nlohmann::ordered_json value;
  int64_t values = 0;
  int64_t estimated_bytes = 0;  // values * kJsonBytesPerValue + string and key bytes
};

// InvalidArgument for text that is not JSON (saying at which byte, in our
// words, never the library's), nested deeper than max_depth, or an object
// with more than max_object_keys keys; OutOfRange for more than max_values
// values (HTTP answers that 413). `what` names the text in errors ("the
// request body").
absl::StatusOr<ParsedJson> ParseBoundedJson(absl::string_view text, const JsonLimits& limits, absl::string_view what);

}  // namespace tandem
