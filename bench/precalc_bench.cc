// tandem-precalc-bench: what DAOP pre-calculation (lossy, coordinator/precalc.h)
// does to a model's outputs. Per preset and pool size, teacher-forced on the
// exact greedy continuation of each prompt: the fraction of positions whose
// greedy token agrees with the exact one, the drift of the exact token's
// logprob (mean and max |Δ|), and the prediction accuracy. One JSON line per
// (preset, pool). Pools: "none" (no orchestrator: every expert is a CPU
// expert), then the no-GPU host pool with the given fractions of all experts
// resident (uniform placement, cpu-only execution, static cache: residency
// stays the placement).
//   tandem-precalc-bench --presets tiny,demo --prompts 4 --tokens 32 --start_layer 1
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/json_lines.h"
#include "common/base/flags_usage.h"
#include "common/base/status_macros.h"
#include "common/model/model.h"
#include "coordinator/runtime/local_runtime.h"

ABSL_FLAG(std::string, presets, "tiny,demo", "synthetic presets");
ABSL_FLAG(int32_t, prompts, 4, "prompts per preset");
ABSL_FLAG(int32_t, prompt_tokens, 16, "tokens per prompt (random ids from a fixed seed)");
ABSL_FLAG(int32_t, tokens, 32, "greedy tokens per prompt");
ABSL_FLAG(int32_t, start_layer, 1, "precalc_start_layer");
ABSL_FLAG(std::string, pool_fractions, "0,0.5,0.75,1", "resident fraction of all experts per pool run");
ABSL_FLAG(int32_t, threads, 2, "compute threads");
ABSL_FLAG(uint64_t, seed, 7, "model seed");

namespace tandem {
namespace {

std::vector<int32_t> PromptTokens(int n, int64_t vocab, uint32_t seed) {
  std::vector<int32_t> t;
  uint64_t x = 0x9e3779b97f4a7c15ull * (seed + 1);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    t.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(vocab)));
  }
  return t;
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double LogProb(const std::vector<float>& logits, int32_t token) {
  const double m = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - m);
  return static_cast<double>(logits[static_cast<size_t>(token)]) - m - std::log(sum);
}

// slots < 0: no orchestrator.
absl::StatusOr<std::unique_ptr<LocalRuntime>> MakeRuntime(const std::string& preset, int slots, bool daop) {
  TANDEM_ASSIGN_OR_RETURN(auto model, LoadSyntheticModel(SyntheticModelSpec{
                                          .preset = preset, .seed = absl::GetFlag(FLAGS_seed), .dtype = DType::kBF16}));
  LocalRuntimeOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  if (daop) options.precalc = {.policy = PrecalcPolicy::kDaop, .start_layer = absl::GetFlag(FLAGS_start_layer)};
  if (slots >= 0) {
    options.orchestrator.enabled = true;
    options.orchestrator.execution = ExecutionPolicy::kCpuOnly;
    options.orchestrator.cache = CachePolicyKind::kStatic;
    options.orchestrator.gpu_slots = slots;
    CostModelParams p;  // unused by cpu-only + static; given so nothing is calibrated
    p.expert_bytes = 3 * model->config.hidden_size * model->config.intermediate_size * 2;
    p.activation_row_bytes = model->config.hidden_size * 4;
    p.transports.push_back({"local", TransferCost{}});
    p.cpu_workers.push_back({RooflineCurve{40, 0, 10}, 0});
    p.gpu = RooflineCurve{10, 0, 0.5};
    p.migrate = TransferCost{30, 0};
    options.orchestrator.cost = p;
  }
  return LocalRuntime::Create(std::move(model), options);
}

