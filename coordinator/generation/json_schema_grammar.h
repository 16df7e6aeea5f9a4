// JSON schemas (and "any JSON") compiled into Grammar nodes, so a
// constrained output always parses and validates: what OpenAI's
// response_format json_schema (strict) and a tool's parameters ask for.
//
// Enforced: type (one or a list), properties (generated in the schema's
// order; an optional one may be left out), required, additionalProperties
// (false; or, for an object with no properties, any key with a value
// schema), items, minItems, maxItems, minLength, maxLength, enum, const,
// anyOf, allOf of one schema, $ref to "#", "#/$defs/..." or
// "#/definitions/...", recursion included. Annotations (title,
// description, default, examples, $schema, $id, $comment, deprecated,
// readOnly, writeOnly, and x-* keys) are read past. Every other keyword
// (pattern, format, minimum, oneOf, uniqueItems, ...) cannot be enforced
// by this automaton and is refused by name: never ignored.
//
// Properties are generated in the order the schema lists them (as OpenAI
// does), and properties beyond those listed are never generated: what
// comes out validates against the schema either way.
#pragma once

#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "coordinator/generation/grammar.h"

namespace tandem {

inline constexpr size_t kMaxSchemaNodes = 8192;
inline constexpr size_t kMaxSchemaProperties = 64;  // per object
inline constexpr size_t kMaxSchemaLiterals = 1024;  // enum values

// Adds `schema`'s value to `grammar`; returns its node. InvalidArgument
// starting with `where` and the JSON pointer of the offending keyword
// ("response_format.json_schema.schema: /properties/age: minimum is not
// supported ...").
absl::StatusOr<int32_t> AddJsonSchema(const nlohmann::ordered_json& schema, std::string_view where,
                                      Grammar* grammar);

// Any JSON value; any JSON object (json_object mode).
int32_t AddAnyJsonValue(Grammar* grammar);
int32_t AddAnyJsonObject(Grammar* grammar);

}  // namespace tandem
