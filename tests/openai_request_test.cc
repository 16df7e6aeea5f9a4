// What an OpenAI request body may hold (coordinator/serving/http/
// openai_fields.h): every field docs/http.md refuses is a 400 naming it,
// on the endpoint it belongs to; the harmless ones it accepts change
// nothing; a field tandem does not know, or one of the other endpoint, is
// refused by name; logit_bias is parsed with OpenAI's keys and range, its
// bad keys and values named.
#include "coordinator/serving/http/openai_request.h"

#include <gtest/gtest.h>

#include <string>

#include "coordinator/serving/http/http_error.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

Json Chat() { return {{"messages", Json::array({{{"role", "user"}, {"content", "hi"}}})}}; }
Json Completion() { return {{"prompt", "hi"}}; }

// `body` with `field` set to `value`.
Json With(Json body, const std::string& field, Json value) {
  body[field] = std::move(value);
  return body;
}

// A 400 whose param is `param` and whose message starts with it.
void ExpectRefused(OpenAiEndpoint endpoint, const Json& body, const std::string& param,
                   const std::string& says = "") {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(endpoint, body);
  ASSERT_FALSE(r.ok()) << body.dump();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  const HttpError error = HttpErrorFromStatus(r.status());
  EXPECT_EQ(error.status, 400);
  EXPECT_EQ(error.param, param) << r.status();
  EXPECT_EQ(error.message.rfind(param, 0), 0u) << error.message;
  if (!says.empty()) {
    EXPECT_NE(error.message.find(says), std::string::npos) << error.message;
  }
}

TEST(OpenAiRequestTest, UnsupportedChatFieldsAreRefusedByName) {
  const Json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", Json::object()}}}};
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "functions", Json::array({tool["function"]})), "functions",
                "use tools");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "function_call", "auto"), "function_call", "use tool_choice");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "audio", {{"voice", "alloy"}, {"format", "wav"}}), "audio");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "modalities", {"text", "audio"}), "modalities");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "prediction", {{"type", "content"}, {"content", "x"}}),
                "prediction");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "reasoning_effort", "low"), "reasoning_effort");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "verbosity", "low"), "verbosity");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "web_search_options", Json::object()), "web_search_options");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "store", true), "store");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "user", 5), "user");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "metadata", "x"), "metadata");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "parallel_tool_calls", "yes"), "parallel_tool_calls");
  // llama.cpp's constrained decoding.
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "grammar", "root ::= \"a\""), "grammar", "GBNF");
  // Completions' own fields are not chat's.
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "echo", false), "echo", "/v1/chat/completions");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "prompt", "x"), "prompt");
}

TEST(OpenAiRequestTest, UnsupportedCompletionFieldsAreRefusedByName) {
  ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), "echo", true), "echo");
  ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), "best_of", 2), "best_of", "n for several");
  ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), "suffix", "after"), "suffix");
  ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), "grammar", "root ::= \"a\""), "grammar");
  // Chat's own fields are not completions'.
  for (const char* field : {"tools", "tool_choice", "response_format", "top_logprobs", "messages", "store",
                            "metadata", "add_generation_prompt", "chat_template_kwargs"}) {
    ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), field, 1), field, "/v1/completions");
  }
}

