// A GGUF's own chat template serves /v1/chat/completions as its Hugging Face
// folder's does: tandem-quantize writes the folder's template (and
// add_bos_token) into the file; the chat prompt rendered and encoded from
// the GGUF (its bos/eos pieces as template variables, its control tokens as
// the added vocabulary) is the folder's, text and ids; a GGUF without a
// template is a 400 naming the key it lacks; and a chat request over HTTP
// against a tandem-server running the GGUF equals gRPC's greedy tokens for
// that prompt. Also: ChatSetup::Encode adds the tokenizer's own special
// tokens when asked (never config.json's BOS of its own accord).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/model/gguf_quantize.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/model.h"
#include "coordinator/serving/http/chat_setup.h"
#include "tests/http_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using nlohmann::json;
using OrderedJson = nlohmann::ordered_json;  // what the template engine takes
namespace fs = std::filesystem;

// Mixtral's shape of template: BOS written by the template, EOS after each
// answer, so the prompt holds both special tokens and plain text.
constexpr char kTemplate[] =
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}";

OrderedJson Messages() {
  return OrderedJson::array({{{"role", "user"}, {"content", "Name a colour."}},
                      {{"role", "assistant"}, {"content", "Blue."}},
                      {{"role", "user"}, {"content", "Another one?"}}});
}

// The tiny test model's folder with a tokenizer_config.json as transformers
// writes one (its SentencePiece ids: <unk> 0, <s> 1, </s> 2).
void WriteChatFolder(const fs::path& dir, bool with_template) {
  ASSERT_OK(WriteTestModel(dir));
  json config = {{"add_bos_token", true},
                 {"add_eos_token", false},
                 {"bos_token", "<s>"},
                 {"eos_token", "</s>"},
                 {"unk_token", "<unk>"},
                 {"added_tokens_decoder",
                  {{"0", {{"content", "<unk>"}, {"special", true}}},
                   {"1", {{"content", "<s>"}, {"special", true}}},
                   {"2", {{"content", "</s>"}, {"special", true}}}}}};
  if (with_template) config["chat_template"] = kTemplate;
  std::ofstream(dir / "tokenizer_config.json") << config.dump();
}

class GgufChatTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    WriteChatFolder(dir_->path() / "folder", /*with_template=*/true);
    WriteChatFolder(dir_->path() / "plain", /*with_template=*/false);
    for (const char* name : {"folder", "plain"}) {
      const fs::path out = dir_->path() / absl::StrCat(name, ".gguf");
      ASSERT_OK(QuantizeModel({.model_dir = dir_->path() / name, .file_type = GgufFileType::kBF16, .out = out})
                    .status());
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path Path(const char* name) { return dir_->path() / name; }

  struct Loaded {
    std::unique_ptr<Model> model;
    std::unique_ptr<ChatSetup> chat;
  };
  static Loaded Load(const fs::path& path) {
    Loaded out;
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(path);
    EXPECT_OK(model.status());
    if (!model.ok()) return out;
    out.model = std::move(*model);
    absl::StatusOr<std::unique_ptr<ChatSetup>> chat = LoadChatSetup(*out.model, "");
    EXPECT_OK(chat.status());
    if (chat.ok()) out.chat = std::move(*chat);
    return out;
  }

  static ScopedTempDir* dir_;
};

ScopedTempDir* GgufChatTest::dir_ = nullptr;

TEST_F(GgufChatTest, QuantizeWritesTheFoldersTemplateAndAddBos) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GgufCheckpoint> checkpoint, GgufCheckpoint::Open(Path("folder.gguf")));
  ASSERT_OK_AND_ASSIGN(std::string text, checkpoint->metadata().GetString(kGgufChatTemplateKey));
  EXPECT_EQ(text, kTemplate);
  ASSERT_OK_AND_ASSIGN(bool add_bos, checkpoint->metadata().GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_TRUE(add_bos);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GgufCheckpoint> plain, GgufCheckpoint::Open(Path("plain.gguf")));
  EXPECT_FALSE(plain->metadata().Contains(kGgufChatTemplateKey));

  // chat_template.jinja wins over tokenizer_config.json's, as in
  // transformers: the GGUF carries the one the folder serves.
  ScopedTempDir dir;
  WriteChatFolder(dir.path() / "m", /*with_template=*/true);
  std::ofstream(dir.path() / "m" / "chat_template.jinja") << "{{ bos_token }}jinja";
  ASSERT_OK(QuantizeModel({.model_dir = dir.path() / "m", .file_type = GgufFileType::kBF16,
                           .out = dir.path() / "m.gguf"})
                .status());
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<GgufCheckpoint> jinja, GgufCheckpoint::Open(dir.path() / "m.gguf"));
  EXPECT_EQ(jinja->metadata().GetString(kGgufChatTemplateKey).value_or(""), "{{ bos_token }}jinja");
}

