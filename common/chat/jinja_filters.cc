// The filters of jinja2 3.1 that chat templates use, with transformers'
// tojson (json.dumps, ensure_ascii=False). Sequences come back as lists
// where jinja2 returns generators (map, select, unique, reverse): the same
// items, and `|list` is a no-op on them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_json.h"
#include "common/chat/py_string.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

using Bound = std::vector<std::optional<Value>>;

Value ArgOr(const std::optional<Value>& arg, Value fallback) { return arg.has_value() ? *arg : fallback; }

// Python's str() of a filter input, charged by size.
absl::StatusOr<std::string> SoftStr(Interpreter& interpreter, const Value& v) {
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(v.weight()));
  return v.is_string() ? v.as_string() : Str(v);
}

absl::StatusOr<Value> StringResult(Interpreter& interpreter, std::string s) {
  return interpreter.NewString(std::move(s));
}

// make_attrgetter: "a.b.0" looks up a, then b, then item 0, as getitem does.
absl::StatusOr<Value> LookupPath(Interpreter& interpreter, const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return GetItem(interpreter, item, attribute);
  Value current = item;
  for (absl::string_view part : absl::StrSplit(attribute.as_string(), '.')) {
    if (current.is_undefined()) return absl::InvalidArgumentError(current.UndefinedMessage());
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) {
      int64_t index = 0;
      if (!absl::SimpleAtoi(part, &index)) return absl::InvalidArgumentError("attribute index out of range");
      TANDEM_ASSIGN_OR_RETURN(current, GetItem(interpreter, current, Value::Int(index)));
    } else {
      TANDEM_ASSIGN_OR_RETURN(current, GetItem(interpreter, current, Value::String(std::string(part))));
    }
  }
  return current;
}

Value IgnoreCase(const Value& v) { return v.is_string() ? Value::String(ToLower(v.as_string())) : v; }

// Sort keys: the attribute(s) named (comma-separated), lower-cased unless
// case_sensitive.
absl::StatusOr<Value> SortKey(Interpreter& interpreter, const Value& item, const std::optional<Value>& attribute,
                              bool case_sensitive, bool multi) {
  if (!attribute.has_value() || attribute->is_none()) return case_sensitive ? item : IgnoreCase(item);
  if (multi && attribute->is_string() && attribute->as_string().find(',') != std::string::npos) {
    ValueList keys;
    for (absl::string_view part : absl::StrSplit(attribute->as_string(), ',')) {
      TANDEM_ASSIGN_OR_RETURN(Value key, LookupPath(interpreter, item, Value::String(std::string(part))));
      keys.push_back(case_sensitive ? key : IgnoreCase(key));
    }
    return Value::List(std::move(keys));
  }
  TANDEM_ASSIGN_OR_RETURN(Value key, LookupPath(interpreter, item, *attribute));
  return case_sensitive ? key : IgnoreCase(key);
}

// Stable sort by keys with Python's `<`; the first failed comparison is the error.
absl::StatusOr<ValueList> SortByKeys(Interpreter& interpreter, ValueList items, ValueList keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(static_cast<int64_t>(items.size()) * 8));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!error.ok()) return false;
    absl::StatusOr<int> c = reverse ? Compare(keys[b], keys[a]) : Compare(keys[a], keys[b]);
    if (!c.ok()) {
      error = c.status();
      return false;
    }
    return *c < 0;
  });
  TANDEM_RETURN_IF_ERROR(error);
  ValueList out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString: return static_cast<int64_t>(CodePointCount(v.as_string()));
    case Value::Kind::kList: return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.as_dict().size());
    case Value::Kind::kUndefined: return 0;
    default: return absl::InvalidArgumentError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

// ---- The filters ----

absl::StatusOr<Value> FilterAbs(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("abs", args, {}).status());
  if (v.is_float()) return Value::Float(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) return absl::InvalidArgumentError("integer result does not fit in 64 bits");
    return Value::Int(std::llabs(v.as_int()));
  }
  return absl::InvalidArgumentError(absl::StrCat("bad operand type for abs(): '", v.TypeName(), "'"));
}

