#include "common/chat/special_tokens.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"
#include "common/chat/unicode.h"

namespace tandem {
namespace {

absl::string_view View(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Bytes of Python/Rust whitespace at the end or start of `s` (HF strips
// char::is_whitespace; for the ASCII and common Unicode spaces these agree).
size_t TrailingSpaceBytes(std::string_view s) {
  const absl::string_view stripped = jinja::StripPython(View(s), nullptr, false, true);
  return s.size() - stripped.size();
}

size_t LeadingSpaceBytes(std::string_view s) {
  const absl::string_view stripped = jinja::StripPython(View(s), nullptr, true, false);
  return s.size() - stripped.size();
}

}  // namespace

absl::StatusOr<SpecialTokenMatcher> SpecialTokenMatcher::Create(const std::vector<SpecialTokenPattern>& patterns) {
  SpecialTokenMatcher matcher;
  matcher.nodes_.emplace_back();  // the root
  for (const SpecialTokenPattern& pattern : patterns) {
    if (pattern.content.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("special token ", pattern.id, " has empty content"));
    }
    if (pattern.id < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("special token \"", pattern.content, "\" has negative id ", pattern.id));
    }
    int32_t node = 0;
    for (unsigned char byte : pattern.content) {
      int32_t next = matcher.Child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(matcher.nodes_.size());
        auto& children = matcher.nodes_[node].children;
        children.insert(std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
                        {byte, next});
        matcher.nodes_.emplace_back();
      }
      node = next;
    }
    const int32_t existing = matcher.nodes_[node].pattern;
    if (existing >= 0) {
      if (matcher.patterns_[existing].id != pattern.id) {
        return absl::InvalidArgumentError(absl::StrCat("special token \"", pattern.content, "\" has two ids: ",
                                                       matcher.patterns_[existing].id, " and ", pattern.id));
      }
      continue;
    }
    matcher.nodes_[node].pattern = static_cast<int32_t>(matcher.patterns_.size());
    matcher.patterns_.push_back(pattern);
  }
  matcher.num_patterns_ = matcher.patterns_.size();
  return matcher;
}

int32_t SpecialTokenMatcher::Child(int32_t node, unsigned char byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

std::vector<PromptPiece> SpecialTokenMatcher::Split(std::string_view text) const {
  std::vector<PromptPiece> pieces;
  size_t text_begin = 0;  // start of the plain text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    // The longest pattern starting at pos.
    int32_t node = 0;
    int32_t found = -1;
    size_t found_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = Child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (nodes_[node].pattern >= 0) {
        found = nodes_[node].pattern;
        found_end = i + 1;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    const SpecialTokenPattern& pattern = patterns_[found];
    std::string_view before = text.substr(text_begin, pos - text_begin);
    if (pattern.lstrip) before.remove_suffix(TrailingSpaceBytes(before));
    if (!before.empty()) pieces.push_back(PromptPiece{.text = std::string(before)});
    pieces.push_back(PromptPiece{.text = pattern.content, .special_id = pattern.id});
    pos = found_end;
    if (pattern.rstrip) pos += LeadingSpaceBytes(text.substr(pos));
    text_begin = pos;
  }
  if (text_begin < text.size()) pieces.push_back(PromptPiece{.text = std::string(text.substr(text_begin))});
  return pieces;
}

absl::StatusOr<std::vector<int32_t>> EncodeWithSpecialTokens(std::string_view prompt,
                                                             const SpecialTokenMatcher& matcher,
                                                             const EncodeTextFn& encode) {
  std::vector<int32_t> ids;
  for (const PromptPiece& piece : matcher.Split(prompt)) {
    if (piece.is_special()) {
      ids.push_back(piece.special_id);
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> piece_ids, encode(piece.text));
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  }
  return ids;
}

}  // namespace tandem
