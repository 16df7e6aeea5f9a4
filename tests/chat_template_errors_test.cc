// What a chat template that cannot be rendered gives: a clear error naming
// the construct and its line and column, raise_exception's own message, or
// ResourceExhausted when a hostile template would hang or exhaust memory —
// never a crash or a hang. Also the inputs' own checks and concurrent renders.
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/chat/chat_template.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using nlohmann::ordered_json;

absl::Status LoadError(const std::string& source) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl = ChatTemplate::Create(source, {.name = "test.jinja"});
  return tmpl.status();
}

absl::StatusOr<std::string> Render(const std::string& source, const ChatTemplateInputs& inputs = {},
                                   const ChatTemplateOptions& options = {.name = "test.jinja"}) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl = ChatTemplate::Create(source, options);
  if (!tmpl.ok()) return tmpl.status();
  return (*tmpl)->Render(inputs);
}

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& fragment) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(std::string(status.message()).find(fragment), std::string::npos)
      << "\"" << status.message() << "\" lacks \"" << fragment << "\"";
}

// ---- Load-time errors: syntax and unsupported constructs ----

TEST(ChatTemplateErrorsTest, UnclosedTagNamesItsPosition) {
  ExpectError(LoadError("line one\n  {% if x "), absl::StatusCode::kInvalidArgument,
              "test.jinja: unclosed tag '{%' (no '%}') at line 2 col 3");
  ExpectError(LoadError("{{ messages"), absl::StatusCode::kInvalidArgument,
              "unclosed tag '{{' (no '}}') at line 1 col 1");
  ExpectError(LoadError("a {# never closed"), absl::StatusCode::kInvalidArgument, "unclosed comment");
  ExpectError(LoadError("{% raw %} never closed"), absl::StatusCode::kInvalidArgument, "unclosed '{% raw %}'");
  ExpectError(LoadError("{{ 'unterminated }}"), absl::StatusCode::kInvalidArgument, "unterminated string literal");
}

TEST(ChatTemplateErrorsTest, UnclosedBlockNamesTheBlockAndWhereItOpened) {
  ExpectError(
      LoadError("x\n{% for m in messages %}\n{% if m %}{% endif %}"), absl::StatusCode::kInvalidArgument,
      "unclosed '{% for %}' (expected '{% endfor %}' or '{% else %}' before the end of the template) at line 2 col 4");
  ExpectError(LoadError("{% macro m() %}body"), absl::StatusCode::kInvalidArgument, "unclosed '{% macro %}'");
  ExpectError(LoadError("{% endif %}"), absl::StatusCode::kInvalidArgument, "unexpected '{% endif %}'");
  ExpectError(LoadError("{% if a %}{% endfor %}"), absl::StatusCode::kInvalidArgument, "unexpected '{% endfor %}'");
}

TEST(ChatTemplateErrorsTest, UnsupportedFilterTestAndTagAreNamedAtLoad) {
  ExpectError(LoadError("a\nb\n  {{ x|xyz }}"), absl::StatusCode::kInvalidArgument,
              "test.jinja: unsupported filter 'xyz' at line 3 col 8");
  // Even in a branch that never runs: the template is refused when loaded.
  ExpectError(LoadError("{% if false %}{{ x | groupby('a') }}{% endif %}"), absl::StatusCode::kInvalidArgument,
              "unsupported filter 'groupby' at line 1 col 22");
  ExpectError(LoadError("{{ x is frobnicated }}"), absl::StatusCode::kInvalidArgument,
              "unsupported test 'frobnicated' at line 1 col 9");
  ExpectError(LoadError("{% include 'other.jinja' %}"), absl::StatusCode::kInvalidArgument,
              "unsupported tag '{% include %}' at line 1 col 4");
  ExpectError(LoadError("{% extends 'base' %}"), absl::StatusCode::kInvalidArgument, "unsupported tag '{% extends %}'");
  ExpectError(LoadError("{% frobnicate %}"), absl::StatusCode::kInvalidArgument, "unknown tag '{% frobnicate %}'");
  ExpectError(LoadError("{% for x in y recursive %}{% endfor %}"), absl::StatusCode::kInvalidArgument,
              "unsupported recursive for loop");
  ExpectError(LoadError("{{ f(*args) }}"), absl::StatusCode::kInvalidArgument, "unsupported *args / **kwargs");
  ExpectError(LoadError("{% break %}"), absl::StatusCode::kInvalidArgument, "'{% break %}' outside a for loop");
}

