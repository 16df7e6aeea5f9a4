// The parsed template: expression and statement nodes, each with the
// position it came from. Built once by ParseTemplate, then only read (by any
// number of renders at once).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/chat/jinja_lexer.h"
#include "common/chat/jinja_value.h"

namespace tandem::jinja {

// ---- Expressions ----

enum class ExprKind {
  kLiteral,  // 1, "a", true, none
  kName,     // messages
  kList,     // [a, b] and (a, b)
  kDict,     // {k: v}
  kGetAttr,  // a.b
  kGetItem,  // a[b]
  kSlice,    // a[b:c:d]
  kCall,     // f(x, y=z)
  kFilter,   // x | f(y)
  kTest,     // x is defined
  kUnary,    // -x, +x
  kBinary,   // + - * / // % **
  kConcat,   // a ~ b ~ c
  kCompare,  // a < b == c, in, not in
  kAnd,
  kOr,
  kNot,
  kCondition,  // a if b else c
};

struct Expr {
  Expr(ExprKind kind, SourcePos pos) : kind(kind), pos(pos) {}
  virtual ~Expr() = default;
  const ExprKind kind;
  const SourcePos pos;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct LiteralExpr : Expr {
  LiteralExpr(SourcePos pos, Value value) : Expr(ExprKind::kLiteral, pos), value(std::move(value)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(SourcePos pos, std::string name) : Expr(ExprKind::kName, pos), name(std::move(name)) {}
  std::string name;
};

struct ListExpr : Expr {
  ListExpr(SourcePos pos, bool tuple) : Expr(ExprKind::kList, pos), tuple(tuple) {}
  bool tuple;
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(SourcePos pos) : Expr(ExprKind::kDict, pos) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(SourcePos pos, ExprPtr object, std::string name)
      : Expr(ExprKind::kGetAttr, pos), object(std::move(object)), name(std::move(name)) {}
  ExprPtr object;
  std::string name;
};

struct GetItemExpr : Expr {
  GetItemExpr(SourcePos pos, ExprPtr object, ExprPtr key)
      : Expr(ExprKind::kGetItem, pos), object(std::move(object)), key(std::move(key)) {}
  ExprPtr object;
  ExprPtr key;
};

struct SliceExpr : Expr {  // a[start:stop:step]; any bound may be null
  explicit SliceExpr(SourcePos pos) : Expr(ExprKind::kSlice, pos) {}
  ExprPtr object;
  ExprPtr start, stop, step;
};

struct CallExpr : Expr {
  CallExpr(SourcePos pos, ExprPtr callee) : Expr(ExprKind::kCall, pos), callee(std::move(callee)) {}
  ExprPtr callee;
  Arguments args;
};

// `operand | name(args)`. In `{% filter %}` and `{% set x | f %}` the first
// filter of the chain has no operand: it takes the block's text.
struct FilterExpr : Expr {
  FilterExpr(SourcePos pos, ExprPtr operand, std::string name)
      : Expr(ExprKind::kFilter, pos), operand(std::move(operand)), name(std::move(name)) {}
  ExprPtr operand;
  std::string name;
  Arguments args;
};

struct TestExpr : Expr {
  TestExpr(SourcePos pos, ExprPtr operand, std::string name)
      : Expr(ExprKind::kTest, pos), operand(std::move(operand)), name(std::move(name)) {}
  ExprPtr operand;
  std::string name;
  Arguments args;
};

struct UnaryExpr : Expr {
  UnaryExpr(SourcePos pos, char op, ExprPtr operand)
      : Expr(ExprKind::kUnary, pos), op(op), operand(std::move(operand)) {}
  char op;  // '-' or '+'
  ExprPtr operand;
};

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };

struct BinaryExpr : Expr {
  BinaryExpr(SourcePos pos, BinaryOp op, ExprPtr left, ExprPtr right)
      : Expr(ExprKind::kBinary, pos), op(op), left(std::move(left)), right(std::move(right)) {}
  BinaryOp op;
  ExprPtr left, right;
};

struct ConcatExpr : Expr {
  explicit ConcatExpr(SourcePos pos) : Expr(ExprKind::kConcat, pos) {}
  std::vector<ExprPtr> parts;
};

enum class CompareOp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct CompareExpr : Expr {
  CompareExpr(SourcePos pos, ExprPtr first) : Expr(ExprKind::kCompare, pos), first(std::move(first)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;  // a < b < c: Python chaining
};

struct LogicalExpr : Expr {  // kAnd, kOr
  LogicalExpr(ExprKind kind, SourcePos pos, ExprPtr left, ExprPtr right)
      : Expr(kind, pos), left(std::move(left)), right(std::move(right)) {}
  ExprPtr left, right;
};

struct NotExpr : Expr {
  NotExpr(SourcePos pos, ExprPtr operand) : Expr(ExprKind::kNot, pos), operand(std::move(operand)) {}
  ExprPtr operand;
};

struct ConditionExpr : Expr {  // then_expr if test else else_expr
  explicit ConditionExpr(SourcePos pos) : Expr(ExprKind::kCondition, pos) {}
  ExprPtr test, then_expr, else_expr;  // else_expr may be null: undefined
};

// ---- Statements ----

enum class StmtKind {
  kData,    // template text
  kOutput,  // {{ expr }}
  kIf,
  kFor,
  kSet,       // {% set target = expr %}
  kSetBlock,  // {% set target %}...{% endset %}
  kMacro,
  kCallBlock,    // {% call macro() %}...{% endcall %}
  kFilterBlock,  // {% filter f %}...{% endfilter %}
  kWith,
  kBreak,
  kContinue,
  kGeneration,  // {% generation %}: transformers' assistant-mask marker; renders its body
};

struct Stmt {
  Stmt(StmtKind kind, SourcePos pos) : kind(kind), pos(pos) {}
  virtual ~Stmt() = default;
  const StmtKind kind;
  const SourcePos pos;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// What a set, for or with assigns to: a name, a tuple of targets (unpacking)
// or a namespace attribute (`ns.count`, set only).
struct Target {
  enum class Kind { kName, kTuple, kAttribute };
  Kind kind = Kind::kName;
  SourcePos pos;
  std::string name;           // kName, and the namespace's name for kAttribute
  std::string attribute;      // kAttribute
  std::vector<Target> items;  // kTuple
};

struct DataStmt : Stmt {
  DataStmt(SourcePos pos, std::string text) : Stmt(StmtKind::kData, pos), text(std::move(text)) {}
  std::string text;
};

struct OutputStmt : Stmt {
  OutputStmt(SourcePos pos, ExprPtr expr) : Stmt(StmtKind::kOutput, pos), expr(std::move(expr)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(SourcePos pos) : Stmt(StmtKind::kIf, pos) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, then each elif
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(SourcePos pos) : Stmt(StmtKind::kFor, pos) {}
  Target target;
  ExprPtr iterable;
  ExprPtr filter;  // `for x in xs if cond`; may be null
  Body body;
  Body else_body;          // runs when no item passed the filter
  bool uses_loop = false;  // the body names `loop`: only then is it built
};

struct SetStmt : Stmt {
  explicit SetStmt(SourcePos pos) : Stmt(StmtKind::kSet, pos) {}
  Target target;
  ExprPtr value;
};

struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(SourcePos pos) : Stmt(StmtKind::kSetBlock, pos) {}
  Target target;
  ExprPtr filter;  // chain applied to the captured text; may be null
  Body body;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required (undefined when missing, as in jinja2)
};

struct MacroStmt : Stmt {
  explicit MacroStmt(SourcePos pos) : Stmt(StmtKind::kMacro, pos) {}
  std::string name;
  std::vector<MacroParam> params;
  Body body;
  // jinja2: a body that names `varargs` / `kwargs` takes extra positional /
  // keyword arguments into them (a tuple / a dict); otherwise extras fail.
  bool catch_varargs = false;
  bool catch_kwargs = false;
};

struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(SourcePos pos) : Stmt(StmtKind::kCallBlock, pos) {}
  std::vector<MacroParam> caller_params;  // {% call(a, b) m() %}
  ExprPtr call;                           // a CallExpr
  Body body;                              // what caller() renders
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(SourcePos pos) : Stmt(StmtKind::kFilterBlock, pos) {}
  ExprPtr filter;
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(SourcePos pos) : Stmt(StmtKind::kWith, pos) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

struct BodyStmt : Stmt {  // kBreak, kContinue (empty body), kGeneration
  BodyStmt(StmtKind kind, SourcePos pos) : Stmt(kind, pos) {}
  Body body;
};

struct Template {
  Body body;
};

}  // namespace tandem::jinja
