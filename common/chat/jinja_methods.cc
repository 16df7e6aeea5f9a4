// Attribute and item access, slicing, and the methods of str, dict and list
// that chat templates call (the mutating ones refuse, as the sandbox does).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/py_string.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

// jinja2's name for a value in "has no attribute" hints.
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return absl::StrCat(v.TypeName(), " object");
}

Value NoAttribute(const Value& object, absl::string_view name) {
  return Value::Undefined(absl::StrCat("'", ObjectTypeRepr(object), "' has no attribute '", name, "'"));
}

// A method that exists in Python but that the immutable sandbox refuses.
Value RefusedMethod(const Value& object, const std::string& name) {
  const std::string what = absl::StrCat(object.TypeName(), ".", name);
  return MakeFunction(what, [what](Interpreter&, CallArgs&) -> absl::StatusOr<Value> {
    return absl::InvalidArgumentError(
        absl::StrCat("access to ", what, " is unsafe: chat templates run in an immutable sandbox"));
  });
}

absl::StatusOr<const std::string*> OptionalString(const std::optional<Value>& arg, absl::string_view what) {
  if (!arg.has_value() || arg->is_none()) return nullptr;
  if (!arg->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " arg must be None or str, not ", arg->TypeName()));
  }
  return &arg->as_string();
}

absl::StatusOr<Value> StringList(Interpreter& interpreter, std::vector<std::string> parts) {
  ValueList items;
  items.reserve(parts.size());
  for (std::string& part : parts) items.push_back(Value::String(std::move(part)));
  return interpreter.NewList(std::move(items));
}

// startswith/endswith: a str or a tuple of str.
absl::StatusOr<bool> AffixMatch(const std::string& s, const Value& affix, bool prefix, absl::string_view method) {
  auto match = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return match(affix.as_string());
  if (affix.is_tuple()) {
    for (const Value& item : affix.as_list()) {
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tuple for ", method, " must only contain str, not ", item.TypeName()));
      }
      if (match(item.as_string())) return true;
    }
    return false;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(method, " first arg must be str or a tuple of str, not ", affix.TypeName()));
}

using Method = absl::StatusOr<Value> (*)(Interpreter&, const Value& self, CallArgs& args);

absl::StatusOr<Value> StrStrip(Interpreter&, const Value& self, CallArgs& args, absl::string_view name, bool left,
                               bool right) {
  TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments(name, args, {"chars"}));
  TANDEM_ASSIGN_OR_RETURN(const std::string* chars, OptionalString(bound[0], name));
  return Value::String(std::string(StripPython(self.as_string(), chars, left, right)));
}

absl::StatusOr<Value> StrSplit(Interpreter& interpreter, const Value& self, CallArgs& args, bool from_right) {
  TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments(from_right ? "rsplit" : "split", args, {"sep", "maxsplit"}));
  TANDEM_ASSIGN_OR_RETURN(const std::string* sep, OptionalString(bound[0], "split"));
  if (sep != nullptr && sep->empty()) return absl::InvalidArgumentError("empty separator");
  int64_t maxsplit = -1;
  if (bound[1].has_value()) {
    TANDEM_ASSIGN_OR_RETURN(maxsplit, ToInt(*bound[1], "split maxsplit"));
  }
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(self.weight()));
  return StringList(interpreter,
                    from_right ? PyRSplit(self.as_string(), sep, maxsplit) : PySplit(self.as_string(), sep, maxsplit));
}

absl::StatusOr<Value> StrFind(Interpreter&, const Value& self, CallArgs& args, absl::string_view name, bool from_right,
                              bool must_find) {
  TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments(name, args, {"sub"}, 1));
  if (!bound[0]->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("must be str, not ", bound[0]->TypeName()));
  }
  const int64_t at = PyFind(self.as_string(), bound[0]->as_string(), from_right);
  if (at < 0 && must_find) return absl::InvalidArgumentError("substring not found");
  return Value::Int(at);
}

absl::StatusOr<Value> StrJustify(Interpreter& interpreter, const Value& self, CallArgs& args, absl::string_view name) {
  TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments(name, args, {"width", "fillchar"}, 1));
  TANDEM_ASSIGN_OR_RETURN(int64_t width, ToInt(*bound[0], name));
  std::string fill = " ";
  if (bound[1].has_value()) {
    if (!bound[1]->is_string() || CodePointCount(bound[1]->as_string()) != 1) {
      return absl::InvalidArgumentError("The fill character must be exactly one character long");
    }
    fill = bound[1]->as_string();
  }
  TANDEM_RETURN_IF_ERROR(interpreter.CheckString(std::max<int64_t>(width, 0) * fill.size() + self.as_string().size()));
  if (name == "center") return Value::String(PyCenter(self.as_string(), width, fill));
  if (name == "ljust") return Value::String(PyLJust(self.as_string(), width, fill));
  return Value::String(PyRJust(self.as_string(), width, fill));
}