TEST(ChatTemplateErrorsTest, SyntaxErrorsNameWhatWasExpected) {
  ExpectError(LoadError("{{ 1 + }}"), absl::StatusCode::kInvalidArgument,
              "expected an expression, got '}}' at line 1 col 8");
  ExpectError(LoadError("{{ (1, 2 }}"), absl::StatusCode::kInvalidArgument, "unexpected '}', expected ')'");
  ExpectError(LoadError("{{ a b }}"), absl::StatusCode::kInvalidArgument, "expected '}}', got 'b'");
  ExpectError(LoadError("{% set %}"), absl::StatusCode::kInvalidArgument, "expected a variable name to assign to");
  ExpectError(LoadError("{% macro m(a=1, b) %}{% endmacro %}"), absl::StatusCode::kInvalidArgument,
              "non-default argument follows default argument");
  ExpectError(LoadError("{{ 1 ! 2 }}"), absl::StatusCode::kInvalidArgument, "unexpected character '!'");
  ExpectError(LoadError("{{ 99999999999999999999 }}"), absl::StatusCode::kInvalidArgument,
              "integer literal out of the 64-bit range");
}

TEST(ChatTemplateErrorsTest, DeepNestingInTheSourceIsRefused) {
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  ExpectError(LoadError(deep), absl::StatusCode::kInvalidArgument, "template nests deeper than 128 levels");
  std::string blocks;
  for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
  ExpectError(LoadError(blocks), absl::StatusCode::kInvalidArgument, "template nests deeper than 128 levels");
}

// ---- Render-time errors ----

TEST(ChatTemplateErrorsTest, RaiseExceptionGivesTheTemplatesMessage) {
  ChatTemplateInputs inputs;
  inputs.messages = ordered_json::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  absl::StatusOr<std::string> out = Render(
      "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% "
      "endfor %}",
      inputs);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Conversation roles must alternate user/assistant/user/assistant/...");
  EXPECT_TRUE(IsRaisedByTemplate(out.status()));
}

TEST(ChatTemplateErrorsTest, RuntimeErrorsNameTheConstructAndPosition) {
  absl::StatusOr<std::string> out = Render("ok\n{{ foo.bar }}");
  ExpectError(out.status(), absl::StatusCode::kInvalidArgument, "test.jinja: 'foo' is undefined at line 2 col 4");
  EXPECT_FALSE(IsRaisedByTemplate(out.status()));
  ExpectError(Render("{{ 1 + 'a' }}").status(), absl::StatusCode::kInvalidArgument,
              "unsupported operand type(s) for +: 'int' and 'str' at line 1 col 6");
  ExpectError(Render("{{ 'a' + 1 }}").status(), absl::StatusCode::kInvalidArgument,
              "can only concatenate str (not \"int\") to str");
  ExpectError(Render("{% for x in 3 %}{% endfor %}").status(), absl::StatusCode::kInvalidArgument,
              "'int' object is not iterable");
  ExpectError(Render("{{ [1]|tojson }}{{ x|tojson }}").status(), absl::StatusCode::kInvalidArgument,
              "Object of type Undefined is not JSON serializable at line 1 col 22");
  ExpectError(Render("{% set x = 1 %}{% set x.y = 2 %}").status(), absl::StatusCode::kInvalidArgument,
              "cannot assign attribute on non-namespace object");
  ExpectError(Render("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").status(), absl::StatusCode::kInvalidArgument,
              "macro 'm' takes not more than 1 argument(s)");
  ExpectError(Render("{{ [1, 2].append(3) }}").status(), absl::StatusCode::kInvalidArgument,
              "access to list.append is unsafe");
  ExpectError(Render("{{ 'abc'.translate({}) }}").status(), absl::StatusCode::kInvalidArgument,
              "unsupported method str.translate()");
  ExpectError(Render("{{ 2 ** 64 }}").status(), absl::StatusCode::kInvalidArgument,
              "integer result does not fit in 64 bits");
}

// ---- Bounds against hostile templates ----

TEST(ChatTemplateErrorsTest, RecursionIsBounded) {
  ExpectError(Render("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}").status(),
              absl::StatusCode::kResourceExhausted, "macro calls nest deeper than 64 levels (calling 'r')");
}

TEST(ChatTemplateErrorsTest, LoopsAreBoundedByTheWorkBudget) {
  ExpectError(Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}").status(),
              absl::StatusCode::kResourceExhausted, "template exceeded its work budget (5000000 steps)");
  // A doubling macro tree does little per call but is exponential.
  ExpectError(
      Render("{% macro t(n) %}{% if n > 0 %}{{ t(n - 1) }}{{ t(n - 1) }}{% endif %}{% endmacro %}{{ t(40) }}").status(),
      absl::StatusCode::kResourceExhausted, "work budget");
  ExpectError(Render("{{ range(10000000000)|length }}").status(), absl::StatusCode::kResourceExhausted,
              "range of 10000000000 items passes the limit");
}