TEST_F(GgufChatTest, PromptRenderedAndEncodedFromTheGgufIsTheFolders) {
  Loaded folder = Load(Path("folder"));
  Loaded gguf = Load(Path("folder.gguf"));
  ASSERT_NE(folder.chat, nullptr);
  ASSERT_NE(gguf.chat, nullptr);
  ASSERT_NE(gguf.chat->chat_template, nullptr) << gguf.chat->no_template_reason;
  EXPECT_EQ(gguf.model->defaults.tokenizer.bos_token, "<s>");
  EXPECT_EQ(gguf.model->defaults.tokenizer.eos_token, "</s>");
  EXPECT_EQ(gguf.model->defaults.tokenizer.add_bos_token, true);
  EXPECT_EQ(gguf.model->EosIds(), folder.model->EosIds());

  const OrderedJson tools;  // none
  const OrderedJson kwargs = OrderedJson::object();
  ASSERT_OK_AND_ASSIGN(std::string from_folder, folder.chat->Render(Messages(), tools, true, kwargs));
  ASSERT_OK_AND_ASSIGN(std::string from_gguf, gguf.chat->Render(Messages(), tools, true, kwargs));
  EXPECT_EQ(from_gguf, from_folder);
  EXPECT_EQ(from_gguf, "<s>[INST] Name a colour. [/INST]Blue.</s>[INST] Another one? [/INST]");

  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> folder_ids, folder.chat->Encode(*folder.model, from_folder, false));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> gguf_ids, gguf.chat->Encode(*gguf.model, from_gguf, false));
  EXPECT_EQ(gguf_ids, folder_ids);
  // The template's BOS once (nothing added to it), its EOS as the id.
  ASSERT_GE(gguf_ids.size(), 3u);
  EXPECT_EQ(gguf_ids[0], 1);
  EXPECT_NE(gguf_ids[1], 1);
  EXPECT_EQ(std::count(gguf_ids.begin(), gguf_ids.end(), 2), 1);
  // Asked for, the tokenizer's own special tokens: its BOS before the text.
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> with_special, gguf.chat->Encode(*gguf.model, "hello", true));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> without, gguf.chat->Encode(*gguf.model, "hello", false));
  ASSERT_EQ(with_special.size(), without.size() + 1);
  EXPECT_EQ(with_special[0], 1);
}

TEST_F(GgufChatTest, GgufWithoutTemplateIsAClearRefusal) {
  Loaded plain = Load(Path("plain.gguf"));
  ASSERT_NE(plain.chat, nullptr);
  EXPECT_EQ(plain.chat->chat_template, nullptr);
  absl::StatusOr<std::string> rendered = plain.chat->Render(Messages(), OrderedJson(), true, OrderedJson::object());
  ASSERT_FALSE(rendered.ok());
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kFailedPrecondition);
  for (const char* says : {"no chat template", "plain.gguf", "tokenizer.chat_template", "--chat_template"}) {
    EXPECT_TRUE(absl::StrContains(rendered.status().message(), says)) << says << ": " << rendered.status();
  }
  EXPECT_FALSE(absl::StrContains(rendered.status().message(), dir_->path().string())) << "no server paths";
}

// Greedy ids through gRPC for `prompt`: the oracle of the HTTP chat answer.
std::string GrpcGreedyText(ServerProcess& server, const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest request;
  request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  request.set_max_tokens(max_tokens);
  request.set_temperature(0);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = server.NewStub()->Generate(&context, request);
  std::string text;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    for (const v1::Token& t : response.tokens()) text += t.text();
  }
  EXPECT_TRUE(reader->Finish().ok());
  return text;
}

TEST_F(GgufChatTest, ChatOverHttpAgainstTheGgufServerUsesItsTemplate) {
  Loaded folder = Load(Path("folder"));
  ASSERT_NE(folder.chat, nullptr);
  ASSERT_OK_AND_ASSIGN(std::string prompt, folder.chat->Render(Messages(), OrderedJson(), true, OrderedJson::object()));
  ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, folder.chat->Encode(*folder.model, prompt, false));

  ASSERT_OK_AND_ASSIGN(HttpServerProcess server,
                       StartHttpServer(Path("folder.gguf"), dir_->path(), {"--threads", "2"}, "gguf"));
  ASSERT_OK_AND_ASSIGN(HttpReply applied, HttpPost(server.port, "/apply-template", json{{"messages", json(Messages())}}));
  ASSERT_EQ(applied.status, 200) << applied.body;
  EXPECT_EQ(applied.json["prompt"], prompt);
  const json request = {{"messages", json(Messages())}, {"max_tokens", 6}, {"temperature", 0}, {"ignore_eos", true}};
  ASSERT_OK_AND_ASSIGN(HttpReply chat, HttpPost(server.port, "/v1/chat/completions", request));
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(chat.json["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(chat.json["choices"][0]["message"]["content"], GrpcGreedyText(*server.server, ids, 6));

  ASSERT_OK_AND_ASSIGN(HttpServerProcess plain,
                       StartHttpServer(Path("plain.gguf"), dir_->path(), {"--threads", "1"}, "plain"));
  ASSERT_OK_AND_ASSIGN(HttpReply refused, HttpPost(plain.port, "/v1/chat/completions", request));
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_EQ(refused.json["error"]["type"], "invalid_request_error");
  EXPECT_EQ(refused.json["error"]["param"], "messages");
  EXPECT_TRUE(absl::StrContains(refused.json["error"]["message"].get<std::string>(), "tokenizer.chat_template"))
      << refused.body;
}

}  // namespace
}  // namespace tandem
