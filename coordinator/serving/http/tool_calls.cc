#include "coordinator/serving/http/tool_calls.h"

#include <random>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/status_macros.h"
#include "coordinator/generation/json_schema_grammar.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kHermesOpen[] = "<tool_call>";
constexpr char kHermesClose[] = "</tool_call>";
constexpr char kPythonTag[] = "<|python_tag|>";
constexpr char kMistralCalls[] = "[TOOL_CALLS]";
constexpr char kMistralArgs[] = "[ARGS]";
constexpr char kDeepSeekCallsBegin[] = "<｜tool▁calls▁begin｜>";
constexpr char kDeepSeekCallsEnd[] = "<｜tool▁calls▁end｜>";
constexpr char kDeepSeekCallBegin[] = "<｜tool▁call▁begin｜>";
constexpr char kDeepSeekCallEnd[] = "<｜tool▁call▁end｜>";
constexpr char kDeepSeekSep[] = "<｜tool▁sep｜>";

// Calls one forced output may hold when parallel calls are allowed.
constexpr int32_t kMaxParallelCalls = 16;

bool IsDeepSeek(ToolCallFormat f) { return f == ToolCallFormat::kDeepSeekV3 || f == ToolCallFormat::kDeepSeekV31; }
bool IsMistral(ToolCallFormat f) { return f == ToolCallFormat::kMistral || f == ToolCallFormat::kMistralArgs; }

// Where a call section starts and ends ("" : at the end of the output).
struct Section {
  absl::string_view open, close;
};
Section SectionOf(ToolCallFormat f) {
  if (f == ToolCallFormat::kHermes) return {kHermesOpen, kHermesClose};
  if (f == ToolCallFormat::kLlama3) return {kPythonTag, ""};
  if (IsMistral(f)) return {kMistralCalls, ""};
  if (IsDeepSeek(f)) return {kDeepSeekCallsBegin, kDeepSeekCallsEnd};
  return {"", ""};
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// {"name": ..., "arguments"/"parameters": ...} → a call; false otherwise.
bool CallFromObject(const Json& j, ToolCall* call) {
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty()) return false;
  call->name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) {
    call->arguments = "{}";
  } else if (args->is_string()) {
    call->arguments = args->get<std::string>();
  } else {
    call->arguments = Dump(*args);
  }
  return true;
}

// A JSON object or a list of them; empty when the text is neither.
std::vector<ToolCall> CallsFromJson(absl::string_view text) {
  std::vector<ToolCall> calls;
  const Json j = Json::parse(absl::StripAsciiWhitespace(text), nullptr, false);
  if (j.is_discarded()) return calls;
  ToolCall call;
  if (CallFromObject(j, &call)) {
    calls.push_back(std::move(call));
    return calls;
  }
  if (!j.is_array()) return calls;
  for (const Json& item : j) {
    if (!CallFromObject(item, &call)) return {};
    calls.push_back(call);
  }
  return calls;
}

// "name[ARGS]{...}", possibly several joined by [TOOL_CALLS].
std::vector<ToolCall> MistralArgsCalls(absl::string_view section) {
  std::vector<ToolCall> calls;
  for (absl::string_view part : absl::StrSplit(section, kMistralCalls, absl::SkipWhitespace())) {
    const size_t args = part.find(kMistralArgs);
    if (args == absl::string_view::npos) return {};
    ToolCall call;
    call.name = std::string(absl::StripAsciiWhitespace(part.substr(0, args)));
    const absl::string_view json = absl::StripAsciiWhitespace(part.substr(args + sizeof(kMistralArgs) - 1));
    if (call.name.empty() || Json::parse(json, nullptr, false).is_discarded()) return {};
    call.arguments = std::string(json);
    calls.push_back(std::move(call));
  }
  return calls;
}

