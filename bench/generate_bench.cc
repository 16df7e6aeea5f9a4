// Prefill and decode throughput of whole models on the CPU, one sequence.
// Prints JSON lines: the machine's triad bandwidth, then per model the
// prefill and decode tokens/s, and the weight bytes a decode step touches per
// second next to the triad bandwidth (decode is bandwidth-bound).
//
//   tandem-generate-bench --presets tiny,demo,mixtral-8x7b:2 --prompt_tokens 128 --decode_tokens 32
//   tandem-generate-bench --model_dir models/demo
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/base/flags_usage.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/json_lines.h"
#include "runtime/local_runtime.h"
#include "common/platform/hardware_probe.h"
#include "common/base/log.h"

ABSL_FLAG(std::string, presets, "tiny,demo,mixtral-8x7b:2",
          "synthetic models generated in memory, preset[:layers], comma-separated");
ABSL_FLAG(std::string, model_dir, "", "benchmark this model folder instead of presets");
ABSL_FLAG(int32_t, prompt_tokens, 128, "prefill length");
ABSL_FLAG(int32_t, decode_tokens, 32, "decode steps timed");
ABSL_FLAG(int32_t, reps, 3, "repetitions; the best is reported");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = all available cores");

namespace {

using nlohmann::json;

// Weight bytes one decode token reads: every dense matrix plus, per layer,
// the K experts it is routed to (the embedding reads one row: ignored).
double DecodeBytesPerToken(const tandem::ModelWeights& w) {
  const auto& c = w.config;
  const double per_expert = static_cast<double>(w.expert_bytes) / (c.num_hidden_layers * c.num_local_experts);
  const double dense = static_cast<double>(w.total_bytes - w.expert_bytes - w.embed_tokens.size_bytes);
  return dense + static_cast<double>(c.num_hidden_layers * c.num_experts_per_tok) * per_expert;
}

absl::Status BenchModel(std::unique_ptr<tandem::Model> model, const std::string& name, double triad_gb_s) {
  tandem::LocalRuntimeOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  const int prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  options.kv_cache_tokens = prompt_tokens + decode_tokens + 16;
  auto runtime = tandem::LocalRuntime::Create(std::move(model), options);
  if (!runtime.ok()) return runtime.status();
  tandem::LocalRuntime& rt = **runtime;
  const tandem::ModelConfig& c = rt.model().config;

  tandem::GenerationRequest request;
  for (int i = 0; i < prompt_tokens; ++i) request.prompt_ids.push_back(static_cast<int32_t>(3 + (i * 7919) % (c.vocab_size - 3)));
  request.max_tokens = decode_tokens + 1;  // the first token comes from prefill
  request.ignore_eos = true;
  double best_prefill = 0, best_decode = 0;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
    auto result = rt.generator().Generate(request);
    if (!result.ok()) return result.status();
    best_prefill = std::max(best_prefill, result->timing.prefill_tokens_per_s);
    best_decode = std::max(best_decode, result->timing.decode_tokens_per_s);
  }
  const double bytes = DecodeBytesPerToken(*rt.model().weights);
  const double decode_gb_s = bytes * best_decode / 1e9;
  tandem::EmitJsonLine({{"bench", "generate"},
        {"model", name},
        {"architecture", c.architecture_name},
        {"layers", c.num_hidden_layers},
        {"hidden_size", c.hidden_size},
        {"weight_bytes", rt.model().weights->total_bytes},
        {"threads", rt.pool().num_threads()},
        {"prompt_tokens", prompt_tokens},
        {"decode_tokens", decode_tokens},
        {"prefill_tokens_per_s", best_prefill},
        {"decode_tokens_per_s", best_decode},
        {"decode_weight_bytes_per_token", bytes},
        {"decode_weight_gb_s", decode_gb_s},
        {"decode_fraction_of_triad", triad_gb_s > 0 ? decode_gb_s / triad_gb_s : 0.0}});
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage("Prefill and decode throughput of whole models on the CPU, one sequence.");
  absl::ParseCommandLine(argc, argv);
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : tandem::AvailableCores();
  double triad = 0;
  {
    tandem::ThreadPool pool({.num_threads = threads, .name = "probe"});
    auto bw = tandem::MeasureMemoryBandwidth(&pool);
    if (bw.ok()) {
      triad = bw->triad_gb_s;
      tandem::EmitJsonLine({{"bench", "machine"}, {"threads", threads}, {"triad_gb_s", bw->triad_gb_s},
            {"triad_with_write_allocate_gb_s", bw->triad_with_write_allocate_gb_s}});
    }
  }
  int failures = 0;
  auto report = [&](const absl::Status& s, const std::string& name) {
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(s.message()).c_str());
      ++failures;
    }
  };
  if (!absl::GetFlag(FLAGS_model_dir).empty()) {
    auto model = tandem::LoadModel(absl::GetFlag(FLAGS_model_dir));
    if (!model.ok()) return report(model.status(), absl::GetFlag(FLAGS_model_dir)), 1;
    report(BenchModel(std::move(*model), absl::GetFlag(FLAGS_model_dir), triad), absl::GetFlag(FLAGS_model_dir));
    return failures ? 1 : 0;
  }
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    tandem::SyntheticModelSpec spec{.preset = parts[0]};
    if (parts.size() > 1 && !absl::SimpleAtoi(parts[1], &spec.num_layers)) {
      report(absl::InvalidArgumentError("--presets: layers must be an integer"), std::string(item));
      continue;
    }
    auto model = tandem::LoadSyntheticModel(spec, threads);
    if (!model.ok()) {
      report(model.status(), std::string(item));
      continue;
    }
    report(BenchModel(std::move(*model), std::string(item), triad), std::string(item));
  }
  return failures ? 1 : 0;
}
