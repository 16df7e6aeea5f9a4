#include "coordinator/serving/http/reasoning.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

constexpr absl::string_view kOpen = "<think>";
constexpr absl::string_view kClose = "</think>";

// How many bytes at the end of `text` may be the start of `marker`.
size_t PartialSuffix(absl::string_view text, absl::string_view marker) {
  for (size_t k = std::min(text.size(), marker.size() - 1); k > 0; --k) {
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

}  // namespace

bool TemplateThinks(absl::string_view source) { return absl::StrContains(source, kOpen); }

bool PromptOpensThinking(absl::string_view prompt) {
  return absl::EndsWith(absl::StripTrailingAsciiWhitespace(prompt), kOpen);
}

ReasoningSplitter::ReasoningSplitter(bool starts_thinking)
    : state_(starts_thinking ? State::kThinking : State::kStart) {}

void ReasoningSplitter::Scan(Output& out, bool final) {
  for (;;) {
    switch (state_) {
      case State::kStart: {
        // The model may open its reasoning first thing (after whitespace).
        const absl::string_view rest = absl::StripLeadingAsciiWhitespace(buffer_);
        if (absl::StartsWith(rest, kOpen)) {
          buffer_.erase(0, buffer_.size() - rest.size() + kOpen.size());
          state_ = State::kThinking;
          continue;
        }
        if (!final && kOpen.substr(0, rest.size()) == rest) return;  // may still become <think>
        state_ = State::kContent;
        continue;
      }
      case State::kThinking: {
        const size_t end = absl::string_view(buffer_).find(kClose);
        if (end != std::string::npos) {
          absl::StrAppend(&out.reasoning, absl::string_view(buffer_).substr(0, end));
          buffer_.erase(0, end + kClose.size());
          state_ = State::kContent;
          after_think_ = true;
          continue;
        }
        const size_t keep = final ? 0 : PartialSuffix(buffer_, kClose);
        absl::StrAppend(&out.reasoning, absl::string_view(buffer_).substr(0, buffer_.size() - keep));
        buffer_.erase(0, buffer_.size() - keep);
        return;
      }
      case State::kContent:
        if (after_think_) {
          // "</think>\n\n" then the answer: the blank lines are the template's.
          const size_t text = buffer_.find_first_not_of("\r\n");
          if (text == std::string::npos && !final) {
            buffer_.clear();
            return;
          }
          buffer_.erase(0, text == std::string::npos ? buffer_.size() : text);
          after_think_ = false;
        }
        out.content += buffer_;
        buffer_.clear();
        return;
    }
  }
}

ReasoningSplitter::Output ReasoningSplitter::Push(absl::string_view text) {
  Output out;
  absl::StrAppend(&buffer_, text);
  Scan(out, false);
  return out;
}

ReasoningSplitter::Output ReasoningSplitter::Finish() {
  Output out;
  Scan(out, true);
  return out;
}

}  // namespace tandem
