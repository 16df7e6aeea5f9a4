// Reading a model folder's generation_config.json, tokenizer_config.json and
// companions into ModelDefaults: eos as an int or a list, special tokens as
// strings or AddedToken objects, added_tokens_decoder, the chat template's
// forms and files, and errors that name the file and the field.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "common/chat/model_defaults.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& fragment) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(std::string(status.message()).find(fragment), std::string::npos)
      << "\"" << status.message() << "\" lacks \"" << fragment << "\"";
}

class ScopedDir {
 public:
  ScopedDir() {
    std::string pattern = (fs::temp_directory_path() / "chat_model_defaults_test.XXXXXX").string();
    if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~ScopedDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name, std::ios::binary) << text;
  }

 private:
  fs::path path_;
};

// ---- generation_config.json ----

TEST(GenerationConfigTest, EosAsOneIdOrAList) {
  absl::StatusOr<GenerationDefaults> one =
      ParseGenerationConfig(R"({"_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2})", "g.json");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->eos_token_ids, std::vector<int32_t>({2}));
  EXPECT_EQ(one->bos_token_id, 1);
  EXPECT_FALSE(one->temperature.has_value());

  absl::StatusOr<GenerationDefaults> list = ParseGenerationConfig(
      R"({"bos_token_id": 1, "eos_token_id": [32000, 32001, 32007], "pad_token_id": 32000})", "g.json");
  ASSERT_TRUE(list.ok()) << list.status();
  EXPECT_EQ(list->eos_token_ids, std::vector<int32_t>({32000, 32001, 32007}));
  EXPECT_EQ(list->pad_token_id, 32000);
}

TEST(GenerationConfigTest, SamplingDefaults) {
  absl::StatusOr<GenerationDefaults> g = ParseGenerationConfig(
      R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 50, "min_p": 0.05,
          "repetition_penalty": 1.1, "max_new_tokens": 512, "max_length": 4096, "pad_token_id": null})",
      "g.json");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->do_sample, true);
  EXPECT_DOUBLE_EQ(*g->temperature, 0.6);
  EXPECT_DOUBLE_EQ(*g->top_p, 0.9);
  EXPECT_EQ(g->top_k, 50);
  EXPECT_DOUBLE_EQ(*g->min_p, 0.05);
  EXPECT_DOUBLE_EQ(*g->repetition_penalty, 1.1);
  EXPECT_EQ(g->max_new_tokens, 512);
  EXPECT_EQ(g->max_length, 4096);
  EXPECT_FALSE(g->pad_token_id.has_value());
  EXPECT_TRUE(g->eos_token_ids.empty());
}

TEST(GenerationConfigTest, BadFieldsAndJsonNameTheFile) {
  ExpectError(
      ParseGenerationConfig(R"({"eos_token_id": "</s>"})", "m/generation_config.json").status(),
      absl::StatusCode::kInvalidArgument,
      "m/generation_config.json: field \"eos_token_id\" must be a token id or a list of token ids, got \"</s>\"");
  ExpectError(ParseGenerationConfig(R"({"eos_token_id": [2, -1]})", "g.json").status(),
              absl::StatusCode::kInvalidArgument, "field \"eos_token_id\"");
  ExpectError(ParseGenerationConfig(R"({"temperature": "hot"})", "g.json").status(), absl::StatusCode::kInvalidArgument,
              "g.json: field \"temperature\" must be a number, got \"hot\"");
  ExpectError(ParseGenerationConfig(R"({"top_p": 1.5})", "g.json").status(), absl::StatusCode::kInvalidArgument,
              "field \"top_p\" must be in (0, 1]");
  ExpectError(ParseGenerationConfig(R"({"top_k": 1.5})", "g.json").status(), absl::StatusCode::kInvalidArgument,
              "field \"top_k\" must be a 32-bit integer");
  ExpectError(ParseGenerationConfig("{\"eos_token_id\": 2,", "m/generation_config.json").status(),
              absl::StatusCode::kInvalidArgument, "m/generation_config.json: not valid JSON");
  ExpectError(ParseGenerationConfig("[1, 2]", "g.json").status(), absl::StatusCode::kInvalidArgument,
              "g.json: expected a JSON object");
}

