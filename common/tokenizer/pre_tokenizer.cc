#include "common/tokenizer/pre_tokenizer.h"

#include <functional>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {
namespace {

// HF's SplitDelimiterBehavior: what becomes of the matches when splitting.
enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

absl::StatusOr<Behavior> BehaviorFromJson(const Json& json, std::string_view key, const std::string& where,
                                          std::optional<std::string> absent = std::nullopt) {
  TANDEM_ASSIGN_OR_RETURN(const std::string name, ReadString(json, key, where, std::move(absent)));
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  return JsonError(FieldPath(where, key), absl::StrCat("\"", name,
                                                       "\" is no SplitDelimiterBehavior (Removed, Isolated, "
                                                       "MergedWithPrevious, MergedWithNext, Contiguous)"));
}

// The spans to keep, from the spans of a pattern (HF's NormalizedString::split).
struct Cut {
  size_t begin, end;
  bool keep;
};
void CutsFor(const std::vector<PatternSpan>& spans, Behavior behavior, std::vector<Cut>* cuts) {
  cuts->clear();
  bool previous_match = false;
  switch (behavior) {
    case Behavior::kIsolated:
      for (const PatternSpan& s : spans) cuts->push_back({s.begin, s.end, true});
      break;
    case Behavior::kRemoved:
      for (const PatternSpan& s : spans) cuts->push_back({s.begin, s.end, !s.is_match});
      break;
    case Behavior::kContiguous:
      for (const PatternSpan& s : spans) {
        if (s.is_match == previous_match && !cuts->empty()) {
          cuts->back().end = s.end;
        } else {
          cuts->push_back({s.begin, s.end, true});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithPrevious:
      for (const PatternSpan& s : spans) {
        if (s.is_match && !previous_match && !cuts->empty()) {
          cuts->back().end = s.end;
        } else {
          cuts->push_back({s.begin, s.end, true});
        }
        previous_match = s.is_match;
      }
      break;
    case Behavior::kMergedWithNext:
      for (size_t i = spans.size(); i-- > 0;) {
        const PatternSpan& s = spans[i];
        if (s.is_match && !previous_match && !cuts->empty()) {
          cuts->back().begin = s.begin;
        } else {
          cuts->push_back({s.begin, s.end, true});
        }
        previous_match = s.is_match;
      }
      std::reverse(cuts->begin(), cuts->end());
      break;
  }
}

// Appends the kept, non-empty pieces of `piece` cut as `spans` say.
void AppendCuts(PreToken&& piece, const std::vector<PatternSpan>& spans, Behavior behavior, std::vector<Cut>* cuts,
                std::vector<PreToken>* out) {
  CutsFor(spans, behavior, cuts);
  if (cuts->size() == 1 && cuts->front().keep && cuts->front().begin == 0 && cuts->front().end == piece.text.size()) {
    if (!piece.text.empty()) out->push_back(std::move(piece));
    return;
  }
  for (const Cut& cut : *cuts) {
    if (!cut.keep || cut.end == cut.begin) continue;
    out->push_back({piece.text.substr(cut.begin, cut.end - cut.begin), piece.at_origin && cut.begin == 0});
  }
}

// HF's Pattern for Fn(char) -> bool: every character it accepts is a match
// of its own.
void CharMatches(std::string_view text, const std::function<bool(char32_t)>& accepts, std::vector<PatternSpan>* spans) {
  spans->clear();
  if (text.empty()) {
    spans->push_back({0, 0, false});
    return;
  }
  size_t last = 0;
  for (size_t pos = 0; pos < text.size();) {
    const size_t begin = pos;
    const char32_t c = NextCodePoint(text, &pos);
    if (!accepts(c)) continue;
    if (last < begin) spans->push_back({last, begin, false});
    spans->push_back({begin, pos, true});
    last = pos;
  }
  if (last < text.size()) spans->push_back({last, text.size(), false});
}

// Splits every piece at the matches of `find` with `behavior`.
template <typename FindFn>
absl::Status SplitEach(std::vector<PreToken>* pieces, Behavior behavior, const FindFn& find) {
  std::vector<PreToken> out;
  out.reserve(pieces->size());
  std::vector<PatternSpan> spans;
  std::vector<Cut> cuts;
  for (PreToken& piece : *pieces) {
    TANDEM_RETURN_IF_ERROR(find(piece.text, &spans));
    AppendCuts(std::move(piece), spans, behavior, &cuts, &out);
  }
  *pieces = std::move(out);
  return absl::OkStatus();
}

// GPT-2's pre-tokenizer regex, which ByteLevel applies with use_regex.
constexpr char kGpt2Regex[] = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& piece : *pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text.insert(piece.text.begin(), ' ');
      }
    }
    if (regex_ != nullptr) {
      TANDEM_RETURN_IF_ERROR(SplitEach(pieces, Behavior::kIsolated, [this](std::string_view text, auto* spans) {
        return regex_->FindMatches(text, spans);
      }));
    }
    std::string mapped;
    for (PreToken& piece : *pieces) {
      mapped.clear();
      AppendByteLevel(piece.text, &mapped);
      piece.text.swap(mapped);
    }
    return absl::OkStatus();
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;  // null without use_regex
};

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Pattern> pattern, Behavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitEach(pieces, behavior_, [this](std::string_view text, std::vector<PatternSpan>* spans) {
      TANDEM_RETURN_IF_ERROR(pattern_->FindMatches(text, spans));
      if (invert_) {
        for (PatternSpan& span : *spans) span.is_match = !span.is_match;
      }
      return absl::OkStatus();
    });
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  Behavior behavior_;
  bool invert_;
};

