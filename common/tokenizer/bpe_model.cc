#include "common/tokenizer/bpe_model.h"

#include <algorithm>
#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {
namespace {

// Words up to this many symbols merge by scanning (cheaper than a heap for
// the short words byte-level pre-tokenizers produce).
constexpr size_t kShortWordSymbols = 48;
constexpr char32_t kCharTableSize = 0x800;

}  // namespace

absl::StatusOr<BpeModel> BpeModel::Create(std::vector<std::pair<std::string, int32_t>> vocab,
                                          const std::vector<std::pair<std::string, std::string>>& merges,
                                          BpeModelOptions options, const std::string& where) {
  BpeModel model;
  model.options_ = std::move(options);
  model.plain_ = !model.options_.continuing_subword_prefix && !model.options_.end_of_word_suffix;
  int32_t limit = 0;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id > kMaxTokenId) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".vocab[\"", token, "\"]: id ", id, " is outside [0, ", kMaxTokenId, "]"));
    }
    limit = std::max(limit, id + 1);
  }
  model.tokens_.resize(limit);
  model.has_token_.assign(limit, false);
  model.vocab_.reserve(vocab.size());
  for (auto& [token, id] : vocab) {
    if (model.has_token_[id]) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".vocab: id ", id, " is given to two tokens, \"",
                                                     model.tokens_[id], "\" and \"", token, "\""));
    }
    if (!model.vocab_.emplace(token, id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".vocab: token \"", token, "\" has two ids, ", model.vocab_[token], " and ", id));
    }
    model.has_token_[id] = true;
    model.tokens_[id] = std::move(token);
  }
  const size_t prefix_length =
      model.options_.continuing_subword_prefix ? model.options_.continuing_subword_prefix->size() : 0;
  model.merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    std::string merged = left;
    if (right.size() < prefix_length) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".merges[", rank, "]: \"", right, "\" is shorter than the continuing_subword_prefix"));
    }
    merged.append(right, prefix_length);
    const std::optional<int32_t> a = model.TokenToId(left), b = model.TokenToId(right), c = model.TokenToId(merged);
    if (!a || !b || !c) {
      const std::string& missing = !a ? left : !b ? right : merged;
      return absl::InvalidArgumentError(absl::StrCat(where, ".merges[", rank, "]: \"", left, "\" + \"", right,
                                                     "\": token \"", missing, "\" is not in the vocabulary"));
    }
    // A pair listed twice keeps its later rank, as HF's map does.
    model.merges_[PairKey(*a, *b)] = Merge{static_cast<int32_t>(rank), *c};
  }
  if (model.options_.unk_token) {
    const std::optional<int32_t> unk = model.TokenToId(*model.options_.unk_token);
    if (!unk) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".unk_token: \"", *model.options_.unk_token, "\" is not in the vocabulary"));
    }
    model.unk_id_ = *unk;
  }
  model.char_ids_.assign(kCharTableSize, -1);
  for (char32_t c = 0; c < kCharTableSize; ++c) {
    std::string utf8;
    AppendUtf8(c, &utf8);
    if (auto id = model.TokenToId(utf8)) model.char_ids_[c] = *id;
  }
  model.byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    if (auto id = model.TokenToId(absl::StrFormat("<0x%02X>", b))) model.byte_ids_[b] = *id;
  }
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

