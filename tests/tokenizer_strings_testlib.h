// Text that is hard to tokenize, made up deterministically from a seed:
// code, whitespace runs, numbers in many scripts, CJK, right-to-left
// scripts, Indic and South-East Asian scripts, emoji sequences (ZWJ, skin
// tones, flags, keycaps, tags), combining marks and text that NFC/NFKC
// change, punctuation runs, contractions, special-token look-alikes and
// random assigned code points. The tokenizer oracle test feeds it to
// Hugging Face's tokenizers and to tandem's; tandem-tokenizer-bench
// tokenizes a megabyte of it. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// `count` strings of 0 to a few hundred characters, valid UTF-8, the same
// for the same seed.
std::vector<std::string> TokenizerTestStrings(uint64_t seed, size_t count);

// Byte strings that are not UTF-8 (lone continuation bytes, truncated and
// overlong sequences, surrogates, bytes F5..FF), each inside ordinary text.
std::vector<std::string> InvalidUtf8Strings();

// About `bytes` bytes (whole characters) of mixed text: prose, code,
// numbers, CJK, other scripts, emoji and whitespace in the proportions a
// long multilingual prompt has.
std::string MixedText(size_t bytes, uint64_t seed);

}  // namespace tandem
