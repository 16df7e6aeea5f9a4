// tandem: the command line for a running tandem server (tandem-server), via
// the C++ SDK. The subcommand is the first argument:
//   tandem generate --prompt "The licensee may" -n 32 [--temperature 0.8 --top_p 0.95 --seed 1 --stop "\n"]
//   tandem generate --prompt_ids 1,415,2201 -n 8 --logprobs 5 --json
//   tandem beam --prompt "Once" --beam_width 4 -n 16 [--num_return_sequences 2 --progress]
//   tandem info | stats [--json]
//   tandem tokenize --prompt "text"      tandem detokenize --prompt_ids 1,2,3
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "common/base/flags_usage.h"
#include "common/base/parse_ids.h"
#include "common/base/runtime_dir.h"

ABSL_FLAG(std::string, server, tandem::DefaultServerAddress(),
          "server address: unix:/path/to/server.sock or host:port (default: where tandem-server listens by "
          "default, unix:<runtime dir>/server.sock; runtime dir = $TANDEM_RUNTIME_DIR, else "
          "${XDG_RUNTIME_DIR:-/tmp}/tandem-<user>, as in deploy/tandem-launch.sh)");
ABSL_FLAG(double, connect_timeout_s, 10, "how long to wait for the server to answer");
ABSL_FLAG(double, timeout_s, 0,
          "deadline of the request in seconds; 0 = the SDK's default (1 h generation, 30 s others)");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
// Prompt (generate, beam, tokenize, detokenize).
ABSL_FLAG(std::string, prompt, "", "prompt text (the model needs a tokenizer)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids, e.g. 1,2,3");
ABSL_FLAG(std::optional<bool>, add_bos, std::nullopt, "prepend BOS to a text prompt (server default: true)");
ABSL_FLAG(std::optional<int32_t>, n, std::nullopt, "maximum number of tokens to generate (server default: 16)");
ABSL_FLAG(std::optional<int32_t>, max_tokens, std::nullopt, "same as -n");
ABSL_FLAG(std::string, stop_ids, "", "comma-separated token ids that end generation (beam: end a beam)");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past the end-of-sequence token");
ABSL_FLAG(std::string, logit_bias, "",
          "ID:BIAS,... added to those tokens' logits, bias in [-100, 100] (-100 all but bans a token)");
// Sampling (generate).
ABSL_FLAG(std::optional<float>, temperature, std::nullopt, "sampling temperature; 0 = greedy (server default: 1.0)");
ABSL_FLAG(std::optional<int32_t>, top_k, std::nullopt, "sample among the k most likely tokens; 0 = all");
ABSL_FLAG(std::optional<float>, top_p, std::nullopt, "nucleus sampling mass in (0, 1] (server default: 1.0)");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt, "random seed (default: drawn by the server, reported)");
ABSL_FLAG(std::string, stop, "",
          "a stop string (repeat the flag for several; C escapes such as \\n are decoded); not printed itself");
ABSL_FLAG(int32_t, logprobs, 0, "report the top-K log probabilities at each position (--json)");
// Beam search (beam).
ABSL_FLAG(int32_t, beam_width, 4, "beams, 1..64");
ABSL_FLAG(std::optional<float>, length_penalty, std::nullopt,
          "score = sum logprob / length^penalty (server default: 1.0)");
ABSL_FLAG(bool, early_stopping, false, "stop as soon as beam_width sequences have finished");
ABSL_FLAG(std::optional<int32_t>, num_return_sequences, std::nullopt, "sequences to print, 1..beam_width (default 1)");
ABSL_FLAG(bool, progress, false, "print each step's best beam on stderr (with --json: a \"progress\" array)");