// <｜tool▁call▁begin｜>[function<｜tool▁sep｜>]name...<｜tool▁call▁end｜>, repeated:
// V3's "function<sep>name\n```json\n{...}\n```" or V3.1's "name<sep>{...}".
std::vector<ToolCall> DeepSeekCalls(absl::string_view section) {
  std::vector<ToolCall> calls;
  for (absl::string_view part : absl::StrSplit(section, kDeepSeekCallBegin, absl::SkipWhitespace())) {
    const size_t end = part.find(kDeepSeekCallEnd);
    if (end != absl::string_view::npos) part = part.substr(0, end);
    const size_t sep = part.find(kDeepSeekSep);
    if (sep == absl::string_view::npos) return {};
    ToolCall call;
    absl::string_view left = part.substr(0, sep), right = part.substr(sep + sizeof(kDeepSeekSep) - 1);
    if (left == "function") {
      const size_t newline = right.find('\n');
      if (newline == absl::string_view::npos) return {};
      call.name = std::string(absl::StripAsciiWhitespace(right.substr(0, newline)));
      right = right.substr(newline + 1);
      absl::ConsumePrefix(&right, "```json");
      right = absl::StripAsciiWhitespace(right);
      absl::ConsumeSuffix(&right, "```");
    } else {
      call.name = std::string(absl::StripAsciiWhitespace(left));
    }
    const absl::string_view json = absl::StripAsciiWhitespace(right);
    if (call.name.empty() || Json::parse(json, nullptr, false).is_discarded()) return {};
    call.arguments = std::string(json);
    calls.push_back(std::move(call));
  }
  return calls;
}

// A marker as one special token when the vocabulary has it as one (it has
// no text to match), else as its text.
int32_t Marker(Grammar& g, const Tokenizer& tokenizer, const std::string& text) {
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text, false);
  if (ids.ok() && ids->size() == 1 && tokenizer.PieceText((*ids)[0]).empty()) return g.AddToken((*ids)[0]);
  return g.AddLiteral(text);
}

int32_t CallObject(Grammar& g, const std::string& name, int32_t arguments, const char* arguments_key) {
  GrammarNode n;
  n.kind = GrammarNode::Kind::kObject;
  n.properties.push_back({Dump(Json("name")), g.AddLiterals({Dump(Json(name))}, true), true});
  n.properties.push_back({Dump(Json(arguments_key)), arguments, true});
  return g.Add(std::move(n));
}

// One call of tool `name` with `arguments` (its parameters' node), as
// `format` writes it.
int32_t CallNode(Grammar& g, ToolCallFormat format, const Tokenizer& tok, const std::string& name,
                 int32_t arguments) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return g.AddSequence({Marker(g, tok, kHermesOpen), g.AddLiteral("\n"), CallObject(g, name, arguments, "arguments"),
                            g.AddLiteral("\n"), Marker(g, tok, kHermesClose)});
    case ToolCallFormat::kLlama3: return CallObject(g, name, arguments, "parameters");
    case ToolCallFormat::kMistral: return CallObject(g, name, arguments, "arguments");
    case ToolCallFormat::kMistralArgs:
      return g.AddSequence({Marker(g, tok, kMistralCalls), g.AddLiteral(name), Marker(g, tok, kMistralArgs), arguments});
    case ToolCallFormat::kDeepSeekV3:
      return g.AddSequence({Marker(g, tok, kDeepSeekCallBegin), g.AddLiteral("function"), Marker(g, tok, kDeepSeekSep),
                            g.AddLiteral(name + "\n```json\n"), arguments, g.AddLiteral("\n```"),
                            Marker(g, tok, kDeepSeekCallEnd)});
    case ToolCallFormat::kDeepSeekV31:
      return g.AddSequence({Marker(g, tok, kDeepSeekCallBegin), g.AddLiteral(name), Marker(g, tok, kDeepSeekSep),
                            arguments, Marker(g, tok, kDeepSeekCallEnd)});
    case ToolCallFormat::kNone: break;
  }
  return -1;
}

}  // namespace

ToolCallFormat DetectToolCallFormat(absl::string_view source) {
  if (absl::StrContains(source, kDeepSeekCallsBegin)) {
    return absl::StrContains(source, "```json") ? ToolCallFormat::kDeepSeekV3 : ToolCallFormat::kDeepSeekV31;
  }
  if (absl::StrContains(source, kMistralCalls)) {
    return absl::StrContains(source, kMistralArgs) ? ToolCallFormat::kMistralArgs : ToolCallFormat::kMistral;
  }
  if (absl::StrContains(source, kPythonTag) ||
      (absl::StrContains(source, "<|start_header_id|>") && absl::StrContains(source, "ipython"))) {
    return ToolCallFormat::kLlama3;
  }
  if (absl::StrContains(source, kHermesOpen)) return ToolCallFormat::kHermes;
  return ToolCallFormat::kNone;
}

