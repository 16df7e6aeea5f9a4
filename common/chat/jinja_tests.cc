// The tests of jinja2 3.1 (`x is defined`, `x is string`, `x is divisibleby 3`, ...).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/py_string.h"

namespace tandem::jinja {
namespace {

using Bound = std::vector<std::optional<Value>>;

absl::StatusOr<bool> NoArgs(absl::string_view name, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(BindArguments(name, args, {}).status());
  return true;
}

absl::StatusOr<Value> OneArg(absl::string_view name, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Bound bound, BindArguments(name, args, {"other"}, 1));
  return *bound[0];
}

#define TANDEM_SIMPLE_TEST(fn, name, expr)                                \
  absl::StatusOr<bool> fn(Interpreter&, const Value& v, CallArgs& args) { \
    TANDEM_RETURN_IF_ERROR(NoArgs(name, args).status());                  \
    return (expr);                                                        \
  }

TANDEM_SIMPLE_TEST(TestDefined, "defined", !v.is_undefined())
TANDEM_SIMPLE_TEST(TestUndefined, "undefined", v.is_undefined())
TANDEM_SIMPLE_TEST(TestNone, "none", v.is_none())
TANDEM_SIMPLE_TEST(TestBoolean, "boolean", v.is_bool())
TANDEM_SIMPLE_TEST(TestTrue, "true", v.is_bool() && v.as_bool())
TANDEM_SIMPLE_TEST(TestFalse, "false", v.is_bool() && !v.as_bool())
TANDEM_SIMPLE_TEST(TestInteger, "integer", v.is_int())
TANDEM_SIMPLE_TEST(TestFloat, "float", v.is_float())
TANDEM_SIMPLE_TEST(TestNumber, "number", v.is_number())
TANDEM_SIMPLE_TEST(TestString, "string", v.is_string())
TANDEM_SIMPLE_TEST(TestMapping, "mapping", v.is_dict())
// Python: anything with __iter__ (undefined included), and with __getitem__
// and __len__ for sequences (undefined has both too).
TANDEM_SIMPLE_TEST(TestIterable, "iterable", v.is_list() || v.is_dict() || v.is_string() || v.is_undefined())
TANDEM_SIMPLE_TEST(TestSequence, "sequence", v.is_list() || v.is_dict() || v.is_string() || v.is_undefined())
TANDEM_SIMPLE_TEST(TestCallable, "callable", v.is_callable())
TANDEM_SIMPLE_TEST(TestEscaped, "escaped", false)
TANDEM_SIMPLE_TEST(TestLower, "lower", PyIsLower(Str(v)))
TANDEM_SIMPLE_TEST(TestUpper, "upper", PyIsUpper(Str(v)))

#undef TANDEM_SIMPLE_TEST

absl::StatusOr<bool> Parity(const Value& v, bool odd, absl::string_view name) {
  if (v.is_float()) {
    const double r = std::fmod(v.as_float(), 2.0);
    return odd ? (r == 1.0 || r == -1.0) : r == 0.0;
  }
  if (!v.is_int() && !v.is_bool()) {
    return absl::InvalidArgumentError(absl::StrCat("test '", name, "' needs a number, got '", v.TypeName(), "'"));
  }
  const int64_t r = v.as_int() % 2;
  return odd ? r != 0 : r == 0;
}

absl::StatusOr<bool> TestOdd(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(NoArgs("odd", args).status());
  return Parity(v, true, "odd");
}

absl::StatusOr<bool> TestEven(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(NoArgs("even", args).status());
  return Parity(v, false, "even");
}

absl::StatusOr<bool> TestDivisibleBy(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Value num, OneArg("divisibleby", args));
  TANDEM_ASSIGN_OR_RETURN(Value remainder, BinaryOperation(interpreter, BinaryOp::kMod, v, num));
  return Equal(remainder, Value::Int(0));
}

absl::StatusOr<bool> TestSameAs(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Value other, OneArg("sameas", args));
  if (v.kind() != other.kind()) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.is_bool()) return v.as_bool() == other.as_bool();
  if (v.is_int())
    return v.as_int() == other.as_int() && v.as_int() >= -5 && v.as_int() <= 256;  // CPython's cached ints
  if (v.is_float()) return false;
  if (v.is_namespace()) return &v.as_namespace() == &other.as_namespace();
  return v.payload() != nullptr && v.payload() == other.payload();
}

absl::StatusOr<bool> TestIn(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Value container, OneArg("in", args));
  return Contains(interpreter, container, v);
}

absl::StatusOr<bool> TestKnownFilter(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(NoArgs("filter", args).status());
  return v.is_string() && IsFilter(v.as_string());
}

absl::StatusOr<bool> TestKnownTest(Interpreter&, const Value& v, CallArgs& args) {
  TANDEM_RETURN_IF_ERROR(NoArgs("test", args).status());
  return v.is_string() && IsTest(v.as_string());
}

absl::StatusOr<bool> TestEq(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Value other, OneArg("eq", args));
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(std::min(v.weight(), other.weight())));
  return Equal(v, other);
}

absl::StatusOr<bool> TestNe(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(bool eq, TestEq(interpreter, v, args));
  return !eq;
}

template <int kSign, bool kOrEqual>
absl::StatusOr<bool> TestOrder(Interpreter& interpreter, const Value& v, CallArgs& args) {
  TANDEM_ASSIGN_OR_RETURN(Value other, OneArg("comparison", args));
  for (const Value* x : {&v, static_cast<const Value*>(&other)}) {
    if (x->is_undefined()) return absl::InvalidArgumentError(x->UndefinedMessage());
  }
  TANDEM_RETURN_IF_ERROR(interpreter.Charge(std::min(v.weight(), other.weight())));
  TANDEM_ASSIGN_OR_RETURN(int c, Compare(v, other));
  return c == kSign || (kOrEqual && c == 0);
}

struct NamedTest {
  absl::string_view name;
  TestFn fn;
};

constexpr NamedTest kTests[] = {
    {"odd", TestOdd},
    {"even", TestEven},
    {"divisibleby", TestDivisibleBy},
    {"defined", TestDefined},
    {"undefined", TestUndefined},
    {"filter", TestKnownFilter},
    {"test", TestKnownTest},
    {"none", TestNone},
    {"boolean", TestBoolean},
    {"false", TestFalse},
    {"true", TestTrue},
    {"integer", TestInteger},
    {"float", TestFloat},
    {"lower", TestLower},
    {"upper", TestUpper},
    {"string", TestString},
    {"mapping", TestMapping},
    {"number", TestNumber},
    {"sequence", TestSequence},
    {"iterable", TestIterable},
    {"callable", TestCallable},
    {"sameas", TestSameAs},
    {"escaped", TestEscaped},
    {"in", TestIn},
    {"==", TestEq},
    {"eq", TestEq},
    {"equalto", TestEq},
    {"!=", TestNe},
    {"ne", TestNe},
    {">", TestOrder<1, false>},
    {"gt", TestOrder<1, false>},
    {"greaterthan", TestOrder<1, false>},
    {">=", TestOrder<1, true>},
    {"ge", TestOrder<1, true>},
    {"<", TestOrder<-1, false>},
    {"lt", TestOrder<-1, false>},
    {"lessthan", TestOrder<-1, false>},
    {"<=", TestOrder<-1, true>},
    {"le", TestOrder<-1, true>},
};

}  // namespace

TestFn FindTest(absl::string_view name) {
  for (const NamedTest& test : kTests) {
    if (test.name == name) return test.fn;
  }
  return nullptr;
}

}  // namespace tandem::jinja
