#include "common/chat/jinja_interpreter.h"

#include <cmath>
#include <limits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/jinja_errors.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

// A macro defined by {% macro %}, closed over the scope it was defined in.
class MacroCallable : public Callable {
 public:
  MacroCallable(const MacroStmt& def, std::shared_ptr<Scope> closure) : def_(def), closure_(std::move(closure)) {}
  absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const override {
    return interpreter.InvokeMacro({.name = def_.name,
                                    .params = def_.params,
                                    .body = def_.body,
                                    .catch_varargs = def_.catch_varargs,
                                    .catch_kwargs = def_.catch_kwargs},
                                   closure_, std::move(args));
  }
  std::string Describe() const override { return absl::StrCat("Macro '", def_.name, "'"); }

 private:
  const MacroStmt& def_;
  std::shared_ptr<Scope> closure_;
};

// caller() inside a macro invoked by {% call %}: renders the call block's body.
class CallerCallable : public Callable {
 public:
  CallerCallable(const CallBlockStmt& def, std::shared_ptr<Scope> closure) : def_(def), closure_(std::move(closure)) {}
  absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const override {
    return interpreter.InvokeMacro({.name = "caller", .params = def_.caller_params, .body = def_.body}, closure_,
                                   std::move(args));
  }
  std::string Describe() const override { return "Macro 'caller'"; }

 private:
  const CallBlockStmt& def_;
  std::shared_ptr<Scope> closure_;
};

// loop.cycle(a, b, ...): the argument at this iteration's index, modulo.
class CycleCallable : public Callable {
 public:
  explicit CycleCallable(size_t index0) : index0_(index0) {}
  absl::StatusOr<Value> Call(Interpreter&, CallArgs args) const override {
    if (!args.keyword.empty()) return absl::InvalidArgumentError("loop.cycle() takes no keyword arguments");
    if (args.positional.empty()) return absl::InvalidArgumentError("no items for cycling given");
    return args.positional[index0_ % args.positional.size()];
  }
  std::string Describe() const override { return "bound method LoopContext.cycle"; }

 private:
  size_t index0_;
};

Value MakeLoop(const ValueList& items, size_t i) {
  const auto n = static_cast<int64_t>(items.size());
  const auto index0 = static_cast<int64_t>(i);
  Dict loop;
  loop.Set(Value::String("index"), Value::Int(index0 + 1));
  loop.Set(Value::String("index0"), Value::Int(index0));
  loop.Set(Value::String("revindex"), Value::Int(n - index0));
  loop.Set(Value::String("revindex0"), Value::Int(n - index0 - 1));
  loop.Set(Value::String("first"), Value::Bool(index0 == 0));
  loop.Set(Value::String("last"), Value::Bool(index0 == n - 1));
  loop.Set(Value::String("length"), Value::Int(n));
  loop.Set(Value::String("depth"), Value::Int(1));
  loop.Set(Value::String("depth0"), Value::Int(0));
  loop.Set(Value::String("previtem"), i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
  loop.Set(Value::String("nextitem"), i + 1 < items.size() ? items[i + 1] : Value::Undefined("there is no next item"));
  loop.Set(Value::String("cycle"), Value::FromCallable(std::make_shared<CycleCallable>(i)));
  return Value::FromDict(std::move(loop));
}

absl::Status IntegerOverflow() { return absl::InvalidArgumentError("integer result does not fit in 64 bits"); }

// Using an undefined value where a value is needed: the error points at
// the expression that was undefined.
absl::Status UndefinedAt(const Value& undefined, SourcePos pos) {
  return AtPosition(absl::InvalidArgumentError(undefined.UndefinedMessage()), pos);
}

absl::Status UnsupportedOperands(absl::string_view op, const Value& a, const Value& b) {
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t PyMod(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

double PyFmod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  if (r == 0) r = std::copysign(0.0, b);
  return r;
}

absl::StatusOr<Value> Repeat(Interpreter& interpreter, const Value& sequence, int64_t times) {
  if (times < 0) times = 0;
  if (sequence.is_string()) {
    const std::string& s = sequence.as_string();
    if (!s.empty() && static_cast<uint64_t>(times) > interpreter.limits().max_output_bytes / s.size()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("string repetition passes the ", interpreter.limits().max_output_bytes, "-byte string limit"));
    }
    TANDEM_RETURN_IF_ERROR(interpreter.CheckString(s.size() * times));
    std::string out;
    out.reserve(s.size() * times);
    for (int64_t i = 0; i < times; ++i) out += s;
    return Value::String(std::move(out));
  }
  const ValueList& items = sequence.as_list();
  if (!items.empty() &&
      (static_cast<uint64_t>(times) > static_cast<uint64_t>(interpreter.limits().max_value_weight) / items.size() ||
       sequence.weight() > interpreter.limits().max_value_weight / std::max<int64_t>(times, 1))) {
    return absl::ResourceExhaustedError(
        absl::StrCat("list repetition passes the value weight limit (", interpreter.limits().max_value_weight, ")"));
  }
  ValueList out;
  out.reserve(items.size() * times);
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return interpreter.NewList(std::move(out), sequence.is_tuple());
}

// Restores the interpreter's scope on exit.
class ScopeSwap {
 public:
  ScopeSwap(std::shared_ptr<Scope>* slot, std::shared_ptr<Scope> parent) : slot_(slot), saved_(*slot) {
    auto child = std::make_shared<Scope>();
    child->parent = std::move(parent);
    *slot_ = std::move(child);
  }
  ~ScopeSwap() { *slot_ = std::move(saved_); }
  ScopeSwap(const ScopeSwap&) = delete;
  ScopeSwap& operator=(const ScopeSwap&) = delete;

 private:
  std::shared_ptr<Scope>* slot_;
  std::shared_ptr<Scope> saved_;
};

}  // namespace

