// The prompt cache's time to first token: a prompt of --prefix_tokens shared
// tokens (a system prompt, a document, a conversation so far) plus
// --suffix_tokens of its own, sent cold (nothing cached) and then warm (the
// same prefix, another suffix), through the scheduler tandem-server runs.
// Each round uses a new prefix, so its cold run is cold. The warm prompts are
// then run again with the cache off, and the tokens must be the same.
// Prints one JSON line per round and a summary.
//
//   tandem-prompt-cache-bench --preset demo --prefix_tokens 1000 --rounds 5
//   tandem-prompt-cache-bench --preset mixtral-8x7b:2 --prefix_tokens 1000 --rounds 3
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/json_lines.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/sample_stats.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/runtime/local_runtime.h"

ABSL_FLAG(std::string, preset, "demo", "synthetic model generated in memory, preset[:layers]");
ABSL_FLAG(int32_t, prefix_tokens, 1000, "shared prompt prefix");
ABSL_FLAG(int32_t, suffix_tokens, 24, "each prompt's own tokens after the prefix");
ABSL_FLAG(int32_t, output_tokens, 8, "tokens generated per request (greedy)");
ABSL_FLAG(int32_t, rounds, 5, "prefixes, each sent cold then warm");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = all available cores");

namespace {

using nlohmann::json;

std::vector<int32_t> Tokens(int n, int64_t vocab, int salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) {
    ids.push_back(static_cast<int32_t>(3 + (static_cast<int64_t>(i) * 7919 + salt * 104729) % (vocab - 3)));
  }
  return ids;
}

struct Result {
  std::vector<int32_t> ids;
  tandem::RequestUsage usage;
};

absl::StatusOr<Result> Generate(tandem::Scheduler& scheduler, std::vector<int32_t> prompt, int max_tokens) {
  tandem::GenerateParams params;
  params.request.prompt_ids = std::move(prompt);
  params.request.max_tokens = max_tokens;
  params.request.ignore_eos = true;
  absl::StatusOr<std::shared_ptr<tandem::RequestStream>> stream = scheduler.SubmitGenerate(std::move(params));
  if (!stream.ok()) return stream.status();
  Result result;
  while (true) {
    std::optional<tandem::StreamEvent> event = (*stream)->Next(absl::Minutes(10));
    if (!event) return absl::DeadlineExceededError("no event within 10 minutes");
    for (const tandem::GeneratedToken& t : event->tokens) result.ids.push_back(t.id);
    if (event->done) {
      if (!event->status.ok()) return event->status;
      result.usage = event->usage;
      return result;
    }
  }
}