absl::StatusOr<Value> FilterAttr(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("attr", args, {"name"}, 1));
  if (!bound[0]->is_string()) return absl::InvalidArgumentError("attr(): attribute name must be a string");
  if (v.is_undefined()) return absl::InvalidArgumentError(v.UndefinedMessage());
  if (v.is_dict()) {  // getattr on a dict sees its methods, never its keys
    TANDEM_ASSIGN_OR_RETURN(Value attribute, GetAttribute(interpreter, v, bound[0]->as_string()));
    if (attribute.is_callable() || attribute.is_undefined()) return attribute;
    return Value::Undefined(absl::StrCat("'dict object' has no attribute '", bound[0]->as_string(), "'"));
  }
  return GetAttribute(interpreter, v, bound[0]->as_string());
}

absl::StatusOr<Value> FilterBatch(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("batch", args, {"linecount", "fill_with"}, 1));
  TANDEM_ASSIGN_OR_RETURN(int64_t linecount, ToInt(*bound[0], "batch linecount"));
  if (linecount <= 0) return absl::InvalidArgumentError("batch(): linecount must be positive");
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  ValueList rows;
  for (size_t i = 0; i < items.size(); i += linecount) {
    ValueList row(items.begin() + i, items.begin() + std::min(items.size(), i + linecount));
    if (static_cast<int64_t>(row.size()) < linecount && bound[1].has_value() && !bound[1]->is_none()) {
      row.resize(linecount, *bound[1]);
    }
    TANDEM_ASSIGN_OR_RETURN(Value row_value, interpreter.NewList(std::move(row)));
    rows.push_back(std::move(row_value));
  }
  return interpreter.NewList(std::move(rows));
}

absl::StatusOr<Value> FilterCapitalize(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("capitalize", args, {}).status());
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  return Value::String(PyCapitalize(s));
}

absl::StatusOr<Value> FilterCenter(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("center", args, {"width"}));
  int64_t width = 80;
  if (bound[0].has_value()) {
    TANDEM_ASSIGN_OR_RETURN(width, ToInt(*bound[0], "center width"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  TANDEM_RETURN_IF_ERROR(interpreter.CheckString(std::max<int64_t>(width, 0) + s.size()));
  return Value::String(PyCenter(s, width, " "));
}

absl::StatusOr<Value> FilterLength(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("length", args, {}).status());
  TANDEM_ASSIGN_OR_RETURN(int64_t n, Length(v));
  return Value::Int(n);
}

absl::StatusOr<Value> FilterDefault(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("default", args, {"default_value", "boolean"}));
  const bool boolean = bound[1].has_value() && bound[1]->Truthy();
  if (v.is_undefined() || (boolean && !v.Truthy())) return ArgOr(bound[0], Value::String(""));
  return v;
}

absl::StatusOr<Value> FilterDictsort(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("dictsort", args, {"case_sensitive", "by", "reverse"}));
  if (!v.is_dict())
    return absl::InvalidArgumentError(absl::StrCat("dictsort(): '", v.TypeName(), "' is not a mapping"));
  const bool case_sensitive = bound[0].has_value() && bound[0]->Truthy();
  const std::string by = bound[1].has_value() ? Str(*bound[1]) : "key";
  if (by != "key" && by != "value")
    return absl::InvalidArgumentError("You can only sort by either \"key\" or \"value\"");
  ValueList items, keys;
  for (const auto& [key, value] : v.as_dict().entries()) {
    items.push_back(Value::Tuple({key, value}));
    const Value& sort_by = by == "key" ? key : value;
    keys.push_back(case_sensitive ? sort_by : IgnoreCase(sort_by));
  }
  TANDEM_ASSIGN_OR_RETURN(ValueList sorted, SortByKeys(interpreter, std::move(items), std::move(keys),
                                                       bound[2].has_value() && bound[2]->Truthy()));
  return interpreter.NewList(std::move(sorted));
}

absl::StatusOr<Value> FilterEscape(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("escape", args, {}).status());
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return StringResult(interpreter, std::move(out));
}

