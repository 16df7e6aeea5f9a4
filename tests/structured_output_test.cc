// Constrained decoding: JSON schemas compiled to grammars, the byte matcher,
// and the vocabulary mask (checked against a token-by-token oracle).
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "coordinator/generation/grammar_constraint.h"
#include "coordinator/generation/json_schema_grammar.h"
#include "coordinator/generation/sampler.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

Grammar SchemaGrammar(const std::string& schema) {
  Grammar g;
  absl::StatusOr<int32_t> root = AddJsonSchema(Json::parse(schema), "schema", &g);
  EXPECT_TRUE(root.ok()) << root.status();
  g.root = root.ok() ? *root : AddAnyJsonValue(&g);
  return g;
}

// Whether `text` is a whole output of `g`.
bool Matches(const Grammar& g, const std::string& text) {
  GrammarMatcher m(&g);
  GrammarState s = m.Start(), scratch;
  return m.StepText(&s, text, &scratch) && m.CanEnd(s);
}

// Whether `text` can still be continued into an output.
bool Prefix(const Grammar& g, const std::string& text) {
  GrammarMatcher m(&g);
  GrammarState s = m.Start(), scratch;
  return m.StepText(&s, text, &scratch);
}

absl::Status CompileError(const std::string& schema) {
  Grammar g;
  return AddJsonSchema(Json::parse(schema), "response_format.json_schema.schema", &g).status();
}

TEST(JsonSchemaGrammar, ObjectPropertiesInOrderRequiredAndOptional) {
  const Grammar g = SchemaGrammar(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["name", "age"], "additionalProperties": false})");
  EXPECT_TRUE(Matches(g, R"({"name":"Ada","age":36})"));
  EXPECT_TRUE(Matches(g, R"({"name": "Ada", "age": 36, "tags": ["x", "y"]})"));
  EXPECT_TRUE(Matches(g, "{\n  \"name\": \"Ada\",\n  \"age\": -3\n}"));
  EXPECT_TRUE(Matches(g, "{\n\t\"name\" : \"Ada\" ,\n\t\"age\":1 }"));
  EXPECT_FALSE(Matches(g, R"({"name":"Ada"})"));                    // age required
  EXPECT_FALSE(Prefix(g, R"({"age":36)"));                          // schema order
  EXPECT_FALSE(Prefix(g, R"({"name":"Ada","age":36,"x")"));         // no other key
  EXPECT_FALSE(Prefix(g, R"({"name":"Ada","age":3.5)"));            // integer
  EXPECT_FALSE(Prefix(g, R"({"name":7)"));                          // a string
  EXPECT_FALSE(Matches(g, R"({"name":"Ada","age":36} )"));          // nothing after
  EXPECT_FALSE(Prefix(g, R"({"name":"Ada","age":012)"));            // no leading zero
}

TEST(JsonSchemaGrammar, OptionalPropertiesMayBeSkippedButNotReordered) {
  const Grammar g = SchemaGrammar(R"({"type": "object", "properties": {
      "a": {"type": "boolean"}, "b": {"type": "null"}, "c": {"type": "number"}}, "required": ["c"]})");
  EXPECT_TRUE(Matches(g, R"({"c":1e5})"));
  EXPECT_TRUE(Matches(g, R"({"a":true,"c":-0.5E-3})"));
  EXPECT_TRUE(Matches(g, R"({"b":null,"c":0})"));
  EXPECT_FALSE(Prefix(g, R"({"b":null,"a")"));
  EXPECT_FALSE(Matches(g, R"({"a":false})"));
  EXPECT_FALSE(Matches(g, R"({})"));
}