const Value* Scope::Find(absl::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
    auto it = s->vars.find(name);
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

// ---- Budgets ----

absl::Status Interpreter::Charge(int64_t units) {
  steps_ += units;
  if (steps_ > limits_.max_steps) {
    return absl::ResourceExhaustedError(
        absl::StrCat("template exceeded its work budget (", limits_.max_steps, " steps): runaway loop or recursion?"));
  }
  return absl::OkStatus();
}

absl::Status Interpreter::CheckString(size_t bytes) {
  if (bytes > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a string of ", bytes, " bytes passes the ", limits_.max_output_bytes, "-byte limit"));
  }
  return Charge(static_cast<int64_t>(bytes / 16));
}

absl::StatusOr<Value> Interpreter::NewString(std::string s) {
  TANDEM_RETURN_IF_ERROR(CheckString(s.size()));
  return Value::String(std::move(s));
}

absl::Status Interpreter::CheckStorable(const Value& v) const {
  if (v.is_namespace()) {
    return absl::InvalidArgumentError("unsupported: a namespace stored inside a list, dict or namespace");
  }
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::NewList(ValueList items, bool tuple) {
  for (const Value& item : items) TANDEM_RETURN_IF_ERROR(CheckStorable(item));
  TANDEM_RETURN_IF_ERROR(Charge(static_cast<int64_t>(items.size())));
  Value v = tuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
  if (v.weight() > limits_.max_value_weight || v.depth() > limits_.max_value_depth) {
    return absl::ResourceExhaustedError(absl::StrCat("a list of weight ", v.weight(), " and depth ", v.depth(),
                                                     " passes the limits (", limits_.max_value_weight, ", ",
                                                     limits_.max_value_depth, ")"));
  }
  return v;
}

absl::StatusOr<Value> Interpreter::NewDict(Dict dict) {
  for (const auto& [key, value] : dict.entries()) TANDEM_RETURN_IF_ERROR(CheckStorable(value));
  TANDEM_RETURN_IF_ERROR(Charge(static_cast<int64_t>(dict.size())));
  Value v = Value::FromDict(std::move(dict));
  if (v.weight() > limits_.max_value_weight || v.depth() > limits_.max_value_depth) {
    return absl::ResourceExhaustedError(absl::StrCat("a dict of weight ", v.weight(), " and depth ", v.depth(),
                                                     " passes the limits (", limits_.max_value_weight, ", ",
                                                     limits_.max_value_depth, ")"));
  }
  return v;
}

absl::Status Interpreter::Write(absl::string_view text) {
  if (live_output_bytes_ + text.size() > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendered output passes the ", limits_.max_output_bytes, "-byte limit"));
  }
  TANDEM_RETURN_IF_ERROR(Charge(static_cast<int64_t>(text.size() / 16)));
  live_output_bytes_ += text.size();
  absl::StrAppend(&outputs_.back(), text);
  return absl::OkStatus();
}

// ---- Render and statements ----

absl::StatusOr<std::string> Interpreter::Render(const Template& tmpl, std::shared_ptr<Scope> globals) {
  absl::Cleanup break_cycles = [this] { BreakClosureCycles(); };
  ScopeSwap scope(&scope_, std::move(globals));
  outputs_.emplace_back();
  absl::StatusOr<Flow> flow = ExecBody(tmpl.body);
  if (!flow.ok()) return flow.status();
  std::string out = std::move(outputs_.back());
  outputs_.pop_back();
  live_output_bytes_ = 0;
  return out;
}

std::shared_ptr<Scope> Interpreter::ClosureScope() {
  if (closure_scopes_.empty() || closure_scopes_.back().lock() != scope_) closure_scopes_.push_back(scope_);
  return scope_;
}

// Nothing a render made outlives it (it returns a string), so emptying the
// closure scopes frees every macro, namespace and scope they held; a scope
// kept alive only by its own macro would otherwise leak.
void Interpreter::BreakClosureCycles() {
  for (const std::weak_ptr<Scope>& weak : closure_scopes_) {
    if (std::shared_ptr<Scope> scope = weak.lock()) {
      scope->vars.clear();
      scope->parent.reset();
    }
  }
  closure_scopes_.clear();
}

absl::StatusOr<std::string> Interpreter::Capture(const Body& body) {
  ScopeSwap scope(&scope_, scope_);
  outputs_.emplace_back();
  absl::StatusOr<Flow> flow = ExecBody(body);
  std::string out = std::move(outputs_.back());
  outputs_.pop_back();
  live_output_bytes_ -= out.size();
  if (!flow.ok()) return flow.status();
  return out;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecBody(const Body& body) {
  for (const StmtPtr& stmt : body) {
    TANDEM_ASSIGN_OR_RETURN(Flow flow, Exec(*stmt));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::Exec(const Stmt& stmt) {
  TANDEM_RETURN_IF_ERROR(Charge(1));
  absl::Status status;
  switch (stmt.kind) {
    case StmtKind::kData: status = Write(static_cast<const DataStmt&>(stmt).text); break;
    case StmtKind::kOutput: {
      TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*static_cast<const OutputStmt&>(stmt).expr));
      TANDEM_RETURN_IF_ERROR(Charge(value.weight()));
      status = Write(value.is_string() ? value.as_string() : Str(value));
      break;
    }
    case StmtKind::kIf: {
      const auto& s = static_cast<const IfStmt&>(stmt);
      for (const auto& [test, body] : s.branches) {
        TANDEM_ASSIGN_OR_RETURN(Value result, Eval(*test));
        if (result.Truthy()) return ExecBody(body);
      }
      return ExecBody(s.else_body);
    }
    case StmtKind::kFor: {
      const auto& s = static_cast<const ForStmt&>(stmt);
      status = ExecFor(s);
      break;
    }
    case StmtKind::kSet: {
      const auto& s = static_cast<const SetStmt&>(stmt);
      TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*s.value));
      status = Assign(s.target, value);
      break;
    }
    case StmtKind::kSetBlock: status = ExecSetBlock(static_cast<const SetBlockStmt&>(stmt)); break;
    case StmtKind::kMacro: {
      const auto& s = static_cast<const MacroStmt&>(stmt);
      scope_->vars[s.name] = Value::FromCallable(std::make_shared<MacroCallable>(s, ClosureScope()));
      break;
    }
    case StmtKind::kCallBlock: status = ExecCallBlock(static_cast<const CallBlockStmt&>(stmt)); break;
    case StmtKind::kFilterBlock: status = ExecFilterBlock(static_cast<const FilterBlockStmt&>(stmt)); break;
    case StmtKind::kWith: status = ExecWith(static_cast<const WithStmt&>(stmt)); break;
    case StmtKind::kBreak: return Flow::kBreak;
    case StmtKind::kContinue: return Flow::kContinue;
    case StmtKind::kGeneration: {
      TANDEM_ASSIGN_OR_RETURN(std::string text, Capture(static_cast<const BodyStmt&>(stmt).body));
      status = Write(text);
      break;
    }
  }
  if (!status.ok()) return AtPosition(status, stmt.pos);
  return Flow::kNormal;
}

absl::Status Interpreter::ExecFor(const ForStmt& stmt) {
  TANDEM_ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.iterable));
  TANDEM_ASSIGN_OR_RETURN(ValueList items, Iterate(*this, iterable));
  const std::shared_ptr<Scope> outer = scope_;
  if (stmt.filter != nullptr) {
    ValueList kept;
    for (const Value& item : items) {
      TANDEM_RETURN_IF_ERROR(Charge(1));
      ScopeSwap scope(&scope_, outer);
      TANDEM_RETURN_IF_ERROR(Assign(stmt.target, item));
      TANDEM_ASSIGN_OR_RETURN(Value keep, Eval(*stmt.filter));
      if (keep.Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  for (size_t i = 0; i < items.size(); ++i) {
    TANDEM_RETURN_IF_ERROR(Charge(1));
    ScopeSwap scope(&scope_, outer);  // each iteration starts afresh: sets do not carry over
    TANDEM_RETURN_IF_ERROR(Assign(stmt.target, items[i]));
    if (stmt.uses_loop) scope_->vars["loop"] = MakeLoop(items, i);
    TANDEM_ASSIGN_OR_RETURN(Flow flow, ExecBody(stmt.body));
    if (flow == Flow::kBreak) break;
  }
  if (items.empty() && !stmt.else_body.empty()) {
    ScopeSwap scope(&scope_, outer);
    TANDEM_ASSIGN_OR_RETURN(Flow flow, ExecBody(stmt.else_body));
    if (flow != Flow::kNormal) {
      return absl::InvalidArgumentError("unsupported break/continue in a for loop's else block");
    }
  }
  return absl::OkStatus();
}

absl::Status Interpreter::Assign(const Target& target, const Value& value) {
  switch (target.kind) {
    case Target::Kind::kName: scope_->vars[target.name] = value; return absl::OkStatus();
    case Target::Kind::kAttribute: {
      const Value* ns = scope_->Find(target.name);
      if (ns == nullptr || !ns->is_namespace()) {
        return AtPosition(absl::InvalidArgumentError("cannot assign attribute on non-namespace object"), target.pos);
      }
      TANDEM_RETURN_IF_ERROR(AtPosition(CheckStorable(value), target.pos));
      ns->as_namespace().attributes.Set(Value::String(target.attribute), value);
      return absl::OkStatus();
    }
    case Target::Kind::kTuple: {
      absl::StatusOr<ValueList> items = Iterate(*this, value);
      if (!items.ok()) {
        return AtPosition(
            absl::InvalidArgumentError(absl::StrCat("cannot unpack non-iterable ", value.TypeName(), " object")),
            target.pos);
      }
      if (items->size() != target.items.size()) {
        return AtPosition(absl::InvalidArgumentError(
                              items->size() > target.items.size()
                                  ? absl::StrCat("too many values to unpack (expected ", target.items.size(), ")")
                                  : absl::StrCat("not enough values to unpack (expected ", target.items.size(),
                                                 ", got ", items->size(), ")")),
                          target.pos);
      }
      for (size_t i = 0; i < items->size(); ++i) TANDEM_RETURN_IF_ERROR(Assign(target.items[i], (*items)[i]));
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

absl::Status Interpreter::ExecSetBlock(const SetBlockStmt& stmt) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, Capture(stmt.body));
  Value value = Value::String(std::move(text));
  if (stmt.filter != nullptr) {
    TANDEM_ASSIGN_OR_RETURN(value, EvalFilter(static_cast<const FilterExpr&>(*stmt.filter), &value));
  }
  return Assign(stmt.target, value);
}

absl::Status Interpreter::ExecCallBlock(const CallBlockStmt& stmt) {
  const auto& call = static_cast<const CallExpr&>(*stmt.call);
  TANDEM_ASSIGN_OR_RETURN(Value callee, Eval(*call.callee));
  TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArguments(call.args));
  args.keyword.emplace_back("caller", Value::FromCallable(std::make_shared<CallerCallable>(stmt, ClosureScope())));
  absl::StatusOr<Value> result = CallValue(callee, std::move(args));
  if (!result.ok()) return AtPosition(result.status(), call.pos);
  return Write(Str(*result));
}

absl::Status Interpreter::ExecFilterBlock(const FilterBlockStmt& stmt) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, Capture(stmt.body));
  const Value input = Value::String(std::move(text));
  TANDEM_ASSIGN_OR_RETURN(Value value, EvalFilter(static_cast<const FilterExpr&>(*stmt.filter), &input));
  return Write(Str(value));
}

