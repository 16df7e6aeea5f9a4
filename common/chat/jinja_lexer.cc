#include "common/chat/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

bool IsNameStart(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80; }
bool IsNameChar(unsigned char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }
bool IsDigitChar(char c) { return c >= '0' && c <= '9'; }

// Python's unicode-escape decoding of a string literal's body (what jinja2
// applies to every string token). Unknown escapes keep their backslash.
absl::StatusOr<std::string> Unescape(absl::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char e = body[++i];
    auto hex = [&](int digits) -> absl::StatusOr<char32_t> {
      char32_t value = 0;
      for (int k = 1; k <= digits; ++k) {
        if (i + k >= body.size()) return absl::InvalidArgumentError("truncated \\x, \\u or \\U escape in a string");
        const char h = body[i + k];
        int d;
        if (h >= '0' && h <= '9') {
          d = h - '0';
        } else if (h >= 'a' && h <= 'f') {
          d = h - 'a' + 10;
        } else if (h >= 'A' && h <= 'F') {
          d = h - 'A' + 10;
        } else {
          return absl::InvalidArgumentError("truncated \\x, \\u or \\U escape in a string");
        }
        value = value * 16 + d;
      }
      i += digits;
      return value;
    };
    switch (e) {
      case '\n': break;  // line continuation
      case '\\': out.push_back('\\'); break;
      case '\'': out.push_back('\''); break;
      case '"': out.push_back('"'); break;
      case 'a': out.push_back('\a'); break;
      case 'b': out.push_back('\b'); break;
      case 'f': out.push_back('\f'); break;
      case 'n': out.push_back('\n'); break;
      case 'r': out.push_back('\r'); break;
      case 't': out.push_back('\t'); break;
      case 'v': out.push_back('\v'); break;
      case 'x':
      case 'u':
      case 'U': {
        absl::StatusOr<char32_t> c = hex(e == 'x' ? 2 : (e == 'u' ? 4 : 8));
        if (!c.ok()) return c.status();
        if (*c > 0x10FFFF) return absl::InvalidArgumentError("illegal Unicode character in a string escape");
        AppendUtf8(&out, *c);
        break;
      }
      case 'N': return absl::InvalidArgumentError("unsupported \\N{...} escape in a string");
      default:
        if (e >= '0' && e <= '7') {
          char32_t value = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k) {
            value = value * 8 + (body[++i] - '0');
          }
          AppendUtf8(&out, value);
        } else {
          out.push_back('\\');
          out.push_back(e);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(const SourceText& source, const LexerOptions& options)
      : source_(source), s_(source.text()), options_(options) {}

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < s_.size()) {
      const size_t tag = FindTagStart(pos_);
      if (tag == absl::string_view::npos) {
        Emit(TokenKind::kData, std::string(s_.substr(pos_)), pos_);
        break;
      }
      if (absl::Status status = LexTag(tag); !status.ok()) return status;
    }
    Emit(TokenKind::kEnd, "", s_.size());
    return std::move(tokens_);
  }

 private:
  enum class Tag { kComment, kBlock, kVariable };

  size_t FindTagStart(size_t from) const {
    for (size_t i = s_.find('{', from); i != absl::string_view::npos; i = s_.find('{', i + 1)) {
      if (i + 1 < s_.size() && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return absl::string_view::npos;
  }

  absl::Status Error(size_t offset, absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at ", Where(source_.Locate(offset))));
  }

  void Emit(TokenKind kind, std::string text, size_t offset) {
    tokens_.push_back(Token{.kind = kind, .text = std::move(text), .offset = offset});
  }

  size_t SkipSpaces(size_t at) const {
    while (at < s_.size()) {
      size_t next = at;
      if (!IsPythonSpace(DecodeUtf8(s_, &next))) break;
      at = next;
    }
    return at;
  }

  // Text before a tag, with `-` stripping or lstrip_blocks applied as
  // jinja2's OptionalLStrip rule does.
  void EmitText(size_t begin, size_t end, char sign, bool lstrip_allowed) {
    absl::string_view text = s_.substr(begin, end - begin);
    if (sign == '-') {
      text = StripPython(text, nullptr, false, true);
    } else if (sign != '+' && options_.lstrip_blocks && lstrip_allowed) {
      const size_t newline = text.rfind('\n');
      const size_t line_begin = newline == absl::string_view::npos ? 0 : newline + 1;
      if ((line_begin > 0 || line_starting_) && line_begin < text.size() &&
          StripPython(text.substr(line_begin), nullptr, true, false).empty()) {
        text = text.substr(0, line_begin);
      }
    }
    if (!text.empty()) Emit(TokenKind::kData, std::string(text), begin);
  }

  // `{%[-+]? raw [-]?%}` at `at`: the offset past it, or npos.
  size_t MatchRawBegin(size_t at) const {
    size_t p = at + 2;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
    p = SkipSpaces(p);
    if (s_.substr(p, 3) != "raw") return absl::string_view::npos;
    p = SkipSpaces(p + 3);
    if (s_.substr(p, 3) == "-%}") return SkipSpaces(p + 3);
    if (s_.substr(p, 2) == "%}") return p + 2;
    return absl::string_view::npos;
  }

  absl::Status LexTag(size_t tag) {
    const char second = s_[tag + 1];
    const char sign = tag + 2 < s_.size() && (s_[tag + 2] == '-' || s_[tag + 2] == '+') ? s_[tag + 2] : '\0';
    if (second == '%') {
      if (size_t raw_end = MatchRawBegin(tag); raw_end != absl::string_view::npos) {
        EmitText(pos_, tag, sign, true);
        line_starting_ = s_[raw_end - 1] == '\n';
        return LexRaw(tag, raw_end);
      }
    }
    const Tag kind = second == '#' ? Tag::kComment : (second == '%' ? Tag::kBlock : Tag::kVariable);
    EmitText(pos_, tag, sign, kind != Tag::kVariable);
    pos_ = tag + 2 + (sign != '\0' ? 1 : 0);
    line_starting_ = false;
    if (kind == Tag::kComment) return LexComment(tag);
    Emit(kind == Tag::kBlock ? TokenKind::kBlockBegin : TokenKind::kVariableBegin, "", tag);
    return LexExpressionTokens(tag, kind);
  }

  absl::Status LexRaw(size_t tag, size_t body_begin) {
    // The first `{%[-+]? endraw [-+]?%}` ends the raw text.
    for (size_t at = s_.find("{%", body_begin); at != absl::string_view::npos; at = s_.find("{%", at + 1)) {
      size_t p = at + 2;
      const char sign = p < s_.size() && (s_[p] == '-' || s_[p] == '+') ? s_[p] : '\0';
      if (sign != '\0') ++p;
      p = SkipSpaces(p);
      if (s_.substr(p, 6) != "endraw") continue;
      p = SkipSpaces(p + 6);
      size_t end;
      if (s_.substr(p, 3) == "+%}") {
        end = p + 3;
      } else if (s_.substr(p, 3) == "-%}") {
        end = SkipSpaces(p + 3);
      } else if (s_.substr(p, 2) == "%}") {
        end = p + 2 + (options_.trim_blocks && p + 2 < s_.size() && s_[p + 2] == '\n' ? 1 : 0);
      } else {
        continue;
      }
      EmitText(body_begin, at, sign, true);
      line_starting_ = s_[end - 1] == '\n';
      pos_ = end;
      return absl::OkStatus();
    }
    return Error(tag, "unclosed '{% raw %}' block (no '{% endraw %}')");
  }

  absl::Status LexComment(size_t tag) {
    const size_t close = s_.find("#}", pos_);
    if (close == absl::string_view::npos) return Error(tag, "unclosed comment '{#' (no '#}')");
    const char sign = close > pos_ && (s_[close - 1] == '-' || s_[close - 1] == '+') ? s_[close - 1] : '\0';
    size_t end = close + 2;
    if (sign == '-') {
      end = SkipSpaces(end);
    } else if (sign == '\0' && options_.trim_blocks && end < s_.size() && s_[end] == '\n') {
      ++end;
    }
    line_starting_ = s_[end - 1] == '\n';
    pos_ = end;
    return absl::OkStatus();
  }

  // The end of the tag at pos_ when the brackets are balanced: the offset
  // past it (with -/trim_blocks whitespace), or npos.
  size_t MatchTagEnd(Tag kind) const {
    if (kind == Tag::kBlock) {
      if (s_.substr(pos_, 3) == "+%}") return pos_ + 3;
      if (s_.substr(pos_, 3) == "-%}") return SkipSpaces(pos_ + 3);
      if (s_.substr(pos_, 2) == "%}") {
        return pos_ + 2 + (options_.trim_blocks && pos_ + 2 < s_.size() && s_[pos_ + 2] == '\n' ? 1 : 0);
      }
      return absl::string_view::npos;
    }
    if (s_.substr(pos_, 3) == "-}}") return SkipSpaces(pos_ + 3);
    if (s_.substr(pos_, 2) == "}}") return pos_ + 2;
    return absl::string_view::npos;
  }

  absl::Status LexExpressionTokens(size_t tag, Tag kind) {
    std::vector<char> brackets;  // the closers expected, innermost last
    while (true) {
      if (pos_ >= s_.size()) {
        return Error(tag, kind == Tag::kBlock ? "unclosed tag '{%' (no '%}')" : "unclosed tag '{{' (no '}}')");
      }
      if (brackets.empty()) {
        if (size_t end = MatchTagEnd(kind); end != absl::string_view::npos) {
          Emit(kind == Tag::kBlock ? TokenKind::kBlockEnd : TokenKind::kVariableEnd, "", pos_);
          line_starting_ = s_[end - 1] == '\n';
          pos_ = end;
          return absl::OkStatus();
        }
      }
      if (const size_t after = SkipSpaces(pos_); after > pos_) {
        pos_ = after;
        continue;
      }
      const char c = s_[pos_];
      if (IsDigitChar(c)) {
        if (absl::Status status = LexNumber(); !status.ok()) return status;
      } else if (IsNameStart(static_cast<unsigned char>(c))) {
        const size_t begin = pos_;
        while (pos_ < s_.size() && IsNameChar(static_cast<unsigned char>(s_[pos_]))) ++pos_;
        Emit(TokenKind::kName, std::string(s_.substr(begin, pos_ - begin)), begin);
      } else if (c == '\'' || c == '"') {
        if (absl::Status status = LexString(); !status.ok()) return status;
      } else if (absl::Status status = LexOperator(&brackets); !status.ok()) {
        return status;
      }
    }
  }

  size_t SkipDigitGroups(size_t at) const {  // (\d+_)*\d+, or `at` when no digit
    if (at >= s_.size() || !IsDigitChar(s_[at])) return at;
    while (at < s_.size() && IsDigitChar(s_[at])) {
      ++at;
      if (at + 1 < s_.size() && s_[at] == '_' && IsDigitChar(s_[at + 1])) ++at;
    }
    return at;
  }

  absl::Status LexNumber() {
    const size_t begin = pos_;
    // Float: digits, then an exponent (after an optional fraction) or a fraction.
    if (begin == 0 || s_[begin - 1] != '.') {
      size_t p = SkipDigitGroups(begin);
      size_t fraction_end = p;
      if (p + 1 < s_.size() && s_[p] == '.' && IsDigitChar(s_[p + 1])) fraction_end = SkipDigitGroups(p + 1);
      size_t exponent_end = fraction_end;
      if (fraction_end < s_.size() && (s_[fraction_end] == 'e' || s_[fraction_end] == 'E')) {
        size_t q = fraction_end + 1;
        if (q < s_.size() && (s_[q] == '+' || s_[q] == '-')) ++q;
        if (const size_t digits_end = SkipDigitGroups(q); digits_end > q) exponent_end = digits_end;
      }
      if (exponent_end > p) {
        std::string text;
        for (char ch : s_.substr(begin, exponent_end - begin)) {
          if (ch != '_') text.push_back(ch);
        }
        Token token{.kind = TokenKind::kFloat, .text = text, .offset = begin};
        token.float_value = std::strtod(text.c_str(), nullptr);
        tokens_.push_back(std::move(token));
        pos_ = exponent_end;
        return absl::OkStatus();
      }
    }
    // Integer: 0b/0o/0x prefixes, decimal, or zeros.
    int base = 10;
    size_t p = begin;
    if (s_[p] == '0' && p + 2 < s_.size()) {
      const char x = static_cast<char>(s_[p + 1] | 0x20);
      base = x == 'b' ? 2 : (x == 'o' ? 8 : (x == 'x' ? 16 : 10));
    }
    auto is_digit = [&](char ch) {
      if (base == 2) return ch == '0' || ch == '1';
      if (base == 8) return ch >= '0' && ch <= '7';
      if (base == 16) return IsDigitChar(ch) || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f');
      return IsDigitChar(ch);
    };
    std::string digits;
    if (base != 10) {
      size_t q = p + 2;
      while (q < s_.size()) {
        if (s_[q] == '_' && q + 1 < s_.size() && is_digit(s_[q + 1])) ++q;
        if (q >= s_.size() || !is_digit(s_[q])) break;
        digits.push_back(s_[q++]);
      }
      if (digits.empty()) {
        base = 10;  // "0b" with no digits: the integer 0, then a name
      } else {
        p = q;
      }
    }
    if (base == 10) {
      const bool zero = s_[begin] == '0';
      size_t q = begin;
      digits.clear();
      while (q < s_.size()) {
        if (q > begin && s_[q] == '_' && q + 1 < s_.size() && IsDigitChar(s_[q + 1]) && (!zero || s_[q + 1] == '0')) {
          ++q;
        }
        if (q >= s_.size() || !IsDigitChar(s_[q]) || (zero && s_[q] != '0')) break;
        digits.push_back(s_[q++]);
      }
      p = q;
    }
    Token token{.kind = TokenKind::kInteger, .text = std::string(s_.substr(begin, p - begin)), .offset = begin};
    errno = 0;
    const long long value = std::strtoll(digits.c_str(), nullptr, base);
    if (errno == ERANGE) return Error(begin, "integer literal out of the 64-bit range");
    token.int_value = value;
    tokens_.push_back(std::move(token));
    pos_ = p;
    return absl::OkStatus();
  }

  absl::Status LexString() {
    const size_t begin = pos_;
    const char quote = s_[pos_];
    size_t p = pos_ + 1;
    while (p < s_.size() && s_[p] != quote) p += s_[p] == '\\' ? 2 : 1;
    if (p >= s_.size()) return Error(begin, "unterminated string literal");
    absl::StatusOr<std::string> value = Unescape(s_.substr(begin + 1, p - begin - 1));
    if (!value.ok()) return Error(begin, value.status().message());
    Emit(TokenKind::kString, std::move(*value), begin);
    pos_ = p + 1;
    return absl::OkStatus();
  }

  absl::Status LexOperator(std::vector<char>* brackets) {
    static constexpr absl::string_view kTwoChar[] = {"//", "**", "==", "!=", ">=", "<="};
    for (absl::string_view op : kTwoChar) {
      if (s_.substr(pos_, 2) == op) {
        Emit(TokenKind::kOperator, std::string(op), pos_);
        pos_ += 2;
        return absl::OkStatus();
      }
    }
    const char c = s_[pos_];
    if (absl::string_view("+-/*%~[](){}><=.:|,;").find(c) == absl::string_view::npos) {
      size_t next = pos_;
      std::string shown;
      AppendUtf8(&shown, DecodeUtf8(s_, &next));
      return Error(pos_, absl::StrCat("unexpected character '", shown, "'"));
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets->push_back(c == '(' ? ')' : (c == '[' ? ']' : '}'));
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets->empty()) return Error(pos_, absl::StrCat("unexpected '", std::string(1, c), "'"));
      if (brackets->back() != c) {
        return Error(pos_, absl::StrCat("unexpected '", std::string(1, c), "', expected '",
                                        std::string(1, brackets->back()), "'"));
      }
      brackets->pop_back();
    }
    Emit(TokenKind::kOperator, std::string(1, c), pos_);
    ++pos_;
    return absl::OkStatus();
  }

  const SourceText& source_;
  absl::string_view s_;
  const LexerOptions& options_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // the last match ended a line (jinja2's lstrip_blocks rule)
  std::vector<Token> tokens_;
};

}  // namespace

