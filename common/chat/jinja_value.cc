#include "common/chat/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

struct ListData {
  ValueList items;
  bool tuple = false;
  int64_t weight = 1;
  int depth = 1;
};

// Weight and depth of a container holding `children`.
template <typename Range, typename Visit>
void Measure(const Range& children, Visit visit, int64_t* weight, int* depth) {
  *weight = 1;
  *depth = 1;
  for (const auto& child : children) {
    visit(child, [&](const Value& v) {
      *weight = AddWeight(*weight, v.weight());
      *depth = std::max(*depth, v.depth() + 1);
    });
  }
}

const std::string& EmptyString() {
  static const std::string* empty = new std::string();
  return *empty;
}

std::string StringRepr(absl::string_view s) {
  // Python picks single quotes unless the text has ' and no ".
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t pos = 0; pos < s.size();) {
    const char32_t c = DecodeUtf8(s, &pos);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (IsPrintable(c)) {
      AppendUtf8(&out, c);
    } else if (c < 0x100) {
      out += absl::StrFormat("\\x%02x", static_cast<unsigned>(c));
    } else if (c < 0x10000) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned>(c));
    } else {
      out += absl::StrFormat("\\U%08x", static_cast<unsigned>(c));
    }
  }
  out.push_back(quote);
  return out;
}

}  // namespace

Value Value::Undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.object_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.scalar_.i = 0;
  v.scalar_.b = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.scalar_.i = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.scalar_.d = d;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.object_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::MakeList(ValueList items, bool tuple) {
  auto data = std::make_shared<ListData>();
  data->items = std::move(items);
  data->tuple = tuple;
  Measure(
      data->items, [](const Value& item, auto add) { add(item); }, &data->weight, &data->depth);
  Value v;
  v.kind_ = Kind::kList;
  v.object_ = std::move(data);
  return v;
}

Value Value::List(ValueList items) { return MakeList(std::move(items), false); }
Value Value::Tuple(ValueList items) { return MakeList(std::move(items), true); }

Value Value::FromDict(Dict dict) {
  Measure(
      dict.entries_,
      [](const auto& entry, auto add) {
        add(entry.first);
        add(entry.second);
      },
      &dict.weight_, &dict.depth_);
  Value v;
  v.kind_ = Kind::kDict;
  v.object_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}

int64_t Value::weight() const {
  switch (kind_) {
    case Kind::kString: return StringWeight(as_string().size());
    case Kind::kList: return static_cast<const ListData*>(object_.get())->weight;
    case Kind::kDict: return as_dict().weight();
    default: return 1;
  }
}

int Value::depth() const {
  switch (kind_) {
    case Kind::kList: return static_cast<const ListData*>(object_.get())->depth;
    case Kind::kDict: return as_dict().depth();
    default: return 0;
  }
}

int64_t AddWeight(int64_t a, int64_t b) {
  constexpr int64_t kMax = int64_t{1} << 62;
  return a >= kMax - b ? kMax : a + b;
}

Value Value::NewNamespace() {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.object_ = std::make_shared<Namespace>();
  return v;
}

Value Value::FromCallable(std::shared_ptr<const Callable> callable) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.object_ = std::move(callable);
  return v;
}

bool Value::is_tuple() const { return kind_ == Kind::kList && static_cast<const ListData*>(object_.get())->tuple; }

const std::string& Value::as_string() const {
  if (object_ == nullptr) return EmptyString();
  return *static_cast<const std::string*>(object_.get());
}

const ValueList& Value::as_list() const { return static_cast<const ListData*>(object_.get())->items; }
const Dict& Value::as_dict() const { return *static_cast<const Dict*>(object_.get()); }
Namespace& Value::as_namespace() const { return *const_cast<Namespace*>(static_cast<const Namespace*>(object_.get())); }
const Callable& Value::as_callable() const { return *static_cast<const Callable*>(object_.get()); }

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return scalar_.b;
    case Kind::kInt: return scalar_.i != 0;
    case Kind::kFloat: return scalar_.d != 0.0;
    case Kind::kString: return !as_string().empty();
    case Kind::kList: return !as_list().empty();
    case Kind::kDict: return as_dict().size() > 0;
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return is_tuple() ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

std::string Value::UndefinedMessage() const {
  const std::string& hint = as_string();
  return hint.empty() ? "value is undefined" : hint;
}

