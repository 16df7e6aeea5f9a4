// Tool calls: the format read from a template, a model's output split into
// content and calls (streamed byte by byte or whole, the same), the
// messages a client sends back made fit for the template, and the grammar
// of a forced call: every output it allows parses back into calls of the
// tools given, with arguments that validate.
#include "coordinator/serving/http/tool_calls.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "coordinator/generation/json_schema_grammar.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

TEST(ToolCallFormat, ReadFromTheTemplate) {
  EXPECT_EQ(DetectToolCallFormat("{{- '<tool_call>\\n' }}{{ tool_call | tojson }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(DetectToolCallFormat("<|start_header_id|>ipython<|end_header_id|>"), ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("{{ '<|python_tag|>' }}"), ToolCallFormat::kLlama3);
  EXPECT_EQ(DetectToolCallFormat("[TOOL_CALLS] [{{ tool_calls | tojson }}]"), ToolCallFormat::kMistral);
  EXPECT_EQ(DetectToolCallFormat("[TOOL_CALLS]{{ name }}[ARGS]{{ args }}"), ToolCallFormat::kMistralArgs);
  EXPECT_EQ(DetectToolCallFormat("<｜tool▁calls▁begin｜>...```json"), ToolCallFormat::kDeepSeekV3);
  EXPECT_EQ(DetectToolCallFormat("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"), ToolCallFormat::kDeepSeekV31);
  EXPECT_EQ(DetectToolCallFormat("{{ messages[0].content }}"), ToolCallFormat::kNone);
}

// The parser's output for `text`, pushed whole and byte by byte: both must agree.
ToolCallParser::Output Parse(ToolCallFormat format, const std::string& text, bool parallel = true) {
  ToolCallParser whole(format, parallel), bytes(format, parallel);
  ToolCallParser::Output a = whole.Push(text), b;
  ToolCallParser::Output end = whole.Finish();
  a.content += end.content;
  a.calls.insert(a.calls.end(), end.calls.begin(), end.calls.end());
  for (char c : text) {
    ToolCallParser::Output o = bytes.Push(std::string(1, c));
    b.content += o.content;
    b.calls.insert(b.calls.end(), o.calls.begin(), o.calls.end());
  }
  end = bytes.Finish();
  b.content += end.content;
  b.calls.insert(b.calls.end(), end.calls.begin(), end.calls.end());
  EXPECT_EQ(a.content, b.content) << text;
  EXPECT_EQ(a.calls.size(), b.calls.size()) << text;
  for (size_t i = 0; i < std::min(a.calls.size(), b.calls.size()); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name);
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments);
  }
  return a;
}

TEST(ToolCallParser, HermesCallsAndTheContentAroundThem) {
  ToolCallParser::Output o = Parse(ToolCallFormat::kHermes,
                                   "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                                   "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
                                   "{}}\n</tool_call>\n");
  EXPECT_EQ(o.content, "Let me look.");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(o.calls[1].name, "get_time");
  EXPECT_EQ(o.calls[0].id.rfind("call_", 0), 0u);
  EXPECT_EQ(o.calls[0].id.size(), 29u);
  EXPECT_NE(o.calls[0].id, o.calls[1].id);
  // parallel_tool_calls false: the first call only.
  EXPECT_EQ(Parse(ToolCallFormat::kHermes,
                  "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>",
                  false)
                .calls.size(),
            1u);
  // Left open at the end (the model stopped at its EOS): still a call.
  o = Parse(ToolCallFormat::kHermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].arguments, R"({"x":1})");
  // Not a call after all: nothing is lost.
  o = Parse(ToolCallFormat::kHermes, "I would write <tool_call>not json</tool_call> here.");
  EXPECT_TRUE(o.calls.empty());
  EXPECT_EQ(o.content, "I would write <tool_call>not json</tool_call> here.");
  o = Parse(ToolCallFormat::kHermes, "a <tool_ca");
  EXPECT_EQ(o.content, "a <tool_ca");
  // Plain text streams through.
  EXPECT_EQ(Parse(ToolCallFormat::kHermes, "Just text, <b>bold</b>.").content, "Just text, <b>bold</b>.");
}