// ---- tokenizer_config.json ----

TEST(TokenizerConfigTest, SpecialTokensAsStringsOrAddedTokenObjects) {
  absl::StatusOr<TokenizerDefaults> t = ParseTokenizerConfig(R"({
      "add_bos_token": true, "add_eos_token": false,
      "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false, "normalized": true},
      "eos_token": "</s>", "unk_token": "<unk>", "pad_token": null,
      "additional_special_tokens": ["<|user|>", {"content": "<|end|>"}],
      "model_max_length": 1000000000000000019884624838656,
      "tokenizer_class": "LlamaTokenizer"})",
                                                             "t.json");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_token, "<s>");
  EXPECT_EQ(t->eos_token, "</s>");
  EXPECT_EQ(t->unk_token, "<unk>");
  EXPECT_FALSE(t->pad_token.has_value());
  EXPECT_EQ(t->additional_special_tokens, std::vector<std::string>({"<|user|>", "<|end|>"}));
  EXPECT_EQ(t->add_bos_token, true);
  EXPECT_EQ(t->add_eos_token, false);
  EXPECT_FALSE(t->chat_template.has_value());
}

TEST(TokenizerConfigTest, AddedTokensDecoderIsReadSortedById) {
  absl::StatusOr<TokenizerDefaults> t = ParseTokenizerConfig(R"({"added_tokens_decoder": {
      "32007": {"content": "<|end|>", "lstrip": false, "normalized": false, "rstrip": true, "single_word": false, "special": true},
      "0": {"content": "<unk>", "special": true},
      "32000": {"content": "<|endoftext|>", "special": true},
      "32010": {"content": "<|user|>", "rstrip": true, "special": true, "lstrip": true}}})",
                                                             "t.json");
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->added_tokens.size(), 4u);
  EXPECT_EQ(t->added_tokens[0].id, 0);
  EXPECT_EQ(t->added_tokens[0].content, "<unk>");
  EXPECT_EQ(t->added_tokens[2].id, 32007);
  EXPECT_TRUE(t->added_tokens[2].rstrip);
  EXPECT_FALSE(t->added_tokens[2].lstrip);
  EXPECT_TRUE(t->added_tokens[3].lstrip);
  EXPECT_EQ(t->IdOf("<|endoftext|>"), 32000);
  EXPECT_FALSE(t->IdOf("<nope>").has_value());
}

TEST(TokenizerConfigTest, ChatTemplateAsStringOrNamedList) {
  absl::StatusOr<TokenizerDefaults> plain = ParseTokenizerConfig(R"({"chat_template": "{{ messages }}"})", "t.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->chat_template, "{{ messages }}");
  EXPECT_EQ(plain->chat_template_source, "t.json");

  absl::StatusOr<TokenizerDefaults> named = ParseTokenizerConfig(
      R"({"chat_template": [{"name": "default", "template": "D"}, {"name": "tool_use", "template": "T"}]})", "t.json");
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->chat_template, "D");
  EXPECT_EQ(named->named_chat_templates.at("tool_use"), "T");

  absl::StatusOr<TokenizerDefaults> no_default =
      ParseTokenizerConfig(R"({"chat_template": [{"name": "rag", "template": "R"}]})", "t.json");
  ASSERT_TRUE(no_default.ok()) << no_default.status();
  EXPECT_FALSE(no_default->chat_template.has_value());
  EXPECT_EQ(no_default->named_chat_templates.size(), 1u);
}

