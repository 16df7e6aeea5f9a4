// UTF-8 and the Unicode character classes the tokenizer pipeline asks about,
// with the meaning Hugging Face tokenizers (Rust) gives them: Rust's
// char::is_whitespace, char::is_numeric, the punctuation of the Punctuation
// pre-tokenizer and the regex crate's \w. The properties come from ICU, never
// from tables of our own. Stateless functions; any thread may call them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tandem {

// OK when `text` is valid UTF-8 (RFC 3629: no overlong forms, surrogates or
// code points above U+10FFFF); else InvalidArgument "<what>: not valid UTF-8
// at byte N (0xHH)".
absl::Status CheckUtf8(std::string_view text, std::string_view what);

// The code point starting at text[*pos] of valid UTF-8 text, advancing *pos
// past it. The caller guarantees validity (CheckUtf8) and *pos < size.
char32_t NextCodePoint(std::string_view text, size_t* pos);
// Bytes of the sequence a lead byte starts (1 for a continuation or invalid
// byte, so that walking never stalls).
size_t Utf8SequenceLength(uint8_t lead);
void AppendUtf8(char32_t code_point, std::string* out);

// What Rust's String::from_utf8_lossy makes of `bytes`: each maximal invalid
// subsequence becomes one U+FFFD (the Unicode "maximal subpart" rule), the
// rest is copied.
std::string Utf8Lossy(std::string_view bytes);

// Rust char::is_whitespace: the White_Space property.
bool IsWhitespace(char32_t c);
// Rust char::is_numeric: general categories Nd, Nl and No.
bool IsNumeric(char32_t c);
// HF's Punctuation pre-tokenizer: ASCII punctuation or a P* category.
bool IsPunctuation(char32_t c);
// The regex crate's \w: Alphabetic, M*, Nd, Pc or Join_Control.
bool IsWordCharacter(char32_t c);

}  // namespace tandem