absl::StatusOr<Value> FilterFirst(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("first", args, {}).status());
  if (v.is_list()) return v.as_list().empty() ? Value::Undefined("No first item, sequence was empty.") : v.as_list()[0];
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> FilterLast(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("last", args, {}).status());
  if (v.is_list())
    return v.as_list().empty() ? Value::Undefined("No last item, sequence was empty.") : v.as_list().back();
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

// Python float(str): whitespace around, optional sign, digits with _ between,
// inf/nan. nullopt when it is no number.
std::optional<double> ParsePythonFloat(absl::string_view text) {
  const std::string s(StripPython(text, nullptr, true, true));
  std::string clean;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (i == 0 || i + 1 == s.size() || !absl::ascii_isdigit(s[i - 1]) || !absl::ascii_isdigit(s[i + 1])) return {};
      continue;
    }
    clean.push_back(s[i]);
  }
  if (clean.empty()) return {};
  const std::string lower = absl::AsciiStrToLower(clean);
  const absl::string_view body = (lower[0] == '+' || lower[0] == '-') ? absl::string_view(lower).substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double magnitude = body == "nan" ? std::nan("") : HUGE_VAL;
    return lower[0] == '-' ? -magnitude : magnitude;
  }
  for (char c : body) {
    if (!absl::ascii_isdigit(c) && c != '.' && c != 'e' && c != '+' && c != '-') return {};
  }
  char* end = nullptr;
  const double d = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return {};
  return d;
}

// Python int(str, base): whitespace, sign, digits with single _ between,
// and a 0x/0o/0b prefix when base is 0 or matches.
std::optional<int64_t> ParsePythonInt(absl::string_view text, int64_t base) {
  std::string s(StripPython(text, nullptr, true, true));
  bool negative = false;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    const int64_t prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base != 0 && (base == 0 || base == prefix_base)) {
      base = prefix_base;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || i >= s.size()) return {};
  int64_t value = 0;
  bool last_underscore = true;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '_') {
      if (last_underscore) return {};
      last_underscore = true;
      continue;
    }
    int digit = absl::ascii_isdigit(c) ? c - '0' : (absl::ascii_isalpha(c) ? (c | 0x20) - 'a' + 10 : 99);
    if (digit >= base) return {};
    if (__builtin_mul_overflow(value, base, &value) || __builtin_add_overflow(value, digit, &value)) return {};
    last_underscore = false;
  }
  if (last_underscore) return {};
  return negative ? -value : value;
}

absl::StatusOr<Value> FilterFloat(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("float", args, {"default"}));
  if (v.is_number()) return Value::Float(v.as_float());
  if (v.is_string()) {
    if (std::optional<double> d = ParsePythonFloat(v.as_string())) return Value::Float(*d);
  }
  return ArgOr(bound[0], Value::Float(0.0));
}

absl::StatusOr<Value> FilterInt(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("int", args, {"default", "base"}));
  int64_t base = 10;
  if (bound[1].has_value()) {
    TANDEM_ASSIGN_OR_RETURN(base, ToInt(*bound[1], "int base"));
  }
  if (v.is_int() || v.is_bool()) return Value::Int(v.as_int());
  if (v.is_float() && std::isfinite(v.as_float()) && std::fabs(v.as_float()) < 9.2e18) {
    return Value::Int(static_cast<int64_t>(v.as_float()));
  }
  if (v.is_string()) {
    if (std::optional<int64_t> i = ParsePythonInt(v.as_string(), base)) return Value::Int(*i);
    // jinja2's quirk: "42.23"|int is 42, through float.
    if (std::optional<double> d = ParsePythonFloat(v.as_string()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
      return Value::Int(static_cast<int64_t>(*d));
    }
  }
  return ArgOr(bound[0], Value::Int(0));
}

absl::StatusOr<Value> FilterFormat(Interpreter& interpreter, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    return absl::InvalidArgumentError("can't handle positional and keyword arguments at the same time");
  }
  TANDEM_ASSIGN_OR_RETURN(std::string format, SoftStr(interpreter, v));
  if (!args.keyword.empty()) {
    Dict kwargs;
    for (auto& [key, value] : args.keyword) kwargs.Set(Value::String(key), std::move(value));
    return FormatPercent(interpreter, format, Value::FromDict(std::move(kwargs)));
  }
  return FormatPercent(interpreter, format, Value::Tuple(std::move(args.positional)));
}