TEST(TokenizerConfigTest, BadFieldsNameTheFileAndField) {
  ExpectError(ParseTokenizerConfig(R"({"bos_token": 5})", "m/tokenizer_config.json").status(),
              absl::StatusCode::kInvalidArgument,
              "m/tokenizer_config.json: field \"bos_token\" must be a string or an AddedToken object");
  ExpectError(ParseTokenizerConfig(R"({"eos_token": {"lstrip": true}})", "t.json").status(),
              absl::StatusCode::kInvalidArgument, "field \"eos_token\"");
  ExpectError(ParseTokenizerConfig(R"({"added_tokens_decoder": {"32000": {"special": true}}})", "t.json").status(),
              absl::StatusCode::kInvalidArgument, "field \"added_tokens_decoder.32000\" needs a non-empty \"content\"");
  ExpectError(ParseTokenizerConfig(R"({"added_tokens_decoder": {"x": {"content": "a"}}})", "t.json").status(),
              absl::StatusCode::kInvalidArgument, "field \"added_tokens_decoder.x\" has a key that is no token id");
  ExpectError(
      ParseTokenizerConfig(R"({"added_tokens_decoder": {"5": {"content": "a", "rstrip": "yes"}}})", "t.json").status(),
      absl::StatusCode::kInvalidArgument, "field \"added_tokens_decoder.5.rstrip\" must be true or false");
  ExpectError(ParseTokenizerConfig(R"({"chat_template": 7})", "t.json").status(), absl::StatusCode::kInvalidArgument,
              "field \"chat_template\" must be a string or a list");
  ExpectError(ParseTokenizerConfig(R"({"chat_template": [{"name": "default"}]})", "t.json").status(),
              absl::StatusCode::kInvalidArgument, "field \"chat_template[0]\"");
  ExpectError(ParseTokenizerConfig(R"({"add_bos_token": 1})", "t.json").status(), absl::StatusCode::kInvalidArgument,
              "field \"add_bos_token\" must be true or false");
  ExpectError(ParseTokenizerConfig("not json", "m/tokenizer_config.json").status(), absl::StatusCode::kInvalidArgument,
              "m/tokenizer_config.json: not valid JSON");
}

// ---- A model folder ----

constexpr char kPhiStyleTokenizerConfig[] = R"({
  "add_bos_token": false,
  "added_tokens_decoder": {
    "1": {"content": "<s>", "special": true},
    "32000": {"content": "<|endoftext|>", "special": true},
    "32001": {"content": "<|assistant|>", "rstrip": true, "special": true},
    "32007": {"content": "<|end|>", "rstrip": true, "special": true},
    "32010": {"content": "<|user|>", "rstrip": true, "special": true}
  },
  "bos_token": "<s>",
  "chat_template": "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
  "eos_token": "<|endoftext|>",
  "pad_token": "<|endoftext|>",
  "unk_token": "<unk>"
})";

TEST(LoadModelDefaultsTest, ReadsAFolderAndRendersItsTemplate) {
  ScopedDir dir;
  dir.Write("generation_config.json",
            R"({"bos_token_id": 1, "eos_token_id": [32000, 32001, 32007], "temperature": 0.7})");
  dir.Write("tokenizer_config.json", kPhiStyleTokenizerConfig);
  absl::StatusOr<ModelDefaults> d = LoadModelDefaults(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->StopTokenIds(), std::vector<int32_t>({32000, 32001, 32007}));
  EXPECT_DOUBLE_EQ(*d->generation.temperature, 0.7);
  EXPECT_EQ(d->TemplateContext().dump(),
            R"({"bos_token":"<s>","eos_token":"<|endoftext|>","unk_token":"<unk>","pad_token":"<|endoftext|>"})");
  EXPECT_EQ(d->SpecialTokenPatterns().size(), 5u);

  absl::StatusOr<std::unique_ptr<ChatTemplate>> tmpl = d->CompileChatTemplate();
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ((*tmpl)->name(), (dir.path() / "tokenizer_config.json").string() + " chat_template");
  ChatTemplateInputs inputs;
  inputs.messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
  inputs.extra_context = d->TemplateContext();
  absl::StatusOr<std::string> prompt = (*tmpl)->Render(inputs);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt, "<|user|>\nHi<|end|>\n<|endoftext|>");
  ExpectError(d->CompileChatTemplate("tool_use").status(), absl::StatusCode::kNotFound,
              "no chat template named \"tool_use\" (it has: default)");
}

