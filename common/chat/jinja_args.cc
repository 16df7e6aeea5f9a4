#include "absl/strings/str_cat.h"
#include "common/chat/jinja_builtins.h"

namespace tandem::jinja {

Value MakeFunction(std::string name, BuiltinFunction::Fn fn) {
  return Value::FromCallable(std::make_shared<BuiltinFunction>(std::move(name), std::move(fn)));
}

absl::StatusOr<std::vector<std::optional<Value>>> BindArguments(absl::string_view function, CallArgs& args,
                                                                const std::vector<absl::string_view>& names,
                                                                size_t required) {
  if (args.positional.size() > names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(function, "() takes at most ", names.size(), " argument(s) (", args.positional.size(), " given)"));
  }
  std::vector<std::optional<Value>> bound(names.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = std::move(args.positional[i]);
  for (auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) {
      return absl::InvalidArgumentError(absl::StrCat(function, "() got an unexpected keyword argument '", key, "'"));
    }
    if (bound[i].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(function, "() got multiple values for argument '", key, "'"));
    }
    bound[i] = std::move(value);
  }
  for (size_t i = 0; i < required; ++i) {
    if (!bound[i].has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(function, "() missing required argument '", names[i], "'"));
    }
  }
  return bound;
}

absl::StatusOr<int64_t> ToInt(const Value& value, absl::string_view what) {
  if (value.is_int() || value.is_bool()) return value.as_int();
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": '", value.TypeName(), "' object cannot be interpreted as an integer"));
}

}  // namespace tandem::jinja