absl::StatusOr<Value> FilterIndent(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("indent", args, {"width", "first", "blank"}));
  std::string indention = "    ";
  if (bound[0].has_value()) {
    if (bound[0]->is_string()) {
      indention = bound[0]->as_string();
    } else {
      TANDEM_ASSIGN_OR_RETURN(int64_t width, ToInt(*bound[0], "indent width"));
      TANDEM_RETURN_IF_ERROR(interpreter.CheckString(std::max<int64_t>(width, 0)));
      indention = std::string(std::max<int64_t>(width, 0), ' ');
    }
  }
  const bool first = bound[1].has_value() && bound[1]->Truthy();
  const bool blank = bound[2].has_value() && bound[2]->Truthy();
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  s += "\n";  // jinja2's quirk for splitlines
  const std::vector<std::string> lines = PySplitLines(s, false);
  TANDEM_RETURN_IF_ERROR(interpreter.CheckString(s.size() + lines.size() * (indention.size() + 1)));
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
  }
  if (first) out = indention + out;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterItems(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("items", args, {}).status());
  if (v.is_undefined()) return interpreter.NewList({});
  if (!v.is_dict()) return absl::InvalidArgumentError("Can only get item pairs from a mapping.");
  ValueList items;
  for (const auto& [key, value] : v.as_dict().entries()) items.push_back(Value::Tuple({key, value}));
  return interpreter.NewList(std::move(items));
}

absl::StatusOr<Value> FilterJoin(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("join", args, {"d", "attribute"}));
  const std::string separator = bound[0].has_value() ? Str(*bound[0]) : "";
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    Value item = items[i];
    if (bound[1].has_value() && !bound[1]->is_none()) {
      TANDEM_ASSIGN_OR_RETURN(item, LookupPath(interpreter, item, *bound[1]));
    }
    if (i > 0) out += separator;
    TANDEM_ASSIGN_OR_RETURN(std::string text, SoftStr(interpreter, item));
    out += text;
    TANDEM_RETURN_IF_ERROR(interpreter.CheckString(out.size()));
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> FilterList(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("list", args, {}).status());
  if (v.is_list() && !v.is_tuple()) return v;
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  return interpreter.NewList(std::move(items));
}

absl::StatusOr<Value> FilterLower(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("lower", args, {}).status());
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  return Value::String(ToLower(s));
}

absl::StatusOr<Value> FilterUpper(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("upper", args, {}).status());
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  return StringResult(interpreter, ToUpper(s));
}

absl::StatusOr<Value> FilterMap(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  ValueList out;
  out.reserve(items.size());
  if (args.positional.empty()) {  // map(attribute="x", default=...)
    TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("map", args, {"attribute", "default"}, 1));
    for (const Value& item : items) {
      TANDEM_ASSIGN_OR_RETURN(Value mapped, LookupPath(interpreter, item, *bound[0]));
      if (mapped.is_undefined() && bound[1].has_value() && !bound[1]->is_none()) mapped = *bound[1];
      out.push_back(std::move(mapped));
    }
    return interpreter.NewList(std::move(out));
  }
  if (!args.positional[0].is_string()) return absl::InvalidArgumentError("map(): the filter name must be a string");
  const std::string name = args.positional[0].as_string();
  if (!IsFilter(name)) return absl::InvalidArgumentError(absl::StrCat("unsupported filter '", name, "' (in map)"));
  CallArgs rest{.positional = ValueList(args.positional.begin() + 1, args.positional.end()), .keyword = args.keyword};
  for (const Value& item : items) {
    TANDEM_ASSIGN_OR_RETURN(Value mapped, interpreter.ApplyFilter(name, item, rest));
    out.push_back(std::move(mapped));
  }
  return interpreter.NewList(std::move(out));
}