absl::Status RunPreset(const std::string& preset) {
  TANDEM_ASSIGN_OR_RETURN(auto exact, MakeRuntime(preset, -1, false));
  const ModelConfig& config = exact->model().config;
  const int total_experts = static_cast<int>(config.num_hidden_layers * config.num_local_experts);
  std::vector<int> pools = {-1};
  for (absl::string_view f : absl::StrSplit(absl::GetFlag(FLAGS_pool_fractions), ',', absl::SkipEmpty())) {
    double v = 0;
    if (absl::SimpleAtod(f, &v)) pools.push_back(static_cast<int>(std::lround(v * total_experts)));
  }
  // The exact greedy continuations and their logits.
  const int num_prompts = absl::GetFlag(FLAGS_prompts), num_tokens = absl::GetFlag(FLAGS_tokens);
  std::vector<std::vector<int32_t>> prompts, continuations;
  std::vector<std::vector<std::vector<float>>> exact_logits;  // [prompt][position][V]
  for (int p = 0; p < num_prompts; ++p) {
    prompts.push_back(PromptTokens(absl::GetFlag(FLAGS_prompt_tokens), config.vocab_size, 1000 + p));
    SequenceKv kv(&exact->kv_pool());
    std::vector<float> logits;
    TANDEM_RETURN_IF_ERROR(exact->engine().Forward(std::vector<ForwardInput>{{&kv, prompts.back()}}, &logits));
    continuations.emplace_back();
    exact_logits.emplace_back();
    for (int i = 0; i < num_tokens; ++i) {
      const int32_t token = Argmax(logits);
      continuations.back().push_back(token);
      exact_logits.back().push_back(logits);
      if (i + 1 < num_tokens) {
        TANDEM_RETURN_IF_ERROR(
            exact->engine().Forward(std::vector<ForwardInput>{{&kv, std::span<const int32_t>(&token, 1)}}, &logits));
      }
    }
  }
  for (int slots : pools) {
    TANDEM_ASSIGN_OR_RETURN(auto daop, MakeRuntime(preset, slots, true));
    int64_t positions = 0, agree = 0, decode_positions = 0, decode_agree = 0;
    double drift_sum = 0, drift_max = 0;
    for (int p = 0; p < num_prompts; ++p) {
      SequenceKv kv(&daop->kv_pool());
      std::vector<float> logits;
      TANDEM_RETURN_IF_ERROR(daop->engine().Forward(std::vector<ForwardInput>{{&kv, prompts[p]}}, &logits));
      for (int i = 0; i < num_tokens; ++i) {
        const int32_t want = continuations[p][i];
        const bool same = Argmax(logits) == want;
        const double drift = std::abs(LogProb(logits, want) - LogProb(exact_logits[p][i], want));
        ++positions;
        agree += same;
        if (i > 0) ++decode_positions, decode_agree += same;  // position 0 comes from the (exact) prefill
        drift_sum += drift;
        drift_max = std::max(drift_max, drift);
        if (i + 1 < num_tokens) {
          TANDEM_RETURN_IF_ERROR(
              daop->engine().Forward(std::vector<ForwardInput>{{&kv, std::span<const int32_t>(&want, 1)}}, &logits));
        }
      }
    }
    const PrecalcStats s = daop->precalc_stats();
    nlohmann::ordered_json line;
    line["bench"] = "precalc";
    line["preset"] = preset;
    line["layers"] = config.num_hidden_layers;
    line["experts"] = config.num_local_experts;
    line["pool"] = slots < 0 ? std::string("none") : "host pool";
    line["resident_slots"] = slots < 0 ? 0 : slots;
    line["total_experts"] = total_experts;
    line["start_layer"] = s.start_layer;
    line["prompts"] = num_prompts;
    line["tokens"] = num_tokens;
    line["positions"] = positions;
    line["greedy_agreement"] = static_cast<double>(agree) / positions;
    line["decode_greedy_agreement"] = decode_positions > 0 ? static_cast<double>(decode_agree) / decode_positions : 1.0;
    line["logprob_drift_mean"] = drift_sum / positions;
    line["logprob_drift_max"] = drift_max;
    line["prediction_accuracy"] = s.accuracy();
    line["predictions"] = s.predictions;
    line["used_true_routing"] = s.used_true_routing;
    line["precomputed_rows"] = s.precomputed_rows;
    line["degradations"] = s.degradations;
    line["no_alternative"] = s.no_alternative;
    line["lossy"] = "daop pre-calculation";
    EmitJsonLine(line);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage("tandem-precalc-bench: what DAOP pre-calculation (lossy) does to a model's outputs.");
  tandem::ParseProgramFlags(argc, argv);
  for (absl::string_view preset : absl::StrSplit(absl::GetFlag(FLAGS_presets), ',', absl::SkipEmpty())) {
    absl::Status status = tandem::RunPreset(std::string(preset));
    if (!status.ok()) {
      std::fprintf(stderr, "tandem-precalc-bench: %s\n", std::string(status.message()).c_str());
      return 1;
    }
  }
  return 0;
}
