// Tokens -> AST, on the grammar of jinja2's parser (precedence from loosest:
// `x if c else y`, or, and, not, comparisons and `in`, + -, ~, * / // %, **,
// unary - +, then postfix `.a [i] (args)` with `| filter` and `is test`).
//
// What it accepts: if/elif/else, for (with `if` filter, else, unpacking),
// set (name, tuple, `ns.attr`, block form with filters), macro (defaults),
// call blocks, filter blocks, with, break/continue, raw, comments and
// transformers' {% generation %}. Everything else jinja2 knows (extends,
// block, include, import, recursive loops, *args in calls) and every filter
// or test the interpreter lacks is refused here, at load time, by name:
// "unsupported filter 'xyz' at line 3 col 14".
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/chat/jinja_ast.h"
#include "common/chat/jinja_lexer.h"

namespace tandem::jinja {

struct ParseOptions {
  LexerOptions lexer;
  // Nesting of expressions and blocks: the parser and the interpreter
  // recurse once per level, so this bounds their stack.
  int max_nesting = 128;
};

// InvalidArgument naming the construct and its line and column.
absl::StatusOr<std::unique_ptr<Template>> ParseTemplate(absl::string_view source, const ParseOptions& options);

}  // namespace tandem::jinja
