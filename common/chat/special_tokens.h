// Special tokens in a rendered prompt become their ids: the text is split at
// every occurrence of an added token's content ("<s>", "[INST]",
// "<|im_start|>"), the tokens map to their ids and only the text between
// them is tokenized normally, as Hugging Face tokenizers do with their added
// vocabulary (leftmost match, the longest one where several start at the
// same place; lstrip/rstrip tokens absorb the whitespace beside them).
//
// Pure: the tokenizer itself is a callback, so this stays free of any
// tokenizer library. A matcher is immutable after Create: any thread may use it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct SpecialTokenPattern {
  std::string content;
  int32_t id = -1;
  bool lstrip = false;  // the whitespace right before it belongs to the token
  bool rstrip = false;  // the whitespace right after it belongs to the token
};

// A piece of a split prompt: plain text to tokenize (special_id < 0), or a
// special token (text holds its content).
struct PromptPiece {
  std::string text;
  int32_t special_id = -1;
  bool is_special() const { return special_id >= 0; }
};

class SpecialTokenMatcher {
 public:
  // InvalidArgument for an empty content, a negative id, or one content
  // given two different ids. The same content twice with one id is fine.
  static absl::StatusOr<SpecialTokenMatcher> Create(const std::vector<SpecialTokenPattern>& patterns);

  // `text` as pieces; concatenating the pieces' text gives `text` back
  // except for whitespace absorbed by lstrip/rstrip tokens. No piece of
  // plain text is empty. O(text length x longest token).
  std::vector<PromptPiece> Split(std::string_view text) const;

  size_t size() const { return num_patterns_; }

 private:
  // A byte trie over the patterns' contents.
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t pattern = -1;                                     // index into patterns_ when a content ends here
  };
  int32_t Child(int32_t node, unsigned char byte) const;

  std::vector<SpecialTokenPattern> patterns_;
  std::vector<Node> nodes_;
  size_t num_patterns_ = 0;
};

// Tokenizes plain text (no BOS added); `text` is a piece between special
// tokens.
using EncodeTextFn = std::function<absl::StatusOr<std::vector<int32_t>>(std::string_view text)>;

// The ids of `prompt`: special tokens as their ids, the text between them
// through `encode`. Errors are encode's.
absl::StatusOr<std::vector<int32_t>> EncodeWithSpecialTokens(std::string_view prompt,
                                                             const SpecialTokenMatcher& matcher,
                                                             const EncodeTextFn& encode);

}  // namespace tandem