namespace {

using tandem::ParseIds;
using tandem::ParseLogitBias;
using tandem::sdk::Client;

constexpr char kUsage[] =
    "Talk to a running tandem server.\n"
    "  tandem generate --prompt \"text\" -n 32 [--temperature T --top_k K --top_p P --seed S --stop STR\n"
    "                  --stop_ids IDS --logit_bias ID:BIAS,... --logprobs K --ignore_eos --json]\n"
    "  tandem beam --prompt \"text\" --beam_width 4 -n 16 [--length_penalty L --early_stopping\n"
    "              --num_return_sequences N --progress --json]\n"
    "  tandem info [--json]        the model and where its experts run\n"
    "  tandem stats [--json]       throughput, queue, KV cache, per-layer timings, workers\n"
    "  tandem tokenize --prompt \"text\" [--json]      tandem detokenize --prompt_ids 1,2,3 [--json]\n"
    "Every command takes --server (unix:/path.sock or host:port); the default is tandem-server's own,\n"
    "unix:<runtime dir>/server.sock, runtime dir = $TANDEM_RUNTIME_DIR or ${XDG_RUNTIME_DIR:-/tmp}/tandem-<user>.";

constexpr int kExitError = 1;  // the request failed
constexpr int kExitUsage = 2;  // bad command line

// What the command line named, read before absl parses it: which flags were
// given (to reject those that do not apply to the subcommand) and every
// --stop value (absl keeps only the last of a repeated flag).
struct GivenFlags {
  std::set<std::string> names;
  std::vector<std::string> stop;
};

GivenFlags ScanFlags(int argc, char** argv) {
  GivenFlags given;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    const size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    if (name == "stop") {
      if (eq != std::string::npos) {
        given.stop.push_back(body.substr(eq + 1));
      } else if (i + 1 < argc) {
        given.stop.push_back(argv[++i]);
      }
    }
    given.names.insert(name);
  }
  return given;
}

int UsageError(const std::string& message) {
  std::fprintf(stderr, "tandem: %s\nRun 'tandem --help' for the flags.\n", message.c_str());
  return kExitUsage;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tandem: %s\n", status.ToString().c_str());
  return kExitError;
}

absl::Duration Seconds(double s) { return s > 0 ? absl::Seconds(s) : absl::ZeroDuration(); }

tandem::sdk::CallOptions Call() { return {.timeout = Seconds(absl::GetFlag(FLAGS_timeout_s))}; }

std::string Dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

nlohmann::json ToJson(const tandem::sdk::Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"generated_tokens", u.generated_tokens},
          {"queue_ms", u.queue_ms},
          {"time_to_first_token_ms", u.time_to_first_token_ms},
          {"mean_inter_token_ms", u.mean_inter_token_ms},
          {"p50_inter_token_ms", u.p50_inter_token_ms},
          {"p99_inter_token_ms", u.p99_inter_token_ms},
          {"tokens_per_s", u.tokens_per_s},
          {"total_ms", u.total_ms}};
}

nlohmann::json ToJson(const tandem::sdk::BeamSequence& s) {
  return {{"ids", s.ids},
          {"text", s.text},
          {"score", s.score},
          {"sum_logprob", s.sum_logprob},
          {"finish_reason", std::string(tandem::sdk::FinishReasonName(s.finish_reason))}};
}

// The prompt flags, shared by generate and beam: exactly one of text and ids.
struct Prompt {
  std::string text;
  std::vector<int32_t> ids;
};
absl::StatusOr<Prompt> ReadPrompt() {
  Prompt p{.text = absl::GetFlag(FLAGS_prompt)};
  const std::string ids = absl::GetFlag(FLAGS_prompt_ids);
  if (p.text.empty() == ids.empty()) return absl::InvalidArgumentError("give exactly one of --prompt and --prompt_ids");
  auto parsed = ParseIds(ids, "prompt_ids");
  if (!parsed.ok()) return parsed.status();
  p.ids = *parsed;
  return p;
}

absl::StatusOr<std::optional<int32_t>> ReadMaxTokens() {
  const auto n = absl::GetFlag(FLAGS_n), max_tokens = absl::GetFlag(FLAGS_max_tokens);
  if (n && max_tokens) return absl::InvalidArgumentError("give one of -n and --max_tokens, not both");
  return n ? n : max_tokens;
}

// The text of a token for the terminal: its text, or its id when the model has no tokenizer.
std::string Show(const std::string& text, int32_t id, bool has_tokenizer) {
  return has_tokenizer ? text : absl::StrCat(id, " ");
}

// After the command line is checked: a bad flag is reported as such, whether or not a server is up.
// Whether the server's model has a tokenizer, which decides whether plain
// output shows text or ids; --json shows both and does not ask.
absl::StatusOr<bool> HasTokenizer(Client& client, bool json) {
  if (json) return true;
  auto info = client.Info(Call());
  if (!info.ok()) return info.status();
  return info->has_tokenizer;
}

absl::StatusOr<std::unique_ptr<Client>> ConnectToServer() {
  return Client::Connect(absl::GetFlag(FLAGS_server),
                         {.connect_timeout = Seconds(absl::GetFlag(FLAGS_connect_timeout_s))});
}