absl::StatusOr<Value> MinOrMax(Interpreter& interpreter, const Value& v, CallArgs& args, bool max) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments(max ? "max" : "min", args, {"case_sensitive", "attribute"}));
  const bool case_sensitive = bound[0].has_value() && bound[0]->Truthy();
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  TANDEM_ASSIGN_OR_RETURN(Value best_key, SortKey(interpreter, items[0], bound[1], case_sensitive, false));
  for (size_t i = 1; i < items.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(Value key, SortKey(interpreter, items[i], bound[1], case_sensitive, false));
    TANDEM_ASSIGN_OR_RETURN(int c, Compare(key, best_key));
    if (max ? c > 0 : c < 0) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

absl::StatusOr<Value> FilterMax(Interpreter& interpreter, const Value& v, CallArgs& args) {
  return MinOrMax(interpreter, v, args, true);
}
absl::StatusOr<Value> FilterMin(Interpreter& interpreter, const Value& v, CallArgs& args) {
  return MinOrMax(interpreter, v, args, false);
}

// select/reject/selectattr/rejectattr: keep items whose test (or truth)
// equals `keep`.
absl::StatusOr<Value> SelectOrReject(Interpreter& interpreter, const Value& v, CallArgs& args, bool keep,
                                     bool lookup_attribute, absl::string_view name) {
  if (!v.Truthy()) return interpreter.NewList({});
  size_t next = 0;
  std::optional<Value> attribute;
  if (lookup_attribute) {
    if (args.positional.empty()) return absl::InvalidArgumentError("Missing parameter for attribute name");
    attribute = args.positional[next++];
  }
  std::optional<std::string> test;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string())
      return absl::InvalidArgumentError(absl::StrCat(name, "(): the test name must be a string"));
    test = args.positional[next++].as_string();
    if (!IsTest(*test))
      return absl::InvalidArgumentError(absl::StrCat("unsupported test '", *test, "' (in ", name, ")"));
  }
  CallArgs test_args{.positional = ValueList(args.positional.begin() + next, args.positional.end()),
                     .keyword = args.keyword};
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (attribute.has_value()) {
      TANDEM_ASSIGN_OR_RETURN(subject, LookupPath(interpreter, item, *attribute));
    }
    bool passed;
    if (test.has_value()) {
      TANDEM_ASSIGN_OR_RETURN(passed, interpreter.ApplyTest(*test, subject, test_args));
    } else {
      passed = subject.Truthy();
    }
    if (passed == keep) out.push_back(item);
  }
  return interpreter.NewList(std::move(out));
}

absl::StatusOr<Value> FilterSelect(Interpreter& interpreter, const Value& v, CallArgs& args) {
  return SelectOrReject(interpreter, v, args, true, false, "select");
}
absl::StatusOr<Value> FilterReject(Interpreter& interpreter, const Value& v, CallArgs& args) {
  return SelectOrReject(interpreter, v, args, false, false, "reject");
}
absl::StatusOr<Value> FilterSelectAttr(Interpreter& interpreter, const Value& v, CallArgs& args) {
  return SelectOrReject(interpreter, v, args, true, true, "selectattr");
}
absl::StatusOr<Value> FilterRejectAttr(Interpreter& interpreter, const Value& v, CallArgs& args) {
  return SelectOrReject(interpreter, v, args, false, true, "rejectattr");
}

absl::StatusOr<Value> FilterReplace(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("replace", args, {"old", "new", "count"}, 2));
  int64_t count = -1;
  if (bound[2].has_value() && !bound[2]->is_none()) {
    TANDEM_ASSIGN_OR_RETURN(count, ToInt(*bound[2], "replace count"));
  }
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  const std::string old = Str(*bound[0]);
  const std::string replacement = Str(*bound[1]);
  if (!old.empty()) {
    const int64_t occurrences = PyCount(s, old);
    const int64_t replaced = count < 0 ? occurrences : std::min(count, occurrences);
    if (replacement.size() > old.size()) {
      TANDEM_RETURN_IF_ERROR(interpreter.CheckString(s.size() + replaced * (replacement.size() - old.size())));
    }
  } else {
    TANDEM_RETURN_IF_ERROR(interpreter.CheckString(s.size() + (CodePointCount(s) + 1) * replacement.size()));
  }
  return Value::String(PyReplace(s, old, replacement, count));
}

