#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {
namespace {

// Whether the last character of `s` is a word character (HF: regex \w$).
bool EndsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t begin = s.size() - 1;
  while (begin > 0 && (static_cast<uint8_t>(s[begin]) & 0xC0) == 0x80) --begin;
  size_t pos = begin;
  return IsWordCharacter(NextCodePoint(s, &pos));
}

bool StartsWithWord(std::string_view s) {
  if (s.empty()) return false;
  size_t pos = 0;
  return IsWordCharacter(NextCodePoint(s, &pos));
}

// Where the whitespace at the end of `s` starts (HF: \s*$).
size_t TrailingSpaceStart(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t begin = start - 1;
    while (begin > 0 && (static_cast<uint8_t>(s[begin]) & 0xC0) == 0x80) --begin;
    size_t pos = begin;
    if (!IsWhitespace(NextCodePoint(s, &pos))) break;
    start = begin;
  }
  return start;
}

// Bytes of whitespace at the start of `s` (HF: ^\s*).
size_t LeadingSpaceLength(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    size_t next = pos;
    if (!IsWhitespace(NextCodePoint(s, &next))) break;
    pos = next;
  }
  return pos;
}

}  // namespace

void AddedVocabulary::Trie::Add(std::string_view pattern, int32_t token) {
  int32_t node = 0;
  first_byte[static_cast<unsigned char>(pattern[0])] = true;
  for (unsigned char byte : pattern) {
    int32_t next = Child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes.size());
      auto& children = nodes[node].children;
      children.insert(std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1})),
                      {byte, next});
      nodes.emplace_back();
    }
    node = next;
  }
  nodes[node].token = token;
}

int32_t AddedVocabulary::Trie::Child(int32_t node, unsigned char byte) const {
  const auto& children = nodes[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(byte, int32_t{-1}));
  return it != children.end() && it->first == byte ? it->second : -1;
}

absl::StatusOr<AddedVocabulary> AddedVocabulary::Create(std::vector<Token> tokens, const BpeModel& model,
                                                        const Normalizer* normalizer, const std::string& where) {
  AddedVocabulary vocabulary;
  absl::flat_hash_map<std::string, int32_t> id_of_content;
  int64_t next_id = static_cast<int64_t>(model.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    Token& token = tokens[i];
    if (token.content.empty()) continue;  // HF ignores empty added tokens
    int64_t id;
    if (auto it = id_of_content.find(token.content); it != id_of_content.end()) {
      id = it->second;
    } else if (std::optional<int32_t> in_model = model.TokenToId(token.content)) {
      id = *in_model;
    } else {
      id = next_id++;
    }
    if (id > kMaxTokenId) {
      return absl::InvalidArgumentError(absl::StrCat(where, "[", i, "]: id ", id, " is past ", kMaxTokenId));
    }
    token.id = static_cast<int32_t>(id);
    id_of_content[token.content] = token.id;
    if (token.special) vocabulary.special_contents_.insert(token.content);
    std::string normalized;
    if (token.normalized && normalizer != nullptr) {
      std::string text = token.content;
      if (absl::Status status = normalizer->Normalize(&text); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(where, "[", i, "]: ", status.message()));
      }
      if (text != token.content) normalized = std::move(text);
    }
    // A later entry for the same id replaces the earlier one, as in HF's map.
    if (auto it = vocabulary.index_of_id_.find(token.id); it != vocabulary.index_of_id_.end()) {
      vocabulary.tokens_[it->second] = std::move(token);
      vocabulary.normalized_content_[it->second] = std::move(normalized);
    } else {
      vocabulary.index_of_id_[token.id] = static_cast<int32_t>(vocabulary.tokens_.size());
      vocabulary.tokens_.push_back(std::move(token));
      vocabulary.normalized_content_.push_back(std::move(normalized));
    }
  }
  for (size_t i = 0; i < vocabulary.tokens_.size(); ++i) {
    const Token& token = vocabulary.tokens_[i];
    vocabulary.id_limit_ = std::max(vocabulary.id_limit_, token.id + 1);
    if (token.normalized) {
      const std::string& pattern = vocabulary.DecodedText(token);
      if (!pattern.empty()) vocabulary.normalized_trie_.Add(pattern, static_cast<int32_t>(i));
    } else {
      vocabulary.raw_trie_.Add(token.content, static_cast<int32_t>(i));
    }
  }
  return vocabulary;
}

const AddedVocabulary::Token* AddedVocabulary::Find(int32_t id) const {
  auto it = index_of_id_.find(id);
  return it == index_of_id_.end() ? nullptr : &tokens_[it->second];
}

const std::string& AddedVocabulary::DecodedText(const Token& token) const {
  const std::string& normalized = normalized_content_[index_of_id_.at(token.id)];
  return normalized.empty() ? token.content : normalized;
}

void AddedVocabulary::FindMatches(std::string_view text, const Trie& trie, std::vector<Match>* matches) const {
  matches->clear();
  size_t start_offset = 0;  // end of the last piece emitted
  size_t pos = 0;           // where the trie search resumes
  while (pos < text.size()) {
    if (!trie.first_byte[static_cast<unsigned char>(text[pos])]) {
      ++pos;
      continue;
    }
    // The longest pattern starting at pos.
    int32_t node = 0, found = -1;
    size_t found_end = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = trie.Child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (trie.nodes[node].token >= 0) {
        found = trie.nodes[node].token;
        found_end = i + 1;
      }
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = found_end;
    pos = found_end;
    const Token& token = tokens_[found];
    if (token.single_word) {
      const bool start_space = start == 0 || !EndsWithWord(text.substr(0, start));
      const bool stop_space = stop == text.size() || !StartsWithWord(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (token.lstrip) start = std::max(TrailingSpaceStart(text.substr(0, start)), start_offset);
    if (token.rstrip) stop += LeadingSpaceLength(text.substr(stop));
    if (start_offset < start) matches->push_back({start_offset, start, -1});
    matches->push_back({start, stop, found});
    start_offset = stop;
  }
  if (start_offset != text.size()) matches->push_back({start_offset, text.size(), -1});
}

void AddedVocabulary::Split(bool normalized, std::vector<TextPiece>* pieces) const {
  const Trie& trie = normalized ? normalized_trie_ : raw_trie_;
  std::vector<TextPiece> out;
  out.reserve(pieces->size());
  std::vector<Match> matches;
  for (TextPiece& piece : *pieces) {
    if (piece.token_id >= 0) {
      out.push_back(std::move(piece));
      continue;
    }
    if (piece.text.empty()) continue;
    if (trie.empty()) {
      out.push_back(std::move(piece));
      continue;
    }
    FindMatches(piece.text, trie, &matches);
    for (const Match& match : matches) {
      if (match.end <= match.begin && match.token < 0) continue;
      out.push_back({piece.text.substr(match.begin, match.end - match.begin),
                     match.token < 0 ? -1 : tokens_[match.token].id, piece.at_origin && match.begin == 0});
    }
  }
  *pieces = std::move(out);
}

}  // namespace tandem