TEST(ToolCallParser, Llama3MistralAndDeepSeek) {
  ToolCallParser::Output o =
      Parse(ToolCallFormat::kLlama3, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(o.content, "");
  o = Parse(ToolCallFormat::kLlama3, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(Parse(ToolCallFormat::kLlama3, "The answer is {x}.").content, "The answer is {x}.");

  o = Parse(ToolCallFormat::kMistral,
            "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": [1]}}, {\"name\": \"b\", \"arguments\": {}}]");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].arguments, R"({"k":[1]})");
  EXPECT_EQ(o.calls[0].id.size(), 9u);  // Mistral's templates check it
  o = Parse(ToolCallFormat::kMistralArgs, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Rome\"}[TOOL_CALLS]b[ARGS]{}");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, R"({"city": "Rome"})");

  o = Parse(ToolCallFormat::kDeepSeekV3,
            "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
            "\"Lima\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜><"
            "｜tool▁calls▁end｜>");
  EXPECT_EQ(o.content, "Checking.");
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].name, "get_weather");
  EXPECT_EQ(o.calls[0].arguments, R"({"city": "Lima"})");
  o = Parse(ToolCallFormat::kDeepSeekV31,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Kyiv\"}<｜tool▁call▁end｜><｜"
            "tool▁calls▁end｜>");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].arguments, R"({"city": "Kyiv"})");
}

TEST(ToolMessages, ArgumentsBecomeObjectsExceptForDeepSeek) {
  const Json messages = Json::parse(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}])");
  ASSERT_OK_AND_ASSIGN(Json hermes, ToolMessagesForTemplate(messages, ToolCallFormat::kHermes));
  EXPECT_EQ(hermes[1]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  ASSERT_OK_AND_ASSIGN(Json deepseek, ToolMessagesForTemplate(messages, ToolCallFormat::kDeepSeekV3));
  EXPECT_EQ(deepseek[1]["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\"}");
  Json bad = messages;
  bad[1]["tool_calls"][0]["function"]["arguments"] = "{city";
  const absl::Status s = ToolMessagesForTemplate(bad, ToolCallFormat::kHermes).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("messages[1].tool_calls[0].function.arguments"), std::string::npos) << s;
}