int RunGenerate(const GivenFlags& given) {
  auto prompt = ReadPrompt();
  if (!prompt.ok()) return UsageError(std::string(prompt.status().message()));
  auto max_tokens = ReadMaxTokens();
  if (!max_tokens.ok()) return UsageError(std::string(max_tokens.status().message()));
  auto stop_ids = ParseIds(absl::GetFlag(FLAGS_stop_ids), "stop_ids");
  if (!stop_ids.ok()) return UsageError(std::string(stop_ids.status().message()));
  auto logit_bias = ParseLogitBias(absl::GetFlag(FLAGS_logit_bias), "logit_bias");
  if (!logit_bias.ok()) return UsageError(std::string(logit_bias.status().message()));
  tandem::sdk::GenerateOptions options{.prompt = prompt->text,
                                       .prompt_ids = prompt->ids,
                                       .add_bos = absl::GetFlag(FLAGS_add_bos),
                                       .max_tokens = *max_tokens,
                                       .temperature = absl::GetFlag(FLAGS_temperature),
                                       .top_k = absl::GetFlag(FLAGS_top_k),
                                       .top_p = absl::GetFlag(FLAGS_top_p),
                                       .seed = absl::GetFlag(FLAGS_seed),
                                       .stop_ids = *stop_ids,
                                       .ignore_eos = absl::GetFlag(FLAGS_ignore_eos),
                                       .logprobs = absl::GetFlag(FLAGS_logprobs)};
  options.logit_bias = *logit_bias;
  for (const std::string& s : given.stop) {
    std::string unescaped, error;
    if (!absl::CUnescape(s, &unescaped, &error)) return UsageError(absl::StrCat("--stop \"", s, "\": ", error));
    options.stop.push_back(unescaped);
  }
  auto connected = ConnectToServer();
  if (!connected.ok()) return Fail(connected.status());
  Client& client = **connected;

  const bool json = absl::GetFlag(FLAGS_json);
  auto has_tokenizer = HasTokenizer(client, json);
  if (!has_tokenizer.ok()) return Fail(has_tokenizer.status());
  if (!json && !options.prompt.empty()) std::cout << options.prompt << std::flush;
  auto result = client.Generate(
      options,
      [&](const tandem::sdk::StreamedToken& token) {
        if (!json) std::cout << Show(token.text, token.id, *has_tokenizer) << std::flush;
      },
      Call());
  if (!json) std::cout << std::endl;  // flushed before the usage line or error on stderr
  if (!result.ok()) return Fail(result.status());

  const std::string finish = std::string(tandem::sdk::FinishReasonName(result->finish_reason));
  const tandem::sdk::Usage& u = result->usage;
  if (json) {
    nlohmann::json tokens = nlohmann::json::array();
    for (const tandem::sdk::StreamedToken& t : result->tokens) {
      nlohmann::json top = nlohmann::json::array();
      for (const tandem::sdk::TopLogprob& lp : t.top_logprobs) {
        top.push_back({{"id", lp.id}, {"text", lp.text}, {"logprob", lp.logprob}});
      }
      tokens.push_back({{"id", t.id}, {"text", t.text}, {"logprob", t.logprob}, {"top_logprobs", top}});
    }
    std::cout << Dump({{"tokens", tokens},
                       {"ids", result->ids()},
                       {"text", result->text},
                       {"finish_reason", finish},
                       {"seed", result->seed},
                       {"usage", ToJson(u)}})
              << "\n";
  } else {
    std::fprintf(
        stderr,
        "[%lld prompt tokens, %lld generated (%s); queue %.1f ms, first token %.1f ms, %.1f tok/s; seed %llu]\n",
        static_cast<long long>(u.prompt_tokens), static_cast<long long>(u.generated_tokens), finish.c_str(), u.queue_ms,
        u.time_to_first_token_ms, u.tokens_per_s, static_cast<unsigned long long>(result->seed));
  }
  return 0;
}

