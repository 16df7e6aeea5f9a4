// The global functions a chat template can call: jinja2's range, dict and
// namespace, and the two transformers adds, raise_exception and
// strftime_now.
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_errors.h"

namespace tandem::jinja {
namespace {

absl::StatusOr<Value> Range(Interpreter& interpreter, CallArgs& args) {
  if (!args.keyword.empty()) return absl::InvalidArgumentError("range() takes no keyword arguments");
  if (args.positional.empty() || args.positional.size() > 3) {
    return absl::InvalidArgumentError(absl::StrCat("range expected 1 to 3 arguments, got ", args.positional.size()));
  }
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < args.positional.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(bounds[args.positional.size() == 1 ? 1 : i], ToInt(args.positional[i], "range()"));
  }
  const auto [start, stop, step] = bounds;
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  // Count first: a huge range is refused before anything is allocated.
  const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  const __int128 magnitude = step > 0 ? step : -static_cast<__int128>(step);
  const __int128 count = span <= 0 ? 0 : (span + magnitude - 1) / magnitude;
  if (count > interpreter.limits().max_value_weight) {
    return absl::ResourceExhaustedError(absl::StrCat("range of ", static_cast<int64_t>(count),
                                                     " items passes the limit of ",
                                                     interpreter.limits().max_value_weight));
  }
  ValueList items;
  items.reserve(static_cast<size_t>(count));
  for (__int128 i = 0; i < count; ++i) items.push_back(Value::Int(static_cast<int64_t>(start + i * step)));
  return interpreter.NewList(std::move(items));
}

// dict(mapping_or_pairs, **kwargs), as Python's dict() builds it.
absl::StatusOr<Dict> BuildDict(Interpreter& interpreter, CallArgs& args, absl::string_view function) {
  if (args.positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(function, " expected at most 1 positional argument, got ", args.positional.size()));
  }
  Dict dict;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      for (const auto& [key, value] : source.as_dict().entries()) dict.Set(key, value);
    } else if (source.is_namespace()) {
      for (const auto& [key, value] : source.as_namespace().attributes.entries()) dict.Set(key, value);
    } else {
      TANDEM_ASSIGN_OR_RETURN(ValueList pairs, Iterate(interpreter, source));
      for (const Value& pair : pairs) {
        if (!pair.is_list() || pair.as_list().size() != 2) {
          return absl::InvalidArgumentError(absl::StrCat(function, ": each element must be a key and value pair"));
        }
        dict.Set(pair.as_list()[0], pair.as_list()[1]);
      }
    }
  }
  for (auto& [key, value] : args.keyword) dict.Set(Value::String(key), std::move(value));
  for (const auto& [key, value] : dict.entries()) TANDEM_RETURN_IF_ERROR(interpreter.CheckStorable(value));
  return dict;
}

absl::StatusOr<Value> MakeDict(Interpreter& interpreter, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Dict dict, BuildDict(interpreter, args, "dict()"));
  return interpreter.NewDict(std::move(dict));
}

absl::StatusOr<Value> MakeNamespace(Interpreter& interpreter, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Dict dict, BuildDict(interpreter, args, "namespace()"));
  Value ns = Value::NewNamespace();
  for (const auto& [key, value] : dict.entries()) ns.as_namespace().attributes.Set(key, value);
  return ns;
}

absl::StatusOr<Value> RaiseException(Interpreter&, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("raise_exception", args, {"message"}, 1));
  return RaisedByTemplate(Str(*bound[0]));
}

// transformers: datetime.now().strftime(format), in the server's local time.
absl::StatusOr<Value> StrftimeNow(Interpreter& interpreter, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(auto bound, BindArguments("strftime_now", args, {"format"}, 1));
  if (!bound[0]->is_string()) return absl::InvalidArgumentError("strftime_now() argument must be str");
  return interpreter.NewString(absl::FormatTime(bound[0]->as_string(), absl::Now(), absl::LocalTimeZone()));
}

}  // namespace

void AddGlobals(Scope& scope) {
  scope.vars["range"] = MakeFunction("range", Range);
  scope.vars["dict"] = MakeFunction("dict", MakeDict);
  scope.vars["namespace"] = MakeFunction("namespace", MakeNamespace);
  scope.vars["raise_exception"] = MakeFunction("raise_exception", RaiseException);
  scope.vars["strftime_now"] = MakeFunction("strftime_now", StrftimeNow);
}

}  // namespace tandem::jinja
