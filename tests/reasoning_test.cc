// A thinking model's reasoning kept apart from its answer: the splitter
// (streamed byte by byte or whole, the same), and tandem-server giving it
// out as reasoning_content, streamed and not.
#include "coordinator/serving/http/reasoning.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/http_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;

ReasoningSplitter::Output Split(const std::string& text, bool starts_thinking) {
  ReasoningSplitter whole(starts_thinking), bytes(starts_thinking);
  ReasoningSplitter::Output a = whole.Push(text), end = whole.Finish(), b;
  a.reasoning += end.reasoning;
  a.content += end.content;
  for (char c : text) {
    ReasoningSplitter::Output o = bytes.Push(std::string(1, c));
    b.reasoning += o.reasoning;
    b.content += o.content;
  }
  end = bytes.Finish();
  b.reasoning += end.reasoning;
  b.content += end.content;
  EXPECT_EQ(a.reasoning, b.reasoning) << text;
  EXPECT_EQ(a.content, b.content) << text;
  return a;
}

TEST(ReasoningSplitter, ThinkTagsGoToReasoningTheRestToContent) {
  ReasoningSplitter::Output o = Split("<think>\nAdd them: 4.\n</think>\n\nThe answer is 4.", false);
  EXPECT_EQ(o.reasoning, "\nAdd them: 4.\n");
  EXPECT_EQ(o.content, "The answer is 4.");
  // The template opened it (R1, Qwen3): the output starts as reasoning.
  o = Split("Hmm, 2 + 2.</think>4", true);
  EXPECT_EQ(o.reasoning, "Hmm, 2 + 2.");
  EXPECT_EQ(o.content, "4");
  // Never closed (max_tokens): all of it reasoning.
  o = Split("still thinking <", true);
  EXPECT_EQ(o.reasoning, "still thinking <");
  EXPECT_EQ(o.content, "");
  // No thinking: all content, even text that starts like the tag.
  EXPECT_EQ(Split("<thin ice>", false).content, "<thin ice>");
  EXPECT_EQ(Split("  Plain answer.", false).content, "  Plain answer.");
  EXPECT_EQ(Split("", false).content, "");
  // A tag later in an answer is content.
  EXPECT_EQ(Split("Use <think> tags.", false).content, "Use <think> tags.");
}

TEST(ReasoningSplitter, TemplatesAndPrompts) {
  EXPECT_TRUE(TemplateThinks("{{ '<think>\\n' }}"));
  EXPECT_FALSE(TemplateThinks("{{ messages }}"));
  EXPECT_TRUE(PromptOpensThinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(PromptOpensThinking("<|im_start|>assistant\n"));
}

// A ChatML template that opens the assistant's reasoning, as R1's does.
constexpr char kThinkingTemplate[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{% endif %}";

TEST(ReasoningThroughHttp, ReasoningContentApartStreamedAndNot) {
  ScopedTempDir dir;
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  std::ofstream(dir.path() / "think.jinja") << kThinkingTemplate;
  absl::StatusOr<HttpServerProcess> server =
      StartHttpServer(dir.path() / "model", dir.path(),
                      {"--threads", "2", "--chat_template", (dir.path() / "think.jinja").string()}, "server");
  ASSERT_OK(server);
  const json body = {{"messages", {{{"role", "user"}, {"content", "2 + 2?"}}}},
                     {"max_tokens", 24},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  ASSERT_OK_AND_ASSIGN(HttpReply whole, HttpPost(server->port, "/v1/chat/completions", body));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const json& message = whole.json["choices"][0]["message"];
  // The completion's raw text, for comparison.
  ASSERT_OK_AND_ASSIGN(HttpReply applied, HttpPost(server->port, "/apply-template", json{{"messages", body["messages"]}}));
  json raw_body = {{"prompt", applied.json["prompt"]}, {"max_tokens", 24}, {"temperature", 0}, {"ignore_eos", true}};
  ASSERT_OK_AND_ASSIGN(HttpReply raw, HttpPost(server->port, "/v1/completions", raw_body));
  ASSERT_EQ(raw.status, 200) << raw.body;
  const std::string text = raw.json["choices"][0]["text"];
  const size_t close = text.find("</think>");
  if (close == std::string::npos) {
    EXPECT_EQ(message["reasoning_content"], text);
    EXPECT_EQ(message["content"], "");
  } else {
    EXPECT_EQ(message["reasoning_content"], text.substr(0, close));
  }

  json streamed_body = body;
  streamed_body["stream"] = true;
  ASSERT_OK_AND_ASSIGN(HttpReply streamed, HttpPost(server->port, "/v1/chat/completions", streamed_body));
  ASSERT_OK_AND_ASSIGN(std::vector<json> events, SseData(streamed.body));
  std::string reasoning, content;
  for (const json& e : events) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const json& delta = e["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) reasoning += delta["reasoning_content"].get<std::string>();
    if (delta.contains("content")) content += delta["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, message.value("reasoning_content", ""));
  EXPECT_EQ(content, message["content"]);
}

}  // namespace
}  // namespace tandem