absl::Status Interpreter::ExecWith(const WithStmt& stmt) {
  std::vector<Value> values;
  for (const auto& [target, expr] : stmt.assignments) {
    TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*expr));
    values.push_back(std::move(value));
  }
  ScopeSwap scope(&scope_, scope_);
  for (size_t i = 0; i < values.size(); ++i) TANDEM_RETURN_IF_ERROR(Assign(stmt.assignments[i].first, values[i]));
  TANDEM_ASSIGN_OR_RETURN(Flow flow, ExecBody(stmt.body));
  if (flow != Flow::kNormal) return absl::InvalidArgumentError("unsupported break/continue inside a with block");
  return absl::OkStatus();
}

absl::StatusOr<Value> Interpreter::InvokeMacro(const MacroBody& macro, const std::shared_ptr<Scope>& closure,
                                               CallArgs args) {
  const std::vector<MacroParam>& params = macro.params;
  if (call_depth_ >= limits_.max_call_depth) {
    return absl::ResourceExhaustedError(
        absl::StrCat("macro calls nest deeper than ", limits_.max_call_depth, " levels (calling '", macro.name, "')"));
  }
  if (args.positional.size() > params.size() && !macro.catch_varargs) {
    return absl::InvalidArgumentError(
        absl::StrCat("macro '", macro.name, "' takes not more than ", params.size(), " argument(s)"));
  }
  ++call_depth_;
  struct DepthRestore {
    int* depth;
    ~DepthRestore() { --*depth; }
  } restore{&call_depth_};
  ScopeSwap scope(&scope_, closure);
  std::vector<bool> bound(params.size(), false);
  ValueList varargs;
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i >= params.size()) {
      varargs.push_back(std::move(args.positional[i]));
      continue;
    }
    scope_->vars[params[i].name] = std::move(args.positional[i]);
    bound[i] = true;
  }
  Dict kwargs;
  for (auto& [key, value] : args.keyword) {
    if (key == "caller") {
      scope_->vars["caller"] = std::move(value);
      continue;
    }
    size_t i = 0;
    while (i < params.size() && params[i].name != key) ++i;
    if (i == params.size()) {
      if (!macro.catch_kwargs) {
        return absl::InvalidArgumentError(
            absl::StrCat("macro '", macro.name, "' takes no keyword argument '", key, "'"));
      }
      kwargs.Set(Value::String(key), std::move(value));
      continue;
    }
    if (bound[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("macro '", macro.name, "' got multiple values for argument '", key, "'"));
    }
    scope_->vars[key] = std::move(value);
    bound[i] = true;
  }
  if (macro.catch_varargs) {
    TANDEM_ASSIGN_OR_RETURN(scope_->vars["varargs"], NewList(std::move(varargs), true));
  }
  if (macro.catch_kwargs) {
    TANDEM_ASSIGN_OR_RETURN(scope_->vars["kwargs"], NewDict(std::move(kwargs)));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (bound[i]) continue;
    if (params[i].default_value != nullptr) {
      TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*params[i].default_value));
      scope_->vars[params[i].name] = std::move(value);
    } else {
      scope_->vars[params[i].name] = Value::Undefined(absl::StrCat("'", params[i].name, "' is undefined"));
    }
  }
  outputs_.emplace_back();
  absl::StatusOr<Flow> flow = ExecBody(macro.body);
  std::string out = std::move(outputs_.back());
  outputs_.pop_back();
  live_output_bytes_ -= out.size();
  if (!flow.ok()) return flow.status();
  return Value::String(std::move(out));
}