// A vocabulary of single bytes, a few words, and the formats' markers as
// special tokens (no text): Encode finds a marker as its one token.
class MarkerTokenizer : public Tokenizer {
 public:
  MarkerTokenizer() {
    for (int b = 0; b < 256; ++b) pieces_.push_back(std::string(1, static_cast<char>(b)));
    for (const char* p : {"get_weather", "city", "\": \"", "\"}", "Paris", "{\"name\": \"", "arguments"}) {
      pieces_.push_back(p);
    }
    for (const char* m : {"[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                          "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"}) {
      specials_[m] = static_cast<int32_t>(pieces_.size());
      names_.push_back(m);
      pieces_.push_back("");
    }
    eos_ = static_cast<int32_t>(pieces_.size());
    pieces_.push_back("");
  }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool) const override {
    if (auto it = specials_.find(std::string(text)); it != specials_.end()) return std::vector<int32_t>{it->second};
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  void AddSpecialTokens(std::vector<int32_t>*) const override {}
  using Tokenizer::Decode;
  absl::StatusOr<std::string> Decode(std::span<const int32_t>, const DecodeOptions&) const override { return ""; }
  std::string PieceText(int32_t id) const override { return pieces_[static_cast<size_t>(id)]; }
  // What the server writes for a token: its text, or a special token's name.
  std::string Written(int32_t id) const {
    if (pieces_[static_cast<size_t>(id)].empty() && id != eos_) {
      for (const auto& [name, sid] : specials_) {
        if (sid == id) return name;
      }
    }
    return pieces_[static_cast<size_t>(id)];
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return eos_; }

 private:
  std::vector<std::string> pieces_, names_;
  std::map<std::string, int32_t> specials_;
  int32_t eos_ = -1;
};

TEST(ToolCallGrammar, EveryForcedOutputParsesIntoCallsOfTheToolsWithValidArguments) {
  MarkerTokenizer tok;
  auto vocab = VocabularyIndex::Build(tok, tok.vocab_size());
  const Json weather_params = Json::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]}}, "required": ["city"]})");
  const Json tools = Json::array(
      {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", weather_params}}}},
       {{"type", "function"}, {"function", {{"name", "now"}}}}});
  Grammar check;
  ASSERT_OK_AND_ASSIGN(check.root, AddJsonSchema(weather_params, "p", &check));
  for (ToolCallFormat format : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kMistral,
                                ToolCallFormat::kMistralArgs, ToolCallFormat::kDeepSeekV3, ToolCallFormat::kDeepSeekV31}) {
    for (const std::string forced : {"", "get_weather"}) {
      ToolRequest request{.tools = tools, .forced = forced, .required = true, .parallel = true};
      ASSERT_OK_AND_ASSIGN(std::shared_ptr<TokenGrammar> grammar,
                           ToolCallGrammar(format, request, tok, vocab, {tok.eos_id()}));
      std::mt19937 rng(static_cast<unsigned>(format) * 31 + forced.size());
      for (int walk = 0; walk < 10; ++walk) {
        GrammarConstraint c(grammar);
        std::vector<uint8_t> allowed;
        std::string written;
        for (int step = 0; step < 600; ++step) {
          c.AllowedTokens(&allowed);
          std::vector<int32_t> ids, closers;
          for (int32_t id = 0; id < tok.vocab_size(); ++id) {
            if (!allowed[static_cast<size_t>(id)]) continue;
            ids.push_back(id);
            const std::string w = tok.Written(id);
            if (w.find_first_of("\"}]") != std::string::npos || tok.PieceText(id).empty()) closers.push_back(id);
          }
          ASSERT_FALSE(ids.empty()) << written;
          int32_t id = ids[rng() % ids.size()];
          if (c.EndId() >= 0 && rng() % 2 == 0) {
            id = c.EndId();
          } else if (!closers.empty() && rng() % 2 == 0) {
            id = closers[rng() % closers.size()];
          }
          ASSERT_OK(c.Accept(id));
          if (id == tok.eos_id()) break;
          written += tok.Written(id);
        }
        ASSERT_TRUE(c.complete()) << ToolCallFormatName(format) << ": " << written;
        ToolCallParser parser(format, true);
        ToolCallParser::Output out = parser.Push(written);
        ToolCallParser::Output end = parser.Finish();
        out.calls.insert(out.calls.end(), end.calls.begin(), end.calls.end());
        ASSERT_FALSE(out.calls.empty()) << ToolCallFormatName(format) << ": " << written;
        EXPECT_EQ(out.content + end.content, "") << written;
        for (const ToolCall& call : out.calls) {
          if (!forced.empty()) EXPECT_EQ(call.name, forced);
          ASSERT_TRUE(call.name == "get_weather" || call.name == "now") << call.name;
          const Json args = Json::parse(call.arguments, nullptr, false);
          ASSERT_TRUE(args.is_object()) << call.arguments;
          if (call.name == "get_weather") {
            GrammarMatcher m(&check);
            GrammarState s = m.Start(), scratch;
            EXPECT_TRUE(m.StepText(&s, call.arguments, &scratch) && m.CanEnd(s)) << call.arguments;
          }
        }
      }
    }
  }
}

TEST(ToolCallGrammar, RefusesWhatItCannotEnforceNamingTheTool) {
  MarkerTokenizer tok;
  auto vocab = VocabularyIndex::Build(tok, tok.vocab_size());
  const Json tools = Json::parse(R"([{"type": "function", "function": {"name": "f", "parameters":
      {"type": "object", "properties": {"email": {"type": "string", "format": "email"}}}}}])");
  const absl::Status s =
      ToolCallGrammar(ToolCallFormat::kHermes, {.tools = tools, .required = true}, tok, vocab, {tok.eos_id()}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_NE(s.message().find("tools[0].function.parameters: /properties/email: format"), std::string::npos) << s;
  EXPECT_FALSE(ToolCallGrammar(ToolCallFormat::kNone, {.tools = tools, .required = true}, tok, vocab, {}).ok());
}

}  // namespace
}  // namespace tandem
