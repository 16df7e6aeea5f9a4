// The values a Jinja template computes with, on Python semantics: undefined,
// None, bool, int, float, str, list (and tuple), dict (insertion-ordered),
// namespace and callables (macros, builtins, bound methods).
//
// A Value is cheap to copy: strings, lists and dicts are shared and
// immutable (chat templates run in Hugging Face's immutable sandbox, where
// list.append and dict.update are refused); a namespace is shared and
// mutable, as `{% set ns.x = ... %}` needs. Values are confined to the one
// render that made them: no thread-safety beyond that.
//
// Every value knows its weight (what walking it costs: 1 per value plus 1
// per 16 bytes of text, children counted every time they are referenced) and
// its depth, computed once when a list or dict is made. The interpreter
// bounds both, so a template cannot build a structure whose repr, tojson or
// comparison would exhaust memory, time or the stack: sharing makes
// `[x, x]` twice as heavy as x, however cheap it was to build.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::jinja {

class Value;
class Interpreter;
using ValueList = std::vector<Value>;

// Arguments of one call: `f(1, 2, key=3)`.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// Something a template can call. Errors name what was called, not where: the
// interpreter adds the position.
class Callable {
 public:
  virtual ~Callable() = default;
  virtual absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const = 0;
  // For str() and errors: "macro 'foo'", "built-in method strip".
  virtual std::string Describe() const = 0;
};

class Dict;
struct Namespace;

class Value {
 public:
  enum class Kind : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable };

  Value() = default;  // undefined
  static Value Undefined(std::string hint = "");
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items);
  static Value Tuple(ValueList items);
  static Value FromDict(Dict dict);
  static Value NewNamespace();
  static Value FromCallable(std::shared_ptr<const Callable> callable);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }  // list or tuple
  bool is_tuple() const;
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return scalar_.b; }
  int64_t as_int() const { return kind_ == Kind::kBool ? scalar_.b : scalar_.i; }  // bool is an int in Python
  double as_float() const { return kind_ == Kind::kFloat ? scalar_.d : static_cast<double>(as_int()); }
  const std::string& as_string() const;  // also an undefined's hint
  const ValueList& as_list() const;
  const Dict& as_dict() const;
  Namespace& as_namespace() const;  // shared and mutable
  const Callable& as_callable() const;
  // Identity of the shared payload (strings, lists, dicts): equal pointers
  // mean equal values, so comparisons can skip the walk.
  const void* payload() const { return object_.get(); }

  // Saturating; see the file comment. Scalars weigh 1 and have depth 0.
  int64_t weight() const;
  int depth() const;

  // Python truthiness; undefined is false.
  bool Truthy() const;
  // Python's type name for errors: 'int', 'str', 'NoneType', 'dict', ...
  std::string TypeName() const;
  // An undefined's description for errors: "'foo' is undefined".
  std::string UndefinedMessage() const;

 private:
  static Value MakeList(ValueList items, bool tuple);

  Kind kind_ = Kind::kUndefined;
  union {
    bool b;
    int64_t i;
    double d;
  } scalar_{.i = 0};
  std::shared_ptr<const void> object_;  // string, list, dict, namespace or callable, by kind_
};

// A Python dict: insertion-ordered, keys compared with Python equality.
// String keys are hashed once a dict outgrows a few entries, so a request
// with a huge object cannot make lookups quadratic.
class Dict {
 public:
  // Weight and depth of the dict as a value; computed by Value::FromDict.
  int64_t weight() const { return weight_; }
  int depth() const { return depth_; }

  const Value* Find(const Value& key) const;
  const Value* Find(absl::string_view key) const;
  // Replaces the value of an existing key (keeping its place) or appends.
  void Set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }

 private:
  friend class Value;
  static constexpr size_t kIndexFrom = 16;   // below this a scan beats hashing (the loop object has 12)
  size_t FindIndex(const Value& key) const;  // entries_.size() when absent

  std::vector<std::pair<Value, Value>> entries_;
  absl::flat_hash_map<std::string, size_t> string_index_;  // empty until kIndexFrom entries
  int64_t weight_ = 1;
  int depth_ = 1;
};

struct Namespace {
  Dict attributes;
};

// Python ==: deep for lists and dicts, numeric across bool/int/float,
// undefined equals only undefined.
bool Equal(const Value& a, const Value& b);
// Python <: -1, 0 or 1 for numbers, strings and lists (lexicographic);
// InvalidArgument "'<' not supported between instances of 'int' and 'str'"
// otherwise.
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// Python str() and repr(). Undefined is "" in str(). A namespace inside a
// namespace prints as "<Namespace ...>" (the interpreter never nests them).
std::string Str(const Value& v);
std::string Repr(const Value& v);

// Adds weights without overflowing.
int64_t AddWeight(int64_t a, int64_t b);
// The weight of a string of `bytes` bytes.
inline int64_t StringWeight(size_t bytes) { return 1 + static_cast<int64_t>(bytes / 16); }
// Python repr() of a float: the shortest round-trip digits, "1.0", "1e-05",
// "1e+16", "inf", "nan".
std::string FloatRepr(double d);

}  // namespace tandem::jinja
