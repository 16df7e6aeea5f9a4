// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}) or of a
// GGUF "gpt2" vocabulary: the vocabulary (token string -> id), the merges
// (ranked pairs of tokens) and how a word with no merge path is spelled
// (byte_fallback's <0xNN> tokens, the unknown token, or nothing). Encoding a
// word applies, as Hugging Face's BPE does, the lowest-ranked merge among
// adjacent pairs, the leftmost where several rank the same, until none
// applies; ignore_merges first looks the whole word up.
//
// Immutable after Create: any thread may tokenize with it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Token ids are bounded so that tables indexed by id stay small: no real
// vocabulary comes near 4M entries.
inline constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

struct BpeModelOptions {
  std::optional<std::string> unk_token;
  std::optional<std::string> continuing_subword_prefix;
  std::optional<std::string> end_of_word_suffix;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;
};

class BpeModel {
 public:
  // `vocab`: (token, id) pairs; `merges`: pairs in rank order. `where`
  // names them in errors ("tokenizer.json: model"). InvalidArgument for an
  // id outside [0, kMaxTokenId], two tokens with one id, a merge naming a
  // token (or making one) that is not in the vocabulary, an unk_token that
  // is not in it.
  static absl::StatusOr<BpeModel> Create(std::vector<std::pair<std::string, int32_t>> vocab,
                                         const std::vector<std::pair<std::string, std::string>>& merges,
                                         BpeModelOptions options, const std::string& where);

  // Appends the ids of one word (a pre-tokenized piece, valid UTF-8).
  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const;

  // An empty model (no tokens); Create makes real ones.
  BpeModel() = default;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token's string; null for an id the vocabulary does not hold.
  const std::string* IdToToken(int32_t id) const;
  // Entries in the vocabulary (HF's get_vocab_size).
  size_t size() const { return vocab_.size(); }
  // One past the largest id.
  int32_t id_limit() const { return static_cast<int32_t>(tokens_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  // One symbol of a word being merged: a token id covering bytes of the word.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t length;  // bytes of the word it covers; 0 once merged away
  };

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  const Merge* FindMerge(int32_t left, int32_t right) const;
  // The word's characters as symbols (with byte_fallback and unk applied).
  void InitialSymbols(std::string_view word, std::vector<Symbol>* symbols) const;
  std::optional<int32_t> CharId(std::string_view character, bool first, bool last) const;
  // Applies the merges: a scan per merge for short words, a heap for long.
  void MergeShort(std::vector<Symbol>* symbols) const;
  void MergeLong(std::vector<Symbol>* symbols) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id ("" where none)
  std::vector<bool> has_token_;      // by id
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::vector<int32_t> char_ids_;  // id of the one-character token for code points < 0x800, else -1
  std::vector<int32_t> byte_ids_;  // id of "<0xNN>" per byte (byte_fallback), else -1
  int32_t unk_id_ = -1;
  BpeModelOptions options_;
  bool plain_ = true;  // no prefix or suffix: characters map through char_ids_
};

}  // namespace tandem
