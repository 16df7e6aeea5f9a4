// What a Split pre-tokenizer, a Replace normalizer or decoder looks for in
// text: a literal string or a regular expression, matched as Hugging Face
// tokenizers does. HF compiles its regexes with Oniguruma (the onig crate's
// default syntax, UTF-8, no options); so does this, through the same C
// library, so \s, \p{L}, look-ahead, (?i:...) and $ mean what they mean to
// HF. Matches come as the onig crate's find_iter gives them: leftmost, each
// search starting where the last match ended (look-behind sees the text
// before), an empty match right after the previous match skipped.
//
// Immutable after Create: any thread may match with it (Oniguruma's search
// writes only to the per-call region).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/json_fields.h"

namespace tandem {

// One stretch of the text: a match of the pattern or the text between two.
struct PatternSpan {
  size_t begin = 0;
  size_t end = 0;
  bool is_match = false;
};

class Pattern {
 public:
  // InvalidArgument naming `where` and Oniguruma's message when the
  // expression does not compile.
  static absl::StatusOr<std::unique_ptr<Pattern>> Regex(std::string_view expression, const std::string& where);
  static std::unique_ptr<Pattern> Literal(std::string_view text);
  ~Pattern();
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;

  // `text` cut into matches and the stretches between them, in order,
  // covering it (HF's Pattern::find_matches): one non-match span (0, 0) for
  // an empty text. ResourceExhausted when Oniguruma gives up (its retry
  // limit, on a pathological pattern and text).
  absl::Status FindMatches(std::string_view text, std::vector<PatternSpan>* spans) const;

  const std::string& source() const { return source_; }

 private:
  struct OnigRegex;
  Pattern(std::string source, std::unique_ptr<OnigRegex> regex);
  // Start and end of the first match at or after `from`; false when none.
  absl::StatusOr<bool> Search(std::string_view text, size_t from, size_t* begin, size_t* end) const;

  std::string source_;                // the expression, or the literal text
  std::unique_ptr<OnigRegex> regex_;  // null for a non-empty literal
};

// HF's JSON form of a pattern: {"String": "..."} or {"Regex": "..."}.
absl::StatusOr<std::unique_ptr<Pattern>> PatternFromJson(const Json& json, const std::string& where);

}  // namespace tandem
