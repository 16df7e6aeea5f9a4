#include "coordinator/generation/json_schema_grammar.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

// The form a model writes a literal in: compact, as json.dumps with
// separators (",", ":") and ensure_ascii off.
std::string Literal(const Json& value) { return value.dump(-1, ' ', false, Json::error_handler_t::replace); }

GrammarNode Node(GrammarNode::Kind kind) {
  GrammarNode n;
  n.kind = kind;
  return n;
}

const std::set<std::string, std::less<>>& Annotations() {
  static const auto* set = new std::set<std::string, std::less<>>{
      "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
      "writeOnly", "$defs", "definitions", "strict"};
  return *set;
}

// Why each keyword that cannot be enforced is refused.
const std::map<std::string, std::string, std::less<>>& Refusals() {
  static const auto* map = new std::map<std::string, std::string, std::less<>>{
      {"pattern", "regular expressions are not enforced"},
      {"format", "string formats (date-time, email, ...) are not enforced"},
      {"minimum", "numeric bounds are not enforced"},
      {"maximum", "numeric bounds are not enforced"},
      {"exclusiveMinimum", "numeric bounds are not enforced"},
      {"exclusiveMaximum", "numeric bounds are not enforced"},
      {"multipleOf", "is not enforced"},
      {"oneOf", "is not enforced (an output matching two alternatives would not validate); use anyOf"},
      {"not", "is not enforced"},
      {"if", "conditional schemas are not enforced"},
      {"then", "conditional schemas are not enforced"},
      {"else", "conditional schemas are not enforced"},
      {"patternProperties", "is not enforced"},
      {"propertyNames", "is not enforced"},
      {"minProperties", "is not enforced"},
      {"maxProperties", "is not enforced"},
      {"dependentRequired", "is not enforced"},
      {"dependentSchemas", "is not enforced"},
      {"dependencies", "is not enforced"},
      {"unevaluatedProperties", "is not enforced"},
      {"unevaluatedItems", "is not enforced"},
      {"prefixItems", "tuples are not enforced"},
      {"additionalItems", "is not enforced"},
      {"contains", "is not enforced"},
      {"minContains", "is not enforced"},
      {"maxContains", "is not enforced"},
      {"uniqueItems", "is not enforced (only false is accepted)"},
      {"contentEncoding", "is not enforced"},
      {"contentMediaType", "is not enforced"},
      {"nullable", "is OpenAPI's, not JSON Schema's: write \"type\": [\"...\", \"null\"]"},
  };
  return *map;
}

const std::set<std::string, std::less<>>& Understood() {
  static const auto* set = new std::set<std::string, std::less<>>{
      "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
      "maxLength", "enum", "const", "anyOf", "allOf", "$ref"};
  return *set;
}

class SchemaCompiler {
 public:
  SchemaCompiler(const Json& root, std::string_view where, Grammar* g) : root_(root), where_(where), g_(*g) {}

  absl::StatusOr<int32_t> Compile(const Json& schema, const std::string& path, int depth);

 private:
  absl::Status Error(const std::string& path, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", path.empty() ? "/" : path, ": ", what));
  }
  absl::Status CheckKeywords(const Json& schema, const std::string& path) const;
  absl::StatusOr<int32_t> Ref(const Json& schema, const std::string& path, int depth);
  absl::StatusOr<int32_t> Typed(const Json& schema, const std::string& type, const std::string& path, int depth);
  absl::StatusOr<int32_t> Object(const Json& schema, const std::string& path, int depth);
  absl::StatusOr<int32_t> Array(const Json& schema, const std::string& path, int depth);
  absl::StatusOr<int32_t> String(const Json& schema, const std::string& path);
  absl::StatusOr<int32_t> Bound(const Json& schema, const char* key, const std::string& path, int32_t fallback);
  absl::Status CheckSize(const std::string& path) const {
    if (g_.nodes.size() > kMaxSchemaNodes) {
      return Error(path, absl::StrCat("the schema compiles to more than ", kMaxSchemaNodes, " nodes"));
    }
    return absl::OkStatus();
  }