TEST(ChatTemplateErrorsTest, OutputAndStringsAreBounded) {
  ChatTemplateOptions options{.name = "test.jinja"};
  options.limits.max_output_bytes = 1 << 20;
  ExpectError(Render("{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}", {}, options).status(),
              absl::StatusCode::kResourceExhausted, "rendered output passes the 1048576-byte limit");
  ExpectError(Render("{{ 'x' * 100000000000 }}", {}, options).status(), absl::StatusCode::kResourceExhausted,
              "string repetition passes");
  ExpectError(
      Render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}"
             "{% endfor %}",
             {}, options)
          .status(),
      absl::StatusCode::kResourceExhausted, "passes the 1048576-byte limit");
}

TEST(ChatTemplateErrorsTest, SharedStructuresCannotGrowExponentially) {
  // [x, x] doubles the weight while costing one step: the depth and weight
  // bounds stop it before a tojson or == could walk 2^n items.
  ExpectError(Render("{% set ns = namespace(a=[1]) %}{% for i in range(200) %}{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
                     "{{ ns.a|tojson }}")
                  .status(),
              absl::StatusCode::kResourceExhausted, "a list of weight");
  ExpectError(
      Render("{% set ns = namespace(a=[1]) %}{% for i in range(100) %}{% set ns.a = [ns.a] %}{% endfor %}").status(),
      absl::StatusCode::kResourceExhausted, "depth 65 passes the limits");
  ExpectError(Render("{% set ns = namespace() %}{% set ns.me = ns %}").status(), absl::StatusCode::kInvalidArgument,
              "unsupported: a namespace stored inside a list, dict or namespace");
}

// ---- Inputs ----

TEST(ChatTemplateErrorsTest, InputsAreChecked) {
  ChatTemplateInputs both;
  both.add_generation_prompt = true;
  both.continue_final_message = true;
  ExpectError(Render("x", both).status(), absl::StatusCode::kInvalidArgument,
              "continue_final_message and add_generation_prompt are not compatible");
  ChatTemplateInputs reserved;
  reserved.extra_context = {{"messages", 1}};
  ExpectError(Render("x", reserved).status(), absl::StatusCode::kInvalidArgument,
              "extra_context may not set 'messages'");
  ChatTemplateInputs deep;
  ordered_json nested = ordered_json::array();
  for (int i = 0; i < 1000; ++i) nested = ordered_json::array({nested});
  deep.messages = ordered_json::array({{{"role", "user"}, {"content", nested}}});
  ExpectError(Render("x", deep).status(), absl::StatusCode::kInvalidArgument,
              "chat template input 'messages': JSON nests arrays and objects too deeply");
  ChatTemplateInputs not_a_list;
  not_a_list.messages = {{"role", "user"}};
  ExpectError(Render("x", not_a_list).status(), absl::StatusCode::kInvalidArgument, "messages must be a list");
  ChatTemplateInputs cont;
  cont.continue_final_message = true;
  cont.messages = ordered_json::parse(R"([{"role": "assistant", "content": "never shown"}])");
  ExpectError(Render("{{ 'other text' }}", cont).status(), absl::StatusCode::kInvalidArgument,
              "the final message does not appear in the chat");
}

TEST(ChatTemplateErrorsTest, KeyOrderOfOrderedJsonIsKept) {
  ChatTemplateInputs inputs;
  inputs.tools = ordered_json::parse(R"([{"name": "f", "parameters": {"z": 1, "a": 2}}])");
  absl::StatusOr<std::string> out = Render("{{ tools|tojson }}", inputs);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, R"([{"name": "f", "parameters": {"z": 1, "a": 2}}])");
}

TEST(ChatTemplateErrorsTest, ConcurrentRendersOfOneTemplateAgree) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl = ChatTemplate::Create(
      "{% set ns = namespace(n=0) %}{% macro m(x) %}<{{ x.role }}:{{ x.content|upper }}>{% endmacro %}"
      "{% for msg in messages %}{% set ns.n = ns.n + 1 %}{{ m(msg) }}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  std::vector<std::string> results(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      ChatTemplateInputs inputs;
      for (int i = 0; i <= t; ++i) inputs.messages.push_back({{"role", "user"}, {"content", absl::StrCat("m", i)}});
      for (int repeat = 0; repeat < 50; ++repeat) {
        absl::StatusOr<std::string> out = (*tmpl)->Render(inputs);
        results[t] = out.ok() ? *out : std::string(out.status().message());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) {
    std::string expected;
    for (int i = 0; i <= t; ++i) absl::StrAppend(&expected, "<user:M", i, ">");
    EXPECT_EQ(results[t], absl::StrCat(expected, t + 1));
  }
}

}  // namespace
}  // namespace tandem