// ---- Expressions ----

absl::StatusOr<Value> Interpreter::Eval(const Expr& expr) {
  TANDEM_RETURN_IF_ERROR(Charge(1));
  absl::StatusOr<Value> value = EvalInner(expr);
  if (!value.ok()) return AtPosition(value.status(), expr.pos);
  return value;
}

absl::StatusOr<Value> Interpreter::EvalInner(const Expr& expr) {
  switch (expr.kind) {
    case ExprKind::kLiteral: return static_cast<const LiteralExpr&>(expr).value;
    case ExprKind::kName: {
      const std::string& name = static_cast<const NameExpr&>(expr).name;
      if (const Value* value = scope_->Find(name)) return *value;
      return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
    }
    case ExprKind::kList: return EvalList(static_cast<const ListExpr&>(expr));
    case ExprKind::kDict: return EvalDict(static_cast<const DictExpr&>(expr));
    case ExprKind::kGetAttr: {
      const auto& e = static_cast<const GetAttrExpr&>(expr);
      TANDEM_ASSIGN_OR_RETURN(Value object, Eval(*e.object));
      if (object.is_undefined()) return UndefinedAt(object, e.object->pos);
      return GetAttribute(*this, object, e.name);
    }
    case ExprKind::kGetItem: {
      const auto& e = static_cast<const GetItemExpr&>(expr);
      TANDEM_ASSIGN_OR_RETURN(Value object, Eval(*e.object));
      TANDEM_ASSIGN_OR_RETURN(Value key, Eval(*e.key));
      if (object.is_undefined()) return UndefinedAt(object, e.object->pos);
      return GetItem(*this, object, key);
    }
    case ExprKind::kSlice: return EvalSlice(static_cast<const SliceExpr&>(expr));
    case ExprKind::kCall: return EvalCall(static_cast<const CallExpr&>(expr));
    case ExprKind::kFilter: return EvalFilter(static_cast<const FilterExpr&>(expr), nullptr);
    case ExprKind::kTest: return EvalTest(static_cast<const TestExpr&>(expr));
    case ExprKind::kUnary: {
      const auto& e = static_cast<const UnaryExpr&>(expr);
      TANDEM_ASSIGN_OR_RETURN(Value operand, Eval(*e.operand));
      if (operand.is_undefined()) return absl::InvalidArgumentError(operand.UndefinedMessage());
      if (!operand.is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat("bad operand type for unary ", std::string(1, e.op), ": '", operand.TypeName(), "'"));
      }
      if (operand.is_float()) return Value::Float(e.op == '-' ? -operand.as_float() : operand.as_float());
      if (e.op == '+') return Value::Int(operand.as_int());
      if (operand.as_int() == std::numeric_limits<int64_t>::min()) {
        return IntegerOverflow();
      }
      return Value::Int(-operand.as_int());
    }
    case ExprKind::kBinary: {
      const auto& e = static_cast<const BinaryExpr&>(expr);
      TANDEM_ASSIGN_OR_RETURN(Value left, Eval(*e.left));
      TANDEM_ASSIGN_OR_RETURN(Value right, Eval(*e.right));
      return BinaryOperation(*this, e.op, left, right);
    }
    case ExprKind::kConcat: {
      std::string out;
      for (const ExprPtr& part : static_cast<const ConcatExpr&>(expr).parts) {
        TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*part));
        TANDEM_RETURN_IF_ERROR(Charge(value.weight()));
        out += value.is_string() ? value.as_string() : Str(value);
        TANDEM_RETURN_IF_ERROR(CheckString(out.size()));
      }
      return Value::String(std::move(out));
    }
    case ExprKind::kCompare: return EvalCompare(static_cast<const CompareExpr&>(expr));
    case ExprKind::kAnd: {
      const auto& e = static_cast<const LogicalExpr&>(expr);
      TANDEM_ASSIGN_OR_RETURN(Value left, Eval(*e.left));
      if (!left.Truthy()) return left;
      return Eval(*e.right);
    }
    case ExprKind::kOr: {
      const auto& e = static_cast<const LogicalExpr&>(expr);
      TANDEM_ASSIGN_OR_RETURN(Value left, Eval(*e.left));
      if (left.Truthy()) return left;
      return Eval(*e.right);
    }
    case ExprKind::kNot: {
      TANDEM_ASSIGN_OR_RETURN(Value operand, Eval(*static_cast<const NotExpr&>(expr).operand));
      return Value::Bool(!operand.Truthy());
    }
    case ExprKind::kCondition: {
      const auto& e = static_cast<const ConditionExpr&>(expr);
      TANDEM_ASSIGN_OR_RETURN(Value test, Eval(*e.test));
      if (test.Truthy()) return Eval(*e.then_expr);
      if (e.else_expr != nullptr) return Eval(*e.else_expr);
      return Value::Undefined("the inline if-expression evaluated to false and no else section was defined");
    }
  }
  return absl::InternalError("unknown expression kind");
}