SourceText::SourceText(absl::string_view raw_source) {
  text_.reserve(raw_source.size());
  for (size_t i = 0; i < raw_source.size(); ++i) {
    if (raw_source[i] == '\r') {
      text_.push_back('\n');
      if (i + 1 < raw_source.size() && raw_source[i + 1] == '\n') ++i;
    } else {
      text_.push_back(raw_source[i]);
    }
  }
  if (!text_.empty() && text_.back() == '\n') text_.pop_back();  // keep_trailing_newline=False
  line_starts_.push_back(0);
  for (size_t i = 0; i < text_.size(); ++i) {
    if (text_[i] == '\n') line_starts_.push_back(i + 1);
  }
}

SourcePos SourceText::Locate(size_t offset) const {
  offset = std::min(offset, text_.size());
  const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
  const size_t line_start = *(it - 1);
  return SourcePos{
      .line = static_cast<int>(it - line_starts_.begin()),
      .column = static_cast<int>(CodePointCount(absl::string_view(text_).substr(line_start, offset - line_start))) + 1};
}

std::string Where(SourcePos pos) { return absl::StrCat("line ", pos.line, " col ", pos.column); }

absl::StatusOr<std::vector<Token>> Tokenize(const SourceText& source, const LexerOptions& options) {
  return Lexer(source, options).Run();
}

}  // namespace tandem::jinja