// A character class split: Digits (numeric characters) and Punctuation.
class CharClassPreTokenizer final : public PreTokenizer {
 public:
  CharClassPreTokenizer(bool (*accepts)(char32_t), Behavior behavior) : accepts_(accepts), behavior_(behavior) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    return SplitEach(pieces, behavior_, [this](std::string_view text, std::vector<PatternSpan>* spans) {
      CharMatches(text, accepts_, spans);
      return absl::OkStatus();
    });
  }

 private:
  bool (*accepts_)(char32_t);
  Behavior behavior_;
};

enum class PrependScheme { kFirst, kNever, kAlways };

// Spaces become the replacement character ("▁"), which then marks where
// words start.
class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}

  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (PreToken& piece : *pieces) {
      std::string replaced;
      replaced.reserve(piece.text.size() + replacement_.size());
      for (char c : piece.text) {
        if (c == ' ') {
          replaced.append(replacement_);
        } else {
          replaced.push_back(c);
        }
      }
      const bool starts_with_marker = replaced.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts_with_marker &&
          (scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && piece.at_origin))) {
        replaced.insert(0, replacement_);
      }
      piece.text = std::move(replaced);
    }
    if (!split_) return absl::OkStatus();
    return SplitEach(pieces, Behavior::kMergedWithNext, [this](std::string_view text, auto* spans) {
      spans->clear();
      if (text.empty()) {
        spans->push_back({0, 0, false});
        return absl::OkStatus();
      }
      size_t last = 0;
      for (size_t at = text.find(replacement_); at != std::string_view::npos;
           at = text.find(replacement_, at + replacement_.size())) {
        if (last < at) spans->push_back({last, at, false});
        spans->push_back({at, at + replacement_.size(), true});
        last = at + replacement_.size();
      }
      if (last < text.size()) spans->push_back({last, text.size(), false});
      return absl::OkStatus();
    });
  }

 private:
  std::string replacement_;  // one character, UTF-8
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  absl::Status PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& step : steps_) TANDEM_RETURN_IF_ERROR(step->PreTokenize(pieces));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