TEST(OpenAiRequestTest, UnknownFieldsAreRefusedNamingThemWhateverTheirName) {
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "temprature", 0.5), "temprature", "unknown field");
  ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), "stop_token_ids", {1}), "stop_token_ids");
  // Null does not make an unknown field known.
  ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), "guided_json", nullptr), "guided_json");
  // A name the message could not lead with still becomes the param.
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "x-custom field", 1), "x-custom field");
  const std::string long_name(300, 'z');
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(OpenAiEndpoint::kChat, With(Chat(), long_name, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_LT(r.status().message().size(), 300u);  // cut
  // Fields inside stream_options and message content parts too.
  Json streaming = With(Chat(), "stream", true);
  ExpectRefused(OpenAiEndpoint::kChat, With(streaming, "stream_options", {{"include_obfuscation", true}}),
                "stream_options.include_obfuscation");
  ExpectRefused(OpenAiEndpoint::kChat, With(streaming, "stream_options", {{"continuous_usage_stats", true}}),
                "stream_options.continuous_usage_stats");
  Json image = Chat();
  image["messages"][0]["content"] = Json::array(
      {{{"type", "text"}, {"text", "what is this?"}}, {{"type", "image_url"}, {"image_url", {{"url", "x"}}}}});
  ExpectRefused(OpenAiEndpoint::kChat, image, "messages[0].content[1].type", "only text parts");
}

TEST(OpenAiRequestTest, HarmlessFieldsAreAcceptedAndChangeNothing) {
  Json chat = Chat();
  chat["user"] = "someone";
  chat["metadata"] = {{"k", "v"}};
  chat["store"] = false;
  chat["service_tier"] = "auto";
  chat["prompt_cache_key"] = "k";
  chat["safety_identifier"] = "s";
  chat["parallel_tool_calls"] = true;
  chat["tool_choice"] = "none";
  chat["function_call"] = "none";
  chat["response_format"] = {{"type", "text"}};
  chat["modalities"] = {"text"};
  chat["tools"] = nullptr;  // null is absent
  chat["functions"] = nullptr;
  chat["stream"] = true;
  chat["stream_options"] = {{"include_usage", true}, {"include_obfuscation", false}};
  chat["messages"][0]["content"] = Json::array({{{"type", "text"}, {"text", "hi"}}});
  ASSERT_OK_AND_ASSIGN(OpenAiRequest r, ParseOpenAiRequest(OpenAiEndpoint::kChat, chat));
  EXPECT_TRUE(r.tools.is_null());
  EXPECT_TRUE(r.include_usage);
  Json plain = Chat();
  plain["stream"] = true;
  plain["stream_options"] = {{"include_usage", true}};
  ASSERT_OK_AND_ASSIGN(OpenAiRequest p, ParseOpenAiRequest(OpenAiEndpoint::kChat, plain));
  EXPECT_EQ(r.n, p.n);
  EXPECT_EQ(r.max_tokens, p.max_tokens);
  EXPECT_EQ(r.temperature, p.temperature);

  Json completion = Completion();
  completion["echo"] = false;
  completion["best_of"] = 1;
  completion["suffix"] = "";
  completion["user"] = "someone";
  EXPECT_OK(ParseOpenAiRequest(OpenAiEndpoint::kCompletion, completion).status());
  // /apply-template only renders: tools reach the template there.
  ASSERT_OK_AND_ASSIGN(OpenAiRequest applied,
                       ParseOpenAiRequest(OpenAiEndpoint::kApplyTemplate,
                                          With(Chat(), "tools", Json::array({{{"type", "function"},
                                                                               {"function", {{"name", "f"}}}}}))));
  EXPECT_EQ(applied.tools.size(), 1u);
}

TEST(OpenAiRequestTest, ToolsAndToolChoiceAreReadAndChecked) {
  const Json weather = {{"type", "function"},
                        {"function",
                         {{"name", "get_weather"},
                          {"description", "today's weather"},
                          {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}};
  const Json tools = Json::array({weather});
  ASSERT_OK_AND_ASSIGN(OpenAiRequest r, ParseOpenAiRequest(OpenAiEndpoint::kChat, With(Chat(), "tools", tools)));
  EXPECT_EQ(r.tool_choice, ToolChoice::kAuto);
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_TRUE(r.parallel_tool_calls);
  Json named = With(With(Chat(), "tools", tools), "tool_choice",
                    {{"type", "function"}, {"function", {{"name", "get_weather"}}}});
  named["parallel_tool_calls"] = false;
  ASSERT_OK_AND_ASSIGN(r, ParseOpenAiRequest(OpenAiEndpoint::kChat, named));
  EXPECT_EQ(r.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.tool_choice_name, "get_weather");
  EXPECT_FALSE(r.parallel_tool_calls);
  ASSERT_OK_AND_ASSIGN(r, ParseOpenAiRequest(OpenAiEndpoint::kChat,
                                             With(With(Chat(), "tools", tools), "tool_choice", "required")));
  EXPECT_EQ(r.tool_choice, ToolChoice::kRequired);
  // "none": the model is not told of the tools.
  ASSERT_OK_AND_ASSIGN(r, ParseOpenAiRequest(OpenAiEndpoint::kChat,
                                             With(With(Chat(), "tools", tools), "tool_choice", "none")));
  EXPECT_TRUE(r.tools.is_null());

  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "tools", "get_weather"), "tools");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "tools", Json::array({{{"type", "code"}}})), "tools[0].type");
  ExpectRefused(OpenAiEndpoint::kChat,
                With(Chat(), "tools", Json::array({{{"type", "function"}, {"function", {{"name", "a b"}}}}})),
                "tools[0].function.name");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "tools", Json::array({weather, weather})),
                "tools[1].function.name", "twice");
  ExpectRefused(OpenAiEndpoint::kChat,
                With(Chat(), "tools", Json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"x", 1}}}}})),
                "tools[0].function.x");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "tool_choice", "required"), "tool_choice", "needs tools");
  ExpectRefused(OpenAiEndpoint::kChat, With(With(Chat(), "tools", tools), "tool_choice", "always"), "tool_choice");
  ExpectRefused(OpenAiEndpoint::kChat,
                With(With(Chat(), "tools", tools), "tool_choice",
                     {{"type", "function"}, {"function", {{"name", "get_time"}}}}),
                "tool_choice", "not in tools");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "parallel_tool_calls", "yes"), "parallel_tool_calls");
  ExpectRefused(OpenAiEndpoint::kChat,
                With(With(With(Chat(), "tools", tools), "tool_choice", "required"), "beam_width", 4), "beam_width");
}

