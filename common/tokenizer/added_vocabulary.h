// Added tokens: the tokens a tokenizer.json lists under "added_tokens" (a
// GGUF file's control and user-defined tokens), matched in the text before
// any pre-tokenizer sees it, as Hugging Face's AddedVocabulary does: the
// non-normalized ones in the raw text, the normalized ones in the
// normalized text; leftmost match, the longest where several start at one
// place; single_word, lstrip and rstrip as HF applies them. Special tokens
// are the ones skip_special_tokens drops when decoding.
//
// Immutable after Create: any thread may split text with it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/normalizer.h"

namespace tandem {

// A stretch of input text: plain text, or an added token (token_id >= 0,
// text its matched bytes).
struct TextPiece {
  std::string text;
  int32_t token_id = -1;
  bool at_origin = false;  // starts where the whole input starts
};

class AddedVocabulary {
 public:
  // One added token, as tokenizer.json's added_tokens lists it.
  struct Token {
    int32_t id = -1;  // as the file gives it; Create assigns the id HF uses
    std::string content;
    bool single_word = false;
    bool lstrip = false;
    bool rstrip = false;
    bool normalized = true;
    bool special = false;
  };

  // `tokens` in the file's order. Ids as HF's add_tokens gives them: the
  // model's id for a content the vocabulary holds, else the next one past
  // the model's vocabulary, in order. Normalized tokens are matched (and
  // decoded) in their normalized form. InvalidArgument naming `where` when
  // normalizing a content fails.
  static absl::StatusOr<AddedVocabulary> Create(std::vector<Token> tokens, const BpeModel& model,
                                                const Normalizer* normalizer, const std::string& where);
  AddedVocabulary() = default;

  // Splits every plain piece of `pieces` at the added tokens of one set:
  // the non-normalized tokens (`normalized` false, on the raw text) or the
  // normalized ones (on normalized text). Pieces that are tokens already
  // stay as they are; empty plain pieces are dropped.
  void Split(bool normalized, std::vector<TextPiece>* pieces) const;

  // The token with this id, or null.
  const Token* Find(int32_t id) const;
  // What decoding shows for the token: its normalized content when it is
  // normalized, else its content.
  const std::string& DecodedText(const Token& token) const;
  // Whether `text` is the content of a special token (HF filters decoded
  // tokens by content).
  bool IsSpecialContent(std::string_view text) const {
    return special_contents_.contains(absl::string_view(text.data(), text.size()));
  }
  // One past the largest id; 0 without tokens.
  int32_t id_limit() const { return id_limit_; }
  const std::vector<Token>& tokens() const { return tokens_; }

 private:
  // A byte trie over the patterns of one set.
  struct Trie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
      int32_t token = -1;                                       // index into tokens_ when a pattern ends here
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void Add(std::string_view pattern, int32_t token);
    int32_t Child(int32_t node, unsigned char byte) const;
    bool empty() const { return nodes.size() == 1; }
  };
  struct Match {
    size_t begin, end;
    int32_t token;  // index into tokens_, -1 for plain text
  };
  void FindMatches(std::string_view text, const Trie& trie, std::vector<Match>* matches) const;

  std::vector<Token> tokens_;                          // one per id, by first appearance
  std::vector<std::string> normalized_content_;        // per token; "" when the content is used
  absl::flat_hash_map<int32_t, int32_t> index_of_id_;  // id -> index into tokens_
  absl::flat_hash_set<std::string> special_contents_;
  Trie raw_trie_, normalized_trie_;
  int32_t id_limit_ = 0;
};

}  // namespace tandem