absl::StatusOr<Value> FilterReverse(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("reverse", args, {}).status());
  if (v.is_string()) {
    std::vector<size_t> offsets = CodePointOffsets(v.as_string());
    std::string out;
    out.reserve(v.as_string().size());
    for (size_t i = offsets.size() - 1; i > 0; --i)
      out.append(v.as_string(), offsets[i - 1], offsets[i] - offsets[i - 1]);
    return Value::String(std::move(out));
  }
  absl::StatusOr<ValueList> items = Iterate(interpreter, v);
  if (!items.ok()) return absl::InvalidArgumentError("argument must be iterable");
  std::reverse(items->begin(), items->end());
  return interpreter.NewList(std::move(*items));
}

// Python round(x, n) on a float: correctly rounded, ties to even on the
// exact binary value, which is what printf's %.*f does.
double PythonRound(double value, int64_t precision) {
  if (!std::isfinite(value)) return value;
  if (precision > 300) return value;
  if (precision < 0) {
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    return std::nearbyint(value / scale) * scale;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), value);
  return std::strtod(buf, nullptr);
}

// Python round(int, n): the int itself for n >= 0, else rounded to a
// multiple of 10**-n with ties to even.
int64_t RoundInt(int64_t value, int64_t precision) {
  if (precision >= 0) return value;
  if (precision < -18) return 0;
  int64_t scale = 1;
  for (int64_t i = 0; i < -precision; ++i) scale *= 10;
  int64_t quotient = value / scale;
  int64_t remainder = value % scale;
  if (remainder < 0) {  // floor division
    remainder += scale;
    --quotient;
  }
  if (2 * remainder > scale || (2 * remainder == scale && (quotient & 1))) ++quotient;
  int64_t rounded;
  if (__builtin_mul_overflow(quotient, scale, &rounded)) return value;
  return rounded;
}

absl::StatusOr<Value> FilterRound(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("round", args, {"precision", "method"}));
  int64_t precision = 0;
  if (bound[0].has_value()) {
    TANDEM_ASSIGN_OR_RETURN(precision, ToInt(*bound[0], "round precision"));
  }
  const std::string method = bound[1].has_value() ? Str(*bound[1]) : "common";
  if (method != "common" && method != "ceil" && method != "floor") {
    return absl::InvalidArgumentError("method must be common, ceil or floor");
  }
  if (!v.is_number())
    return absl::InvalidArgumentError(absl::StrCat("type ", v.TypeName(), " doesn't define __round__ method"));
  if (method == "common") {
    if (!v.is_float()) return Value::Int(RoundInt(v.as_int(), precision));
    return Value::Float(PythonRound(v.as_float(), precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = v.as_float() * scale;
  return Value::Float((method == "ceil" ? std::ceil(scaled) : std::floor(scaled)) / scale);
}

absl::StatusOr<Value> FilterSafe(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("safe", args, {}).status());
  if (v.is_string()) return v;
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  return StringResult(interpreter, std::move(s));
}

absl::StatusOr<Value> FilterSort(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("sort", args, {"reverse", "case_sensitive", "attribute"}));
  const bool reverse = bound[0].has_value() && bound[0]->Truthy();
  const bool case_sensitive = bound[1].has_value() && bound[1]->Truthy();
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  ValueList keys;
  keys.reserve(items.size());
  for (const Value& item : items) {
    TANDEM_ASSIGN_OR_RETURN(Value key, SortKey(interpreter, item, bound[2], case_sensitive, true));
    keys.push_back(std::move(key));
  }
  TANDEM_ASSIGN_OR_RETURN(ValueList sorted, SortByKeys(interpreter, std::move(items), std::move(keys), reverse));
  return interpreter.NewList(std::move(sorted));
}

absl::StatusOr<Value> FilterString(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("string", args, {}).status());
  if (v.is_string()) return v;
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  return StringResult(interpreter, std::move(s));
}

