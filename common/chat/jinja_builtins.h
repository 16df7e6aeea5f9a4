// What a template can name besides its variables: filters, tests, globals
// (range, namespace, dict, raise_exception, strftime_now) and the attributes
// and methods of values (dict.items, str.strip, ...), each on the semantics
// of jinja2 3.1 in Hugging Face's ImmutableSandboxedEnvironment with
// transformers' tojson. Errors are InvalidArgument with Python's wording and
// no position (the interpreter adds it).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/jinja_interpreter.h"
#include "common/chat/jinja_value.h"

namespace tandem::jinja {

using FilterFn = absl::StatusOr<Value> (*)(Interpreter&, const Value& input, CallArgs& args);
using TestFn = absl::StatusOr<bool> (*)(Interpreter&, const Value& input, CallArgs& args);

// nullptr for a name the engine does not implement.
FilterFn FindFilter(absl::string_view name);
TestFn FindTest(absl::string_view name);
inline bool IsFilter(absl::string_view name) { return FindFilter(name) != nullptr; }
inline bool IsTest(absl::string_view name) { return FindTest(name) != nullptr; }

// `object.name`: a dict's methods first, then its keys (Python getattr, then
// jinja2's fallback to [name]); string and list methods; namespace
// attributes; undefined (with a hint) when absent. Methods that would mutate
// (list.append, dict.update) give a callable refusing as the sandbox does.
absl::StatusOr<Value> GetAttribute(Interpreter& interpreter, const Value& object, const std::string& name);
// `object[key]`: keys, then attributes for a string key; list and string
// indices (negative from the end); undefined when absent.
absl::StatusOr<Value> GetItem(Interpreter& interpreter, const Value& object, const Value& key);
// `object[start:stop:step]` for lists, tuples and strings (Python slicing).
absl::StatusOr<Value> GetSlice(Interpreter& interpreter, const Value& object, const Value& start, const Value& stop,
                               const Value& step);

// A function implemented here (a global, a bound method).
class BuiltinFunction : public Callable {
 public:
  using Fn = std::function<absl::StatusOr<Value>(Interpreter&, CallArgs&)>;
  BuiltinFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const override { return fn_(interpreter, args); }
  std::string Describe() const override { return "built-in function " + name_; }

 private:
  std::string name_;
  Fn fn_;
};
Value MakeFunction(std::string name, BuiltinFunction::Fn fn);

// Python's printf-style `format % args` (the % operator and the format
// filter): %s %r %d %i %f %e %g %x %o %c %% with flags, width, precision
// and %(name)s keys; args a tuple, a dict or one value.
absl::StatusOr<Value> FormatPercent(Interpreter& interpreter, const std::string& format, const Value& args);
// Python's str.format for {} {0} {name} {name.attr} {name[0]} with
// conversions !s !r and format specs on the same mini-language as %.
absl::StatusOr<Value> FormatBraces(Interpreter& interpreter, const std::string& format, const CallArgs& args);

// Adds the global functions to `scope`.
void AddGlobals(Scope& scope);

// Binds call arguments to named parameters as Python does: positional in
// order, then keywords by name. InvalidArgument naming `function` for too
// many positional arguments, an unknown keyword or one given twice, or a
// missing required one (the first `required` names). Absent ones are nullopt.
absl::StatusOr<std::vector<std::optional<Value>>> BindArguments(absl::string_view function, CallArgs& args,
                                                                const std::vector<absl::string_view>& names,
                                                                size_t required = 0);

// An int or bool as an index or count (Python's __index__); InvalidArgument
// naming `what` for anything else, floats included.
absl::StatusOr<int64_t> ToInt(const Value& value, absl::string_view what);

}  // namespace tandem::jinja
