// tandem-generate: run a model in this process and generate from a prompt.
//   tandem-generate --model DIR --prompt "text" -n 32 [--temperature 0.8 --top_k 40 --top_p 0.95 --seed 1]
//   tandem-generate --model DIR --prompt_ids 1,2,3 -n 8 --logprobs 5 --json
// With --synthetic, the model is generated in memory instead (the weights and
// tokenizer tandem-make-model --preset PRESET --layers L --seed N writes):
//   tandem-generate --synthetic tiny:2 --synthetic_seed 7 --prompt "Once upon a time" -n 16
// With --workers, the experts run in tandem-cpu-worker processes (one per
// NUMA node, started separately on the same model) instead of this process:
//   tandem-generate --model DIR --workers unix:/run/tandem/w0.sock,unix:/run/tandem/w1.sock --transport shm ...
// With --execution_policy, the experts go through the orchestrator (planner,
// cost model, cache and placement policies) over the no-GPU host expert pool:
//   tandem-generate --model DIR --execution_policy makespan --cache_policy lru --gpu_slots 8 ...
// --precalc daop [--precalc_start_layer N] turns on DAOP's one-layer-ahead
// expert pre-calculation: LOSSY (it changes the outputs), off by default.
// --record_trace / --record_usage write the routing (for tandem-sim) and the
// expert usage (for --placement popularity --usage_profile FILE).
#include <malloc.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/parse_ids.h"
#include "common/base/status_macros.h"
#include "common/model/model_fingerprint.h"
#include "coordinator/generation/utf8_stream.h"
#include "coordinator/orchestration/remote_expert_executor.h"
#include "coordinator/runtime/local_runtime.h"
#include "coordinator/runtime/runtime_flags.h"

ABSL_FLAG(std::string, prompt, "", "prompt text (needs the model's tokenizer.model)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids, e.g. 1,2,3");
ABSL_FLAG(int32_t, n, 32, "maximum number of tokens to generate");
ABSL_FLAG(float, temperature, 0.0f, "sampling temperature; 0 = greedy");
ABSL_FLAG(int32_t, top_k, 0, "sample among the k most likely tokens; 0 = all");
ABSL_FLAG(float, top_p, 1.0f, "nucleus sampling mass in (0, 1]");
ABSL_FLAG(uint64_t, seed, 0, "random seed for sampling");
ABSL_FLAG(std::string, stop_ids, "", "comma-separated token ids that end generation");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past the end-of-sequence token");
ABSL_FLAG(bool, add_bos, true, "prepend the BOS token to a text prompt");
ABSL_FLAG(int32_t, logprobs, 0, "report the top-K log probabilities at each generated position");
ABSL_FLAG(bool, json, false, "print one JSON object instead of streaming text");
// --model, --synthetic and --synthetic_seed are runtime_flags.cc's (tandem-server's too).