size_t Dict::FindIndex(const Value& key) const {
  if (key.is_string() && !string_index_.empty()) {
    auto it = string_index_.find(key.as_string());
    return it == string_index_.end() ? entries_.size() : it->second;
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (Equal(entries_[i].first, key)) return i;
  }
  return entries_.size();
}

const Value* Dict::Find(const Value& key) const {
  const size_t i = FindIndex(key);
  return i < entries_.size() ? &entries_[i].second : nullptr;
}

const Value* Dict::Find(absl::string_view key) const {
  if (!string_index_.empty()) {
    auto it = string_index_.find(key);
    return it == string_index_.end() ? nullptr : &entries_[it->second].second;
  }
  for (const auto& [k, v] : entries_) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  const size_t i = FindIndex(key);
  if (i < entries_.size()) {
    entries_[i].second = std::move(value);
    return;
  }
  if (key.is_string() && !string_index_.empty()) string_index_.emplace(key.as_string(), entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
  if (entries_.size() == kIndexFrom) {
    for (size_t j = 0; j < entries_.size(); ++j) {
      if (entries_[j].first.is_string()) string_index_.emplace(entries_[j].first.as_string(), j);
    }
  }
}

bool Equal(const Value& a, const Value& b) {
  using Kind = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  if (a.payload() != nullptr && a.payload() == b.payload()) return true;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.as_string() == b.as_string();
    case Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.as_list().size() != b.as_list().size()) return false;
      for (size_t i = 0; i < a.as_list().size(); ++i) {
        if (!Equal(a.as_list()[i], b.as_list()[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict().entries()) {
        const Value* other = b.as_dict().Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return &a.as_namespace() == &b.as_namespace();
    case Kind::kCallable: return &a.as_callable() == &b.as_callable();
    default: return false;
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_float();
      const double y = b.as_float();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    return a.as_int() < b.as_int() ? -1 : (a.as_int() > b.as_int() ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code-point order
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const ValueList& x = a.as_list();
    const ValueList& y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (Equal(x[i], y[i])) continue;
      return Compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'<' not supported between instances of '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  absl::string_view s(buf, result.ptr - buf);  // "-1.2345e+02": shortest round-trip digits
  std::string out;
  if (s.front() == '-') {
    out.push_back('-');
    s.remove_prefix(1);
  }
  const size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(s.data() + e + 1 + (s[e + 1] == '+'), s.data() + s.size(), exponent);
  if (exponent >= -4 && exponent < 16) {  // Python's repr switches to exponent notation outside this range
    if (exponent >= 0) {
      if (digits.size() < static_cast<size_t>(exponent) + 1) digits.append(exponent + 1 - digits.size(), '0');
      out += digits.substr(0, exponent + 1);
      out.push_back('.');
      out += digits.size() > static_cast<size_t>(exponent) + 1 ? digits.substr(exponent + 1) : "0";
    } else {
      out += "0.";
      out.append(-exponent - 1, '0');
      out += digits;
    }
    return out;
  }
  out.push_back(digits[0]);
  if (digits.size() > 1) absl::StrAppend(&out, ".", digits.substr(1));
  absl::StrAppend(&out, exponent < 0 ? "e-" : "e+", absl::StrFormat("%02d", std::abs(exponent)));
  return out;
}

std::string Str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kString: return v.as_string();
    case Value::Kind::kCallable: return absl::StrCat("<", v.as_callable().Describe(), ">");
    default: return Repr(v);
  }
}

std::string Repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return absl::StrCat(v.as_int());
    case Value::Kind::kFloat: return FloatRepr(v.as_float());
    case Value::Kind::kString: return StringRepr(v.as_string());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      const ValueList& items = v.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += ", ";
        out += Repr(items[i]);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      out += v.is_tuple() ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.as_dict().entries()) {
        if (!first) out += ", ";
        first = false;
        absl::StrAppend(&out, Repr(key), ": ", Repr(value));
      }
      return out + "}";
    }
    case Value::Kind::kNamespace: {
      std::string out = "<Namespace {";
      bool first = true;
      for (const auto& [key, value] : v.as_namespace().attributes.entries()) {
        if (!first) out += ", ";
        first = false;
        absl::StrAppend(&out, Repr(key), ": ", Repr(value));
      }
      return out + "}>";
    }
    case Value::Kind::kCallable: return absl::StrCat("<", v.as_callable().Describe(), ">");
  }
  return "";
}

}  // namespace tandem::jinja
