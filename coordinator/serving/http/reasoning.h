// A thinking model's reasoning kept out of its answer: the text between
// <think> and </think> (Qwen3, QwQ, DeepSeek R1, GLM-4.5) is given out as
// OpenAI-style `reasoning_content`, the rest as `content`, as llama-server
// and vLLM do. The output may start inside the reasoning when the chat
// template already opened it (R1's and Qwen3's templates end the prompt
// with "<think>\n"), or open it itself.
//
// ReasoningSplitter is one choice's: one thread at a time.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

// Whether a chat template makes its model think in <think> tags.
bool TemplateThinks(absl::string_view template_source);
// Whether a rendered prompt ends inside an open <think> (the output starts
// as reasoning).
bool PromptOpensThinking(absl::string_view prompt);

class ReasoningSplitter {
 public:
  explicit ReasoningSplitter(bool starts_thinking);

  struct Output {
    std::string reasoning;
    std::string content;
  };
  Output Push(absl::string_view text);
  // The end of the output: whatever was held back goes out (an unclosed
  // reasoning stays reasoning).
  Output Finish();

 private:
  enum class State { kStart, kThinking, kContent };
  void Scan(Output& out, bool final);

  State state_;
  std::string buffer_;  // text held back: a marker may be starting
  bool after_think_ = false;  // the newlines right after </think> are dropped
};

}  // namespace tandem
