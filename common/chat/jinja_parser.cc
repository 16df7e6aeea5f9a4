#include "common/chat/jinja_parser.h"

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_builtins.h"

namespace tandem::jinja {
namespace {

// Tags jinja2 has that chat templates do not need; named in the error.
constexpr absl::string_view kUnsupportedTags[] = {"extends",    "block", "include", "import",   "from",
                                                  "autoescape", "do",    "trans",   "pluralize"};

class Parser {
 public:
  Parser(const SourceText& source, std::vector<Token> tokens, const ParseOptions& options)
      : source_(source), tokens_(std::move(tokens)), options_(options) {}

  absl::StatusOr<std::unique_ptr<Template>> Run() {
    auto tmpl = std::make_unique<Template>();
    std::string end_tag;
    TANDEM_ASSIGN_OR_RETURN(tmpl->body, ParseBody({}, &end_tag));
    return tmpl;
  }

 private:
  // ---- Token stream ----

  const Token& Current() const { return tokens_[index_]; }
  const Token& Peek(size_t ahead = 1) const { return tokens_[std::min(index_ + ahead, tokens_.size() - 1)]; }
  void Advance() {
    if (index_ + 1 < tokens_.size()) ++index_;
  }
  SourcePos Pos(const Token& token) const { return source_.Locate(token.offset); }
  SourcePos Pos() const { return Pos(Current()); }

  bool IsName(absl::string_view name, const Token& token) const {
    return token.kind == TokenKind::kName && token.text == name;
  }
  bool IsName(absl::string_view name) const { return IsName(name, Current()); }
  bool IsOp(absl::string_view op) const { return Current().kind == TokenKind::kOperator && Current().text == op; }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(absl::string_view name) {
    if (!IsName(name)) return false;
    Advance();
    return true;
  }

  static std::string Describe(const Token& token) {
    switch (token.kind) {
      case TokenKind::kData: return "template text";
      case TokenKind::kVariableBegin: return "'{{'";
      case TokenKind::kVariableEnd: return "'}}'";
      case TokenKind::kBlockBegin: return "'{%'";
      case TokenKind::kBlockEnd: return "'%}'";
      case TokenKind::kName: return absl::StrCat("'", token.text, "'");
      case TokenKind::kString: return "a string";
      case TokenKind::kInteger:
      case TokenKind::kFloat: return absl::StrCat("number ", token.text);
      case TokenKind::kOperator: return absl::StrCat("'", token.text, "'");
      case TokenKind::kEnd: return "the end of the template";
    }
    return "a token";
  }

  absl::Status ErrorAt(SourcePos pos, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at ", Where(pos)));
  }
  absl::Status Unexpected(absl::string_view expected) const {
    return ErrorAt(Pos(), absl::StrCat("expected ", expected, ", got ", Describe(Current())));
  }
  absl::Status ExpectOp(absl::string_view op) {
    if (!SkipOp(op)) return Unexpected(absl::StrCat("'", op, "'"));
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Current().kind != TokenKind::kBlockEnd) return Unexpected("'%}'");
    Advance();
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Current().kind != TokenKind::kName) return Unexpected("a name");
    std::string name = Current().text;
    Advance();
    return name;
  }

  // Bounds the recursion of both the parser and the interpreter.
  class NestingGuard {
   public:
    explicit NestingGuard(Parser* parser) : parser_(parser) { ++parser_->nesting_; }
    ~NestingGuard() { --parser_->nesting_; }
    absl::Status Check() const {
      if (parser_->nesting_ > parser_->options_.max_nesting) {
        return parser_->ErrorAt(parser_->Pos(),
                                absl::StrCat("template nests deeper than ", parser_->options_.max_nesting, " levels"));
      }
      return absl::OkStatus();
    }

   private:
    Parser* parser_;
  };

  // ---- Statements ----