  const Json& root_;
  std::string where_;
  Grammar& g_;
  std::map<std::string, int32_t> refs_;  // JSON pointer -> node (recursion)
};

absl::Status SchemaCompiler::CheckKeywords(const Json& schema, const std::string& path) const {
  for (const auto& [key, value] : schema.items()) {
    if (Understood().contains(key) || Annotations().contains(key) || absl::StartsWith(key, "x-")) continue;
    if (key == "uniqueItems" && value == false) continue;
    auto why = Refusals().find(key);
    if (why != Refusals().end()) return Error(path, absl::StrCat(key, ": ", why->second));
    return Error(path, absl::StrCat(key.substr(0, 64), ": unknown keyword; refused rather than ignored"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> SchemaCompiler::Bound(const Json& schema, const char* key, const std::string& path,
                                              int32_t fallback) {
  auto it = schema.find(key);
  if (it == schema.end()) return fallback;
  if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 20)) {
    return Error(path, absl::StrCat(key, ": must be an integer in [0, 1048576]"));
  }
  return static_cast<int32_t>(it->get<int64_t>());
}

absl::StatusOr<int32_t> SchemaCompiler::Ref(const Json& schema, const std::string& path, int depth) {
  const Json& ref = schema["$ref"];
  for (const auto& [key, value] : schema.items()) {
    if (key != "$ref" && !Annotations().contains(key)) {
      return Error(path, absl::StrCat(key, ": beside $ref is not supported (put it in the referenced schema)"));
    }
  }
  if (!ref.is_string() || !absl::StartsWith(ref.get<std::string>(), "#")) {
    return Error(path, "$ref: only references inside the schema (\"#...\") are supported");
  }
  const std::string pointer = ref.get<std::string>().substr(1);
  if (auto it = refs_.find(pointer); it != refs_.end()) return it->second;
  const Json* target = &root_;
  for (absl::string_view part : absl::StrSplit(pointer, '/', absl::SkipEmpty())) {
    std::string key(part);
    absl::StrReplaceAll({{"~1", "/"}, {"~0", "~"}}, &key);
    if (!target->is_object() || !target->contains(key)) {
      return Error(path, absl::StrCat("$ref: \"", ref.get<std::string>().substr(0, 128), "\" points at nothing"));
    }
    target = &(*target)[key];
  }
  // A placeholder first, so a schema that refers to itself finds it.
  const int32_t node = g_.AddAnyOf({});
  refs_[pointer] = node;
  TANDEM_ASSIGN_OR_RETURN(const int32_t body, Compile(*target, pointer, depth + 1));
  g_.nodes[static_cast<size_t>(node)].children = {body};
  return node;
}

absl::StatusOr<int32_t> SchemaCompiler::String(const Json& schema, const std::string& path) {
  GrammarNode n = Node(GrammarNode::Kind::kString);
  TANDEM_ASSIGN_OR_RETURN(n.min, Bound(schema, "minLength", path, 0));
  TANDEM_ASSIGN_OR_RETURN(n.max, Bound(schema, "maxLength", path, kGrammarUnbounded));
  if (n.max != kGrammarUnbounded && n.max < n.min) return Error(path, "maxLength is below minLength");
  return g_.Add(std::move(n));
}

absl::StatusOr<int32_t> SchemaCompiler::Array(const Json& schema, const std::string& path, int depth) {
  GrammarNode n = Node(GrammarNode::Kind::kArray);
  TANDEM_ASSIGN_OR_RETURN(n.min, Bound(schema, "minItems", path, 0));
  TANDEM_ASSIGN_OR_RETURN(n.max, Bound(schema, "maxItems", path, kGrammarUnbounded));
  if (n.max != kGrammarUnbounded && n.max < n.min) return Error(path, "maxItems is below minItems");
  auto items = schema.find("items");
  if (items == schema.end() || *items == true) {
    n.items = AddAnyJsonValue(&g_);
  } else if (*items == false) {
    n.items = AddAnyJsonValue(&g_);
    n.max = 0;
    if (n.min > 0) return Error(path, "items is false but minItems is above 0");
  } else {
    TANDEM_ASSIGN_OR_RETURN(n.items, Compile(*items, path + "/items", depth + 1));
  }
  return g_.Add(std::move(n));
}

absl::StatusOr<int32_t> SchemaCompiler::Object(const Json& schema, const std::string& path, int depth) {
  auto props = schema.find("properties");
  auto extra = schema.find("additionalProperties");
  if (props != schema.end() && !props->is_object()) return Error(path, "properties: must be an object");
  std::set<std::string> required;
  if (auto req = schema.find("required"); req != schema.end()) {
    if (!req->is_array()) return Error(path, "required: must be a list of property names");
    for (const Json& name : *req) {
      if (!name.is_string()) return Error(path, "required: must be a list of property names");
      if (props == schema.end() || !props->contains(name.get<std::string>())) {
        return Error(path, absl::StrCat("required: \"", name.get<std::string>().substr(0, 64),
                                        "\" is not one of the properties"));
      }
      required.insert(name.get<std::string>());
    }
  }
  if (props == schema.end() || props->empty()) {
    if (extra != schema.end() && *extra == false) return g_.AddLiterals({"{}"}, true);
    GrammarNode n = Node(GrammarNode::Kind::kObject);
    n.items = g_.Add(Node(GrammarNode::Kind::kString));
    if (extra == schema.end() || *extra == true) {
      n.free_value = AddAnyJsonValue(&g_);
    } else {
      TANDEM_ASSIGN_OR_RETURN(n.free_value, Compile(*extra, path + "/additionalProperties", depth + 1));
    }
    return g_.Add(std::move(n));
  }
  if (extra != schema.end() && !extra->is_boolean() && !extra->is_object()) {
    return Error(path, "additionalProperties: must be a boolean or a schema");
  }
  if (props->size() > kMaxSchemaProperties) {
    return Error(path, absl::StrCat("properties: at most ", kMaxSchemaProperties, " per object are supported"));
  }
  GrammarNode n = Node(GrammarNode::Kind::kObject);
  for (const auto& [name, sub] : props->items()) {
    GrammarProperty p;
    p.key = Literal(Json(name));
    p.required = required.contains(name);
    std::string sub_path = absl::StrCat(path, "/properties/", name.substr(0, 64));
    TANDEM_ASSIGN_OR_RETURN(p.value, Compile(sub, sub_path, depth + 1));
    n.properties.push_back(std::move(p));
  }
  return g_.Add(std::move(n));
}

absl::StatusOr<int32_t> SchemaCompiler::Typed(const Json& schema, const std::string& type, const std::string& path,
                                              int depth) {
  if (type == "string") return String(schema, path);
  if (type == "number" || type == "integer") {
    GrammarNode n = Node(GrammarNode::Kind::kNumber);
    n.integer = type == "integer";
    return g_.Add(std::move(n));
  }
  if (type == "boolean") return g_.AddLiterals({"true", "false"}, true);
  if (type == "null") return g_.AddLiterals({"null"}, true);
  if (type == "object") return Object(schema, path, depth);
  if (type == "array") return Array(schema, path, depth);
  return Error(path, absl::StrCat("type: \"", type.substr(0, 64), "\" is not a JSON Schema type"));
}

absl::StatusOr<int32_t> SchemaCompiler::Compile(const Json& schema, const std::string& path, int depth) {
  TANDEM_RETURN_IF_ERROR(CheckSize(path));
  if (depth > 64) return Error(path, "the schema nests deeper than 64");
  if (schema == true || (schema.is_object() && schema.empty())) return AddAnyJsonValue(&g_);
  if (!schema.is_object()) return Error(path, "must be a schema (an object) or true");
  if (schema.contains("$ref")) return Ref(schema, path, depth);
  TANDEM_RETURN_IF_ERROR(CheckKeywords(schema, path));
  if (auto c = schema.find("const"); c != schema.end()) return g_.AddLiterals({Literal(*c)}, true);
  if (auto e = schema.find("enum"); e != schema.end()) {
    if (!e->is_array() || e->empty()) return Error(path, "enum: must be a non-empty list");
    if (e->size() > kMaxSchemaLiterals) return Error(path, absl::StrCat("enum: at most ", kMaxSchemaLiterals, " values"));
    std::vector<std::string> literals;
    for (const Json& v : *e) literals.push_back(Literal(v));
    return g_.AddLiterals(std::move(literals), true);
  }
  if (auto any = schema.find("anyOf"); any != schema.end()) {
    if (!any->is_array() || any->empty()) return Error(path, "anyOf: must be a non-empty list of schemas");
    for (const auto& [key, value] : schema.items()) {
      if (key != "anyOf" && !Annotations().contains(key)) {
        return Error(path, absl::StrCat(key, ": beside anyOf is not supported (put it in each alternative)"));
      }
    }
    std::vector<int32_t> alternatives;
    for (size_t i = 0; i < any->size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(const int32_t alt, Compile((*any)[i], absl::StrCat(path, "/anyOf/", i), depth + 1));
      alternatives.push_back(alt);
    }
    return g_.AddAnyOf(std::move(alternatives));
  }
  if (auto all = schema.find("allOf"); all != schema.end()) {
    if (!all->is_array() || all->size() != 1 || schema.size() != 1) {
      return Error(path, "allOf: only a list of one schema, alone, is supported");
    }
    return Compile((*all)[0], path + "/allOf/0", depth + 1);
  }
  auto type = schema.find("type");
  if (type == schema.end()) {
    if (schema.contains("properties") || schema.contains("additionalProperties") || schema.contains("required")) {
      return Object(schema, path, depth);
    }
    if (schema.contains("items") || schema.contains("minItems") || schema.contains("maxItems")) {
      return Array(schema, path, depth);
    }
    if (schema.contains("minLength") || schema.contains("maxLength")) return String(schema, path);
    return AddAnyJsonValue(&g_);
  }
  if (type->is_string()) return Typed(schema, type->get<std::string>(), path, depth);
  if (!type->is_array() || type->empty()) return Error(path, "type: must be a type name or a list of them");
  std::vector<int32_t> alternatives;
  for (const Json& t : *type) {
    if (!t.is_string()) return Error(path, "type: must be a type name or a list of them");
    TANDEM_ASSIGN_OR_RETURN(const int32_t alt, Typed(schema, t.get<std::string>(), path, depth));
    alternatives.push_back(alt);
  }
  return g_.AddAnyOf(std::move(alternatives));
}

}  // namespace

int32_t AddAnyJsonValue(Grammar* g) {
  // One per grammar: found again by its shape (an anyOf whose first child
  // is a free object whose values are that anyOf).
  for (size_t i = 0; i < g->nodes.size(); ++i) {
    const GrammarNode& n = g->nodes[i];
    if (n.kind != GrammarNode::Kind::kAnyOf || n.children.size() != 5) continue;
    const GrammarNode& first = g->nodes[static_cast<size_t>(n.children[0])];
    if (first.kind == GrammarNode::Kind::kObject && first.free_value == static_cast<int32_t>(i)) {
      return static_cast<int32_t>(i);
    }
  }
  const int32_t value = g->AddAnyOf({});
  GrammarNode object = Node(GrammarNode::Kind::kObject);
  object.items = g->Add(Node(GrammarNode::Kind::kString));
  object.free_value = value;
  const int32_t object_node = g->Add(std::move(object));
  GrammarNode array = Node(GrammarNode::Kind::kArray);
  array.items = value;
  const int32_t array_node = g->Add(std::move(array));
  const int32_t string_node = g->Add(Node(GrammarNode::Kind::kString));
  const int32_t number_node = g->Add(Node(GrammarNode::Kind::kNumber));
  const int32_t literals = g->AddLiterals({"true", "false", "null"}, true);
  g->nodes[static_cast<size_t>(value)].children = {object_node, array_node, string_node, number_node, literals};
  return value;
}

int32_t AddAnyJsonObject(Grammar* g) {
  const int32_t value = AddAnyJsonValue(g);
  return g->nodes[static_cast<size_t>(value)].children[0];
}

absl::StatusOr<int32_t> AddJsonSchema(const nlohmann::ordered_json& schema, std::string_view where, Grammar* grammar) {
  SchemaCompiler compiler(schema, where, grammar);
  return compiler.Compile(schema, "", 0);
}

}  // namespace tandem
