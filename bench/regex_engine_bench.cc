// Why the tokenizers run their regexes through Oniguruma: the pre-tokenizer
// patterns of GPT-2, Llama 3 and GPT-4o over the same ~1 MB of mixed text,
// Oniguruma (what Hugging Face's tokenizers compiles them with) beside
// PCRE2 with its JIT. Matches are counted on both sides as a check that
// both split the text alike; one JSON line per pattern and round.
// Built only where libpcre2-dev is installed (it is no dependency of tandem).
//   tandem-regex-engine-bench --rounds 3
#include <oniguruma.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/json_lines.h"
#include "tests/tokenizer_strings_testlib.h"

ABSL_FLAG(int, rounds, 3, "rounds per pattern");
ABSL_FLAG(int64_t, text_bytes, 1 << 20, "bytes of mixed text");

namespace tandem {
namespace {

struct Named {
  const char* name;
  const char* pattern;
};
constexpr Named kPatterns[] = {
    {"gpt2", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
    {"llama3",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
    {"gpt4o",
     R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
};

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Matches of `pattern` over `text`, each search from the last match's end.
std::pair<size_t, double> Oniguruma(const char* pattern, const std::string& text) {
  regex_t* regex = nullptr;
  OnigErrorInfo info;
  const auto* p = reinterpret_cast<const UChar*>(pattern);
  onig_new(&regex, p, p + std::strlen(pattern), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  OnigRegion* region = onig_region_new();
  const auto* s = reinterpret_cast<const UChar*>(text.data());
  const UChar* end = s + text.size();
  size_t matches = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const UChar* at = s; at < end;) {
    if (onig_search(regex, s, end, at, end, region, ONIG_OPTION_NONE) < 0) break;
    ++matches;
    at = s + region->end[0] + (region->end[0] == region->beg[0] ? 1 : 0);
  }
  const double seconds = Seconds(start);
  onig_region_free(region, 1);
  onig_free(regex);
  return {matches, seconds};
}

std::pair<size_t, double> Pcre2Jit(const char* pattern, const std::string& text) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                   &error, &offset, nullptr);
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
  size_t matches = 0;
  const auto start = std::chrono::steady_clock::now();
  for (size_t at = 0; at < text.size();) {
    if (pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, PCRE2_NO_UTF_CHECK, match,
                    nullptr) < 0) {
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
    ++matches;
    at = ovector[1] + (ovector[1] == ovector[0] ? 1 : 0);
  }
  const double seconds = Seconds(start);
  pcre2_match_data_free(match);
  pcre2_code_free(code);
  return {matches, seconds};
}

int Main() {
  OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
  onig_initialize(encodings, 1);
  const std::string text = MixedText(static_cast<size_t>(absl::GetFlag(FLAGS_text_bytes)), /*seed=*/1);
  const double mb = static_cast<double>(text.size()) / 1e6;
  for (const Named& p : kPatterns) {
    for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
      const auto [onig_matches, onig_s] = Oniguruma(p.pattern, text);
      const auto [pcre_matches, pcre_s] = Pcre2Jit(p.pattern, text);
      EmitJsonLine({{"bench", "regex_engine"},
                    {"pattern", p.name},
                    {"round", round},
                    {"bytes", text.size()},
                    {"oniguruma_matches", onig_matches},
                    {"oniguruma_mb_per_s", mb / onig_s},
                    {"pcre2_jit_matches", pcre_matches},
                    {"pcre2_jit_mb_per_s", mb / pcre_s}});
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Main();
}