  // Statements until a block tag named in `end_tags` (left current, its name
  // in *end_tag) or the end of the template (an error when end_tags is not
  // empty).
  absl::StatusOr<Body> ParseBody(std::initializer_list<absl::string_view> end_tags, std::string* end_tag,
                                 SourcePos opened_at = {}, absl::string_view opened_by = "") {
    NestingGuard guard(this);
    TANDEM_RETURN_IF_ERROR(guard.Check());
    Body body;
    while (true) {
      const Token& token = Current();
      switch (token.kind) {
        case TokenKind::kData:
          body.push_back(std::make_unique<DataStmt>(Pos(), token.text));
          Advance();
          break;
        case TokenKind::kVariableBegin: {
          Advance();
          const SourcePos pos = Pos();
          TANDEM_ASSIGN_OR_RETURN(ExprPtr expr, ParseTuple(/*with_condition=*/true));
          if (Current().kind != TokenKind::kVariableEnd) return Unexpected("'}}'");
          Advance();
          body.push_back(std::make_unique<OutputStmt>(pos, std::move(expr)));
          break;
        }
        case TokenKind::kBlockBegin: {
          Advance();
          if (Current().kind == TokenKind::kName) {
            for (absl::string_view end : end_tags) {
              if (Current().text == end) {
                *end_tag = Current().text;
                return body;
              }
            }
          }
          TANDEM_ASSIGN_OR_RETURN(StmtPtr stmt, ParseStatement());
          TANDEM_RETURN_IF_ERROR(ExpectBlockEnd());
          body.push_back(std::move(stmt));
          break;
        }
        case TokenKind::kEnd:
          if (end_tags.size() == 0) return body;
          return ErrorAt(opened_at,
                         absl::StrCat("unclosed '{% ", opened_by, " %}' (expected '{% ",
                                      absl::StrJoin(end_tags, " %}' or '{% "), " %}' before the end of the template)"));
        default: return Unexpected("template text or a tag");
      }
    }
  }