absl::StatusOr<std::unique_ptr<tandem::Scheduler>> MakeScheduler(tandem::LocalRuntime& runtime, bool prompt_cache,
                                                                  int64_t max_batch_tokens) {
  tandem::SchedulerOptions options;
  options.prompt_cache = prompt_cache;
  options.max_batch_tokens = max_batch_tokens;
  return tandem::Scheduler::Create(&runtime.model(), &runtime.engine(), &runtime.kv_pool(), options);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tandem-prompt-cache-bench: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage("Time to first token with and without a cached prompt prefix.");
  tandem::ParseProgramFlags(argc, argv);
  tandem::SetMinLogLevel(tandem::LogLevel::kWarning);
  absl::StatusOr<tandem::SyntheticModelSpec> parsed = tandem::ParseSyntheticPreset(absl::GetFlag(FLAGS_preset), 1);
  if (!parsed.ok()) return Fail(parsed.status());
  tandem::SyntheticModelSpec spec = *parsed;
  const int prefix = absl::GetFlag(FLAGS_prefix_tokens), suffix = absl::GetFlag(FLAGS_suffix_tokens);
  const int output = absl::GetFlag(FLAGS_output_tokens), rounds = absl::GetFlag(FLAGS_rounds);
  if (prefix < 1 || suffix < 1 || output < 1 || rounds < 1) {
    return Fail(absl::InvalidArgumentError("--prefix_tokens, --suffix_tokens, --output_tokens, --rounds must be >= 1"));
  }
  auto model = tandem::LoadSyntheticModel(spec, /*num_threads=*/2);
  if (!model.ok()) return Fail(model.status());
  tandem::LocalRuntimeOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  // Every round's prefix stays cached: the warm runs measure hits, not evictions.
  options.kv_cache_tokens = static_cast<int64_t>(rounds + 2) * (prefix + 2 * suffix + output + 64);
  auto runtime = tandem::LocalRuntime::Create(std::move(*model), options);
  if (!runtime.ok()) return Fail(runtime.status());
  const int64_t vocab = (*runtime)->model().config.vocab_size;
  // tandem-server's default: a cold 1k-token prompt prefills in 4 steps.
  const int64_t batch = 256;
  const json base = {{"bench", "prompt_cache"},
                     {"preset", absl::GetFlag(FLAGS_preset)},
                     {"threads", (*runtime)->pool().num_threads()},
                     {"prefix_tokens", prefix},
                     {"suffix_tokens", suffix},
                     {"output_tokens", output},
                     {"max_batch_tokens", batch},
                     {"command", absl::StrCat("tandem-prompt-cache-bench --preset ", absl::GetFlag(FLAGS_preset),
                                              " --prefix_tokens ", prefix, " --suffix_tokens ", suffix, " --rounds ",
                                              rounds)}};

  std::vector<std::vector<int32_t>> warm_prompts;
  std::vector<std::vector<int32_t>> warm_ids;
  std::vector<double> speedups;
  {
    absl::StatusOr<std::unique_ptr<tandem::Scheduler>> scheduler = MakeScheduler(**runtime, true, batch);
    if (!scheduler.ok()) return Fail(scheduler.status());
    // Warm-up: first touch of the weights and KV blocks, on a prefix of its own.
    if (auto warm = Generate(**scheduler, Tokens(prefix + suffix, vocab, 999), output); !warm.ok()) {
      return Fail(warm.status());
    }
    for (int round = 0; round < rounds; ++round) {
      const std::vector<int32_t> shared = Tokens(prefix, vocab, round);
      std::vector<int32_t> cold_prompt = shared, warm_prompt = shared;
      const std::vector<int32_t> a = Tokens(suffix, vocab, 5000 + round), b = Tokens(suffix, vocab, 7000 + round);
      cold_prompt.insert(cold_prompt.end(), a.begin(), a.end());
      warm_prompt.insert(warm_prompt.end(), b.begin(), b.end());
      absl::StatusOr<Result> cold = Generate(**scheduler, cold_prompt, output);
      if (!cold.ok()) return Fail(cold.status());
      absl::StatusOr<Result> warm = Generate(**scheduler, warm_prompt, output);
      if (!warm.ok()) return Fail(warm.status());
      const double speedup = cold->usage.time_to_first_token_ms / warm->usage.time_to_first_token_ms;
      speedups.push_back(speedup);
      json line = base;
      line["round"] = round;
      line["ttft_cold_ms"] = cold->usage.time_to_first_token_ms;
      line["ttft_warm_ms"] = warm->usage.time_to_first_token_ms;
      line["cached_prompt_tokens"] = warm->usage.cached_prompt_tokens;
      line["ttft_speedup"] = speedup;
      tandem::EmitJsonLine(line);
      warm_prompts.push_back(warm_prompt);
      warm_ids.push_back(warm->ids);
    }
  }
  // The same warm prompts with the cache off: the tokens must not change.
  absl::StatusOr<std::unique_ptr<tandem::Scheduler>> plain = MakeScheduler(**runtime, false, batch);
  if (!plain.ok()) return Fail(plain.status());
  int same = 0;
  for (size_t i = 0; i < warm_prompts.size(); ++i) {
    absl::StatusOr<Result> uncached = Generate(**plain, warm_prompts[i], output);
    if (!uncached.ok()) return Fail(uncached.status());
    same += uncached->ids == warm_ids[i] ? 1 : 0;
  }
  json summary = base;
  summary["summary"] = true;
  summary["rounds"] = rounds;
  summary["ttft_speedup_min"] = *std::min_element(speedups.begin(), speedups.end());
  summary["ttft_speedup_median"] = tandem::Percentile(speedups, 0.5);
  summary["same_tokens_as_uncached"] = absl::StrCat(same, "/", warm_prompts.size());
  tandem::EmitJsonLine(summary);
  return same == static_cast<int>(warm_prompts.size()) ? 0 : 1;
}