absl::StatusOr<Value> Interpreter::EvalList(const ListExpr& expr) {
  ValueList items;
  items.reserve(expr.items.size());
  for (const ExprPtr& item : expr.items) {
    TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*item));
    items.push_back(std::move(value));
  }
  return NewList(std::move(items), expr.tuple);
}

absl::StatusOr<Value> Interpreter::EvalDict(const DictExpr& expr) {
  Dict dict;
  for (const auto& [key_expr, value_expr] : expr.items) {
    TANDEM_ASSIGN_OR_RETURN(Value key, Eval(*key_expr));
    TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*value_expr));
    if (key.is_list() && !key.is_tuple()) return absl::InvalidArgumentError("unhashable type: 'list'");
    if (key.is_dict()) return absl::InvalidArgumentError("unhashable type: 'dict'");
    if (key.is_undefined()) return absl::InvalidArgumentError(key.UndefinedMessage());
    dict.Set(std::move(key), std::move(value));
  }
  return NewDict(std::move(dict));
}

absl::StatusOr<Value> Interpreter::EvalSlice(const SliceExpr& expr) {
  TANDEM_ASSIGN_OR_RETURN(Value object, Eval(*expr.object));
  if (object.is_undefined()) return UndefinedAt(object, expr.object->pos);
  Value bounds[3];
  const ExprPtr* exprs[3] = {&expr.start, &expr.stop, &expr.step};
  for (int i = 0; i < 3; ++i) {
    if (*exprs[i] != nullptr) {
      TANDEM_ASSIGN_OR_RETURN(bounds[i], Eval(**exprs[i]));
    }
  }
  return GetSlice(*this, object, bounds[0], bounds[1], bounds[2]);
}