TEST(OpenAiRequestTest, ResponseFormatIsReadAndChecked) {
  const Json schema = {{"type", "object"}, {"properties", {{"x", {{"type", "integer"}}}}}};
  ASSERT_OK_AND_ASSIGN(OpenAiRequest r,
                       ParseOpenAiRequest(OpenAiEndpoint::kChat,
                                          With(Chat(), "response_format",
                                               {{"type", "json_schema"},
                                                {"json_schema", {{"name", "n"}, {"schema", schema}, {"strict", true}}}})));
  EXPECT_EQ(r.response_format, ResponseFormat::kJsonSchema);
  EXPECT_EQ(r.json_schema, schema);
  ASSERT_OK_AND_ASSIGN(r, ParseOpenAiRequest(OpenAiEndpoint::kChat,
                                             With(Chat(), "response_format", {{"type", "json_object"}})));
  EXPECT_EQ(r.response_format, ResponseFormat::kJsonObject);
  ASSERT_OK_AND_ASSIGN(r, ParseOpenAiRequest(OpenAiEndpoint::kCompletion, With(Completion(), "json_schema", schema)));
  EXPECT_EQ(r.response_format, ResponseFormat::kJsonSchema);

  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "response_format", {{"type", "yaml"}}), "response_format.type");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "response_format", {{"type", "json_schema"}}),
                "response_format.json_schema");
  ExpectRefused(OpenAiEndpoint::kChat,
                With(Chat(), "response_format", {{"type", "json_schema"}, {"json_schema", {{"name", "n"}}}}),
                "response_format.json_schema.schema");
  ExpectRefused(OpenAiEndpoint::kChat,
                With(Chat(), "response_format",
                     {{"type", "json_schema"}, {"json_schema", {{"schema", schema}, {"format", "x"}}}}),
                "response_format.json_schema.format");
  ExpectRefused(OpenAiEndpoint::kChat, With(With(Chat(), "response_format", {{"type", "json_object"}}), "ignore_eos", true),
                "ignore_eos");
  Json both = With(Chat(), "response_format", {{"type", "json_object"}});
  both["tools"] = Json::array({{{"type", "function"}, {"function", {{"name", "f"}}}}});
  ExpectRefused(OpenAiEndpoint::kChat, both, "response_format", "tool_choice");
  both["tool_choice"] = "none";
  EXPECT_OK(ParseOpenAiRequest(OpenAiEndpoint::kChat, both).status());
}

TEST(OpenAiRequestTest, LogitBiasKeysAreTokenIdsAndBiasesWithinOpenAisRange) {
  ASSERT_OK_AND_ASSIGN(OpenAiRequest r,
                       ParseOpenAiRequest(OpenAiEndpoint::kCompletion,
                                          With(Completion(), "logit_bias", {{"0", -100}, {"15043", 100}, {"7", 2.5}})));
  ASSERT_EQ(r.logit_bias.size(), 3u);
  EXPECT_EQ(r.logit_bias[0], std::make_pair(0, -100.0f));
  EXPECT_EQ(r.logit_bias[1], std::make_pair(15043, 100.0f));
  EXPECT_EQ(r.logit_bias[2], std::make_pair(7, 2.5f));
  ASSERT_OK_AND_ASSIGN(OpenAiRequest none,
                       ParseOpenAiRequest(OpenAiEndpoint::kChat, With(Chat(), "logit_bias", nullptr)));
  EXPECT_TRUE(none.logit_bias.empty());

  for (const char* key : {"abc", "-1", "01", "1.5", "", " 3", "99999999999"}) {
    ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "logit_bias", {{key, 1}}), "logit_bias",
                  absl::StrCat("key \"", key, "\""));
  }
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "logit_bias", {{"5", 100.5}}), "logit_bias", "key \"5\"");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "logit_bias", {{"5", -101}}), "logit_bias", "[-100, 100]");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "logit_bias", {{"5", "1"}}), "logit_bias", "key \"5\"");
  ExpectRefused(OpenAiEndpoint::kChat, With(Chat(), "logit_bias", Json::array({1})), "logit_bias");
  Json many = Json::object();
  for (int i = 0; i <= static_cast<int>(kMaxLogitBiasEntries); ++i) many[std::to_string(i)] = 1;
  ExpectRefused(OpenAiEndpoint::kCompletion, With(Completion(), "logit_bias", many), "logit_bias", "at most 1024");
}

}  // namespace
}  // namespace tandem
