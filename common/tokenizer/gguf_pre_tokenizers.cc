#include "common/tokenizer/gguf_pre_tokenizers.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem {
namespace {

// The regexes of the original tokenizer.json files (llama.cpp's comments name
// them; it runs rewritten forms its own engine can take, HF runs these).
constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kGpt4oRegex[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kTekkenRegex[] =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kBailingMoeRegex[] =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr char kDeepseekV3Regex[] =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Greek Extended and letterlike characters whose NFC form differs are written
// as \x{...}: editors and tools that normalize text must not change them.
constexpr char kDeepseekLlmLetters[] =
    R"(\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝ\x{1F5F}-\x{1F7D}ᾀ-ᾴᾶ-ᾼ\x{1FBE}ῂ-ῄῆ-ῌ\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\x{2126}ℨ\x{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+)";
constexpr char kDeepseekLlmPunctuation[] = R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)";
constexpr char kDeepseekCjk[] = R"([一-龥ࠀ-一가-퟿]+)";

Json Split(const char* regex) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}};
}
Json ByteLevel(bool use_regex) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", use_regex}};
}
Json Digits(bool individual) { return {{"type", "Digits"}, {"individual_digits", individual}}; }
Json Sequence(std::vector<Json> steps) { return {{"type", "Sequence"}, {"pretokenizers", std::move(steps)}}; }
Json Nfc() { return {{"type", "NFC"}}; }

// One regex, then the byte-level mapping: the shape of every tiktoken-era
// tokenizer.json.
GgufPreTokenizer RegexThenBytes(const char* regex, bool ignore_merges = false, bool add_bos = false,
                                Json normalizer = nullptr) {
  return {std::move(normalizer), Sequence({Split(regex), ByteLevel(false)}), ignore_merges, add_bos};
}

const std::map<std::string, GgufPreTokenizer, std::less<>>& Table() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, GgufPreTokenizer, std::less<>>;
    const GgufPreTokenizer gpt2{nullptr, ByteLevel(true)};
    // GPT-NeoX's tokenizer (MPT, OLMo) normalizes to NFC first.
    const GgufPreTokenizer neox{Nfc(), ByteLevel(true)};
    const GgufPreTokenizer llama3 = RegexThenBytes(kLlama3Regex, /*ignore_merges=*/true, /*add_bos=*/true);
    const GgufPreTokenizer qwen2 = RegexThenBytes(kQwen2Regex, false, false, Nfc());
    const GgufPreTokenizer gpt4o = RegexThenBytes(kGpt4oRegex);
    const GgufPreTokenizer llama3_regex = RegexThenBytes(kLlama3Regex);
    const GgufPreTokenizer digits_then_gpt2{nullptr, Sequence({Digits(true), ByteLevel(true)})};
    for (const char* name : {"default", "gpt-2", "phi-2"}) (*t)[name] = gpt2;
    for (const char* name : {"mpt", "olmo"}) (*t)[name] = neox;
    for (const char* name : {"llama-bpe", "llama3", "llama-v3"}) (*t)[name] = llama3;
    for (const char* name : {"qwen2", "deepseek-r1-qwen", "megrez"}) (*t)[name] = qwen2;
    for (const char* name : {"gpt-4o", "llama4", "minimax-m2"}) (*t)[name] = gpt4o;
    for (const char* name : {"glm4", "chatglm-bpe", "dbrx", "smaug-bpe"}) (*t)[name] = llama3_regex;
    for (const char* name : {"starcoder", "refact"}) (*t)[name] = digits_then_gpt2;
    for (const char* name : {"bailingmoe", "bailingmoe2", "llada-moe"}) (*t)[name] = RegexThenBytes(kBailingMoeRegex);
    (*t)["tekken"] = RegexThenBytes(kTekkenRegex, /*ignore_merges=*/true, /*add_bos=*/true);
    (*t)["deepseek-v3"] = {nullptr, Sequence({Split(R"(\p{N}{1,3})"), Split(R"([一-龥぀-ゟ゠-ヿ]+)"),
                                              Split(kDeepseekV3Regex), ByteLevel(false)})};
    (*t)["deepseek-llm"] = {nullptr,
                            Sequence({Split(R"([\r\n])"), Split(kDeepseekLlmLetters), Split(kDeepseekLlmPunctuation),
                                      Split(R"(\s+$)"), Split(kDeepseekCjk), Digits(false), ByteLevel(false)})};
    (*t)["deepseek-coder"] = {nullptr, Sequence({Split(R"([\r\n])"), Split(R"(\s?\p{L}+)"), Split(R"(\s?\p{P}+)"),
                                                 Split(kDeepseekCjk), Digits(true), ByteLevel(false)})};
    (*t)["falcon"] = {nullptr, Sequence({{{"type", "Punctuation"}, {"behavior", "Contiguous"}},
                                         ByteLevel(true),
                                         Digits(false),
                                         Split("[0-9][0-9][0-9]")})};
    return t;
  }();
  return *table;
}

}  // namespace

absl::StatusOr<GgufPreTokenizer> GgufPreTokenizerNamed(std::string_view name) {
  const auto& table = Table();
  auto it = table.find(name.empty() ? std::string_view("default") : name);
  if (it == table.end()) {
    return absl::NotFoundError(
        absl::StrCat("pre-tokenizer \"", std::string(name),
                     "\" is not one tandem knows (known: ", absl::StrJoin(KnownGgufPreTokenizers(), ", "), ")"));
  }
  return it->second;
}

std::vector<std::string> KnownGgufPreTokenizers() {
  std::vector<std::string> names;
  for (const auto& [name, pipeline] : Table()) names.push_back(name);
  return names;
}

}  // namespace tandem
