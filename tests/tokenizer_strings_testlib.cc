#include "tests/tokenizer_strings_testlib.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <array>
#include <string_view>

namespace tandem {
namespace {

// splitmix64: a tiny generator whose sequence does not depend on the
// standard library's distributions.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(Next() % n); }
  template <typename T, size_t N>
  const T& Pick(const std::array<T, N>& items) {
    return items[Below(N)];
  }

 private:
  uint64_t state_;
};

void Append(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

constexpr std::array<std::string_view, 24> kProse = {
    "The quick brown fox jumps over the lazy dog.",
    "I've been told he's there, but I'm not sure we'll make it; they'd said so.",
    "Hello, y'all! How are you doing today?",
    "'RE you sure? 'M not sure I'LL make it, 'D you like some tea? We'Ve a'lL",
    "Mixture-of-Experts models route each token to a few experts.",
    "In 1969, Apollo 11 landed on the Moon; Neil Armstrong's first words were famous.",
    "Dear Sir or Madam, please find the attached invoice #4821 (due 2024-05-31).",
    "She sells sea-shells by the sea-shore -- or so they say...",
    "A naïve café owner in Zürich served crème brûlée and jalapeño piñatas.",
    "ALL CAPS SENTENCE WITH ACRONYMS LIKE NASA, GPU AND HTTP/2.",
    "camelCaseIdentifier and snake_case_identifier and SCREAMING_SNAKE",
    "Große Straße, Ärger über Öl: Fußgänger überqueren.",
    "Ça va? Très bien, merci! L'été dernier, c'était génial.",
    "¿Dónde está la biblioteca? ¡Allí!",
    "Привет, мир! Как дела? Всё хорошо.",
    "Γειά σου Κόσμε· αυτό είναι ελληνικά.",
    "Україна, Беларусь і Қазақстан пишуть кирилицею.",
    "Việt Nam có nhiều tỉnh thành đẹp.",
    "Türkçe metin: İstanbul'da ılık bir gün.",
    "Polski: Zażółć gęślą jaźń.",
    "Čeština a slovenčina: příliš žluťoučký kůň.",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "e.g. i.e. etc. vs. Mr. Dr. St. -- U.S.A. 3.14 4.0",
    "the the the the the the",
};

constexpr std::array<std::string_view, 14> kCode = {
    "int main(int argc, char** argv) {\n  return argc > 1 ? 0 : -1;\n}\n",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (size_t i = 0; i < v.size(); ++i) { sum += v[i] * w[i]; }",
    "const x = await fetch(`https://example.com/api?q=${query}&n=10`);",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC LIMIT 10;",
    "<div class=\"row\"><span id='x'>&amp;&lt;&gt;</span></div>",
    "#include <vector>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "if [ -f \"$HOME/.bashrc\" ]; then source ~/.bashrc; fi",
    "\tfn add(a: i32, b: i32) -> i32 { a + b }\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares",
    "    return std::make_unique<Foo>(std::move(bar));\n\n\n",
    "a+=b;c-=d;e*=f;g/=h;i%=j;k<<=1;l>>=2;m&=n;o|=p;q^=r;",
    "/* comment */ // another\r\nlet s = 'single' + \"double\";",
};

constexpr std::array<std::string_view, 16> kCjk = {
    "我想在苹果公司工作，因为他们的产品很好。",
    "今天天气很好，我们去公园散步吧。",
    "人工智能正在改变世界。1314151天",
    "日本語のテキストです。ひらがなとカタカナと漢字。",
    "東京タワーは333メートルです。",
    "ｶﾀｶﾅ（半角）とカタカナ（全角）",
    "안녕하세요, 세계! 한국어 텍스트입니다.",
    "대한민국의 수도는 서울입니다.",
    "繁體中文與简体中文",
    "「引用」『二重引用』【括弧】〜",
    "一二三四五六七八九十百千万",
    "的一是不了人我在有他这为之大来以个中上们",
    "ㄅㄆㄇㄈ注音符號",
    "𠀀𠀁𠀂𪚥 (CJK extension B)",
    "こんにちは世界！",
    "中文English混合Text",
};

constexpr std::array<std::string_view, 16> kScripts = {
    "مرحبا بالعالم! هذا نص عربي.",
    "اَلْعَرَبِيَّةُ مع التشكيل",
    "שלום עולם, זהו טקסט בעברית.",
    "בְּרֵאשִׁית בָּרָא אֱלֹהִים",
    "فارسی: سلام دنیا ۱۲۳",
    "اردو: ہیلو دنیا",
    "नमस्ते दुनिया! यह हिंदी पाठ है।",
    "বাংলা ভাষা সুন্দর",
    "தமிழ் மொழி மிகவும் பழமையானது",
    "ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "សួស្តីពិភពលោក",
    "ພາສາລາວ",
    "မြန်မာဘာသာ",
    "ქართული ენა",
    "Հայերեն լեզու",
    "አማርኛ ቋንቋ",
};

constexpr std::array<std::string_view, 18> kEmoji = {
    "🚀",
    "😶‍🌫️",
    "👨‍👩‍👧‍👦",
    "👍🏽",
    "🇺🇸🇯🇵🇩🇪",
    "1️⃣#️⃣*️⃣",
    "❤️❤︎",
    "🏴󠁧󠁢󠁥󠁮󠁧󠁿",
    "🦙🦙",
    "✅",
    "🧑🏿‍💻",
    "👩‍❤️‍💋‍👨",
    "🙂🙃😉",
    "🐈‍⬛",
    "☃️⛄",
    "🫠🫡",
    "👋🏻👋🏼👋🏽👋🏾👋🏿",
    "🤷‍♂️",
};

// Text that NFC or NFKC changes, or that looks alike but is not.
constexpr std::array<std::string_view, 16> kNormalization = {
    "e\xCC\x81",                                                     // e + combining acute (NFC: é)
    "A\xCC\x8A",                                                     // A + ring (NFC: Å)
    "\xE1\x84\x80\xE1\x85\xA1",                                      // Hangul jamo (NFC: 가)
    "\xEF\xAC\x81nance",                                             // ﬁ ligature (NFKC: fi)
    "\xE2\x84\xAA",                                                  // Kelvin sign (NFC: K)
    "\xE2\x84\xA6",                                                  // Ohm sign (NFC: Ω)
    "\xE1\xBD\xB1",                                                  // alpha with oxia (NFC: tonos)
    "x\xC2\xB2 + y\xC2\xB3",                                         // superscripts (NFKC: 2, 3)
    "\xEF\xBC\xA8\xEF\xBD\x85\xEF\xBD\x8C\xEF\xBD\x8C\xEF\xBD\x8F",  // fullwidth Hello
    "\xE2\x91\xA0\xE2\x91\xA1\xE2\x91\xA2",                          // circled digits
    "Z\xCC\xB5\xCD\x8C\xCC\x9F"
    "a\xCC\xB7\xCC\x94l\xCC\xB6g\xCD\x9Do",  // stacked marks
    "\xE2\x85\xAB \xC2\xBD \xC2\xBE",        // Roman twelve, fractions
    "o\xCC\x88\xCC\x81",                     // o + diaeresis + acute
    "\xE3\x8C\x80",                          // square apaato (NFKC: アパート)
    "\xEF\xB9\xBD",                          // small form
    "\xC3\x85ngstr\xC3\xB6m \xE2\x84\xAB",   // Å vs Angstrom sign
};

constexpr std::array<std::string_view, 16> kPunctuation = {
    "!!!!!!", "......", "''''''",   "```````",  "\"\"\"\"",     "??????", "?!?!",         "---===",
    "…",      "—–-",    "“quotes”", "‘single’", "«guillemets»", "。，、", "(())[[]]{{}}", "@#$%^&*~|\\/",
};

constexpr std::array<std::string_view, 14> kSpecialLike = {
    "<|endoftext|>", "<s>",      "</s>",     "[INST]", "<|im_start|>user", "<|im_end|>", "<pad>", "<0x0A>",
    "\xE2\x96\x81",  "\xC4\xA0", "\xC4\x8A", "<unk>",  "<|eot_id|>",       "<mask>",
};

constexpr std::array<std::string_view, 10> kWhitespace = {
    " ", "  ", "\t", "\n", "\r\n", "\xC2\xA0", "\xE3\x80\x80", "\xE2\x80\xA8", "\xC2\x85", "\xE2\x80\x8B",
};

std::string Whitespace(Random& r) {
  std::string out;
  const size_t n = 1 + r.Below(r.Below(4) == 0 ? 60 : 6);
  for (size_t i = 0; i < n; ++i) out.append(r.Pick(kWhitespace));
  return out;
}

std::string Number(Random& r) {
  std::string out;
  switch (r.Below(8)) {
    case 0: out.push_back('-'); break;
    case 1: out.push_back('$'); break;
    default: break;
  }
  const size_t digits = 1 + r.Below(r.Below(3) == 0 ? 24 : 5);
  // ASCII, Arabic-Indic, Devanagari, fullwidth digits.
  static constexpr std::array<char32_t, 4> kZero = {U'0', U'\u0660', U'\u0966', U'\uFF10'};
  const char32_t zero = r.Below(4) == 0 ? kZero[r.Below(kZero.size())] : U'0';
  for (size_t i = 0; i < digits; ++i) {
    Append(zero + static_cast<char32_t>(r.Below(10)), &out);
    if (r.Below(9) == 0) out.push_back(r.Below(2) ? ',' : '.');
  }
  if (r.Below(5) == 0) out.append(r.Below(2) ? "%" : "e-7");
  return out;
}

// A character from the whole assigned range, as old as Unicode 13 (so that
// every Unicode-based library on either side knows it), surrogates excluded.
std::string RandomCharacter(Random& r) {
  while (true) {
    char32_t c;
    switch (r.Below(4)) {
      case 0: c = static_cast<char32_t>(r.Below(0x80)); break;
      case 1: c = static_cast<char32_t>(r.Below(0x3000)); break;
      case 2: c = static_cast<char32_t>(r.Below(0x10000)); break;
      default: c = static_cast<char32_t>(r.Below(0x30000)); break;
    }
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    UVersionInfo age;
    u_charAge(static_cast<UChar32>(c), age);
    if (u_charType(static_cast<UChar32>(c)) == U_UNASSIGNED || age[0] > 13 || (age[0] == 0 && c != 0)) continue;
    std::string out;
    Append(c, &out);
    return out;
  }
}

std::string CombiningMarks(Random& r) {
  std::string out;
  const size_t bases = 1 + r.Below(4);
  for (size_t b = 0; b < bases; ++b) {
    out.push_back(static_cast<char>('a' + r.Below(26)));
    const size_t marks = r.Below(6);
    for (size_t i = 0; i < marks; ++i) Append(0x300 + static_cast<char32_t>(r.Below(0x70)), &out);
  }
  return out;
}

std::string Repeated(Random& r) {
  static constexpr std::array<std::string_view, 8> kUnits = {" ", "a", "1", "ab", "中", "\n", "=", "😀"};
  std::string_view unit = r.Pick(kUnits);
  const size_t n = 20 + r.Below(300);
  std::string out;
  for (size_t i = 0; i < n; ++i) out.append(unit);
  return out;
}

std::string Fragment(Random& r) {
  switch (r.Below(14)) {
    case 0:
    case 1: return std::string(r.Pick(kProse));
    case 2: return std::string(r.Pick(kCode));
    case 3: return std::string(r.Pick(kCjk));
    case 4: return std::string(r.Pick(kScripts));
    case 5: return std::string(r.Pick(kEmoji));
    case 6: return std::string(r.Pick(kNormalization));
    case 7: return std::string(r.Pick(kPunctuation));
    case 8: return std::string(r.Pick(kSpecialLike));
    case 9: return Whitespace(r);
    case 10: return Number(r);
    case 11: return CombiningMarks(r);
    case 12: {
      std::string out;
      const size_t n = 1 + r.Below(12);
      for (size_t i = 0; i < n; ++i) out += RandomCharacter(r);
      return out;
    }
    default: {
      if (r.Below(4) == 0) return Repeated(r);
      std::string prose(r.Pick(kProse));
      size_t cut = std::min(prose.size(), r.Below(30));
      while (cut > 0 && cut < prose.size() && (static_cast<uint8_t>(prose[cut]) & 0xC0) == 0x80) --cut;
      return prose.substr(0, cut);
    }
  }
}

}  // namespace

std::vector<std::string> TokenizerTestStrings(uint64_t seed, size_t count) {
  Random r(seed);
  std::vector<std::string> strings;
  strings.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t fragments = r.Below(7);
    for (size_t f = 0; f < fragments; ++f) {
      if (f > 0) {
        switch (r.Below(4)) {
          case 0: break;
          case 1: s.push_back('\n'); break;
          default: s.push_back(' '); break;
        }
      }
      s += Fragment(r);
    }
    strings.push_back(std::move(s));
  }
  return strings;
}

std::vector<std::string> InvalidUtf8Strings() {
  return {
      "abc\x80"
      "def",                    // lone continuation byte
      "caf\xC3",                // truncated at the end
      "\xE2\x82 euro",          // truncated three-byte sequence
      "over\xC0\xAFlong",       // overlong '/'
      "\xE0\x80\xAF",           // overlong three-byte
      "sur\xED\xA0\x80rogate",  // UTF-16 surrogate
      "big\xF4\x90\x80\x80",    // above U+10FFFF
      "\xF5\xFF\xFE bytes",     // never valid
      std::string("nul\0\xFF", 5),
      "ok \xF0\x9F\x98 broken emoji",
  };
}

std::string MixedText(size_t bytes, uint64_t seed) {
  Random r(seed);
  std::string text;
  text.reserve(bytes + 1024);
  while (text.size() < bytes) {
    const size_t kind = r.Below(20);
    if (kind < 8) {
      text.append(r.Pick(kProse));
      text.push_back(r.Below(5) == 0 ? '\n' : ' ');
    } else if (kind < 13) {
      text.append(r.Pick(kCode));
    } else if (kind < 16) {
      text.append(r.Pick(kCjk));
    } else if (kind < 18) {
      text.append(r.Pick(kScripts));
      text.push_back(' ');
    } else if (kind == 18) {
      text.append(Number(r));
      text.push_back(' ');
    } else {
      text.append(r.Pick(kEmoji));
      text.append(Whitespace(r));
    }
  }
  // Cut at a character boundary.
  size_t end = bytes;
  while (end > 0 && (static_cast<uint8_t>(text[end]) & 0xC0) == 0x80) --end;
  text.resize(end);
  return text;
}

}  // namespace tandem