const BpeModel::Merge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::optional<int32_t> BpeModel::CharId(std::string_view character, bool first, bool last) const {
  if (plain_) {
    size_t pos = 0;
    const char32_t c = NextCodePoint(character, &pos);
    if (c < kCharTableSize) {
      const int32_t id = char_ids_[c];
      return id < 0 ? std::nullopt : std::optional<int32_t>(id);
    }
    return TokenToId(character);
  }
  std::string spelled;
  if (!first && options_.continuing_subword_prefix) spelled = *options_.continuing_subword_prefix;
  spelled.append(character);
  if (last && options_.end_of_word_suffix) spelled.append(*options_.end_of_word_suffix);
  return TokenToId(spelled);
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<Symbol>* symbols) const {
  symbols->clear();
  // A run of characters without a token, pending as one unknown symbol.
  int32_t unk_length = 0;
  bool unk_pending = false;
  auto add = [symbols](int32_t id, uint32_t length) {
    const int32_t index = static_cast<int32_t>(symbols->size());
    symbols->push_back({id, index - 1, index + 1, length});
  };
  for (size_t pos = 0; pos < word.size();) {
    const size_t begin = pos;
    pos += std::min(Utf8SequenceLength(static_cast<uint8_t>(word[pos])), word.size() - pos);
    const std::string_view character = word.substr(begin, pos - begin);
    if (const std::optional<int32_t> id = CharId(character, begin == 0, pos == word.size())) {
      if (unk_pending) add(unk_id_, unk_length);
      unk_pending = false;
      add(*id, static_cast<uint32_t>(character.size()));
      continue;
    }
    if (options_.byte_fallback) {
      // HF spells the character as it would be looked up: with the prefix or
      // suffix when they apply.
      std::string spelled(character);
      if (!plain_) {
        if (begin != 0 && options_.continuing_subword_prefix) spelled.insert(0, *options_.continuing_subword_prefix);
        if (pos == word.size() && options_.end_of_word_suffix) spelled.append(*options_.end_of_word_suffix);
      }
      const bool all_bytes = std::all_of(spelled.begin(), spelled.end(),
                                         [this](char b) { return byte_ids_[static_cast<uint8_t>(b)] >= 0; });
      if (all_bytes) {
        for (char b : spelled) add(byte_ids_[static_cast<uint8_t>(b)], 1);
        continue;
      }
    }
    if (unk_id_ < 0) continue;  // no unknown token: the character is dropped, as HF drops it
    if (unk_pending && options_.fuse_unk) {
      unk_length += static_cast<int32_t>(character.size());
    } else {
      if (unk_pending) add(unk_id_, unk_length);
      unk_pending = true;
      unk_length = static_cast<int32_t>(character.size());
    }
  }
  if (unk_pending) add(unk_id_, unk_length);
  if (!symbols->empty()) symbols->back().next = -1;
}

void BpeModel::MergeShort(std::vector<Symbol>* symbols) const {
  std::vector<Symbol>& s = *symbols;
  // The merge of each symbol with its next one (null when none), kept up to
  // date so that each round is a scan of integers.
  thread_local std::vector<const Merge*> pair_merge;
  pair_merge.assign(s.size(), nullptr);
  for (size_t i = 0; i + 1 < s.size(); ++i) pair_merge[i] = FindMerge(s[i].id, s[i + 1].id);
  while (true) {
    int32_t best = -1;
    int32_t best_rank = 0;
    for (int32_t i = 0; i >= 0; i = s[i].next) {
      const Merge* merge = pair_merge[i];
      if (merge != nullptr && (best < 0 || merge->rank < best_rank)) {
        best = i;
        best_rank = merge->rank;
      }
    }
    if (best < 0) return;
    Symbol& left = s[best];
    Symbol& right = s[left.next];
    left.id = pair_merge[best]->new_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) s[left.next].prev = best;
    pair_merge[best] = left.next >= 0 ? FindMerge(left.id, s[left.next].id) : nullptr;
    if (left.prev >= 0) pair_merge[left.prev] = FindMerge(s[left.prev].id, left.id);
  }
}

void BpeModel::MergeLong(std::vector<Symbol>* symbols) const {
  std::vector<Symbol>& s = *symbols;
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(s.size()); ++i) {
    if (const Merge* m = FindMerge(s[i].id, s[i + 1].id)) queue.push({m->rank, i, m->new_id});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = s[top.pos];
    if (left.length == 0 || left.next < 0) continue;
    const int32_t next = left.next;
    const Merge* current = FindMerge(left.id, s[next].id);
    if (current == nullptr || current->new_id != top.new_id) continue;  // a stale entry
    left.id = top.new_id;
    left.length += s[next].length;
    s[next].length = 0;
    left.next = s[next].next;
    if (left.next >= 0) s[left.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const Merge* m = FindMerge(s[left.prev].id, left.id)) queue.push({m->rank, left.prev, m->new_id});
    }
    if (left.next >= 0) {
      if (const Merge* m = FindMerge(left.id, s[left.next].id)) queue.push({m->rank, top.pos, m->new_id});
    }
  }
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (std::optional<int32_t> id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  InitialSymbols(word, &symbols);
  if (symbols.empty()) return;
  if (symbols.size() <= kShortWordSymbols) {
    MergeShort(&symbols);
  } else {
    MergeLong(&symbols);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace tandem