absl::StatusOr<Value> CallStringMethod(Interpreter& interpreter, const Value& self, const std::string& name,
                                       CallArgs& args) {
  const std::string& s = self.as_string();
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(self.weight()));
  auto no_args = [&]() -> absl::Status {
    if (!args.positional.empty() || !args.keyword.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("str.", name, "() takes no arguments"));
    }
    return absl::OkStatus();
  };
  if (name == "strip") return StrStrip(interpreter, self, args, "strip", true, true);
  if (name == "lstrip") return StrStrip(interpreter, self, args, "lstrip", true, false);
  if (name == "rstrip") return StrStrip(interpreter, self, args, "rstrip", false, true);
  if (name == "split") return StrSplit(interpreter, self, args, false);
  if (name == "rsplit") return StrSplit(interpreter, self, args, true);
  if (name == "splitlines") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("splitlines", args, {"keepends"}));
    return StringList(interpreter, PySplitLines(s, bound[0].has_value() && bound[0]->Truthy()));
  }
  if (name == "startswith" || name == "endswith") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments(name, args, {"prefix"}, 1));
    TANDEM_ASSIGN_OR_RETURN(bool match, AffixMatch(s, *bound[0], name == "startswith", name));
    return Value::Bool(match);
  }
  if (name == "find") return StrFind(interpreter, self, args, "find", false, false);
  if (name == "rfind") return StrFind(interpreter, self, args, "rfind", true, false);
  if (name == "index") return StrFind(interpreter, self, args, "index", false, true);
  if (name == "rindex") return StrFind(interpreter, self, args, "rindex", true, true);
  if (name == "count") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("count", args, {"sub"}, 1));
    if (!bound[0]->is_string()) return absl::InvalidArgumentError("must be str, not " + bound[0]->TypeName());
    return Value::Int(PyCount(s, bound[0]->as_string()));
  }
  if (name == "replace") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("replace", args, {"old", "new", "count"}, 2));
    if (!bound[0]->is_string() || !bound[1]->is_string()) {
      return absl::InvalidArgumentError("replace() arguments must be str");
    }
    int64_t count = -1;
    if (bound[2].has_value()) {
      TANDEM_ASSIGN_OR_RETURN(count, ToInt(*bound[2], "replace count"));
    }
    std::string out = PyReplace(s, bound[0]->as_string(), bound[1]->as_string(), count);
    return interpreter.NewString(std::move(out));
  }
  if (name == "join") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("join", args, {"iterable"}, 1));
    TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(interpreter, *bound[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence item ", i, ": expected str instance, ", items[i].TypeName(), " found"));
      }
      if (i > 0) out += s;
      out += items[i].as_string();
      TANDEM_RETURN_IF_ERROR(interpreter.CheckString(out.size()));
    }
    return Value::String(std::move(out));
  }
  if (name == "format") return FormatBraces(interpreter, s, args);
  if (name == "center" || name == "ljust" || name == "rjust") return StrJustify(interpreter, self, args, name);
  if (name == "zfill") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("zfill", args, {"width"}, 1));
    TANDEM_ASSIGN_OR_RETURN(int64_t width, ToInt(*bound[0], "zfill"));
    TANDEM_RETURN_IF_ERROR(interpreter.CheckString(std::max<int64_t>(width, 0) + s.size()));
    const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
    std::string padded = PyRJust(s.substr(sign ? 1 : 0), width - (sign ? 1 : 0), "0");
    return Value::String(sign ? s.substr(0, 1) + padded : padded);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments(name, args, {"affix"}, 1));
    if (!bound[0]->is_string()) return absl::InvalidArgumentError(name + "() argument must be str");
    const std::string& a = bound[0]->as_string();
    TANDEM_ASSIGN_OR_RETURN(bool match, AffixMatch(s, *bound[0], name == "removeprefix", name));
    if (!match) return self;
    return Value::String(name == "removeprefix" ? s.substr(a.size()) : s.substr(0, s.size() - a.size()));
  }
  TANDEM_RETURN_IF_ERROR(no_args());
  if (name == "lower") return Value::String(ToLower(s));
  if (name == "upper") return Value::String(ToUpper(s));
  if (name == "title") return Value::String(PyTitle(s));
  if (name == "capitalize") return Value::String(PyCapitalize(s));
  if (name == "swapcase") return Value::String(PySwapCase(s));
  if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") return Value::Bool(PyIsDigit(s));
  if (name == "isalpha") return Value::Bool(PyIsAlpha(s));
  if (name == "isalnum") return Value::Bool(PyIsAlnum(s));
  if (name == "isspace") return Value::Bool(PyIsSpace(s));
  if (name == "islower") return Value::Bool(PyIsLower(s));
  if (name == "isupper") return Value::Bool(PyIsUpper(s));
  return absl::InvalidArgumentError(absl::StrCat("unsupported method str.", name, "()"));
}

