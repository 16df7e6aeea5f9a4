// Runs a parsed template over values: jinja2's semantics for scoping (a for
// iteration, macro call, with, filter block and set block each get a scope;
// if does not), the loop object, macros with defaults and caller(),
// namespaces, break/continue, and Python's operators.
//
// An Interpreter renders once; it is not shared between threads. Every
// resource a template could exhaust is bounded by RenderLimits: nesting is
// bounded by the parser, macro recursion, work (one unit per node evaluated
// or loop iteration, plus the size of every bulk operation), the size of
// every string and of the output, and the weight and depth of every list or
// dict the template builds.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_value.h"

namespace tandem::jinja {

struct RenderLimits {
  // The rendered text, every captured block or macro output, and every
  // string the template builds.
  size_t max_output_bytes = size_t{16} << 20;
  int max_call_depth = 64;  // macro and caller() recursion
  // Work units: one per expression node, statement or loop iteration, plus
  // one per 16 bytes of text and per value walked by bulk operations.
  // 5M is ~1-2 s of work and thousands of times what a real chat template
  // spends on a long conversation.
  int64_t max_steps = 5'000'000;
  // Any list or dict the template builds (see jinja_value.h); inputs are
  // bounded only in depth.
  int64_t max_value_weight = int64_t{1} << 22;
  int max_value_depth = 64;
};

// A variable scope; child scopes see their parent's names. Shared because a
// macro keeps the scope it was defined in (jinja2 macros are closures).
struct Scope {
  absl::flat_hash_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
  const Value* Find(absl::string_view name) const;
};

class Interpreter {
 public:
  explicit Interpreter(const RenderLimits& limits) : limits_(limits) {}
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `tmpl` with `globals` (the builtins and the caller's variables)
  // as its outermost scope. Errors carry the line and column of the construct
  // that failed; raise_exception's message comes through unchanged.
  absl::StatusOr<std::string> Render(const Template& tmpl, std::shared_ptr<Scope> globals);

  // ---- For builtins ----

  const RenderLimits& limits() const { return limits_; }
  // Spends work units; ResourceExhausted past max_steps.
  absl::Status Charge(int64_t units);
  // ResourceExhausted when a string of `bytes` would pass max_output_bytes;
  // charges its construction.
  absl::Status CheckString(size_t bytes);
  absl::StatusOr<Value> NewString(std::string s);
  // Builds a list (or tuple) or dict within max_value_weight and depth.
  absl::StatusOr<Value> NewList(ValueList items, bool tuple = false);
  absl::StatusOr<Value> NewDict(Dict dict);
  // Refuses values a container or namespace may not hold (namespaces: so
  // no cycle can form).
  absl::Status CheckStorable(const Value& v) const;

  absl::StatusOr<Value> CallValue(const Value& callee, CallArgs args);
  absl::StatusOr<Value> ApplyFilter(absl::string_view name, const Value& input, CallArgs args);
  absl::StatusOr<bool> ApplyTest(absl::string_view name, const Value& input, CallArgs args);

  // What InvokeMacro runs: a {% macro %} or a {% call %} block's caller().
  struct MacroBody {
    absl::string_view name;
    const std::vector<MacroParam>& params;
    const Body& body;
    bool catch_varargs = false;
    bool catch_kwargs = false;
  };
  // `macro`'s body with `args` bound to its parameters, in a scope under
  // `closure`; returns its output.
  absl::StatusOr<Value> InvokeMacro(const MacroBody& macro, const std::shared_ptr<Scope>& closure, CallArgs args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  absl::StatusOr<Flow> ExecBody(const Body& body);
  absl::StatusOr<Flow> Exec(const Stmt& stmt);
  absl::Status ExecFor(const ForStmt& stmt);
  absl::Status ExecSetBlock(const SetBlockStmt& stmt);
  absl::Status ExecCallBlock(const CallBlockStmt& stmt);
  absl::Status ExecFilterBlock(const FilterBlockStmt& stmt);
  absl::Status ExecWith(const WithStmt& stmt);
  absl::Status Assign(const Target& target, const Value& value);
  // Runs `body` in a child scope, capturing its output.
  absl::StatusOr<std::string> Capture(const Body& body);

  absl::StatusOr<Value> Eval(const Expr& expr);
  absl::StatusOr<Value> EvalInner(const Expr& expr);
  absl::StatusOr<Value> EvalList(const ListExpr& expr);
  absl::StatusOr<Value> EvalDict(const DictExpr& expr);
  absl::StatusOr<Value> EvalSlice(const SliceExpr& expr);
  absl::StatusOr<Value> EvalCall(const CallExpr& expr);
  // `input` replaces the innermost operand when the chain starts a block.
  absl::StatusOr<Value> EvalFilter(const FilterExpr& expr, const Value* input);
  absl::StatusOr<Value> EvalTest(const TestExpr& expr);
  absl::StatusOr<Value> EvalCompare(const CompareExpr& expr);
  absl::StatusOr<CallArgs> EvalArguments(const Arguments& args);

  absl::Status Write(absl::string_view text);
  // The current scope, kept by a macro or caller() being defined: such
  // scopes can hold their own closure (a macro in the scope it was defined
  // in), a reference cycle that Render breaks when it ends.
  std::shared_ptr<Scope> ClosureScope();
  void BreakClosureCycles();

  const RenderLimits& limits_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  std::shared_ptr<Scope> scope_;
  std::vector<std::weak_ptr<Scope>> closure_scopes_;  // deduplicated; one per scope that defined a macro
  std::vector<std::string> outputs_;  // innermost capture last
  size_t live_output_bytes_ = 0;      // across outputs_
};

// Python binary operators and `in` on values (shared with filters such as
// sum). InvalidArgument with Python's TypeError text on mismatched types.
absl::StatusOr<Value> BinaryOperation(Interpreter& interpreter, BinaryOp op, const Value& a, const Value& b);
absl::StatusOr<bool> Contains(Interpreter& interpreter, const Value& container, const Value& item);
// The items a for loop, list() or join see: list items, dict keys, string
// characters; nothing for undefined; InvalidArgument otherwise.
absl::StatusOr<ValueList> Iterate(Interpreter& interpreter, const Value& value);

}  // namespace tandem::jinja
