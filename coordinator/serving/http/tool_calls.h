// Tool calling in the formats current models write, chosen from the model's
// own chat template: Hermes/Qwen (<tool_call>{json}</tool_call>), Llama 3.x
// (a bare {"name", "parameters"} object, or after <|python_tag|>), Mistral
// ([TOOL_CALLS] and a JSON list, or [TOOL_CALLS]name[ARGS]{json}) and
// DeepSeek V3/R1 and V3.1 (<｜tool▁calls▁begin｜> markers).
//
// Three parts: the tool-call messages a client sends back made fit for the
// template; the model's output split into content and OpenAI tool_calls as
// it streams; and, for tool_choice "required" or a named function, the
// grammar that makes the output a well-formed call of the tools given
// (their parameters' JSON schemas enforced).
//
// ToolCallParser is one choice's: one thread at a time. The rest is pure.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "common/tokenizer/tokenizer.h"
#include "coordinator/generation/grammar_constraint.h"

namespace tandem {

enum class ToolCallFormat {
  kNone,         // the template renders no tool calls
  kHermes,       // Qwen 2.5/3, Hermes 2/3, and templates like them
  kLlama3,       // Llama 3.1-3.3
  kMistral,      // [TOOL_CALLS][{...}, ...]
  kMistralArgs,  // [TOOL_CALLS]name[ARGS]{...} (Mistral Small 3.2, Magistral, Devstral)
  kDeepSeekV3,   // V3, R1: function<｜tool▁sep｜>name\n```json\n{...}\n```
  kDeepSeekV31,  // V3.1: name<｜tool▁sep｜>{...}
};

ToolCallFormat DetectToolCallFormat(absl::string_view template_source);
absl::string_view ToolCallFormatName(ToolCallFormat format);

// The tools of a request, and what tool_choice asks.
struct ToolRequest {
  nlohmann::ordered_json tools;    // OpenAI's list, checked by the request parser
  std::string forced;              // a named function, or "" for any
  bool required = false;           // "required" or a named function: a call must come
  bool parallel = true;            // parallel_tool_calls
};

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text, as OpenAI sends it
};

// A new call id: call_ and 24 letters and digits, or 9 for Mistral (its
// templates check the length).
std::string NewToolCallId(ToolCallFormat format);

// `messages` as the template expects them: the arguments of an assistant's
// tool_calls parsed into objects (a JSON string is what OpenAI sends; most
// templates write them with tojson), left as text for DeepSeek's (which
// concatenate them). InvalidArgument naming the message for arguments that
// are not JSON.
absl::StatusOr<nlohmann::ordered_json> ToolMessagesForTemplate(const nlohmann::ordered_json& messages,
                                                               ToolCallFormat format);

// Splits a choice's output into content and tool calls as it streams: text
// that may begin a call is held back until it is known not to; a call is
// given out once complete. The output here is the model's text with its
// special tokens written out (a call's markers may be special tokens).
class ToolCallParser {
 public:
  ToolCallParser(ToolCallFormat format, bool parallel);

  struct Output {
    std::string content;
    std::vector<ToolCall> calls;
  };
  Output Push(absl::string_view text);
  // The end of the output: a call left open is parsed if it can be, else
  // given back as content (nothing is lost).
  Output Finish();
  int calls() const { return calls_made_; }

 private:
  void Scan(Output& out, bool final);
  void EmitCalls(absl::string_view section, Output& out);
  void EmitContent(absl::string_view text, Output& out);

  ToolCallFormat format_;
  bool parallel_;
  std::string buffer_;        // text not yet given out
  bool in_call_ = false;      // buffer_ starts at a call section's start marker
  bool started_ = false;      // some output seen (Llama 3's bare object must come first)
  std::string held_space_;    // whitespace held until text follows (dropped after calls)
  int calls_made_ = 0;
};

// The grammar a forced call follows (tool_choice "required" or named),
// matched over `vocabulary`; markers that are one special token are matched
// as that token. InvalidArgument naming tools[i].function.parameters for a
// schema it cannot enforce, or the format when it has no grammar.
absl::StatusOr<std::shared_ptr<TokenGrammar>> ToolCallGrammar(ToolCallFormat format, const ToolRequest& request,
                                                              const Tokenizer& tokenizer,
                                                              std::shared_ptr<const VocabularyIndex> vocabulary,
                                                              std::vector<int32_t> end_ids);

}  // namespace tandem
