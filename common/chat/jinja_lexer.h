// Template source -> tokens, on the rules of jinja2's lexer: newlines
// normalised to \n and one trailing newline dropped (keep_trailing_newline
// off); `{%- -%}`, `{{- -}}`, `{#- -#}` strip whitespace; trim_blocks drops
// the newline after a block or comment tag; lstrip_blocks strips the
// whitespace before one on its own line (`{%+` opts out); `{% raw %}` text
// passes through untouched.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::jinja {

struct LexerOptions {
  bool trim_blocks = true;  // as transformers' apply_chat_template sets it
  bool lstrip_blocks = true;
};

enum class TokenKind {
  kData,           // template text, emitted as is
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // text holds the unescaped value
  kInteger,
  kFloat,
  kOperator,  // text holds the operator: "+", "//", "==", "(", ...
  kEnd,       // end of template
};

struct Token {
  TokenKind kind;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  size_t offset = 0;  // into the normalised source
};

// 1-based line and column (in code points) of a byte offset.
struct SourcePos {
  int line = 1;
  int column = 1;
};

// The normalised source and its line starts, for positions in errors.
class SourceText {
 public:
  explicit SourceText(absl::string_view raw_source);
  const std::string& text() const { return text_; }
  SourcePos Locate(size_t offset) const;

 private:
  std::string text_;
  std::vector<size_t> line_starts_;
};

// InvalidArgument naming the line and column: an unclosed tag, comment,
// string or raw block, an unexpected character, unbalanced brackets.
absl::StatusOr<std::vector<Token>> Tokenize(const SourceText& source, const LexerOptions& options);

// "line 3 col 14"
std::string Where(SourcePos pos);

}  // namespace tandem::jinja