absl::StatusOr<Value> FilterSum(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("sum", args, {"attribute", "start"}));
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  Value total = ArgOr(bound[1], Value::Int(0));
  for (const Value& item : items) {
    Value term = item;
    if (bound[0].has_value() && !bound[0]->is_none()) {
      TANDEM_ASSIGN_OR_RETURN(term, LookupPath(interpreter, item, *bound[0]));
    }
    if (total.is_string()) return absl::InvalidArgumentError("sum() can't sum strings [use ''.join(seq) instead]");
    TANDEM_ASSIGN_OR_RETURN(total, BinaryOperation(interpreter, BinaryOp::kAdd, total, term));
  }
  return total;
}

absl::StatusOr<Value> FilterTitle(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("title", args, {}).status());
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  // jinja2: each piece between runs of [-\s({[<] gets its first character
  // upper-cased and the rest lower-cased.
  auto separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPythonSpace(c);
  };
  std::string out;
  bool piece_start = true;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    if (separator(c)) {
      AppendUtf8(&out, c);
      piece_start = true;
    } else if (piece_start) {
      if (c == 0xDF) {
        out += "SS";
      } else {
        AppendUtf8(&out, UpperChar(c));
      }
      piece_start = false;
    } else {
      AppendUtf8(&out, LowerChar(c));
    }
  }
  return Value::String(std::move(out));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False).
absl::StatusOr<Value> FilterToJson(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound,
                          BindArguments("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions options;
  options.ensure_ascii = bound[0].has_value() && bound[0]->Truthy();
  if (bound[1].has_value() && !bound[1]->is_none()) {
    if (bound[1]->is_string()) {
      options.indent = bound[1]->as_string();
    } else {
      TANDEM_ASSIGN_OR_RETURN(int64_t width, ToInt(*bound[1], "tojson indent"));
      options.indent = std::string(std::clamp<int64_t>(width, 0, 64), ' ');
    }
  }
  if (bound[2].has_value() && !bound[2]->is_none()) {
    const Value& separators = *bound[2];
    if (!separators.is_list() || separators.as_list().size() != 2 || !separators.as_list()[0].is_string() ||
        !separators.as_list()[1].is_string()) {
      return absl::InvalidArgumentError("tojson separators must be a pair of strings");
    }
    options.item_separator = separators.as_list()[0].as_string();
    options.key_separator = separators.as_list()[1].as_string();
  }
  options.sort_keys = bound[3].has_value() && bound[3]->Truthy();
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(v.weight()));
  // Indentation multiplies with depth: bound the worst case before writing.
  const int64_t indent_bytes = options.indent ? static_cast<int64_t>(options.indent->size()) * (v.depth() + 1) : 0;
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(v.weight() * indent_bytes / 16));
  options.max_bytes = interpreter.limits().max_output_bytes;
  TANDEM_ASSIGN_OR_RETURN(std::string json, DumpJson(v, options));
  return StringResult(interpreter, std::move(json));
}

absl::StatusOr<Value> FilterTrim(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("trim", args, {"chars"}));
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  const std::string* chars = nullptr;
  std::string chars_text;
  if (bound[0].has_value() && !bound[0]->is_none()) {
    chars_text = Str(*bound[0]);
    chars = &chars_text;
  }
  return Value::String(std::string(StripPython(s, chars, true, true)));
}

absl::StatusOr<Value> FilterTruncate(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("truncate", args, {"length", "killwords", "end", "leeway"}));
  int64_t length = 255;
  int64_t leeway = 5;  // jinja2's default policy truncate.leeway
  if (bound[0].has_value()) {
    TANDEM_ASSIGN_OR_RETURN(length, ToInt(*bound[0], "truncate length"));
  }
  if (bound[3].has_value() && !bound[3]->is_none()) {
    TANDEM_ASSIGN_OR_RETURN(leeway, ToInt(*bound[3], "truncate leeway"));
  }
  const bool killwords = bound[1].has_value() && bound[1]->Truthy();
  const std::string end = bound[2].has_value() ? Str(*bound[2]) : "...";
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  const auto end_length = static_cast<int64_t>(CodePointCount(end));
  if (length < end_length)
    return absl::InvalidArgumentError(absl::StrCat("expected length >= ", end_length, ", got ", length));
  if (leeway < 0) return absl::InvalidArgumentError(absl::StrCat("expected leeway >= 0, got ", leeway));
  const std::vector<size_t> offsets = CodePointOffsets(s);
  const auto n = static_cast<int64_t>(offsets.size()) - 1;
  if (n <= length + leeway) return Value::String(std::move(s));
  std::string head = s.substr(0, offsets[length - end_length]);
  if (!killwords) {
    const size_t space = head.rfind(' ');
    if (space != std::string::npos) head = head.substr(0, space);
  }
  return Value::String(head + end);
}