absl::StatusOr<CallArgs> Interpreter::EvalArguments(const Arguments& args) {
  CallArgs out;
  for (const ExprPtr& arg : args.positional) {
    TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*arg));
    out.positional.push_back(std::move(value));
  }
  for (const auto& [name, arg] : args.keyword) {
    TANDEM_ASSIGN_OR_RETURN(Value value, Eval(*arg));
    out.keyword.emplace_back(name, std::move(value));
  }
  return out;
}

absl::StatusOr<Value> Interpreter::EvalCall(const CallExpr& expr) {
  TANDEM_ASSIGN_OR_RETURN(Value callee, Eval(*expr.callee));
  if (callee.is_undefined()) return UndefinedAt(callee, expr.callee->pos);
  TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArguments(expr.args));
  return CallValue(callee, std::move(args));
}

absl::StatusOr<Value> Interpreter::CallValue(const Value& callee, CallArgs args) {
  TANDEM_RETURN_IF_ERROR(Charge(1));
  if (callee.is_undefined()) return absl::InvalidArgumentError(callee.UndefinedMessage());
  if (!callee.is_callable()) {
    return absl::InvalidArgumentError(absl::StrCat("'", callee.TypeName(), "' object is not callable"));
  }
  return callee.as_callable().Call(*this, std::move(args));
}

