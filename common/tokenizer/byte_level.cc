#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/unicode_text.h"

namespace tandem {
namespace {

// HF's bytes_char(): printable bytes keep their code point; the rest, in
// increasing order, take 256, 257, ...
struct Alphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::array<std::string, 256> utf8_of_byte;
  std::array<int16_t, 512> byte_of_char{};  // every character of the alphabet is below U+0200

  Alphabet() {
    byte_of_char.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char_of_byte[b] = printable ? static_cast<char32_t>(b) : next++;
      AppendUtf8(char_of_byte[b], &utf8_of_byte[b]);
      byte_of_char[char_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& TheAlphabet() {
  static const Alphabet alphabet;
  return alphabet;
}

}  // namespace

std::string_view ByteLevelChar(uint8_t byte) { return TheAlphabet().utf8_of_byte[byte]; }

int ByteLevelByte(char32_t c) { return c < 512 ? TheAlphabet().byte_of_char[c] : -1; }

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const Alphabet& alphabet = TheAlphabet();
  for (char b : bytes) out->append(alphabet.utf8_of_byte[static_cast<uint8_t>(b)]);
}

}  // namespace tandem
