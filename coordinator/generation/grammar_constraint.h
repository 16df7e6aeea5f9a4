// Constrained decoding: a Grammar over the model's vocabulary. Which tokens
// may come next (a mask the sampler applies to the logits, or a yes/no for
// one token), and the grammar advanced by the token chosen.
//
// VocabularyIndex is built once per model and shared (immutable: any
// thread); a GrammarConstraint is one sequence's, used by one thread at a
// time (its sampler's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/generation/grammar.h"
#include "coordinator/generation/grammar_matcher.h"

namespace tandem {

// The vocabulary as bytes, arranged for masking: each token's text (its
// streamed piece), the tokens that have text sorted bytewise with the length
// of the prefix each shares with the one before (a walk steps a shared
// prefix once and skips every token behind a rejected prefix), and which
// tokens are plain JSON string content (no quote, backslash or control
// byte; whole UTF-8) and how many characters each is: inside a string
// those are allowed at once, by length, without a walk.
class VocabularyIndex {
 public:
  struct Walk {
    std::vector<int32_t> ids;
    std::vector<uint16_t> shared;  // bytes shared with the previous id's text
  };
  // `vocab_size`: the model's (it may exceed the tokenizer's; those rows
  // have no text and are never allowed).
  static std::shared_ptr<const VocabularyIndex> Build(const Tokenizer& tokenizer, int32_t vocab_size);

  int32_t vocab_size() const { return static_cast<int32_t>(offsets_.size()) - 1; }
  std::string_view text(int32_t id) const {
    return std::string_view(bytes_).substr(offsets_[static_cast<size_t>(id)],
                                           offsets_[static_cast<size_t>(id) + 1] - offsets_[static_cast<size_t>(id)]);
  }
  // The characters of a plain token's text (< 256); 0 for a token that is
  // not plain.
  uint8_t plain_chars(int32_t id) const { return plain_chars_[static_cast<size_t>(id)]; }
  const Walk& all() const { return all_; }
  const Walk& not_plain() const { return not_plain_; }

 private:
  std::string bytes_;
  std::vector<uint32_t> offsets_;
  std::vector<uint8_t> plain_chars_;
  Walk all_, not_plain_;
};

// What a request's sampler is constrained by: the grammar and the
// vocabulary it is matched over.
struct TokenGrammar {
  Grammar grammar;
  std::shared_ptr<const VocabularyIndex> vocabulary;
};

class GrammarConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const TokenGrammar> grammar);

  // Whether `id` may come next.
  bool Allows(int32_t id) const;
  // allowed[id] = 1 for each token that may come next, 0 otherwise
  // (resized to the vocabulary).
  void AllowedTokens(std::vector<uint8_t>* allowed);
  // Advances by `id`; FailedPrecondition when it was not allowed.
  absl::Status Accept(int32_t id);
  // An end id the grammar accepts now, or -1.
  int32_t EndId() const;
  // Whether the grammar is complete (only an end id may follow).
  bool complete() const;

 private:
  bool IsEnd(int32_t id) const;
  void MarkWalk(const VocabularyIndex::Walk& walk, std::vector<uint8_t>& allowed);

  std::shared_ptr<const TokenGrammar> grammar_;
  GrammarMatcher matcher_;
  GrammarState state_;
  std::vector<GrammarState> depth_states_;  // a walk's states, by byte
  mutable GrammarState scratch_, trial_;
};

}  // namespace tandem