absl::StatusOr<Value> Interpreter::EvalFilter(const FilterExpr& expr, const Value* input) {
  Value operand;
  if (expr.operand == nullptr) {
    operand = *input;
  } else if (input != nullptr && expr.operand->kind == ExprKind::kFilter) {
    TANDEM_ASSIGN_OR_RETURN(operand, EvalFilter(static_cast<const FilterExpr&>(*expr.operand), input));
  } else {
    TANDEM_ASSIGN_OR_RETURN(operand, Eval(*expr.operand));
  }
  TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArguments(expr.args));
  absl::StatusOr<Value> result = ApplyFilter(expr.name, operand, std::move(args));
  if (!result.ok()) return AtPosition(result.status(), expr.pos);
  return result;
}

absl::StatusOr<Value> Interpreter::ApplyFilter(absl::string_view name, const Value& input, CallArgs args) {
  TANDEM_RETURN_IF_ERROR(Charge(1));
  const FilterFn filter = FindFilter(name);
  if (filter == nullptr) return absl::InvalidArgumentError(absl::StrCat("unsupported filter '", name, "'"));
  return filter(*this, input, args);
}

absl::StatusOr<Value> Interpreter::EvalTest(const TestExpr& expr) {
  TANDEM_ASSIGN_OR_RETURN(Value operand, Eval(*expr.operand));
  TANDEM_ASSIGN_OR_RETURN(CallArgs args, EvalArguments(expr.args));
  TANDEM_ASSIGN_OR_RETURN(bool result, ApplyTest(expr.name, operand, std::move(args)));
  return Value::Bool(result);
}

absl::StatusOr<bool> Interpreter::ApplyTest(absl::string_view name, const Value& input, CallArgs args) {
  TANDEM_RETURN_IF_ERROR(Charge(1));
  const TestFn test = FindTest(name);
  if (test == nullptr) return absl::InvalidArgumentError(absl::StrCat("unsupported test '", name, "'"));
  return test(*this, input, args);
}

absl::StatusOr<Value> Interpreter::EvalCompare(const CompareExpr& expr) {
  TANDEM_ASSIGN_OR_RETURN(Value left, Eval(*expr.first));
  for (const auto& [op, right_expr] : expr.rest) {
    TANDEM_ASSIGN_OR_RETURN(Value right, Eval(*right_expr));
    bool result = false;
    switch (op) {
      case CompareOp::kEq:
      case CompareOp::kNe:
        TANDEM_RETURN_IF_ERROR(Charge(std::min(left.weight(), right.weight())));
        result = Equal(left, right) == (op == CompareOp::kEq);
        break;
      case CompareOp::kIn:
      case CompareOp::kNotIn: {
        TANDEM_ASSIGN_OR_RETURN(bool in, Contains(*this, right, left));
        result = in == (op == CompareOp::kIn);
        break;
      }
      default: {
        for (const Value* v : {&left, &right}) {
          if (v->is_undefined()) return absl::InvalidArgumentError(v->UndefinedMessage());
        }
        TANDEM_RETURN_IF_ERROR(Charge(std::min(left.weight(), right.weight())));
        absl::StatusOr<int> c = Compare(left, right);
        if (!c.ok()) {
          const char* symbol = op == CompareOp::kLt   ? "<"
                               : op == CompareOp::kLe ? "<="
                               : op == CompareOp::kGt ? ">"
                                                      : ">=";
          return absl::InvalidArgumentError(absl::StrCat("'", symbol, "' not supported between instances of '",
                                                         left.TypeName(), "' and '", right.TypeName(), "'"));
        }
        result = op == CompareOp::kLt   ? *c < 0
                 : op == CompareOp::kLe ? *c <= 0
                 : op == CompareOp::kGt ? *c > 0
                                        : *c >= 0;
      }
    }
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

// ---- Operators shared with builtins ----

absl::StatusOr<Value> BinaryOperation(Interpreter& interpreter, BinaryOp op, const Value& a, const Value& b) {
  for (const Value* v : {&a, &b}) {
    if (v->is_undefined()) return absl::InvalidArgumentError(v->UndefinedMessage());
  }
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.is_float() || b.is_float());
  switch (op) {
    case BinaryOp::kAdd: {
      if (floats) return Value::Float(a.as_float() + b.as_float());
      if (numbers) {
        int64_t r;
        if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return IntegerOverflow();
        return Value::Int(r);
      }
      if (a.is_string() && b.is_string()) {
        TANDEM_RETURN_IF_ERROR(interpreter.CheckString(a.as_string().size() + b.as_string().size()));
        return Value::String(a.as_string() + b.as_string());
      }
      if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
        ValueList items = a.as_list();
        items.insert(items.end(), b.as_list().begin(), b.as_list().end());
        return interpreter.NewList(std::move(items), a.is_tuple());
      }
      if (a.is_string() || a.is_list()) {
        return absl::InvalidArgumentError(
            absl::StrCat("can only concatenate ", a.TypeName(), " (not \"", b.TypeName(), "\") to ", a.TypeName()));
      }
      return UnsupportedOperands("+", a, b);
    }
    case BinaryOp::kSub: {
      if (floats) return Value::Float(a.as_float() - b.as_float());
      if (numbers) {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return IntegerOverflow();
        return Value::Int(r);
      }
      return UnsupportedOperands("-", a, b);
    }
    case BinaryOp::kMul: {
      if (floats) return Value::Float(a.as_float() * b.as_float());
      if (numbers) {
        int64_t r;
        if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return IntegerOverflow();
        return Value::Int(r);
      }
      const bool a_int = a.is_int() || a.is_bool();
      const bool b_int = b.is_int() || b.is_bool();
      if ((a.is_string() || a.is_list()) && b_int) return Repeat(interpreter, a, b.as_int());
      if ((b.is_string() || b.is_list()) && a_int) return Repeat(interpreter, b, a.as_int());
      return UnsupportedOperands("*", a, b);
    }
    case BinaryOp::kDiv:
      if (!numbers) return UnsupportedOperands("/", a, b);
      if (b.as_float() == 0) return absl::InvalidArgumentError("division by zero");
      return Value::Float(a.as_float() / b.as_float());
    case BinaryOp::kFloorDiv:
      if (!numbers) return UnsupportedOperands("//", a, b);
      if (b.as_float() == 0) {
        return absl::InvalidArgumentError(floats ? "float floor division by zero"
                                                 : "integer division or modulo by zero");
      }
      if (floats) return Value::Float(std::floor(a.as_float() / b.as_float()));
      if (a.as_int() == std::numeric_limits<int64_t>::min() && b.as_int() == -1) {
        return IntegerOverflow();
      }
      return Value::Int(FloorDiv(a.as_int(), b.as_int()));
    case BinaryOp::kMod:
      if (a.is_string()) return FormatPercent(interpreter, a.as_string(), b);
      if (!numbers) return UnsupportedOperands("%", a, b);
      if (b.as_float() == 0) {
        return absl::InvalidArgumentError(floats ? "float modulo" : "integer division or modulo by zero");
      }
      if (floats) return Value::Float(PyFmod(a.as_float(), b.as_float()));
      if (b.as_int() == -1) return Value::Int(0);
      return Value::Int(PyMod(a.as_int(), b.as_int()));
    case BinaryOp::kPow: {
      if (!numbers) return UnsupportedOperands("** or pow()", a, b);
      if (floats || b.as_int() < 0) {
        if (a.as_float() == 0 && b.as_float() < 0) {
          return absl::InvalidArgumentError("0.0 cannot be raised to a negative power");
        }
        return Value::Float(std::pow(a.as_float(), b.as_float()));
      }
      int64_t result = 1;
      int64_t base = a.as_int();
      for (int64_t e = b.as_int(); e > 0; e >>= 1) {  // square and multiply, checking every step
        if (e & 1) {
          if (__builtin_mul_overflow(result, base, &result)) return IntegerOverflow();
        }
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) return IntegerOverflow();
      }
      return Value::Int(result);
    }
  }
  return absl::InternalError("unknown operator");
}

