// GPT-2's byte-level alphabet: each of the 256 byte values as one printable
// character (the byte itself for '!'..'~', '¡'..'¬' and '®'..'ÿ'; U+0100
// onwards for the others, so a space is "Ġ" and a newline "Ċ"). Byte-level
// vocabularies spell their tokens in it; the ByteLevel pre-tokenizer maps
// text into it and the ByteLevel decoder maps it back. Constant tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// The character for `byte`, as UTF-8 (two bytes at most).
std::string_view ByteLevelChar(uint8_t byte);
// The byte a character of the alphabet stands for; -1 for one outside it.
int ByteLevelByte(char32_t c);
// `bytes` spelled in the alphabet, appended to `out`.
void AppendByteLevel(std::string_view bytes, std::string* out);

}  // namespace tandem