int RunBeam() {
  auto prompt = ReadPrompt();
  if (!prompt.ok()) return UsageError(std::string(prompt.status().message()));
  auto max_tokens = ReadMaxTokens();
  if (!max_tokens.ok()) return UsageError(std::string(max_tokens.status().message()));
  auto stop_ids = ParseIds(absl::GetFlag(FLAGS_stop_ids), "stop_ids");
  if (!stop_ids.ok()) return UsageError(std::string(stop_ids.status().message()));
  auto logit_bias = ParseLogitBias(absl::GetFlag(FLAGS_logit_bias), "logit_bias");
  if (!logit_bias.ok()) return UsageError(std::string(logit_bias.status().message()));
  tandem::sdk::BeamSearchOptions options{.prompt = prompt->text,
                                               .prompt_ids = prompt->ids,
                                               .add_bos = absl::GetFlag(FLAGS_add_bos),
                                               .beam_width = absl::GetFlag(FLAGS_beam_width),
                                               .max_tokens = *max_tokens,
                                               .length_penalty = absl::GetFlag(FLAGS_length_penalty),
                                               .early_stopping = absl::GetFlag(FLAGS_early_stopping),
                                               .num_return_sequences = absl::GetFlag(FLAGS_num_return_sequences),
                                               .stop_ids = *stop_ids,
                                               .ignore_eos = absl::GetFlag(FLAGS_ignore_eos)};
  options.logit_bias = *logit_bias;
  auto connected = ConnectToServer();
  if (!connected.ok()) return Fail(connected.status());
  Client& client = **connected;
  const bool json = absl::GetFlag(FLAGS_json);
  auto has_tokenizer = HasTokenizer(client, json);
  if (!has_tokenizer.ok()) return Fail(has_tokenizer.status());
  auto text_of = [&](const tandem::sdk::BeamSequence& s) {
    if (*has_tokenizer) return s.text;
    return absl::StrJoin(s.ids, " ");
  };
  nlohmann::json progress = nlohmann::json::array();
  Client::ProgressCallback on_progress;
  if (absl::GetFlag(FLAGS_progress)) {
    on_progress = [&](const tandem::sdk::BeamProgress& p) {
      if (json) {
        progress.push_back(
            {{"step", p.step}, {"live_beams", p.live_beams}, {"finished", p.finished}, {"best", ToJson(p.best)}});
      } else {
        std::fprintf(stderr, "[step %d: %d live, %d finished; best %.3f: %s]\n", p.step, p.live_beams, p.finished,
                     p.best.score, text_of(p.best).c_str());
      }
    };
  }
  auto result = client.BeamSearch(options, on_progress, Call());
  if (!result.ok()) return Fail(result.status());
  const tandem::sdk::Usage& u = result->usage;
  if (json) {
    nlohmann::json sequences = nlohmann::json::array();
    for (const tandem::sdk::BeamSequence& s : result->sequences) sequences.push_back(ToJson(s));
    nlohmann::json out = {{"sequences", sequences}, {"usage", ToJson(u)}};
    if (absl::GetFlag(FLAGS_progress)) out["progress"] = progress;
    std::cout << Dump(out) << "\n";
    return 0;
  }
  for (size_t i = 0; i < result->sequences.size(); ++i) {
    const tandem::sdk::BeamSequence& s = result->sequences[i];
    std::cout << absl::StrFormat("[%d] score %.4f, sum logprob %.4f, %s: ", i + 1, s.score, s.sum_logprob,
                                 tandem::sdk::FinishReasonName(s.finish_reason))
              << prompt->text << text_of(s) << "\n";
  }
  std::cout << std::flush;
  std::fprintf(stderr, "[%lld prompt tokens, %lld generated; %.1f ms]\n", static_cast<long long>(u.prompt_tokens),
               static_cast<long long>(u.generated_tokens), u.total_ms);
  return 0;
}

int RunInfo() {
  auto connected = ConnectToServer();
  if (!connected.ok()) return Fail(connected.status());
  Client& client = **connected;
  auto info = client.Info(Call());
  if (!info.ok()) return Fail(info.status());
  const tandem::sdk::ModelInfo& m = *info;
  const nlohmann::json j = {{"model_dir", m.model_dir},
                            {"architecture", m.architecture},
                            {"vocab_size", m.vocab_size},
                            {"hidden_size", m.hidden_size},
                            {"intermediate_size", m.intermediate_size},
                            {"num_layers", m.num_layers},
                            {"num_experts", m.num_experts},
                            {"experts_per_token", m.experts_per_token},
                            {"max_context", m.max_context},
                            {"parameters", m.parameters},
                            {"expert_bytes", m.expert_bytes},
                            {"fingerprint", m.fingerprint},
                            {"has_tokenizer", m.has_tokenizer},
                            {"bos_id", m.bos_id},
                            {"eos_ids", m.eos_ids},
                            {"placement_summary", m.placement_summary},
                            {"max_sequences", m.max_sequences},
                            {"kv_cache_tokens", m.kv_cache_tokens}};
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Dump(j) << "\n";
  } else {
    for (const auto& [key, value] : j.items()) {
      std::cout << key << ": " << (value.is_string() ? value.get<std::string>() : Dump(value)) << "\n";
    }
  }
  return 0;
}

