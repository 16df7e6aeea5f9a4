// A real client end to end: the official `openai` npm package (pinned by
// tests/node/package-lock.json, installed into the build folder with npm ci)
// drives tandem-server's HTTP API — models, completions and chat, streamed
// and not — and the texts it gets equal what the gRPC API returns for the
// same greedy requests; and tool calls (forced, streamed, fed back) and
// structured output reach it in OpenAI's shapes, always parsing. Skipped,
// saying why, without node and npm or when the package cannot be installed
// (no registry).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <grpcpp/grpcpp.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/http_testlib.h"
#include "tests/node_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;

TEST(HttpOpenAiClientTest, TheOfficialClientGetsWhatGrpcGives) {
  ScopedTempDir dir;
  // The package, installed once per build folder from the committed lock file.
  absl::StatusOr<std::filesystem::path> prefix = InstallNodePackages("openai", dir.path());
  if (absl::IsFailedPrecondition(prefix.status()) || absl::IsUnavailable(prefix.status())) {
    GTEST_SKIP() << "the openai client cannot run: " << prefix.status().message();
  }
  ASSERT_OK(prefix);
  const std::string node = FindOnPath("node");

  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  std::ofstream(dir.path() / "chatml.jinja") << kChatmlTemplate;
  absl::StatusOr<HttpServerProcess> server =
      StartHttpServer(dir.path() / "model", dir.path(),
                      {"--threads", "2", "--chat_template", (dir.path() / "chatml.jinja").string()}, "server");
  ASSERT_OK(server);

  const std::string prompt = "Once upon a time";
  const json messages = json::array({{{"role", "user"}, {"content", "Tell me a story."}}});
  const int max_tokens = 12;
  absl::StatusOr<HttpReply> applied = HttpPost(server->port, "/apply-template", json{{"messages", messages}});
  ASSERT_OK(applied);
  const std::string chat_prompt = applied->json["prompt"];
  ASSERT_OK_AND_ASSIGN(const std::string expected_completion,
                       GrpcGreedyText(*server->server, prompt, {}, true, max_tokens));
  ASSERT_OK_AND_ASSIGN(const std::string expected_chat,
                       GrpcGreedyText(*server->server, chat_prompt, {}, false, max_tokens));

  const json input = {{"base_url", absl::StrCat("http://127.0.0.1:", server->port)},
                      {"prompt", prompt},
                      {"messages", messages},
                      {"max_tokens", max_tokens}};
  absl::StatusOr<ProcessResult> run =
      RunProcess({node, (*prefix / "openai_client.mjs").string()}, {absl::StrCat("TANDEM_E2E=", input.dump())},
                 dir.path(), absl::Seconds(120));
  ASSERT_OK(run);
  ASSERT_EQ(run->exit_code, 0) << run->err << "\nserver log: " << server->server->LogTail();
  const json got = json::parse(run->out, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << run->out;
  EXPECT_EQ(got["model"], "model");
  EXPECT_EQ(got["completion"], expected_completion);
  EXPECT_EQ(got["completion_stream"], expected_completion);
  EXPECT_EQ(got["chat"], expected_chat);
  EXPECT_EQ(got["chat_stream"], expected_chat);
  // The tiny model may end early on its EOS; either way both paths agree.
  EXPECT_EQ(got["completion_finish"], got["completion_stream_finish"]);
  EXPECT_EQ(got["chat_finish"], got["chat_stream_finish"]);
  EXPECT_TRUE(got["completion_usage"]["prompt_tokens"].get<int>() > 0) << got;
  EXPECT_TRUE(got["chat_stream_usage"]["completion_tokens"].get<int>() > 0) << got;
  EXPECT_EQ(got["error_status"], 400);
}

// A ChatML template that renders tools and tool messages as Qwen 2.5's does
// (Hermes format: <tool_call> JSON </tool_call>).
constexpr char kHermesTemplate[] = R"({%- if tools %}{{ '<|im_start|>system\n# Tools\n<tools>' }}
{%- for tool in tools %}{{ '\n' }}{{ tool | tojson }}{% endfor %}
{{- '\n</tools>\nCall a function as <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call><|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}{{ '<|im_start|>assistant\n' }}
{%- for tc in message.tool_calls %}{{ '<tool_call>\n{"name": "' + tc.function.name + '", "arguments": ' }}{{ tc.function.arguments | tojson }}{{ '}\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}{{ '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}{{ '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";

TEST(HttpOpenAiClientTest, ToolCallsAndStructuredOutputReachTheOfficialClient) {
  ScopedTempDir dir;
  absl::StatusOr<std::filesystem::path> prefix = InstallNodePackages("openai", dir.path());
  if (absl::IsFailedPrecondition(prefix.status()) || absl::IsUnavailable(prefix.status())) {
    GTEST_SKIP() << "the openai client cannot run: " << prefix.status().message();
  }
  ASSERT_OK(prefix);
  ASSERT_OK(WriteTestModel(dir.path() / "model"));
  {
    // Room for the tools in the prompt and a forced call after it.
    const std::filesystem::path config_path = dir.path() / "model" / "config.json";
    json config = json::parse(std::ifstream(config_path));
    config["max_position_embeddings"] = 2048;
    std::ofstream(config_path) << config.dump();
  }
  std::ofstream(dir.path() / "hermes.jinja") << kHermesTemplate;
  absl::StatusOr<HttpServerProcess> server =
      StartHttpServer(dir.path() / "model", dir.path(),
                      {"--threads", "2", "--chat_template", (dir.path() / "hermes.jinja").string()}, "server");
  ASSERT_OK(server);
  // What the template makes of a call fed back: the arguments as JSON.
  const json fed_back = {
      {"messages",
       {{{"role", "user"}, {"content", "weather?"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "call_1"},
            {"type", "function"},
            {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "-3 C"}}}}};
  absl::StatusOr<HttpReply> applied = HttpPost(server->port, "/apply-template", fed_back);
  ASSERT_OK(applied);
  ASSERT_EQ(applied->status, 200) << applied->body;
  EXPECT_TRUE(absl::StrContains(applied->json["prompt"].get<std::string>(),
                                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}"))
      << applied->json["prompt"];
  EXPECT_TRUE(absl::StrContains(applied->json["prompt"].get<std::string>(), "<tool_response>\n-3 C")) << applied->body;

  const json input = {{"base_url", absl::StrCat("http://127.0.0.1:", server->port)}, {"max_tokens", 1200}};
  absl::StatusOr<ProcessResult> run =
      RunProcess({FindOnPath("node"), (*prefix / "openai_tools.mjs").string()},
                 {absl::StrCat("TANDEM_E2E=", input.dump())}, dir.path(), absl::Seconds(240));
  ASSERT_OK(run);
  ASSERT_EQ(run->exit_code, 0) << run->err << "\nserver log: " << server->server->LogTail();
  const json got = json::parse(run->out, nullptr, false);
  ASSERT_FALSE(got.is_discarded()) << run->out;

  // Forced: a call of one of the tools, its arguments valid for its schema.
  ASSERT_EQ(got["required"]["tool_calls"].size(), 1u) << got;
  EXPECT_TRUE(got["required"]["content"].is_null()) << got;
  EXPECT_EQ(got["required_finish"], "tool_calls");
  for (const json& call : got["required"]["tool_calls"]) {
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["id"].get<std::string>().rfind("call_", 0), 0u);
    const std::string name = call["function"]["name"];
    const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call;
    if (name == "get_weather") {
      EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo" || args["city"] == "Lima") << args;
      EXPECT_TRUE(args["unit"] == "C" || args["unit"] == "F") << args;
      EXPECT_EQ(args.size(), 2u) << args;
    } else {
      EXPECT_EQ(name, "get_time");
      EXPECT_TRUE(args["zone"].is_string() && args["zone"].get<std::string>().size() <= 48) << args;
    }
  }
  // Streamed: the same calls (greedy), given out as deltas.
  ASSERT_EQ(got["streamed"].size(), got["required"]["tool_calls"].size()) << got;
  for (size_t i = 0; i < got["streamed"].size(); ++i) {
    EXPECT_EQ(got["streamed"][i]["name"], got["required"]["tool_calls"][i]["function"]["name"]);
    EXPECT_EQ(got["streamed"][i]["arguments"], got["required"]["tool_calls"][i]["function"]["arguments"]);
  }
  EXPECT_EQ(got["streamed_finish"], "tool_calls");
  // Named, one call only.
  ASSERT_EQ(got["named"]["tool_calls"].size(), 1u) << got;
  EXPECT_EQ(got["named"]["tool_calls"][0]["function"]["name"], "get_time");
  EXPECT_FALSE(got["follow_up_finish"].is_null()) << got;

  // Structured output parses and validates, streamed or not.
  const json verdict = json::parse(got["structured"].get<std::string>(), nullptr, false);
  ASSERT_TRUE(verdict.is_object()) << got["structured"];
  EXPECT_TRUE(verdict["answer"] == "yes" || verdict["answer"] == "no") << verdict;
  EXPECT_TRUE(verdict["confidence"].is_number_integer()) << verdict;
  EXPECT_EQ(verdict.size(), 2u);
  EXPECT_EQ(got["structured_stream"], got["structured"]);
  EXPECT_EQ(got["structured_finish"], "stop");
  // What cannot be enforced is refused, naming the field and the keyword.
  EXPECT_EQ(got["refused"]["status"], 400) << got;
  EXPECT_EQ(got["refused"]["param"], "response_format") << got;
  EXPECT_TRUE(absl::StrContains(got["refused"]["message"].get<std::string>(), "pattern")) << got;
}

}  // namespace
}  // namespace tandem