TEST(LoadModelDefaultsTest, StopIdsFallBackToTheEosTokensId) {
  ScopedDir dir;
  dir.Write("tokenizer_config.json", kPhiStyleTokenizerConfig);
  absl::StatusOr<ModelDefaults> d = LoadModelDefaults(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->StopTokenIds(), std::vector<int32_t>({32000}));
}

TEST(LoadModelDefaultsTest, CompanionFilesAsTransformersReadsThem) {
  ScopedDir dir;
  dir.Write("tokenizer_config.json", R"({"chat_template": "old", "eos_token": "</s>"})");
  dir.Write("chat_template.jinja", "{{ bos_token }}new template\n");
  dir.Write("special_tokens_map.json",
            R"({"bos_token": {"content": "<s>"}, "eos_token": "<ignored: tokenizer_config has one>",
                "additional_special_tokens": ["<tool>"]})");
  dir.Write("tokenizer.json", R"({"version": "1.0", "added_tokens": [
      {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 1, "content": "<s>", "special": true}], "model": {"type": "BPE"}})");
  absl::StatusOr<ModelDefaults> d = LoadModelDefaults(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->tokenizer.chat_template, "{{ bos_token }}new template\n");
  EXPECT_EQ(d->tokenizer.chat_template_source, (dir.path() / "chat_template.jinja").string());
  EXPECT_EQ(d->tokenizer.bos_token, "<s>");
  EXPECT_EQ(d->tokenizer.eos_token, "</s>");
  EXPECT_EQ(d->tokenizer.additional_special_tokens, std::vector<std::string>({"<tool>"}));
  ASSERT_EQ(d->tokenizer.added_tokens.size(), 2u);
  EXPECT_EQ(d->tokenizer.added_tokens[0].content, "<s>");
  EXPECT_EQ(d->StopTokenIds(), std::vector<int32_t>({2}));

  ScopedDir json_dir;
  json_dir.Write("chat_template.json", R"({"chat_template": "from chat_template.json"})");
  absl::StatusOr<ModelDefaults> j = LoadModelDefaults(json_dir.path());
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->tokenizer.chat_template, "from chat_template.json");
}

TEST(LoadModelDefaultsTest, EmptyFolderGivesEmptyDefaults) {
  ScopedDir dir;
  absl::StatusOr<ModelDefaults> d = LoadModelDefaults(dir.path());
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->StopTokenIds().empty());
  EXPECT_EQ(d->TemplateContext().dump(), "{}");
  ExpectError(d->CompileChatTemplate().status(), absl::StatusCode::kNotFound, "the model has no chat template");
}

TEST(LoadModelDefaultsTest, ErrorsNameTheFile) {
  ScopedDir dir;
  dir.Write("generation_config.json", "{\"eos_token_id\": [2,");
  ExpectError(LoadModelDefaults(dir.path()).status(), absl::StatusCode::kInvalidArgument,
              (dir.path() / "generation_config.json").string() + ": not valid JSON");
  ScopedDir dir2;
  dir2.Write("tokenizer_config.json", R"({"unk_token": ["<unk>"]})");
  ExpectError(LoadModelDefaults(dir2.path()).status(), absl::StatusCode::kInvalidArgument,
              (dir2.path() / "tokenizer_config.json").string() + ": field \"unk_token\"");
  ScopedDir dir3;
  dir3.Write("tokenizer_config.json", R"({"chat_template": "{% if %}"})");
  absl::StatusOr<ModelDefaults> d = LoadModelDefaults(dir3.path());
  ASSERT_TRUE(d.ok()) << d.status();  // the template is only parsed when compiled
  ExpectError(d->CompileChatTemplate().status(), absl::StatusCode::kInvalidArgument,
              (dir3.path() / "tokenizer_config.json").string() + " chat_template: expected an expression, got '%}'");
}

}  // namespace
}  // namespace tandem