absl::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3: return "llama3";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kMistralArgs: return "mistral-args";
    case ToolCallFormat::kDeepSeekV3: return "deepseek-v3";
    case ToolCallFormat::kDeepSeekV31: return "deepseek-v3.1";
  }
  return "none";
}

std::string NewToolCallId(ToolCallFormat format) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local absl::BitGen gen;
  const bool mistral = IsMistral(format);
  std::string id = mistral ? "" : "call_";
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlphabet[absl::Uniform<size_t>(gen, 0, sizeof(kAlphabet) - 1)];
  return id;
}

absl::StatusOr<Json> ToolMessagesForTemplate(const Json& messages, ToolCallFormat format) {
  Json out = messages;
  for (size_t i = 0; i < out.size(); ++i) {
    auto calls = out[i].find("tool_calls");
    if (calls == out[i].end() || calls->is_null()) continue;
    if (!calls->is_array()) return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].tool_calls: must be a list"));
    for (size_t j = 0; j < calls->size(); ++j) {
      Json& call = (*calls)[j];
      const std::string at = absl::StrCat("messages[", i, "].tool_calls[", j, "]");
      if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
          !call["function"].contains("name") || !call["function"]["name"].is_string()) {
        return absl::InvalidArgumentError(absl::StrCat(at, ": must be {\"id\", \"type\": \"function\", \"function\": "
                                                           "{\"name\", \"arguments\"}}"));
      }
      Json& args = call["function"]["arguments"];
      if (args.is_string() && !IsDeepSeek(format)) {
        Json parsed = Json::parse(args.get<std::string>(), nullptr, false);
        if (parsed.is_discarded()) {
          return absl::InvalidArgumentError(absl::StrCat(at, ".function.arguments: must be JSON text"));
        }
        args = std::move(parsed);
      } else if (!args.is_string() && IsDeepSeek(format)) {
        args = Dump(args);
      }
    }
  }
  return out;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, bool parallel) : format_(format), parallel_(parallel) {}

void ToolCallParser::EmitContent(absl::string_view text, Output& out) {
  if (text.empty()) return;
  const size_t body = text.find_last_not_of(" \t\r\n");
  if (body == absl::string_view::npos) {
    absl::StrAppend(&held_space_, text);
    return;
  }
  out.content += held_space_;
  absl::StrAppend(&out.content, text.substr(0, body + 1));
  held_space_ = std::string(text.substr(body + 1));
}

void ToolCallParser::EmitCalls(absl::string_view raw, Output& out) {
  const Section s = SectionOf(format_);
  absl::string_view section = raw;
  absl::ConsumePrefix(&section, s.open);
  if (!s.close.empty()) absl::ConsumeSuffix(&section, s.close);
  std::vector<ToolCall> calls;
  if (format_ == ToolCallFormat::kMistralArgs) {
    calls = MistralArgsCalls(section);
  } else if (IsDeepSeek(format_)) {
    calls = DeepSeekCalls(section);
  } else {
    calls = CallsFromJson(section);
  }
  if (calls.empty()) return EmitContent(raw, out);  // not a call after all: nothing is lost
  for (ToolCall& call : calls) {
    if (!parallel_ && calls_made_ > 0) break;
    call.id = NewToolCallId(format_);
    out.calls.push_back(std::move(call));
    ++calls_made_;
  }
}

