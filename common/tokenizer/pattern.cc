#include "common/tokenizer/pattern.h"

#include <oniguruma.h>

#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {

struct Pattern::OnigRegex {
  regex_t* regex = nullptr;
  ~OnigRegex() {
    if (regex != nullptr) onig_free(regex);
  }
};

namespace {

void InitializeOniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

// Owns a match region for one FindMatches call.
struct Region {
  OnigRegion* region = onig_region_new();
  ~Region() { onig_region_free(region, 1); }
};

const UChar* Bytes(std::string_view s, size_t offset) { return reinterpret_cast<const UChar*>(s.data()) + offset; }

}  // namespace

Pattern::Pattern(std::string source, std::unique_ptr<OnigRegex> regex)
    : source_(std::move(source)), regex_(std::move(regex)) {}

Pattern::~Pattern() = default;

absl::StatusOr<std::unique_ptr<Pattern>> Pattern::Regex(std::string_view expression, const std::string& where) {
  InitializeOniguruma();
  auto compiled = std::make_unique<OnigRegex>();
  OnigErrorInfo info;
  const int code = onig_new(&compiled->regex, Bytes(expression, 0), Bytes(expression, expression.size()),
                            ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (code != ONIG_NORMAL) {
    compiled->regex = nullptr;
    UChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, code, &info);
    return absl::InvalidArgumentError(absl::StrCat(where, ": regex \"", std::string(expression),
                                                   "\" does not compile: ", reinterpret_cast<const char*>(message)));
  }
  return std::unique_ptr<Pattern>(new Pattern(std::string(expression), std::move(compiled)));
}

std::unique_ptr<Pattern> Pattern::Literal(std::string_view text) {
  if (!text.empty()) return std::unique_ptr<Pattern>(new Pattern(std::string(text), nullptr));
  // HF compiles an escaped literal: the empty one matches the empty string
  // everywhere, as this empty regex does.
  absl::StatusOr<std::unique_ptr<Pattern>> empty = Regex("", "empty literal");
  return std::move(*empty);
}

absl::StatusOr<bool> Pattern::Search(std::string_view text, size_t from, size_t* begin, size_t* end) const {
  if (regex_ == nullptr) {
    const size_t found = text.find(source_, from);
    if (found == std::string_view::npos) return false;
    *begin = found;
    *end = found + source_.size();
    return true;
  }
  thread_local Region region;
  const int found = onig_search(regex_->regex, Bytes(text, 0), Bytes(text, text.size()), Bytes(text, from),
                                Bytes(text, text.size()), region.region, ONIG_OPTION_NONE);
  if (found == ONIG_MISMATCH) return false;
  if (found < 0) {
    UChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, found);
    return absl::ResourceExhaustedError(absl::StrCat("regex \"", source_, "\" gave up on a text of ", text.size(),
                                                     " bytes: ", reinterpret_cast<const char*>(message)));
  }
  *begin = static_cast<size_t>(region.region->beg[0]);
  *end = static_cast<size_t>(region.region->end[0]);
  return true;
}

absl::Status Pattern::FindMatches(std::string_view text, std::vector<PatternSpan>* spans) const {
  spans->clear();
  if (text.empty()) {
    spans->push_back({0, 0, false});
    return absl::OkStatus();
  }
  size_t prev = 0;       // end of the last span emitted
  size_t search_at = 0;  // the onig crate's last_end
  bool matched_before = false;
  while (search_at <= text.size()) {
    size_t begin = 0, end = 0;
    absl::StatusOr<bool> found = Search(text, search_at, &begin, &end);
    if (!found.ok()) return found.status();
    if (!*found) break;
    if (begin == end && matched_before && end == prev) {
      // An empty match right where the last one ended: step one character on.
      search_at += search_at < text.size() ? Utf8SequenceLength(static_cast<uint8_t>(text[search_at])) : 1;
      continue;
    }
    if (prev != begin) spans->push_back({prev, begin, false});
    spans->push_back({begin, end, true});
    prev = end;
    search_at = end;
    matched_before = true;
  }
  if (prev != text.size()) spans->push_back({prev, text.size(), false});
  return absl::OkStatus();
}

// HF's {"String": "..."} or {"Regex": "..."} (SplitPattern, ReplacePattern).
absl::StatusOr<std::unique_ptr<Pattern>> PatternFromJson(const Json& json, const std::string& where) {
  if (json.is_object() && json.size() == 1) {
    if (const Json* literal = FindField(json, "String"); literal != nullptr && literal->is_string()) {
      return Pattern::Literal(literal->get_ref<const std::string&>());
    }
    if (const Json* regex = FindField(json, "Regex"); regex != nullptr && regex->is_string()) {
      return Pattern::Regex(regex->get_ref<const std::string&>(), where);
    }
  }
  return JsonError(where, absl::StrCat("expected {\"String\": ...} or {\"Regex\": ...}, got ", json.dump()));
}

}  // namespace tandem