int RunStats() {
  auto connected = ConnectToServer();
  if (!connected.ok()) return Fail(connected.status());
  Client& client = **connected;
  auto stats = client.Stats(Call());
  if (!stats.ok()) return Fail(stats.status());
  const tandem::sdk::ServerStats& s = *stats;
  nlohmann::json layers = nlohmann::json::array();
  for (const tandem::sdk::LayerTiming& l : s.layers) {
    layers.push_back({{"layer", l.layer},
                      {"attention_ms", l.attention_ms},
                      {"router_ms", l.router_ms},
                      {"experts_ms", l.experts_ms}});
  }
  nlohmann::json workers = nlohmann::json::array();
  for (const tandem::sdk::WorkerHealth& w : s.workers) {
    workers.push_back({{"address", w.address}, {"healthy", w.healthy}, {"detail", w.detail}});
  }
  nlohmann::json j = {{"uptime_s", s.uptime_s},
                      {"requests_total", s.requests_total},
                      {"requests_active", s.requests_active},
                      {"requests_waiting", s.requests_waiting},
                      {"requests_succeeded", s.requests_succeeded},
                      {"requests_failed", s.requests_failed},
                      {"requests_cancelled", s.requests_cancelled},
                      {"requests_rejected", s.requests_rejected},
                      {"prompt_tokens", s.prompt_tokens},
                      {"generated_tokens", s.generated_tokens},
                      {"steps", s.steps},
                      {"tokens_per_s", s.tokens_per_s},
                      {"window_s", s.window_s},
                      {"mean_step_ms", s.mean_step_ms},
                      {"mean_batch_rows", s.mean_batch_rows},
                      {"kv_blocks_in_use", s.kv_blocks_in_use},
                      {"kv_blocks_total", s.kv_blocks_total},
                      {"kv_block_size", s.kv_block_size},
                      {"active_sequences", s.active_sequences},
                      {"cpu", s.cpu},
                      {"cpu_flags", s.cpu_flags},
                      {"isa", s.isa},
                      {"kernel_plan", s.kernel_plan},
                      {"kernels", s.kernels},
                      {"layers", layers},
                      {"workers", workers}};
  // The orchestrator's figures are JSON already: nest them, not a string.
  if (!s.orchestrator_json.empty()) {
    j["orchestrator"] = nlohmann::json::parse(s.orchestrator_json, nullptr, /*allow_exceptions=*/false);
    if (j["orchestrator"].is_discarded()) j["orchestrator"] = s.orchestrator_json;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Dump(j) << "\n";
    return 0;
  }
  for (const auto& [key, value] : j.items()) {
    if (key == "layers" || key == "workers" || key == "orchestrator") continue;
    std::cout << key << ": " << Dump(value) << "\n";
  }
  if (!s.layers.empty()) std::cout << "layer  attention_ms  router_ms  experts_ms\n";
  for (const tandem::sdk::LayerTiming& l : s.layers) {
    std::cout << absl::StrFormat("%5d  %12.3f  %9.3f  %10.3f\n", l.layer, l.attention_ms, l.router_ms, l.experts_ms);
  }
  for (const tandem::sdk::WorkerHealth& w : s.workers) {
    std::cout << "worker " << w.address << ": " << (w.healthy ? "healthy" : "UNHEALTHY")
              << (w.detail.empty() ? "" : " (" + w.detail + ")") << "\n";
  }
  if (j.contains("orchestrator")) std::cout << "orchestrator: " << Dump(j["orchestrator"]) << "\n";
  return 0;
}

int RunTokenize() {
  const std::string text = absl::GetFlag(FLAGS_prompt);
  if (text.empty()) return UsageError("tokenize needs --prompt");
  auto connected = ConnectToServer();
  if (!connected.ok()) return Fail(connected.status());
  Client& client = **connected;
  auto result = client.Tokenize(text, absl::GetFlag(FLAGS_add_bos), Call());
  if (!result.ok()) return Fail(result.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Dump({{"ids", result->ids}, {"pieces", result->pieces}}) << "\n";
  } else {
    std::cout << absl::StrJoin(result->ids, ",") << "\n";
  }
  return 0;
}

