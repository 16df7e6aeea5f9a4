#include "common/chat/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

template <typename Json>
absl::StatusOr<Value> FromJsonImpl(const Json& json, int depth_left) {
  if ((json.is_array() || json.is_object()) && depth_left <= 0) {
    return absl::InvalidArgumentError("JSON nests arrays and objects too deeply for a template value");
  }
  switch (json.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded: return Value::None();
    case nlohmann::json::value_t::boolean: return Value::Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = json.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Value::Int(static_cast<int64_t>(u));
      return Value::Float(static_cast<double>(u));  // past int64: Python would keep a big int
    }
    case nlohmann::json::value_t::number_float: return Value::Float(json.template get<double>());
    case nlohmann::json::value_t::string: return Value::String(json.template get<std::string>());
    case nlohmann::json::value_t::binary: return Value::None();
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(json.size());
      for (const auto& item : json) {
        TANDEM_ASSIGN_OR_RETURN(Value v, FromJsonImpl(item, depth_left - 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (auto it = json.begin(); it != json.end(); ++it) {
        TANDEM_ASSIGN_OR_RETURN(Value v, FromJsonImpl(it.value(), depth_left - 1));
        dict.Set(Value::String(it.key()), std::move(v));
      }
      return Value::FromDict(std::move(dict));
    }
  }
  return Value::None();
}

void AppendJsonString(std::string* out, absl::string_view s, bool ensure_ascii) {
  out->push_back('"');
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    const char32_t c = DecodeUtf8(s, &pos);
    switch (c) {
      case '"': *out += "\\\""; continue;
      case '\\': *out += "\\\\"; continue;
      case '\n': *out += "\\n"; continue;
      case '\r': *out += "\\r"; continue;
      case '\t': *out += "\\t"; continue;
      case '\b': *out += "\\b"; continue;
      case '\f': *out += "\\f"; continue;
      default: break;
    }
    if (c < 0x20) {
      *out += absl::StrFormat("\\u%04x", static_cast<unsigned>(c));
    } else if (c < 0x80 || !ensure_ascii) {
      absl::StrAppend(out, s.substr(start, pos - start));
    } else if (c < 0x10000) {
      *out += absl::StrFormat("\\u%04x", static_cast<unsigned>(c));
    } else {
      const char32_t v = c - 0x10000;
      *out += absl::StrFormat("\\u%04x\\u%04x", static_cast<unsigned>(0xD800 + (v >> 10)),
                              static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
    }
  }
  out->push_back('"');
}

std::string FloatJson(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return FloatRepr(d);
}

absl::Status NotSerializable(const Value& value) {
  return absl::InvalidArgumentError(absl::StrCat("Object of type ", value.TypeName(), " is not JSON serializable"));
}

// A dict key as json.dumps writes it: str as is; int, float, bool, None
// converted; anything else refused.
absl::StatusOr<std::string> KeyText(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString: return key.as_string();
    case Value::Kind::kInt: return absl::StrCat(key.as_int());
    case Value::Kind::kFloat: return FloatJson(key.as_float());
    case Value::Kind::kBool: return std::string(key.as_bool() ? "true" : "false");
    case Value::Kind::kNone: return std::string("null");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("keys must be str, int, float, bool or None, not ", key.TypeName()));
  }
}

class JsonWriter {
 public:
  explicit JsonWriter(const JsonDumpOptions& options)
      : options_(options),
        item_separator_(options.item_separator.value_or(options.indent ? "," : ", ")),
        key_separator_(options.key_separator.value_or(": ")) {}

  absl::Status Write(const Value& value, int level) {
    if (out_.size() > options_.max_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("tojson output passes the ", options_.max_bytes, "-byte limit"));
    }
    switch (value.kind()) {
      case Value::Kind::kNone: out_ += "null"; return absl::OkStatus();
      case Value::Kind::kBool: out_ += value.as_bool() ? "true" : "false"; return absl::OkStatus();
      case Value::Kind::kInt: absl::StrAppend(&out_, value.as_int()); return absl::OkStatus();
      case Value::Kind::kFloat: out_ += FloatJson(value.as_float()); return absl::OkStatus();
      case Value::Kind::kString:
        AppendJsonString(&out_, value.as_string(), options_.ensure_ascii);
        return absl::OkStatus();
      case Value::Kind::kList: return WriteList(value.as_list(), level);
      case Value::Kind::kDict: return WriteDict(value.as_dict(), level);
      default: return NotSerializable(value);
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  void Newline(int level) {
    if (!options_.indent) return;
    out_.push_back('\n');
    for (int i = 0; i < level; ++i) out_ += *options_.indent;
  }

  absl::Status WriteList(const ValueList& items, int level) {
    if (items.empty()) {
      out_ += "[]";
      return absl::OkStatus();
    }
    out_.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out_ += item_separator_;
      Newline(level + 1);
      TANDEM_RETURN_IF_ERROR(Write(items[i], level + 1));
    }
    Newline(level);
    out_.push_back(']');
    return absl::OkStatus();
  }

  absl::Status WriteDict(const Dict& dict, int level) {
    if (dict.size() == 0) {
      out_ += "{}";
      return absl::OkStatus();
    }
    std::vector<std::pair<std::string, const Value*>> entries;
    for (const auto& [key, value] : dict.entries()) {
      if (options_.sort_keys && !key.is_string()) {
        return absl::InvalidArgumentError(absl::StrCat("'<' not supported between instances of '", key.TypeName(),
                                                       "' and 'str' (sort_keys needs str keys)"));
      }
      TANDEM_ASSIGN_OR_RETURN(std::string text, KeyText(key));
      entries.emplace_back(std::move(text), &value);
    }
    if (options_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    out_.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out_ += item_separator_;
      Newline(level + 1);
      AppendJsonString(&out_, entries[i].first, options_.ensure_ascii);
      out_ += key_separator_;
      TANDEM_RETURN_IF_ERROR(Write(*entries[i].second, level + 1));
    }
    Newline(level);
    out_.push_back('}');
    return absl::OkStatus();
  }

  const JsonDumpOptions& options_;
  const std::string item_separator_;
  const std::string key_separator_;
  std::string out_;
};

}  // namespace

absl::StatusOr<Value> FromJson(const nlohmann::ordered_json& json, int max_depth) {
  return FromJsonImpl(json, max_depth);
}
absl::StatusOr<Value> FromJson(const nlohmann::json& json, int max_depth) { return FromJsonImpl(json, max_depth); }

absl::StatusOr<std::string> DumpJson(const Value& value, const JsonDumpOptions& options) {
  JsonWriter writer(options);
  TANDEM_RETURN_IF_ERROR(writer.Write(value, 0));
  return writer.Take();
}

}  // namespace tandem::jinja