absl::StatusOr<Value> FilterUnique(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments("unique", args, {"case_sensitive", "attribute"}));
  const bool case_sensitive = bound[0].has_value() && bound[0]->Truthy();
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, v));
  ValueList out;
  absl::flat_hash_set<std::string> seen_strings;
  ValueList seen_other;
  for (const Value& item : items) {
    TANDEM_ASSIGN_OR_RETURN(Value key, SortKey(interpreter, item, bound[1], case_sensitive, false));
    if ((key.is_list() && !key.is_tuple()) || key.is_dict()) {
      return absl::InvalidArgumentError(absl::StrCat("unhashable type: '", key.TypeName(), "'"));
    }
    bool fresh;
    if (key.is_string()) {
      fresh = seen_strings.insert(key.as_string()).second;
    } else {
      TANDEM_RETURN_IF_ERROR(interpreter.Charge(static_cast<int64_t>(seen_other.size())));
      fresh = std::none_of(seen_other.begin(), seen_other.end(), [&](const Value& s) { return Equal(s, key); });
      if (fresh) seen_other.push_back(key);
    }
    if (fresh) out.push_back(item);
  }
  return interpreter.NewList(std::move(out));
}

absl::StatusOr<Value> FilterWordcount(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments("wordcount", args, {}).status());
  TANDEM_ASSIGN_OR_RETURN(std::string s, SoftStr(interpreter, v));
  int64_t words = 0;
  bool in_word = false;
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    const bool word_char = IsAlpha(c) || IsDigit(c) || c == '_';
    if (word_char && !in_word) ++words;
    in_word = word_char;
  }
  return Value::Int(words);
}

struct NamedFilter {
  absl::string_view name;
  FilterFn fn;
};

constexpr NamedFilter kFilters[] = {
    {"abs", FilterAbs},
    {"attr", FilterAttr},
    {"batch", FilterBatch},
    {"capitalize", FilterCapitalize},
    {"center", FilterCenter},
    {"count", FilterLength},
    {"d", FilterDefault},
    {"default", FilterDefault},
    {"dictsort", FilterDictsort},
    {"e", FilterEscape},
    {"escape", FilterEscape},
    {"first", FilterFirst},
    {"float", FilterFloat},
    {"format", FilterFormat},
    {"indent", FilterIndent},
    {"int", FilterInt},
    {"items", FilterItems},
    {"join", FilterJoin},
    {"last", FilterLast},
    {"length", FilterLength},
    {"list", FilterList},
    {"lower", FilterLower},
    {"map", FilterMap},
    {"max", FilterMax},
    {"min", FilterMin},
    {"reject", FilterReject},
    {"rejectattr", FilterRejectAttr},
    {"replace", FilterReplace},
    {"reverse", FilterReverse},
    {"round", FilterRound},
    {"safe", FilterSafe},
    {"select", FilterSelect},
    {"selectattr", FilterSelectAttr},
    {"sort", FilterSort},
    {"string", FilterString},
    {"sum", FilterSum},
    {"title", FilterTitle},
    {"tojson", FilterToJson},
    {"trim", FilterTrim},
    {"truncate", FilterTruncate},
    {"unique", FilterUnique},
    {"upper", FilterUpper},
    {"wordcount", FilterWordcount},
};

}  // namespace

FilterFn FindFilter(absl::string_view name) {
  for (const NamedFilter& filter : kFilters) {
    if (filter.name == name) return filter.fn;
  }
  return nullptr;
}

}  // namespace tandem::jinja