int RunDetokenize() {
  auto ids = ParseIds(absl::GetFlag(FLAGS_prompt_ids), "prompt_ids");
  if (!ids.ok()) return UsageError(std::string(ids.status().message()));
  if (ids->empty()) return UsageError("detokenize needs --prompt_ids");
  auto connected = ConnectToServer();
  if (!connected.ok()) return Fail(connected.status());
  Client& client = **connected;
  auto text = client.Detokenize(*ids, Call());
  if (!text.ok()) return Fail(text.status());
  if (absl::GetFlag(FLAGS_json)) {
    std::cout << Dump({{"text", *text}}) << "\n";
  } else {
    std::cout << *text << "\n";
  }
  return 0;
}

// The flags each subcommand accepts (besides --server, --connect_timeout_s,
// --timeout_s and --json); anything else given is a mistake worth reporting.
const std::set<std::string>& FlagsOf(const std::string& command) {
  static const std::set<std::string> kNone;
  static const std::set<std::string> kGenerate = {"prompt",   "prompt_ids", "add_bos",     "n",     "max_tokens",
                                                  "stop_ids", "ignore_eos", "temperature", "top_k", "top_p",
                                                  "seed",     "stop",       "logprobs",    "logit_bias"};
  static const std::set<std::string> kBeam = {"prompt",
                                              "prompt_ids",
                                              "add_bos",
                                              "n",
                                              "max_tokens",
                                              "stop_ids",
                                              "ignore_eos",
                                              "beam_width",
                                              "length_penalty",
                                              "early_stopping",
                                              "num_return_sequences",
                                              "progress",
                                              "logit_bias"};
  static const std::set<std::string> kTokenize = {"prompt", "add_bos"};
  static const std::set<std::string> kDetokenize = {"prompt_ids"};
  if (command == "generate") return kGenerate;
  if (command == "beam") return kBeam;
  if (command == "tokenize") return kTokenize;
  if (command == "detokenize") return kDetokenize;
  return kNone;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage(kUsage);
  const GivenFlags given = ScanFlags(argc, argv);
  std::vector<char*> positional = tandem::ParseProgramFlags(argc, argv);
  if (positional.size() < 2) return UsageError("give a command: generate, beam, info, stats, tokenize or detokenize");
  const std::string command = positional[1];
  static const std::set<std::string> kCommands = {"generate", "beam", "info", "stats", "tokenize", "detokenize"};
  if (!kCommands.contains(command)) {
    return UsageError(absl::StrCat("unknown command \"", command,
                                   "\" (expected generate, beam, info, stats, tokenize or detokenize)"));
  }
  if (positional.size() > 2) return UsageError(absl::StrCat("unexpected argument \"", positional[2], "\""));
  if (!(absl::GetFlag(FLAGS_connect_timeout_s) > 0)) return UsageError("--connect_timeout_s must be > 0");
  // 0 is the SDK's default; below 0 (or NaN) is a mistake, not a default.
  if (!(absl::GetFlag(FLAGS_timeout_s) >= 0)) return UsageError("--timeout_s must be >= 0 (0: the SDK's default)");
  static const std::set<std::string> kCommon = {"server", "connect_timeout_s", "timeout_s", "json"};
  for (const std::string& given_name : given.names) {
    // A known flag that this command would ignore is a mistake worth
    // reporting (absl has already rejected unknown names). --noflag names
    // the boolean flag.
    std::string name = given_name;
    bool known = false;
    for (const std::string& candidate : {given_name, absl::StartsWith(given_name, "no") ? given_name.substr(2) : ""}) {
      for (const char* c : {"generate", "beam", "tokenize", "detokenize"}) {
        if (!known && FlagsOf(c).contains(candidate)) known = true, name = candidate;
      }
    }
    if (known && !kCommon.contains(name) && !FlagsOf(command).contains(name)) {
      return UsageError(absl::StrCat("--", name, " does not apply to '", command, "'"));
    }
  }

  if (command == "generate") return RunGenerate(given);
  if (command == "beam") return RunBeam();
  if (command == "info") return RunInfo();
  if (command == "stats") return RunStats();
  if (command == "tokenize") return RunTokenize();
  return RunDetokenize();
}