TEST(JsonSchemaGrammar, EnumConstAnyOfAndTypeLists) {
  const Grammar g = SchemaGrammar(R"({"type": "object", "properties": {
      "unit": {"enum": ["celsius", "fahrenheit", 1, 12, null]},
      "v": {"const": {"k": [1, "two"]}},
      "w": {"anyOf": [{"type": "string", "maxLength": 2}, {"type": "array", "maxItems": 1}]},
      "x": {"type": ["integer", "null"]}}, "required": ["unit", "v", "w", "x"]})");
  EXPECT_TRUE(Matches(g, R"({"unit":"celsius","v":{"k":[1,"two"]},"w":"ab","x":null})"));
  EXPECT_TRUE(Matches(g, R"({"unit":1,"v":{"k":[1,"two"]},"w":[],"x":5})"));
  EXPECT_TRUE(Matches(g, R"({"unit":12,"v":{"k":[1,"two"]},"w":[{"z":1}],"x":-7})"));
  EXPECT_TRUE(Matches(g, R"({"unit":null,"v":{"k":[1,"two"]},"w":"","x":0})"));
  EXPECT_FALSE(Prefix(g, R"({"unit":"kelvin")"));
  EXPECT_FALSE(Prefix(g, R"({"unit":123)"));
  EXPECT_FALSE(Prefix(g, R"({"unit":1,"v":{"k":[1, "two"]})"));  // const is compact
  EXPECT_FALSE(Prefix(g, R"({"unit":1,"v":{"k":[1,"two"]},"w":"abc")"));
  EXPECT_FALSE(Prefix(g, R"({"unit":1,"v":{"k":[1,"two"]},"w":[1,2)"));
}