constexpr absl::string_view kStringMethods[] = {
    "strip",        "lstrip",    "rstrip",  "split",   "rsplit",     "splitlines", "startswith",
    "endswith",     "find",      "rfind",   "index",   "rindex",     "count",      "replace",
    "join",         "format",    "center",  "ljust",   "rjust",      "zfill",      "removeprefix",
    "removesuffix", "lower",     "upper",   "title",   "capitalize", "swapcase",   "isdigit",
    "isdecimal",    "isnumeric", "isalpha", "isalnum", "isspace",    "islower",    "isupper"};
// Python str methods this engine lacks: named in the error when called.
constexpr absl::string_view kOtherStringMethods[] = {"casefold",  "encode",       "expandtabs",  "format_map",
                                                     "isascii",   "isidentifier", "isprintable", "istitle",
                                                     "maketrans", "partition",    "rpartition",  "translate"};

absl::StatusOr<Value> CallDictMethod(Interpreter& interpreter, const Value& self, const std::string& name,
                                     CallArgs& args) {
  const Dict& dict = self.as_dict();
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(static_cast<int64_t>(dict.size())));
  if (name == "get") {
    TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("get", args, {"key", "default"}, 1));
    if (const Value* found = dict.Find(*bound[0])) return *found;
    return bound[1].value_or(Value::None());
  }
  if (!args.positional.empty() || !args.keyword.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("dict.", name, "() takes no arguments"));
  }
  if (name == "copy") return self;
  ValueList items;
  items.reserve(dict.size());
  for (const auto& [key, value] : dict.entries()) {
    if (name == "keys") {
      items.push_back(key);
    } else if (name == "values") {
      items.push_back(value);
    } else {
      items.push_back(Value::Tuple({key, value}));
    }
  }
  return interpreter.NewList(std::move(items));
}

constexpr absl::string_view kDictMethods[] = {"items", "keys", "values", "get", "copy"};
constexpr absl::string_view kDictMutators[] = {"pop", "popitem", "update", "setdefault", "clear", "fromkeys"};

absl::StatusOr<Value> CallListMethod(Interpreter& interpreter, const Value& self, const std::string& name,
                                     CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(self.weight()));
  if (name == "copy") return interpreter.NewList(self.as_list(), false);
  TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments(name, args, {"value"}, 1));
  const ValueList& items = self.as_list();
  if (name == "count") {
    return Value::Int(std::count_if(items.begin(), items.end(), [&](const Value& v) { return Equal(v, *bound[0]); }));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (Equal(items[i], *bound[0])) return Value::Int(static_cast<int64_t>(i));
  }
  return absl::InvalidArgumentError(absl::StrCat(Repr(*bound[0]), " is not in list"));
}

constexpr absl::string_view kListMethods[] = {"index", "count", "copy"};
constexpr absl::string_view kListMutators[] = {"append", "extend",  "insert", "pop",
                                               "remove", "reverse", "sort",   "clear"};

template <size_t N>
bool In(const absl::string_view (&names)[N], absl::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Value BoundMethod(const Value& self, const std::string& name) {
  using Caller = absl::StatusOr<Value> (*)(Interpreter&, const Value&, const std::string&, CallArgs&);
  Caller call = self.is_string() ? CallStringMethod : self.is_dict() ? CallDictMethod : CallListMethod;
  return MakeFunction(
      absl::StrCat(self.TypeName(), ".", name),
      [self, name, call](Interpreter& interpreter, CallArgs& args) { return call(interpreter, self, name, args); });
}

// Python slice bounds (PySlice_AdjustIndices): the indices a slice visits.
// jinja2 compiles a slice to a plain Python subscript, so a bound that is no
// integer fails rather than giving undefined.
absl::StatusOr<std::vector<int64_t>> SliceIndices(int64_t length, const Value& start_v, const Value& stop_v,
                                                  const Value& step_v) {
  std::optional<int64_t> bounds[3];
  const Value* values[3] = {&start_v, &stop_v, &step_v};
  for (int i = 0; i < 3; ++i) {
    if (values[i]->is_undefined() || values[i]->is_none()) continue;
    if (!values[i]->is_int() && !values[i]->is_bool()) {
      return absl::InvalidArgumentError("slice indices must be integers or None or have an __index__ method");
    }
    bounds[i] = values[i]->as_int();
  }
  const std::optional<int64_t> start = bounds[0];
  const std::optional<int64_t> stop = bounds[1];
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  auto adjust = [&](std::optional<int64_t> v, int64_t if_absent) {
    if (!v) return if_absent;
    int64_t i = *v;
    if (i < 0) {
      i += length;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= length) {
      i = step < 0 ? length - 1 : length;
    }
    return i;
  };
  const int64_t first = adjust(start, step < 0 ? length - 1 : 0);
  const int64_t last = adjust(stop, step < 0 ? -1 : length);
  std::vector<int64_t> indices;
  for (int64_t i = first; step > 0 ? i < last : i > last; i += step) indices.push_back(i);
  return indices;
}

}  // namespace