absl::StatusOr<std::unique_ptr<PreTokenizer>> ByteLevelFromJson(const Json& json, const std::string& where) {
  TANDEM_ASSIGN_OR_RETURN(const bool add_prefix_space, ReadBool(json, "add_prefix_space", where, true));
  TANDEM_ASSIGN_OR_RETURN(const bool use_regex, ReadBool(json, "use_regex", where, true));
  std::unique_ptr<Pattern> regex;
  if (use_regex) {
    TANDEM_ASSIGN_OR_RETURN(regex, Pattern::Regex(kGpt2Regex, where));
  }
  return std::make_unique<ByteLevelPreTokenizer>(add_prefix_space, std::move(regex));
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> MetaspaceFromJson(const Json& json, const std::string& where) {
  TANDEM_ASSIGN_OR_RETURN(std::string replacement, ReadChar(json, "replacement", where));
  TANDEM_ASSIGN_OR_RETURN(const std::string scheme_name, ReadString(json, "prepend_scheme", where, "always"));
  PrependScheme scheme;
  if (scheme_name == "first") {
    scheme = PrependScheme::kFirst;
  } else if (scheme_name == "never") {
    scheme = PrependScheme::kNever;
  } else if (scheme_name == "always") {
    scheme = PrependScheme::kAlways;
  } else {
    return JsonError(FieldPath(where, "prepend_scheme"),
                     absl::StrCat("\"", scheme_name, "\" is not first, never or always"));
  }
  // The older form: add_prefix_space false means never (and must not contradict).
  if (const Json* add = FindField(json, "add_prefix_space"); add != nullptr && add->is_boolean() && !add->get<bool>()) {
    if (FindField(json, "prepend_scheme") != nullptr && scheme != PrependScheme::kNever) {
      return JsonError(where, "add_prefix_space false does not match prepend_scheme");
    }
    scheme = PrependScheme::kNever;
  }
  TANDEM_ASSIGN_OR_RETURN(const bool split, ReadBool(json, "split", where, true));
  return std::make_unique<MetaspacePreTokenizer>(std::move(replacement), scheme, split);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const Json& json, const std::string& where) {
  if (json.is_null()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(const std::string type, ReadType(json, where));
  if (type == "ByteLevel") return ByteLevelFromJson(json, where);
  if (type == "Metaspace") return MetaspaceFromJson(json, where);
  if (type == "Split") {
    const Json* pattern = FindField(json, "pattern");
    if (pattern == nullptr) return JsonError(FieldPath(where, "pattern"), "missing");
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Pattern> compiled, PatternFromJson(*pattern, FieldPath(where, "pattern")));
    TANDEM_ASSIGN_OR_RETURN(const Behavior behavior, BehaviorFromJson(json, "behavior", where));
    TANDEM_ASSIGN_OR_RETURN(const bool invert, ReadBool(json, "invert", where, false));
    return std::make_unique<SplitPreTokenizer>(std::move(compiled), behavior, invert);
  }
  if (type == "Digits") {
    TANDEM_ASSIGN_OR_RETURN(const bool individual, ReadBool(json, "individual_digits", where, false));
    return std::make_unique<CharClassPreTokenizer>(&IsNumeric,
                                                   individual ? Behavior::kIsolated : Behavior::kContiguous);
  }
  if (type == "Punctuation") {
    TANDEM_ASSIGN_OR_RETURN(const Behavior behavior, BehaviorFromJson(json, "behavior", where, "Isolated"));
    return std::make_unique<CharClassPreTokenizer>(&IsPunctuation, behavior);
  }
  if (type == "Sequence") {
    const Json* list = FindField(json, "pretokenizers");
    const std::string list_where = FieldPath(where, "pretokenizers");
    if (list == nullptr || !list->is_array()) return JsonError(list_where, "expected a list of pre-tokenizers");
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> step,
                              PreTokenizerFromJson((*list)[i], ElementPath(list_where, i)));
      if (step == nullptr) return JsonError(ElementPath(list_where, i), "null is not a pre-tokenizer");
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  return JsonError(where, absl::StrCat("pre-tokenizer type \"", type,
                                       "\" is not supported (supported: ByteLevel, Split, Metaspace, Digits, "
                                       "Punctuation, Sequence)"));
}

}  // namespace tandem