TEST(JsonSchemaGrammar, StringsCountCharactersAndCheckEscapesAndUtf8) {
  const Grammar g = SchemaGrammar(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(Matches(g, "\"h\\u00e9\""));
  EXPECT_TRUE(Matches(g, "\"\xc3\xa9t\xc3\xa9\""));  // été: 3 characters, 5 bytes
  EXPECT_TRUE(Matches(g, "\"a\\n\""));
  EXPECT_FALSE(Matches(g, "\"a\""));
  EXPECT_FALSE(Prefix(g, "\"abcd"));
  EXPECT_FALSE(Prefix(g, "\"a\\q"));
  EXPECT_FALSE(Prefix(g, "\"a\n"));          // a raw control byte
  EXPECT_FALSE(Prefix(g, "\"\xc3\x28"));     // broken UTF-8
  EXPECT_FALSE(Prefix(g, "\"\xff"));
}

TEST(JsonSchemaGrammar, ArraysAndRecursionThroughRef) {
  const Grammar g = SchemaGrammar(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(Matches(g, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"));
  EXPECT_FALSE(Prefix(g, R"({"v":1,"kids":[{"v":2},{"v":3},)"));
  const Grammar self = SchemaGrammar(R"({"anyOf": [{"type": "integer"}, {"type": "array", "items": {"$ref": "#"}}]})");
  EXPECT_TRUE(Matches(self, "[1,[2,[3]],[]]"));
  EXPECT_TRUE(Matches(self, "42"));
  const Grammar loop = SchemaGrammar(R"({"anyOf": [{"$ref": "#"}]})");
  EXPECT_FALSE(Matches(loop, "1"));  // matches nothing, and does not hang
}

TEST(JsonSchemaGrammar, AnyJsonObject) {
  Grammar g;
  g.root = AddAnyJsonObject(&g);
  EXPECT_TRUE(Matches(g, R"({"a":[1,2.5e3,"x",{"b":null}],"c":{},"d":true})"));
  EXPECT_TRUE(Matches(g, "{}"));
  EXPECT_FALSE(Prefix(g, "["));
  EXPECT_FALSE(Prefix(g, R"({"a" 1)"));
  EXPECT_FALSE(Prefix(g, R"({a)"));
  // Whitespace is bounded: a model cannot pad forever.
  EXPECT_TRUE(Prefix(g, "{ "));
  EXPECT_FALSE(Prefix(g, "{  "));
  EXPECT_TRUE(Prefix(g, "{\n" + std::string(kMaxJsonIndent, ' ')));
  EXPECT_TRUE(Prefix(g, "{\n\t\t"));
  EXPECT_FALSE(Prefix(g, "{\n" + std::string(kMaxJsonIndent + 1, ' ')));
  EXPECT_FALSE(Prefix(g, "{\n\n"));
  EXPECT_FALSE(Prefix(g, "{\r"));
}

TEST(JsonSchemaGrammar, RefusesWhatItCannotEnforceByName) {
  const struct {
    const char* schema;
    const char* says;
  } cases[] = {
      {R"({"type": "string", "pattern": "^a"})", "/: pattern"},
      {R"({"type": "string", "format": "email"})", "/: format"},
      {R"({"properties": {"n": {"type": "integer", "minimum": 1}}})", "/properties/n: minimum"},
      {R"({"oneOf": [{"type": "string"}]})", "oneOf"},
      {R"({"type": "array", "uniqueItems": true})", "uniqueItems"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})", "\"b\" is not one of the properties"},
      {R"({"type": "text"})", "\"text\" is not a JSON Schema type"},
      {R"({"$ref": "#/$defs/none"})", "points at nothing"},
      {R"({"$ref": "https://example.com/s.json"})", "only references inside the schema"},
      {R"({"frobnicate": 1})", "frobnicate: unknown keyword"},
      {R"({"type": "string", "nullable": true})", "nullable"},
      {R"({"type": "array", "minItems": 3, "maxItems": 2})", "maxItems is below minItems"},
  };
  for (const auto& c : cases) {
    const absl::Status s = CompileError(c.schema);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << c.schema;
    EXPECT_NE(s.message().find(c.says), std::string_view::npos) << s.message();
    EXPECT_EQ(s.message().find("response_format.json_schema.schema: "), 0u) << s.message();
  }
  // Annotations are read past; uniqueItems false asks for nothing.
  EXPECT_TRUE(CompileError(R"({"title": "t", "description": "d", "default": 1, "examples": [1], "x-ui": 2,
                              "type": "array", "uniqueItems": false})")
                  .ok());
}

// A vocabulary of short pieces, as a byte-level BPE has: every byte, JSON
// punctuation runs, words, quotes glued to words, and two special tokens.
class PieceTokenizer : public Tokenizer {
 public:
  PieceTokenizer() {
    for (int b = 0; b < 256; ++b) pieces_.push_back(std::string(1, static_cast<char>(b)));
    for (const char* p : {"{\"", "\":", "\",", "\"}", "\":\"", " {", "},", "}]", "[{", "true", "false", "null",
                          "name", "age", "Ada", " Lovelace", "12", "345", ".5", "e-3", "\\n", "\\\"", "\xc3\xa9",
                          "\xe2\x82", "\xac", "  ", "\n  ", "tags", "\"tags\":[\"", "kids", ", ", "\"v\":",
                          "<tool_call>", "arguments"}) {
      pieces_.push_back(p);
    }
    eos_ = static_cast<int32_t>(pieces_.size());
    pieces_.push_back("");  // EOS: no text
    marker_ = static_cast<int32_t>(pieces_.size());
    pieces_.push_back("");  // a special marker
  }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view, bool) const override { return std::vector<int32_t>(); }
  void AddSpecialTokens(std::vector<int32_t>*) const override {}
  using Tokenizer::Decode;
  absl::StatusOr<std::string> Decode(std::span<const int32_t>, const DecodeOptions&) const override { return ""; }
  std::string PieceText(int32_t id) const override { return pieces_[static_cast<size_t>(id)]; }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return eos_; }
  int32_t marker() const { return marker_; }

 private:
  std::vector<std::string> pieces_;
  int32_t eos_ = -1, marker_ = -1;
};

std::shared_ptr<TokenGrammar> MakeTokenGrammar(Grammar g, const PieceTokenizer& tok, int32_t extra_rows = 3) {
  auto tg = std::make_shared<TokenGrammar>();
  g.end_ids = {tok.eos_id()};
  tg->grammar = std::move(g);
  tg->vocabulary = VocabularyIndex::Build(tok, tok.vocab_size() + extra_rows);
  return tg;
}

// Walks random allowed tokens to the end, checking at every step that the
// mask is exactly the set of tokens Allows says yes to; returns the text.
std::string RandomWalk(std::shared_ptr<TokenGrammar> tg, std::mt19937& rng, int max_steps = 400) {
  GrammarConstraint c(tg);
  std::vector<uint8_t> allowed;
  std::string text;
  const int32_t n = tg->vocabulary->vocab_size();
  for (int step = 0; step < max_steps; ++step) {
    c.AllowedTokens(&allowed);
    std::vector<int32_t> ids;
    for (int32_t id = 0; id < n; ++id) {
      EXPECT_EQ(allowed[static_cast<size_t>(id)] != 0, c.Allows(id)) << "token " << id << " after: " << text;
      if (allowed[static_cast<size_t>(id)]) ids.push_back(id);
    }
    if (ids.empty()) {
      ADD_FAILURE() << "nothing allowed after: " << text;
      break;
    }
    // Favour ending (the grammar's, a string's, a container's), so walks finish.
    std::vector<int32_t> closers;
    for (int32_t id : ids) {
      if (tg->vocabulary->text(id).find_first_of("\"}]") != std::string_view::npos) closers.push_back(id);
    }
    const int32_t end = c.EndId();
    int32_t id = ids[rng() % ids.size()];
    if (end >= 0 && rng() % 3 == 0) {
      id = end;
    } else if (!closers.empty() && rng() % 2 == 0) {
      id = closers[rng() % closers.size()];
    }
    EXPECT_TRUE(c.Accept(id).ok());
    if (id == tg->grammar.end_ids[0]) return text;
    text += tg->vocabulary->text(id);
  }
  return text;
}

TEST(GrammarConstraint, MaskEqualsTheTokenOracleAndEveryOutputValidates) {
  PieceTokenizer tok;
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"enum": ["a", "b\"c", "é"]}, "maxItems": 3},
      "kids": {"type": "array", "items": {"type": "object", "properties": {"v": {"type": "number"}},
               "required": ["v"]}, "maxItems": 2}},
      "required": ["name", "age"]})";
  auto tg = MakeTokenGrammar(SchemaGrammar(schema), tok);
  std::mt19937 rng(7);
  int ended = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string text = RandomWalk(tg, rng);
    if (text.empty()) continue;
    const Json parsed = Json::parse(text, nullptr, false);
    ASSERT_FALSE(parsed.is_discarded()) << text;
    EXPECT_TRUE(parsed.contains("name") && parsed["name"].is_string()) << text;
    EXPECT_TRUE(parsed.contains("age") && parsed["age"].is_number_integer()) << text;
    EXPECT_TRUE(Matches(tg->grammar, text)) << text;
    ++ended;
  }
  EXPECT_GT(ended, 30);
}