absl::StatusOr<Value> GetAttribute(Interpreter& interpreter, const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kDict:
      if (In(kDictMethods, name)) return BoundMethod(object, name);
      if (In(kDictMutators, name)) return RefusedMethod(object, name);
      if (const Value* found = object.as_dict().Find(name)) return *found;
      return NoAttribute(object, name);
    case Value::Kind::kString:
      if (In(kStringMethods, name)) return BoundMethod(object, name);
      if (In(kOtherStringMethods, name)) {
        return MakeFunction("str." + name, [name](Interpreter&, CallArgs&) -> absl::StatusOr<Value> {
          return absl::InvalidArgumentError(absl::StrCat("unsupported method str.", name, "()"));
        });
      }
      return NoAttribute(object, name);
    case Value::Kind::kList:
      if (In(kListMethods, name)) return BoundMethod(object, name);
      if (In(kListMutators, name)) return RefusedMethod(object, name);
      return NoAttribute(object, name);
    case Value::Kind::kNamespace:
      if (const Value* found = object.as_namespace().attributes.Find(name)) return *found;
      return NoAttribute(object, name);
    default: return NoAttribute(object, name);
  }
}

absl::StatusOr<Value> GetItem(Interpreter& interpreter, const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kDict: {
      if ((key.is_list() && !key.is_tuple()) || key.is_dict() || key.is_undefined()) break;  // unhashable
      if (const Value* found = object.as_dict().Find(key)) return *found;
      break;
    }
    case Value::Kind::kList:
    case Value::Kind::kString: {
      if (!key.is_int() && !key.is_bool()) break;
      int64_t i = key.as_int();
      if (object.is_list()) {
        const auto n = static_cast<int64_t>(object.as_list().size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) {
          return Value::Undefined(absl::StrCat("'", ObjectTypeRepr(object), "' has no element ", key.as_int()));
        }
        return object.as_list()[i];
      }
      const std::vector<size_t> offsets = CodePointOffsets(object.as_string());
      const auto n = static_cast<int64_t>(offsets.size()) - 1;
      if (i < 0) i += n;
      if (i < 0 || i >= n) {
        return Value::Undefined(absl::StrCat("'", ObjectTypeRepr(object), "' has no element ", key.as_int()));
      }
      return Value::String(object.as_string().substr(offsets[i], offsets[i + 1] - offsets[i]));
    }
    default: break;
  }
  // jinja2 falls back to the attribute for a string key.
  if (key.is_string()) return GetAttribute(interpreter, object, key.as_string());
  return Value::Undefined(absl::StrCat("'", ObjectTypeRepr(object), "' has no element ", Repr(key)));
}

absl::StatusOr<Value> GetSlice(Interpreter& interpreter, const Value& object, const Value& start, const Value& stop,
                               const Value& step) {
  if (object.is_list()) {
    const ValueList& items = object.as_list();
    TANDEM_ASSIGN_OR_RETURN(std::vector<int64_t> indices,
                            SliceIndices(static_cast<int64_t>(items.size()), start, stop, step));
    ValueList out;
    out.reserve(indices.size());
    for (int64_t i : indices) out.push_back(items[i]);
    return interpreter.NewList(std::move(out), object.is_tuple());
  }
  if (object.is_string()) {
    const std::string& s = object.as_string();
    const std::vector<size_t> offsets = CodePointOffsets(s);
    TANDEM_ASSIGN_OR_RETURN(std::vector<int64_t> indices,
                            SliceIndices(static_cast<int64_t>(offsets.size()) - 1, start, stop, step));
    TANDEM_RETURN_IF_ERROR(interpreter.Charge(static_cast<int64_t>(indices.size())));
    std::string out;
    out.reserve(s.size());
    for (int64_t i : indices) out.append(s, offsets[i], offsets[i + 1] - offsets[i]);
    return Value::String(std::move(out));
  }
  if (object.is_dict()) return absl::InvalidArgumentError("unhashable type: 'slice'");
  return absl::InvalidArgumentError(absl::StrCat("'", object.TypeName(), "' object is not subscriptable"));
}

}  // namespace tandem::jinja
