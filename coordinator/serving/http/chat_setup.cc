#include "coordinator/serving/http/chat_setup.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

constexpr size_t kMaxTemplateBytes = 1 << 20;

absl::StatusOr<std::string> ReadTemplateFile(const std::string& path) {
  std::error_code error;
  const auto size = std::filesystem::file_size(path, error);
  if (error) return absl::InvalidArgumentError(absl::StrCat("--chat_template ", path, ": ", error.message()));
  if (size > kMaxTemplateBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat_template ", path, ": ", size, " bytes, more than the ", kMaxTemplateBytes, " allowed"));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--chat_template ", path, ": cannot read"));
  return text.str();
}

// "models/demo/" -> "demo", "/m/x.gguf (2 files)" -> "x.gguf (2 files)":
// errors that reach clients name no server paths.
std::string OriginName(const std::string& origin) {
  std::filesystem::path p = std::filesystem::path(origin).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

// Why the model has no template, naming where one would have been.
std::string NoTemplateReason(const Model& model, bool folder) {
  std::string where;
  if (folder) {
    where = absl::StrCat("none in ", OriginName(model.origin),
                         ": tokenizer_config.json chat_template, chat_template.jinja or chat_template.json");
  } else if (absl::StrContains(model.origin, ".gguf")) {
    where = absl::StrCat(OriginName(model.origin), " has no tokenizer.chat_template key");
  } else {
    where = "none in the synthetic model";
  }
  return absl::StrCat("this model has no chat template (", where,
                      "); start tandem-server with --chat_template FILE, or send a plain prompt to /v1/completions");
}

}  // namespace

absl::StatusOr<std::string> ChatSetup::Render(const nlohmann::ordered_json& messages,
                                              const nlohmann::ordered_json& tools, bool add_generation_prompt,
                                              const nlohmann::ordered_json& kwargs) const {
  if (chat_template == nullptr) return absl::FailedPreconditionError(no_template_reason);
  ChatTemplateInputs inputs;
  inputs.messages = messages;
  inputs.tools = tools;
  inputs.add_generation_prompt = add_generation_prompt;
  inputs.extra_context = defaults.TemplateContext();
  for (const auto& [key, value] : kwargs.items()) {
    if (key == "messages" || key == "tools" || key == "documents" || key == "add_generation_prompt") {
      return absl::InvalidArgumentError(absl::StrCat("chat_template_kwargs: may not set \"", key, "\""));
    }
    inputs.extra_context[key] = value;
  }
  return chat_template->Render(inputs);
}

absl::StatusOr<std::vector<int32_t>> ChatSetup::Encode(const Model& model, std::string_view prompt,
                                                       bool add_special_tokens) const {
  if (model.tokenizer == nullptr) {
    return absl::FailedPreconditionError(
        "this model has no tokenizer (tokenizer.json, tokenizer.model or a GGUF vocabulary): text cannot be tokenized");
  }
  const Tokenizer* tokenizer = model.tokenizer.get();
  if (!special_tokens) return tokenizer->Encode(prompt, add_special_tokens);
  auto encode = [tokenizer](std::string_view text) { return tokenizer->Encode(text, /*add_bos=*/false); };
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, EncodeWithSpecialTokens(prompt, *special_tokens, encode));
  // The tokenizer's own, as around any text: never config.json's BOS on a
  // tokenizer that adds none (Qwen), nor a check for one already there
  // (transformers adds it again too).
  if (add_special_tokens) tokenizer->AddSpecialTokens(&ids);
  return ids;
}

absl::StatusOr<std::unique_ptr<ChatSetup>> LoadChatSetup(const Model& model, const std::string& chat_template_file) {
  auto setup = std::make_unique<ChatSetup>();
  std::error_code error;
  const bool folder = std::filesystem::is_directory(model.origin, error);
  setup->defaults = model.defaults;
  if (!chat_template_file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(std::string source, ReadTemplateFile(chat_template_file));
    ChatTemplateOptions options;
    // Render errors reach HTTP clients: they name the file, not where it is.
    options.name = std::filesystem::path(chat_template_file).filename().string();
    TANDEM_ASSIGN_OR_RETURN(setup->chat_template, ChatTemplate::Create(source, options));
  } else {
    // The model's own: a folder's files, or a GGUF's tokenizer.chat_template.
    ChatTemplateOptions options;
    options.name = absl::StrCat(
        std::filesystem::path(setup->defaults.tokenizer.chat_template_source).filename().string(), " chat_template");
    absl::StatusOr<std::unique_ptr<ChatTemplate>> compiled = setup->defaults.CompileChatTemplate("default", options);
    if (compiled.ok()) {
      setup->chat_template = std::move(*compiled);
    } else if (!absl::IsNotFound(compiled.status())) {
      return compiled.status();
    }
  }
  if (setup->chat_template == nullptr) setup->no_template_reason = NoTemplateReason(model, folder);
  const std::vector<SpecialTokenPattern> patterns = setup->defaults.SpecialTokenPatterns();
  if (!patterns.empty()) {
    TANDEM_ASSIGN_OR_RETURN(SpecialTokenMatcher matcher, SpecialTokenMatcher::Create(patterns));
    setup->special_tokens = std::move(matcher);
  }
  return setup;
}

}  // namespace tandem