  // The tag name is current (after '{%'); leaves the '%}' current.
  absl::StatusOr<StmtPtr> ParseStatement() {
    if (Current().kind != TokenKind::kName) return Unexpected("a tag name");
    const std::string tag = Current().text;
    const SourcePos pos = Pos();
    if (tag == "if") return ParseIf(pos);
    if (tag == "for") return ParseFor(pos);
    if (tag == "set") return ParseSet(pos);
    if (tag == "macro") return ParseMacro(pos);
    if (tag == "call") return ParseCallBlock(pos);
    if (tag == "filter") return ParseFilterBlock(pos);
    if (tag == "with") return ParseWith(pos);
    if (tag == "print") return ParsePrint(pos);
    if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) return ErrorAt(pos, absl::StrCat("'{% ", tag, " %}' outside a for loop"));
      Advance();
      return std::make_unique<BodyStmt>(tag == "break" ? StmtKind::kBreak : StmtKind::kContinue, pos);
    }
    if (tag == "generation") {
      Advance();
      auto stmt = std::make_unique<BodyStmt>(StmtKind::kGeneration, pos);
      TANDEM_ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endgeneration"}, pos, "generation"));
      return stmt;
    }
    for (absl::string_view unsupported : kUnsupportedTags) {
      if (tag == unsupported) return ErrorAt(pos, absl::StrCat("unsupported tag '{% ", tag, " %}'"));
    }
    if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else") {
      return ErrorAt(pos, absl::StrCat("unexpected '{% ", tag, " %}' (no open block it closes)"));
    }
    return ErrorAt(pos, absl::StrCat("unknown tag '{% ", tag, " %}'"));
  }

  // {% print a, b %} writes each expression (not a tuple).
  absl::StatusOr<StmtPtr> ParsePrint(SourcePos pos) {
    Advance();
    auto block = std::make_unique<BodyStmt>(StmtKind::kGeneration, pos);
    while (Current().kind != TokenKind::kBlockEnd) {
      if (!block->body.empty()) TANDEM_RETURN_IF_ERROR(ExpectOp(","));
      const SourcePos expr_pos = Pos();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr expr, ParseExpression(true));
      block->body.push_back(std::make_unique<OutputStmt>(expr_pos, std::move(expr)));
    }
    return block;
  }

  // '%}', statements, then `{% end %}` (consumed up to its '%}' exclusive).
  absl::StatusOr<Body> ParseBlockBody(std::initializer_list<absl::string_view> end_tags, SourcePos opened_at,
                                      absl::string_view opened_by, std::string* end_tag_out = nullptr) {
    TANDEM_RETURN_IF_ERROR(ExpectBlockEnd());
    std::string end_tag;
    TANDEM_ASSIGN_OR_RETURN(Body body, ParseBody(end_tags, &end_tag, opened_at, opened_by));
    Advance();  // the end tag's name
    if (end_tag_out != nullptr) *end_tag_out = end_tag;
    return body;
  }

  absl::StatusOr<StmtPtr> ParseIf(SourcePos pos) {
    auto stmt = std::make_unique<IfStmt>(pos);
    Advance();
    while (true) {
      TANDEM_ASSIGN_OR_RETURN(ExprPtr test, ParseTuple(/*with_condition=*/false));
      std::string end_tag;
      TANDEM_ASSIGN_OR_RETURN(Body body, ParseBlockBody({"elif", "else", "endif"}, pos, "if", &end_tag));
      stmt->branches.emplace_back(std::move(test), std::move(body));
      if (end_tag == "elif") continue;
      if (end_tag == "else") {
        TANDEM_ASSIGN_OR_RETURN(stmt->else_body, ParseBlockBody({"endif"}, pos, "if"));
      }
      return stmt;
    }
  }

  absl::StatusOr<StmtPtr> ParseFor(SourcePos pos) {
    auto stmt = std::make_unique<ForStmt>(pos);
    Advance();
    TANDEM_ASSIGN_OR_RETURN(stmt->target, ParseTarget(/*allow_tuple=*/true, /*allow_attribute=*/false));
    if (!SkipName("in")) return Unexpected("'in'");
    TANDEM_ASSIGN_OR_RETURN(stmt->iterable, ParseTuple(/*with_condition=*/false, {"recursive"}));
    if (SkipName("if")) {
      TANDEM_ASSIGN_OR_RETURN(stmt->filter, ParseExpression(true));
    }
    if (IsName("recursive")) return ErrorAt(Pos(), "unsupported recursive for loop ('recursive')");
    ++loop_depth_;
    names_used_.emplace_back();
    std::string end_tag;
    absl::StatusOr<Body> body = ParseBlockBody({"endfor", "else"}, pos, "for", &end_tag);
    --loop_depth_;
    absl::flat_hash_set<std::string> used = std::move(names_used_.back());
    names_used_.pop_back();
    if (!body.ok()) return body.status();
    stmt->body = std::move(*body);
    stmt->uses_loop = used.contains("loop");
    if (!names_used_.empty()) names_used_.back().insert(used.begin(), used.end());
    if (end_tag == "else") {
      TANDEM_ASSIGN_OR_RETURN(stmt->else_body, ParseBlockBody({"endfor"}, pos, "for"));
    }
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseSet(SourcePos pos) {
    Advance();
    TANDEM_ASSIGN_OR_RETURN(Target target, ParseTarget(/*allow_tuple=*/true, /*allow_attribute=*/true));
    if (SkipOp("=")) {
      auto stmt = std::make_unique<SetStmt>(pos);
      stmt->target = std::move(target);
      TANDEM_ASSIGN_OR_RETURN(stmt->value, ParseTuple(/*with_condition=*/true));
      return stmt;
    }
    auto stmt = std::make_unique<SetBlockStmt>(pos);
    stmt->target = std::move(target);
    if (IsOp("|")) {
      Advance();
      TANDEM_ASSIGN_OR_RETURN(stmt->filter, ParseFilterChain(nullptr));
    }
    TANDEM_ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endset"}, pos, "set"));
    return stmt;
  }

  absl::StatusOr<std::vector<MacroParam>> ParseSignature() {
    std::vector<MacroParam> params;
    TANDEM_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!params.empty()) TANDEM_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(")")) break;
      MacroParam param;
      TANDEM_ASSIGN_OR_RETURN(param.name, ExpectName());
      if (SkipOp("=")) {
        TANDEM_ASSIGN_OR_RETURN(param.default_value, ParseExpression(true));
      } else if (!params.empty() && params.back().default_value != nullptr) {
        return ErrorAt(Pos(), "non-default argument follows default argument");
      }
      params.push_back(std::move(param));
    }
    Advance();
    return params;
  }

  absl::StatusOr<StmtPtr> ParseMacro(SourcePos pos) {
    auto stmt = std::make_unique<MacroStmt>(pos);
    Advance();
    TANDEM_ASSIGN_OR_RETURN(stmt->name, ExpectName());
    TANDEM_ASSIGN_OR_RETURN(stmt->params, ParseSignature());
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;  // a macro body is not inside the caller's loop
    names_used_.emplace_back();
    absl::StatusOr<Body> body = ParseBlockBody({"endmacro"}, pos, "macro");
    loop_depth_ = saved_loops;
    absl::flat_hash_set<std::string> used = std::move(names_used_.back());
    names_used_.pop_back();
    if (!body.ok()) return body.status();
    stmt->body = std::move(*body);
    stmt->catch_varargs = used.contains("varargs");
    stmt->catch_kwargs = used.contains("kwargs");
    if (!names_used_.empty()) names_used_.back().insert(used.begin(), used.end());
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseCallBlock(SourcePos pos) {
    auto stmt = std::make_unique<CallBlockStmt>(pos);
    Advance();
    if (IsOp("(")) {
      TANDEM_ASSIGN_OR_RETURN(stmt->caller_params, ParseSignature());
    }
    TANDEM_ASSIGN_OR_RETURN(stmt->call, ParseExpression(true));
    if (stmt->call->kind != ExprKind::kCall) return ErrorAt(pos, "'{% call %}' needs a call such as m(x)");
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    absl::StatusOr<Body> body = ParseBlockBody({"endcall"}, pos, "call");
    loop_depth_ = saved_loops;
    if (!body.ok()) return body.status();
    stmt->body = std::move(*body);
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseFilterBlock(SourcePos pos) {
    auto stmt = std::make_unique<FilterBlockStmt>(pos);
    Advance();
    TANDEM_ASSIGN_OR_RETURN(stmt->filter, ParseFilterChain(nullptr));
    TANDEM_ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endfilter"}, pos, "filter"));
    return stmt;
  }

  absl::StatusOr<StmtPtr> ParseWith(SourcePos pos) {
    auto stmt = std::make_unique<WithStmt>(pos);
    Advance();
    while (Current().kind != TokenKind::kBlockEnd) {
      if (!stmt->assignments.empty()) TANDEM_RETURN_IF_ERROR(ExpectOp(","));
      TANDEM_ASSIGN_OR_RETURN(Target target, ParseTarget(/*allow_tuple=*/true, /*allow_attribute=*/false));
      TANDEM_RETURN_IF_ERROR(ExpectOp("="));
      TANDEM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      stmt->assignments.emplace_back(std::move(target), std::move(value));
    }
    TANDEM_ASSIGN_OR_RETURN(stmt->body, ParseBlockBody({"endwith"}, pos, "with"));
    return stmt;
  }

  // A name, `ns.attr` (set only), or names and parenthesised groups
  // separated by commas (unpacking).
  absl::StatusOr<Target> ParseTarget(bool allow_tuple, bool allow_attribute) {
    NestingGuard guard(this);
    TANDEM_RETURN_IF_ERROR(guard.Check());
    if (allow_attribute && Current().kind == TokenKind::kName && Peek().kind == TokenKind::kOperator &&
        Peek().text == ".") {
      Target target{.kind = Target::Kind::kAttribute, .pos = Pos(), .name = Current().text};
      Advance();
      Advance();
      TANDEM_ASSIGN_OR_RETURN(target.attribute, ExpectName());
      return target;
    }
    Target tuple{.kind = Target::Kind::kTuple, .pos = Pos()};
    bool saw_comma = false;
    while (true) {
      Target item;
      if (SkipOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(item, ParseTarget(true, false));
        TANDEM_RETURN_IF_ERROR(ExpectOp(")"));
      } else {
        if (Current().kind != TokenKind::kName) return Unexpected("a variable name to assign to");
        item = Target{.kind = Target::Kind::kName, .pos = Pos(), .name = Current().text};
        if (item.name == "true" || item.name == "false" || item.name == "none" || item.name == "True" ||
            item.name == "False" || item.name == "None") {
          return ErrorAt(item.pos, absl::StrCat("cannot assign to constant '", item.name, "'"));
        }
        Advance();
      }
      tuple.items.push_back(std::move(item));
      if (!allow_tuple || !IsOp(",")) break;
      Advance();
      saw_comma = true;
      if (IsName("in") || IsOp("=") || IsOp(")") || Current().kind == TokenKind::kBlockEnd) break;  // trailing comma
    }
    if (!saw_comma) return std::move(tuple.items[0]);
    return tuple;
  }

  // ---- Expressions ----

  // Expressions separated by commas make a tuple: `{{ a, b }}`, `set x = 1, 2`.
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condition, std::initializer_list<absl::string_view> extra_ends = {}) {
    const SourcePos pos = Pos();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) TANDEM_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(extra_ends)) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condition));
      items.push_back(std::move(item));
      if (!IsOp(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (items.empty()) return Unexpected("an expression");
      return std::move(items[0]);
    }
    auto tuple = std::make_unique<ListExpr>(pos, /*tuple=*/true);
    tuple->items = std::move(items);
    return tuple;
  }

  bool IsTupleEnd(std::initializer_list<absl::string_view> extra_ends) const {
    const TokenKind kind = Current().kind;
    if (kind == TokenKind::kVariableEnd || kind == TokenKind::kBlockEnd || IsOp(")")) return true;
    for (absl::string_view end : extra_ends) {
      if (IsName(end)) return true;
    }
    return false;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condition) {
    NestingGuard guard(this);
    TANDEM_RETURN_IF_ERROR(guard.Check());
    if (!with_condition) return ParseOr();
    const SourcePos pos = Pos();
    TANDEM_ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (SkipName("if")) {
      auto cond = std::make_unique<ConditionExpr>(pos);
      cond->then_expr = std::move(expr);
      TANDEM_ASSIGN_OR_RETURN(cond->test, ParseOr());
      if (SkipName("else")) {
        TANDEM_ASSIGN_OR_RETURN(cond->else_expr, ParseExpression(true));
      }
      expr = std::move(cond);
    }
    return expr;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const SourcePos pos = Pos();
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = std::make_unique<LogicalExpr>(ExprKind::kOr, pos, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const SourcePos pos = Pos();
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = std::make_unique<LogicalExpr>(ExprKind::kAnd, pos, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      NestingGuard guard(this);
      TANDEM_RETURN_IF_ERROR(guard.Check());
      const SourcePos pos = Pos();
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      return std::make_unique<NotExpr>(pos, std::move(operand));
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const SourcePos pos = Pos();
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::unique_ptr<CompareExpr> compare;
    while (true) {
      CompareOp op;
      const Token& token = Current();
      if (token.kind == TokenKind::kOperator && token.text == "==") {
        op = CompareOp::kEq;
      } else if (token.kind == TokenKind::kOperator && token.text == "!=") {
        op = CompareOp::kNe;
      } else if (token.kind == TokenKind::kOperator && token.text == "<") {
        op = CompareOp::kLt;
      } else if (token.kind == TokenKind::kOperator && token.text == "<=") {
        op = CompareOp::kLe;
      } else if (token.kind == TokenKind::kOperator && token.text == ">") {
        op = CompareOp::kGt;
      } else if (token.kind == TokenKind::kOperator && token.text == ">=") {
        op = CompareOp::kGe;
      } else if (IsName("in")) {
        op = CompareOp::kIn;
      } else if (IsName("not") && IsName("in", Peek())) {
        op = CompareOp::kNotIn;
        Advance();
      } else {
        break;
      }
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      if (compare == nullptr) compare = std::make_unique<CompareExpr>(pos, std::move(first));
      compare->rest.emplace_back(op, std::move(operand));
    }
    if (compare == nullptr) return first;
    return compare;
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const SourcePos pos = Pos();
      const BinaryOp op = IsOp("+") ? BinaryOp::kAdd : BinaryOp::kSub;
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      left = std::make_unique<BinaryExpr>(pos, op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const SourcePos pos = Pos();
    TANDEM_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    auto concat = std::make_unique<ConcatExpr>(pos);
    concat->parts.push_back(std::move(first));
    while (SkipOp("~")) {
      TANDEM_ASSIGN_OR_RETURN(ExprPtr part, ParseMath2());
      concat->parts.push_back(std::move(part));
    }
    return concat;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const SourcePos pos = Pos();
      const std::string& text = Current().text;
      const BinaryOp op = text == "*"    ? BinaryOp::kMul
                          : text == "/"  ? BinaryOp::kDiv
                          : text == "//" ? BinaryOp::kFloorDiv
                                         : BinaryOp::kMod;
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      left = std::make_unique<BinaryExpr>(pos, op, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    TANDEM_ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp("**")) {
      const SourcePos pos = Pos();
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      left = std::make_unique<BinaryExpr>(pos, BinaryOp::kPow, std::move(left), std::move(right));
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    NestingGuard guard(this);
    TANDEM_RETURN_IF_ERROR(guard.Check());
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const SourcePos pos = Pos();
      const char op = Current().text[0];
      Advance();
      TANDEM_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = std::make_unique<UnaryExpr>(pos, op, std::move(operand));
    } else {
      TANDEM_ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    TANDEM_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      TANDEM_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& token = Current();
    const SourcePos pos = Pos();
    switch (token.kind) {
      case TokenKind::kName: {
        ExprPtr node;
        if (token.text == "true" || token.text == "True") {
          node = std::make_unique<LiteralExpr>(pos, Value::Bool(true));
        } else if (token.text == "false" || token.text == "False") {
          node = std::make_unique<LiteralExpr>(pos, Value::Bool(false));
        } else if (token.text == "none" || token.text == "None") {
          node = std::make_unique<LiteralExpr>(pos, Value::None());
        } else {
          if (!names_used_.empty()) names_used_.back().insert(token.text);
          node = std::make_unique<NameExpr>(pos, token.text);
        }
        Advance();
        return node;
      }
      case TokenKind::kString: {
        std::string text;
        while (Current().kind == TokenKind::kString) {  // adjacent literals join, as in Python
          text += Current().text;
          Advance();
        }
        return std::make_unique<LiteralExpr>(pos, Value::String(std::move(text)));
      }
      case TokenKind::kInteger: Advance(); return std::make_unique<LiteralExpr>(pos, Value::Int(token.int_value));
      case TokenKind::kFloat: Advance(); return std::make_unique<LiteralExpr>(pos, Value::Float(token.float_value));
      case TokenKind::kOperator:
        if (token.text == "(") {
          Advance();
          if (IsOp(")")) {  // ()
            Advance();
            return std::make_unique<ListExpr>(pos, /*tuple=*/true);
          }
          TANDEM_ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(true));
          TANDEM_RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (token.text == "[") return ParseList(pos);
        if (token.text == "{") return ParseDict(pos);
        break;
      default: break;
    }
    return Unexpected("an expression");
  }

  absl::StatusOr<ExprPtr> ParseList(SourcePos pos) {
    Advance();
    auto list = std::make_unique<ListExpr>(pos, /*tuple=*/false);
    while (!IsOp("]")) {
      if (!list->items.empty()) TANDEM_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      list->items.push_back(std::move(item));
    }
    Advance();
    return list;
  }

  absl::StatusOr<ExprPtr> ParseDict(SourcePos pos) {
    Advance();
    auto dict = std::make_unique<DictExpr>(pos);
    while (!IsOp("}")) {
      if (!dict->items.empty()) TANDEM_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      TANDEM_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      TANDEM_RETURN_IF_ERROR(ExpectOp(":"));
      TANDEM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      dict->items.emplace_back(std::move(key), std::move(value));
    }
    Advance();
    return dict;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        TANDEM_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        Advance();
        TANDEM_ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node)));
      } else if (IsName("is")) {
        TANDEM_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const SourcePos pos = Pos();
    if (SkipOp(".")) {
      if (Current().kind == TokenKind::kName) {
        std::string name = Current().text;
        Advance();
        return std::make_unique<GetAttrExpr>(pos, std::move(node), std::move(name));
      }
      if (Current().kind == TokenKind::kInteger) {  // x.0 is x[0]
        auto key = std::make_unique<LiteralExpr>(Pos(), Value::Int(Current().int_value));
        Advance();
        return std::make_unique<GetItemExpr>(pos, std::move(node), std::move(key));
      }
      return Unexpected("an attribute name or number after '.'");
    }
    Advance();  // '['
    std::vector<ExprPtr> keys;
    std::unique_ptr<SliceExpr> slice;
    while (!IsOp("]")) {
      if (!keys.empty() || slice != nullptr) TANDEM_RETURN_IF_ERROR(ExpectOp(","));
      ExprPtr key;
      if (!IsOp(":")) {
        TANDEM_ASSIGN_OR_RETURN(key, ParseExpression(true));
      }
      if (!IsOp(":")) {
        if (slice != nullptr) return ErrorAt(pos, "unsupported subscript mixing a slice and other keys");
        keys.push_back(std::move(key));
        continue;
      }
      if (!keys.empty() || slice != nullptr) return ErrorAt(pos, "unsupported subscript with several slices");
      slice = std::make_unique<SliceExpr>(pos);
      slice->start = std::move(key);
      Advance();  // ':'
      if (!IsOp(":") && !IsOp("]") && !IsOp(",")) {
        TANDEM_ASSIGN_OR_RETURN(slice->stop, ParseExpression(true));
      }
      if (SkipOp(":")) {
        if (!IsOp("]") && !IsOp(",")) {
          TANDEM_ASSIGN_OR_RETURN(slice->step, ParseExpression(true));
        }
      }
    }
    Advance();  // ']'
    if (slice != nullptr) {
      if (!keys.empty()) return ErrorAt(pos, "unsupported subscript mixing a slice and other keys");
      slice->object = std::move(node);
      return slice;
    }
    if (keys.empty()) return ErrorAt(pos, "empty subscript '[]'");
    ExprPtr key;
    if (keys.size() == 1) {
      key = std::move(keys[0]);
    } else {
      auto tuple = std::make_unique<ListExpr>(pos, /*tuple=*/true);
      tuple->items = std::move(keys);
      key = std::move(tuple);
    }
    return std::make_unique<GetItemExpr>(pos, std::move(node), std::move(key));
  }

  absl::StatusOr<Arguments> ParseArguments() {
    const SourcePos pos = Pos();
    Advance();  // '('
    Arguments args;
    while (!IsOp(")")) {
      if (!args.positional.empty() || !args.keyword.empty()) {
        TANDEM_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (IsOp("*") || IsOp("**")) return ErrorAt(Pos(), "unsupported *args / **kwargs in a call");
      if (Current().kind == TokenKind::kName && Peek().kind == TokenKind::kOperator && Peek().text == "=") {
        std::string name = Current().text;
        Advance();
        Advance();
        TANDEM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args.keyword.emplace_back(std::move(name), std::move(value));
      } else {
        if (!args.keyword.empty()) return ErrorAt(pos, "positional argument follows keyword argument");
        TANDEM_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args.positional.push_back(std::move(value));
      }
    }
    Advance();  // ')'
    return args;
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto call = std::make_unique<CallExpr>(Pos(), std::move(callee));
    TANDEM_ASSIGN_OR_RETURN(call->args, ParseArguments());
    return call;
  }

  absl::StatusOr<std::string> ParseDottedName() {
    TANDEM_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (SkipOp(".")) {
      TANDEM_ASSIGN_OR_RETURN(std::string part, ExpectName());
      absl::StrAppend(&name, ".", part);
    }
    return name;
  }

  // After '|': name(args) | name ... ; `operand` null for filter blocks.
  absl::StatusOr<ExprPtr> ParseFilterChain(ExprPtr operand) {
    while (true) {
      const SourcePos pos = Pos();
      TANDEM_ASSIGN_OR_RETURN(std::string name, ParseDottedName());
      if (!IsFilter(name)) return ErrorAt(pos, absl::StrCat("unsupported filter '", name, "'"));
      auto filter = std::make_unique<FilterExpr>(pos, std::move(operand), std::move(name));
      if (IsOp("(")) {
        TANDEM_ASSIGN_OR_RETURN(filter->args, ParseArguments());
      }
      operand = std::move(filter);
      if (!IsOp("|")) return operand;
      Advance();
    }
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr operand) {
    const SourcePos pos = Pos();
    Advance();  // 'is'
    const bool negated = SkipName("not");
    const SourcePos name_pos = Pos();
    TANDEM_ASSIGN_OR_RETURN(std::string name, ParseDottedName());
    if (!IsTest(name)) return ErrorAt(name_pos, absl::StrCat("unsupported test '", name, "'"));
    auto test = std::make_unique<TestExpr>(pos, std::move(operand), std::move(name));
    const Token& next = Current();
    if (IsOp("(")) {
      TANDEM_ASSIGN_OR_RETURN(test->args, ParseArguments());
    } else if ((next.kind == TokenKind::kName || next.kind == TokenKind::kString || next.kind == TokenKind::kInteger ||
                next.kind == TokenKind::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return ErrorAt(Pos(), "cannot chain tests with 'is'");
      // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
      TANDEM_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      TANDEM_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      test->args.positional.push_back(std::move(arg));
    }
    if (negated) return std::make_unique<NotExpr>(pos, std::move(test));
    return test;
  }

  const SourceText& source_;
  std::vector<Token> tokens_;
  const ParseOptions& options_;
  size_t index_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;                                        // for break/continue placement
  std::vector<absl::flat_hash_set<std::string>> names_used_;  // names read in each enclosing macro or for body
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> ParseTemplate(absl::string_view source, const ParseOptions& options) {
  SourceText text(source);
  TANDEM_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(text, options.lexer));
  return Parser(text, std::move(tokens), options).Run();
}

}  // namespace tandem::jinja