absl::StatusOr<bool> Contains(Interpreter& interpreter, const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      TANDEM_RETURN_IF_ERROR(interpreter.Charge(container.weight()));
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      TANDEM_RETURN_IF_ERROR(interpreter.Charge(container.weight()));
      for (const Value& v : container.as_list()) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if ((item.is_list() && !item.is_tuple()) || item.is_dict()) {
        return absl::InvalidArgumentError(absl::StrCat("unhashable type: '", item.TypeName(), "'"));
      }
      return container.as_dict().Find(item) != nullptr;
    case Value::Kind::kUndefined: return false;
    default:
      return absl::InvalidArgumentError(absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

absl::StatusOr<ValueList> Iterate(Interpreter& interpreter, const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kList:
      TANDEM_RETURN_IF_ERROR(interpreter.Charge(static_cast<int64_t>(value.as_list().size())));
      return value.as_list();
    case Value::Kind::kDict: {
      ValueList keys;
      keys.reserve(value.as_dict().size());
      for (const auto& [key, v] : value.as_dict().entries()) keys.push_back(key);
      TANDEM_RETURN_IF_ERROR(interpreter.Charge(static_cast<int64_t>(keys.size())));
      return keys;
    }
    case Value::Kind::kString: {
      const std::string& s = value.as_string();
      TANDEM_RETURN_IF_ERROR(interpreter.Charge(static_cast<int64_t>(s.size())));
      ValueList chars;
      for (size_t pos = 0; pos < s.size();) {
        const size_t begin = pos;
        DecodeUtf8(s, &pos);
        chars.push_back(Value::String(s.substr(begin, pos - begin)));
      }
      return chars;
    }
    case Value::Kind::kUndefined: return ValueList{};
    default: return absl::InvalidArgumentError(absl::StrCat("'", value.TypeName(), "' object is not iterable"));
  }
}

}  // namespace tandem::jinja