void ToolCallParser::Scan(Output& out, bool final) {
  const Section s = SectionOf(format_);
  for (;;) {
    if (!in_call_) {
      if (format_ == ToolCallFormat::kLlama3 && !started_) {
        // Llama 3 writes a call as the whole message: a bare object first.
        const size_t first = buffer_.find_first_not_of(" \t\r\n");
        if (first == std::string::npos) {
          if (!final) return;
        } else {
          started_ = true;
          if (buffer_[first] == '{') {
            buffer_.erase(0, first);
            in_call_ = true;
            continue;
          }
        }
      }
      started_ = started_ || !buffer_.empty();
      const size_t at = absl::string_view(buffer_).find(s.open);
      if (at != std::string::npos) {
        EmitContent(absl::string_view(buffer_).substr(0, at), out);
        buffer_.erase(0, at);
        in_call_ = true;
        continue;
      }
      // Hold back what may be the start of a marker.
      size_t keep = 0;
      for (size_t k = std::min(buffer_.size(), s.open.size() - 1); k > 0 && !final; --k) {
        if (absl::string_view(buffer_).substr(buffer_.size() - k) == s.open.substr(0, k)) {
          keep = k;
          break;
        }
      }
      EmitContent(absl::string_view(buffer_).substr(0, buffer_.size() - keep), out);
      buffer_.erase(0, buffer_.size() - keep);
      return;
    }
    if (!s.close.empty()) {
      const size_t end = absl::string_view(buffer_).find(s.close, s.open.size());
      if (end != std::string::npos) {
        EmitCalls(absl::string_view(buffer_).substr(0, end + s.close.size()), out);
        buffer_.erase(0, end + s.close.size());
        in_call_ = false;
        continue;
      }
    }
    if (!final) return;
    EmitCalls(buffer_, out);
    buffer_.clear();
    in_call_ = false;
    return;
  }
}

ToolCallParser::Output ToolCallParser::Push(absl::string_view text) {
  Output out;
  absl::StrAppend(&buffer_, text);
  Scan(out, false);
  return out;
}

ToolCallParser::Output ToolCallParser::Finish() {
  Output out;
  Scan(out, true);
  if (calls_made_ == 0) out.content += held_space_;
  held_space_.clear();
  return out;
}

absl::StatusOr<std::shared_ptr<TokenGrammar>> ToolCallGrammar(ToolCallFormat format, const ToolRequest& request,
                                                              const Tokenizer& tokenizer,
                                                              std::shared_ptr<const VocabularyIndex> vocabulary,
                                                              std::vector<int32_t> end_ids) {
  if (format == ToolCallFormat::kNone) {
    return absl::InvalidArgumentError("tool_choice: this model's chat template writes no tool calls");
  }
  auto out = std::make_shared<TokenGrammar>();
  out->vocabulary = std::move(vocabulary);
  out->grammar.end_ids = std::move(end_ids);
  Grammar& g = out->grammar;
  std::vector<int32_t> calls;
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const Json& function = request.tools[i]["function"];
    const std::string name = function["name"].get<std::string>();
    if (!request.forced.empty() && name != request.forced) continue;
    int32_t arguments = -1;
    auto params = function.find("parameters");
    if (params == function.end() || params->is_null()) {
      arguments = AddAnyJsonObject(&g);
    } else {
      TANDEM_ASSIGN_OR_RETURN(arguments,
                              AddJsonSchema(*params, absl::StrCat("tools[", i, "].function.parameters"), &g));
    }
    calls.push_back(CallNode(g, format, tokenizer, name, arguments));
  }
  if (calls.empty()) return absl::InvalidArgumentError("tool_choice: names no function of tools");
  const int32_t any_call = g.AddAnyOf(std::move(calls));
  const int32_t max = request.parallel && format != ToolCallFormat::kLlama3 ? kMaxParallelCalls : 1;
  switch (format) {
    case ToolCallFormat::kHermes: g.root = g.AddRepeat(any_call, g.AddLiteral("\n"), 1, max); break;
    case ToolCallFormat::kMistral: {
      GrammarNode list;
      list.kind = GrammarNode::Kind::kArray;
      list.items = any_call;
      list.min = 1;
      list.max = max;
      g.root = g.AddSequence({Marker(g, tokenizer, kMistralCalls), g.Add(std::move(list))});
      break;
    }
    case ToolCallFormat::kDeepSeekV3:
    case ToolCallFormat::kDeepSeekV31:
      g.root = g.AddSequence({Marker(g, tokenizer, kDeepSeekCallsBegin),
                              g.AddRepeat(any_call, format == ToolCallFormat::kDeepSeekV3 ? g.AddLiteral("\n") : -1,
                                          1, max),
                              Marker(g, tokenizer, kDeepSeekCallsEnd)});
      break;
    default: g.root = g.AddRepeat(any_call, -1, 1, max);
  }
  return out;
}

}  // namespace tandem