namespace {

using tandem::GeneratedToken;
using tandem::GenerationResult;
using tandem::ParseIds;

nlohmann::json ToJson(const GenerationResult& r, const tandem::Model& model) {
  nlohmann::json tokens = nlohmann::json::array();
  std::vector<int32_t> ids;
  for (const GeneratedToken& t : r.tokens) {
    nlohmann::json lp = nlohmann::json::array();
    for (const auto& [id, logprob] : t.top_logprobs) lp.push_back({id, logprob});
    tokens.push_back({{"id", t.id}, {"text", t.text}, {"logprob", t.logprob}, {"logprobs", lp}});
    ids.push_back(t.id);
  }
  const auto& tm = r.timing;
  nlohmann::json out = {{"prompt_ids", r.prompt_ids},
                        {"tokens", tokens},
                        {"finish_reason", std::string(tandem::FinishReasonName(r.finish_reason))},
                        {"timing",
                         {{"prompt_tokens", tm.prompt_tokens},
                          {"generated_tokens", tm.generated_tokens},
                          {"prefill_ms", tm.prefill_ms},
                          {"time_to_first_token_ms", tm.time_to_first_token_ms},
                          {"decode_ms", tm.decode_ms},
                          {"total_ms", tm.total_ms},
                          {"prefill_tokens_per_s", tm.prefill_tokens_per_s},
                          {"decode_tokens_per_s", tm.decode_tokens_per_s}}}};
  if (model.tokenizer) {
    auto text = model.tokenizer->Decode(ids);
    if (text.ok()) out["text"] = *text;
  }
  return out;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tandem-generate: %s\n", std::string(status.message()).c_str());
  return 1;
}

// The prompt (--prompt encoded, or --prompt_ids), the stop ids and the
// sampling the flags ask for.
absl::StatusOr<tandem::GenerationRequest> RequestFromFlags(const tandem::Model& model, bool has_text) {
  tandem::GenerationRequest request;
  if (has_text) {
    TANDEM_ASSIGN_OR_RETURN(const tandem::Tokenizer* tokenizer, model.RequireTokenizer());
    TANDEM_ASSIGN_OR_RETURN(request.prompt_ids,
                            tokenizer->Encode(absl::GetFlag(FLAGS_prompt), absl::GetFlag(FLAGS_add_bos)));
  } else {
    TANDEM_ASSIGN_OR_RETURN(request.prompt_ids, ParseIds(absl::GetFlag(FLAGS_prompt_ids), "prompt_ids"));
  }
  TANDEM_ASSIGN_OR_RETURN(request.stop_ids, ParseIds(absl::GetFlag(FLAGS_stop_ids), "stop_ids"));
  request.max_tokens = absl::GetFlag(FLAGS_n);
  request.sampling = {.temperature = absl::GetFlag(FLAGS_temperature),
                      .top_k = absl::GetFlag(FLAGS_top_k),
                      .top_p = absl::GetFlag(FLAGS_top_p),
                      .seed = absl::GetFlag(FLAGS_seed)};
  request.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  request.logprobs = absl::GetFlag(FLAGS_logprobs);
  return request;
}

// Generates, streaming the text (or ids) to stdout unless --json.
absl::StatusOr<GenerationResult> GenerateStreaming(tandem::LocalRuntime& runtime,
                                                   const tandem::GenerationRequest& request, bool json, bool has_text) {
  const tandem::Model& model = runtime.model();
  if (!json && has_text) {
    std::cout << absl::GetFlag(FLAGS_prompt) << std::flush;
  }
  // Byte-fallback pieces can split a character: print whole characters only.
  tandem::Utf8Stream utf8;
  auto result = runtime.generator().Generate(request, [&](const GeneratedToken& token) {
    if (json) return;
    if (model.tokenizer) {
      std::cout << utf8.Push(token.text) << std::flush;
    } else {
      std::cout << token.id << ' ' << std::flush;
    }
  });
  if (!result.ok()) return result.status();
  if (!json) std::cout << utf8.Flush();
  return result;
}

// The orchestrator's and precalc's summaries (unless --json) and each
// worker's, on stderr.
void PrintRuntimeStats(tandem::LocalRuntime& runtime, const tandem::RemoteExpertExecutor* remote, bool json) {
  tandem::Orchestrator* orchestrator = runtime.orchestrator();
  if (orchestrator != nullptr && !json) {
    const tandem::OrchestratorStats s = orchestrator->stats();
    std::fprintf(stderr,
                 "[orchestrator (%s, %s/%s/%s): %lld expert runs, %lld GPU hits (%.0f%%), %lld in-flight waits, "
                 "%lld planner copies, %lld CPU runs, %lld cache copies, %lld admissions; makespan error %.0f%% "
                 "(last %d layers); pool copied %.1f MB at %.2f GB/s]\n",
                 s.pool_kind.c_str(), s.execution_policy.c_str(), s.cache_policy.c_str(), s.placement.c_str(),
                 static_cast<long long>(s.total.expert_runs), static_cast<long long>(s.total.gpu_hits),
                 s.total.expert_runs > 0 ? 100.0 * s.total.gpu_hits / s.total.expert_runs : 0.0,
                 static_cast<long long>(s.total.inflight_waits), static_cast<long long>(s.total.planner_migrations),
                 static_cast<long long>(s.total.cpu_runs), static_cast<long long>(s.total.cache_migrations),
                 static_cast<long long>(s.total.cache_admissions), s.accuracy.makespan.mape_percent,
                 s.accuracy.makespan.window, s.pool.bytes_copied / 1e6, s.pool.MigrationGbPerSecond());
  }
  const tandem::PrecalcStats precalc = runtime.precalc_stats();
  if (precalc.policy != "off" && !json) {
    std::fprintf(stderr,
                 "[precalc daop (LOSSY) from layer %d: %lld predictions, %.0f%% correct, %lld experts pre-computed "
                 "(%lld rows), %lld degradations]\n",
                 precalc.start_layer, static_cast<long long>(precalc.predictions), 100.0 * precalc.accuracy(),
                 static_cast<long long>(precalc.precomputed_experts), static_cast<long long>(precalc.precomputed_rows),
                 static_cast<long long>(precalc.degradations));
  }
  if (remote) {
    for (const tandem::RemoteWorkerStats& w : remote->stats()) {
      std::fprintf(stderr,
                   "[worker %s (%s): %lld calls, %lld rows, mean round trip %.1f us (worker compute %.1f us)]\n",
                   w.address.c_str(), w.transport.c_str(), static_cast<long long>(w.calls),
                   static_cast<long long>(w.rows), w.calls > 0 ? w.round_trip_us / static_cast<double>(w.calls) : 0.0,
                   w.calls > 0 ? w.worker_compute_us / static_cast<double>(w.calls) : 0.0);
    }
  }
}

// --json: one object with the stats; else the end of the text and a
// timing line on stderr.
void PrintResult(const GenerationResult& result, tandem::LocalRuntime& runtime, bool json) {
  if (json) {
    nlohmann::json out = ToJson(result, runtime.model());
    tandem::Orchestrator* orchestrator = runtime.orchestrator();
    if (orchestrator != nullptr) out["orchestrator"] = nlohmann::json::parse(orchestrator->stats().ToJson());
    const tandem::PrecalcStats precalc = runtime.precalc_stats();
    if (precalc.policy != "off") out["precalc"] = nlohmann::json::parse(precalc.ToJson());
    std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    const auto& tm = result.timing;
    std::cout << std::endl;  // flushed before the stats line on stderr
    std::fprintf(stderr, "[%lld prompt tokens, %lld generated (%s); prefill %.1f ms (%.1f tok/s), decode %.1f tok/s]\n",
                 static_cast<long long>(tm.prompt_tokens), static_cast<long long>(tm.generated_tokens),
                 std::string(tandem::FinishReasonName(result.finish_reason)).c_str(), tm.prefill_ms,
                 tm.prefill_tokens_per_s, tm.decode_tokens_per_s);
  }
}

// --help: the model, the prompt and sampling first, then the runtime's groups.
std::vector<tandem::FlagGroup> GenerateFlagGroups() {
  std::vector<tandem::FlagGroup> groups = {
      {"Model", tandem::RuntimeModelFlags()},
      {"Prompt and output", {"prompt", "prompt_ids", "add_bos", "n", "stop_ids", "ignore_eos", "logprobs", "json"}},
      {"Sampling", {"temperature", "top_k", "top_p", "seed"}},
  };
  for (tandem::FlagGroup& group : tandem::RuntimeFlagGroups()) groups.push_back(std::move(group));
  return groups;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "Generate text with a MoE model in this process.\n"
      "  tandem-generate --model DIR --prompt \"Once upon a time\" -n 32\n"
      "  tandem-generate --synthetic tiny:2 --synthetic_seed 7 --prompt \"Once upon a time\" -n 32",
      GenerateFlagGroups());
  tandem::ParseProgramFlags(argc, argv);
  // Flag errors before any loading (a full synthetic model takes a while).
  if (auto source = tandem::ModelSourceFromFlags(); !source.ok()) return Fail(source.status());
  const bool has_text = !absl::GetFlag(FLAGS_prompt).empty();
  const bool has_ids = !absl::GetFlag(FLAGS_prompt_ids).empty();
  if (has_text == has_ids) return Fail(absl::InvalidArgumentError("give exactly one of --prompt or --prompt_ids"));

  auto opened = tandem::OpenRuntimeFromFlags({});
  if (!opened.ok()) return Fail(opened.status());
  tandem::LocalRuntime& runtime = *opened->runtime;
  auto request = RequestFromFlags(runtime.model(), has_text);
  if (!request.ok()) return Fail(request.status());
  const bool json = absl::GetFlag(FLAGS_json);
  auto result = GenerateStreaming(runtime, *request, json, has_text);
  if (!result.ok()) return Fail(result.status());
  if (absl::Status recorded = runtime.FinishRecording(); !recorded.ok()) return Fail(recorded);
  PrintRuntimeStats(runtime, opened->remote.get(), json);
  PrintResult(*result, runtime, json);
  return 0;
}