TEST(GrammarConstraint, FreeStringsUsePlainTokensAndSpecialMarkersNeedTheirToken) {
  PieceTokenizer tok;
  Grammar g;
  const int32_t open = g.AddToken(tok.marker());
  const int32_t body = AddAnyJsonObject(&g);
  g.root = g.AddSequence({open, g.AddLiteral("\n"), body});
  auto tg = MakeTokenGrammar(std::move(g), tok);
  std::mt19937 rng(3);
  for (int i = 0; i < 20; ++i) {
    const std::string text = RandomWalk(tg, rng);
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text[0], '\n');  // the marker has no text; then the literal
    EXPECT_FALSE(Json::parse(text.substr(1), nullptr, false).is_discarded()) << text;
  }
  GrammarConstraint c(tg);
  EXPECT_TRUE(c.Allows(tok.marker()));
  EXPECT_FALSE(c.Allows('{'));
  EXPECT_FALSE(c.Allows(tok.eos_id()));
  EXPECT_FALSE(c.Allows(tok.vocab_size()));  // a padding row
  EXPECT_FALSE(c.Accept('{').ok());
}

TEST(GrammarConstraint, SamplerOutputFollowsTheGrammarGreedyAndSampled) {
  PieceTokenizer tok;
  auto tg = MakeTokenGrammar(
      SchemaGrammar(R"({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})"), tok, 0);
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams params;
    params.temperature = temperature;
    params.top_p = 0.9f;
    params.seed = 11;
    params.grammar = tg;
    Sampler sampler(params);
    std::mt19937 rng(5);
    std::normal_distribution<float> noise(0.0f, 3.0f);
    std::string text;
    for (int step = 0; step < 64; ++step) {
      std::vector<float> logits(static_cast<size_t>(tok.vocab_size()));
      for (float& l : logits) l = noise(rng);
      logits['x'] = 50.0f;  // the model's favourite never follows
      const int32_t id = sampler.Sample(logits);
      if (id == tok.eos_id()) break;
      text += tok.PieceText(id);
    }
    EXPECT_TRUE(Matches(tg->grammar, text)) << text;
    EXPECT_TRUE(sampler.constraint()->complete());
  }
}

}  // namespace
}  // namespace tandem
