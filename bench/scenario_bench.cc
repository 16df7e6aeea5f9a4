// The papers' three scenarios in one run, every execution policy side by
// side (issue 6): end-to-end tokens/s for input × output lengths (Fiddler
// Fig. 4), time to first token for long prefills (Fig. 5) and beam search
// widths (Fig. 6), for each expert-pool budget × each policy. One model is
// generated (or mapped) once and shared by the runtimes of every policy,
// which are created one after another (LocalRuntime::Create over a
// shared_ptr<const Model>): a full Mixtral-8x7B is ~93 GB.
//
// Policies (--policies, comma-separated):
//   plain                       no orchestrator: every expert on the CPU executor
//   EXECUTION[+CACHE[+PLACEMENT]]
//     EXECUTION  cpu-only | gpu-only | threshold | makespan
//     CACHE      static (default) | lru | sequence | adaptive
//     PLACEMENT  uniform (default) | first-layers | popularity | popularity-balanced
//                (popularity needs --usage_profile)
// gpu-only is the offloading baseline (every miss copied to the pool, then
// run there); cpu-only is llama.cpp-like (resident experts on the pool, every
// miss on the CPU, nothing copied after the placement); plain is the pure
// CPU engine. plain does not depend on the budget: it runs once and is
// ranked under every budget.
//
// Records, one JSON line each, every one carrying `machine`, `device`,
// `command` and `flags`:
//   record "model"    the model, its expert bytes, the budgets' slot counts
//   record "e2e"      per (budget, policy, input, output): generated tokens /
//                     wall time of the whole request (prefill included), TTFT,
//                     decode tokens/s
//   record "ttft"     per (budget, policy, prefill): time to first token
//   record "beam"     per (budget, policy, width): beam search through the
//                     scheduler in this process (all live beams as one batch):
//                     steps × width / wall time
//   record "summary"  per budget: each scenario's geometric mean per policy,
//                     policies ranked best first, ratios to gpu-only
//   record "error"    a policy that failed (the run goes on; exit status 1)
// e2e/ttft/beam records carry the orchestrator's counters over the point's
// repeats (hits, migrations, bytes copied and migration GB/s, predicted vs
// measured makespan; --full_stats: OrchestratorStats::ToJson whole) and a
// fingerprint of the generated ids (equal across policies with the host
// pool: every placement computes the same bits).
//
// Prompts are deterministic (the same ids for every policy), decoding is
// greedy with ignore_eos. Each runtime gets one short warm-up request; the
// points then run in the same order for every policy, so the cache policies
// carry their state from point to point alike.
//
// Here (no GPU: the host pool stands in for GPU memory, so the numbers show
// the policies' mechanics on this CPU, not GPU speed), and on a GPU machine
// (docs/BENCHMARKS.md, "Planner, policies and simulator"):
//
//   tandem-scenario-bench --synthetic demo --gpu_slots 7,16 --inputs 32,256 --outputs 64,512
//       --prefills 512,1024,2048 --beam_widths 4,8,16 --repeats 3 --threads 2
//   tandem-scenario-bench --synthetic mixtral-8x7b --expert_pool cuda --backend cuda --gpu_memory_mb 24000,48000
//       --prefills 512,1024,2048,4096 --out scenario-mixtral.jsonl
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "common/base/clock.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/model/model.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/orchestration/calibration.h"
#include "coordinator/orchestration/orchestrator.h"
#include "coordinator/orchestration/planner/cache_policy.h"
#include "coordinator/orchestration/planner/placement.h"
#include "coordinator/orchestration/planner/planner.h"
#include "coordinator/runtime/local_runtime.h"
#include "gpu_worker/cuda/cuda_device.h"

ABSL_FLAG(std::string, model, "", "model directory or GGUF file instead of --synthetic (mapped, not copied)");
ABSL_FLAG(std::string, synthetic, "",
          "synthetic model generated in memory once for every policy, PRESET[:layers]; default demo "
          "(e.g. mixtral-8x7b, mixtral-8x7b:2, tiny)");
ABSL_FLAG(uint64_t, synthetic_seed, 0, "seed of the --synthetic weights");
ABSL_FLAG(std::string, policies,
          "plain,cpu-only,gpu-only,gpu-only+lru,threshold,makespan,makespan+lru,makespan+adaptive",
          "comma-separated: plain | EXECUTION[+CACHE[+PLACEMENT]] (see the file comment)");
ABSL_FLAG(std::string, expert_pool, "host",
          "host (no GPU: slots in this process's memory, experts computed by this CPU) | cuda (GPU memory on "
          "--cuda_device)");
ABSL_FLAG(std::string, backend, "cpu", "device of the dense part and the KV cache: cpu | cuda");
ABSL_FLAG(int32_t, cuda_device, 0, "CUDA device of --expert_pool cuda and --backend cuda");
ABSL_FLAG(std::string, gpu_memory_mb, "",
          "pool budgets, comma-separated MB (slots + staging buffers), each run with every policy, e.g. "
          "24000,48000; with --gpu_slots too: both lists are run");
ABSL_FLAG(std::string, gpu_slots, "",
          "pool budgets as expert slots, comma-separated (Fiddler's 24 GB / 48 GB Mixtral machines: 56,125); "
          "neither this nor --gpu_memory_mb: one budget of a quarter of the model's experts");
ABSL_FLAG(int32_t, staging_buffers, 2, "the pool's staging buffers (copies one layer plan may start)");
ABSL_FLAG(std::string, inputs, "32,256", "e2e: prompt lengths, comma-separated (empty: skip e2e)");
ABSL_FLAG(std::string, outputs, "64,512", "e2e: generated tokens, comma-separated");
ABSL_FLAG(std::string, prefills, "512,1024,2048",
          "ttft: prompt lengths, comma-separated (empty: skip); the papers' 4096 needs a context above 4096 "
          "positions (mixtral-8x7b, not demo)");
ABSL_FLAG(std::string, beam_widths, "4,8,16", "beam: widths, comma-separated (empty: skip)");
ABSL_FLAG(int32_t, beam_input, 32, "beam: prompt length (Fiddler: 32)");
ABSL_FLAG(int32_t, beam_output, 64, "beam: steps (Fiddler: 64)");
ABSL_FLAG(int32_t, repeats, 1, "runs of each point; the median is the headline, every run is in `runs`");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = all available cores");
ABSL_FLAG(std::string, calibration_profile, "",
          "calibration cache file (read when machine, model and config match, else written); empty: the first "
          "orchestrated runtime calibrates, every later one reuses its cost model");
ABSL_FLAG(std::string, usage_profile, "",
          "expert usage file for popularity placement (tandem-generate --record_usage)");
ABSL_FLAG(bool, full_stats, false, "put the orchestrator's whole stats (per layer, cost model) in every record");
ABSL_FLAG(std::string, out, "", "write the JSON lines to this file instead of stdout");

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------- settings

struct PolicySpec {
  std::string name;    // as given
  bool plain = false;  // no orchestrator
  ExecutionPolicy execution = ExecutionPolicy::kMakespan;
  CachePolicyKind cache = CachePolicyKind::kStatic;
  PlacementPolicy placement = PlacementPolicy::kUniform;
  bool balance_layers = false;

  // No pool, so no budget changes it (cpu-only still runs its resident
  // experts on the pool).
  bool BudgetFree() const { return plain; }
};

struct Budget {
  std::string name;  // "24000MB", "56 slots", "default"
  int64_t memory_mb = 0;
  int slots = -1;
};

struct Settings {
  ModelSource source;
  std::vector<PolicySpec> policies;
  ExpertPoolKind pool = ExpertPoolKind::kHost;
  BackendKind backend = BackendKind::kCpu;
  int cuda_device = 0;
  std::vector<Budget> budgets;
  int staging_buffers = 2;
  std::vector<int> inputs, outputs, prefills, beam_widths;
  int beam_input = 32, beam_output = 64;
  int repeats = 1;
  int threads = 0;
  std::string calibration_profile, usage_profile;
  bool full_stats = false;
};

// "1,2" → {1, 2}; InvalidArgument naming `flag` for an entry that is not a
// positive integer (ParsePositiveList would skip it silently).
absl::StatusOr<std::vector<int>> PositiveList(const std::string& text, const std::string& flag) {
  std::vector<int> values;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": \"", part, "\" is not a positive integer"));
    }
    values.push_back(v);
  }
  return values;
}

absl::StatusOr<PolicySpec> ParsePolicy(absl::string_view item) {
  PolicySpec p;
  p.name = std::string(absl::StripAsciiWhitespace(item));
  if (p.name == "plain") {
    p.plain = true;
    return p;
  }
  std::vector<std::string> parts = absl::StrSplit(p.name, '+');
  if (parts.size() > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--policies: \"", p.name, "\" has more than EXECUTION+CACHE+PLACEMENT"));
  }
  auto execution = ParseExecutionPolicy(parts[0]);
  if (!execution.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--policies: \"", p.name, "\": ", execution.status().message(), " (or plain)"));
  }
  p.execution = *execution;
  if (parts.size() > 1) {
    auto cache = ParseCachePolicyKind(parts[1]);
    if (!cache.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--policies: \"", p.name, "\": ", cache.status().message()));
    }
    p.cache = *cache;
  }
  if (parts.size() > 2) {
    std::string placement = parts[2];
    p.balance_layers = placement == "popularity-balanced";
    if (p.balance_layers) placement = "popularity";
    auto parsed = ParsePlacementPolicy(placement);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--policies: \"", p.name, "\": ", parsed.status().message(), " (or popularity-balanced)"));
    }
    p.placement = *parsed;
  }
  return p;
}

absl::StatusOr<Settings> SettingsFromFlags() {
  Settings s;
  std::string synthetic = absl::GetFlag(FLAGS_synthetic);
  if (synthetic.empty() && absl::GetFlag(FLAGS_model).empty()) synthetic = "demo";
  TANDEM_ASSIGN_OR_RETURN(s.source,
                          ParseModelSource(absl::GetFlag(FLAGS_model), synthetic, absl::GetFlag(FLAGS_synthetic_seed)));
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_policies), ',', absl::SkipEmpty())) {
    TANDEM_ASSIGN_OR_RETURN(PolicySpec p, ParsePolicy(item));
    if (p.placement == PlacementPolicy::kPopularity && absl::GetFlag(FLAGS_usage_profile).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--policies: \"", p.name, "\" places by popularity, which needs --usage_profile"));
    }
    for (const PolicySpec& q : s.policies) {
      if (q.name == p.name) return absl::InvalidArgumentError(absl::StrCat("--policies: \"", p.name, "\" twice"));
    }
    s.policies.push_back(std::move(p));
  }
  if (s.policies.empty()) return absl::InvalidArgumentError("--policies: empty");
  TANDEM_ASSIGN_OR_RETURN(s.pool, ParseExpertPoolKind(absl::GetFlag(FLAGS_expert_pool), "--expert_pool"));
  TANDEM_ASSIGN_OR_RETURN(s.backend, ParseBackendKind(absl::GetFlag(FLAGS_backend), "--backend"));
  s.cuda_device = absl::GetFlag(FLAGS_cuda_device);
  if (s.cuda_device < 0) return absl::InvalidArgumentError("--cuda_device: must be >= 0");
  TANDEM_ASSIGN_OR_RETURN(std::vector<int> memory, PositiveList(absl::GetFlag(FLAGS_gpu_memory_mb), "--gpu_memory_mb"));
  TANDEM_ASSIGN_OR_RETURN(std::vector<int> slots, PositiveList(absl::GetFlag(FLAGS_gpu_slots), "--gpu_slots"));
  for (int mb : memory) s.budgets.push_back({.name = absl::StrCat(mb, "MB"), .memory_mb = mb});
  for (int n : slots) s.budgets.push_back({.name = absl::StrCat(n, " slots"), .slots = n});
  if (s.budgets.empty()) s.budgets.push_back({.name = "default (a quarter of the experts)"});
  s.staging_buffers = absl::GetFlag(FLAGS_staging_buffers);
  if (s.staging_buffers < 1) {
    // Calibration times the pool's copies through a staging buffer.
    return absl::InvalidArgumentError("--staging_buffers: must be >= 1");
  }
  TANDEM_ASSIGN_OR_RETURN(s.inputs, PositiveList(absl::GetFlag(FLAGS_inputs), "--inputs"));
  TANDEM_ASSIGN_OR_RETURN(s.outputs, PositiveList(absl::GetFlag(FLAGS_outputs), "--outputs"));
  if (!s.inputs.empty() && s.outputs.empty()) return absl::InvalidArgumentError("--outputs: empty but --inputs is not");
  TANDEM_ASSIGN_OR_RETURN(s.prefills, PositiveList(absl::GetFlag(FLAGS_prefills), "--prefills"));
  TANDEM_ASSIGN_OR_RETURN(s.beam_widths, PositiveList(absl::GetFlag(FLAGS_beam_widths), "--beam_widths"));
  s.beam_input = absl::GetFlag(FLAGS_beam_input);
  s.beam_output = absl::GetFlag(FLAGS_beam_output);
  if (s.beam_input < 1) return absl::InvalidArgumentError("--beam_input: must be >= 1");
  if (s.beam_output < 1) return absl::InvalidArgumentError("--beam_output: must be >= 1");
  s.repeats = absl::GetFlag(FLAGS_repeats);
  if (s.repeats < 1) return absl::InvalidArgumentError("--repeats: must be >= 1");
  s.threads = absl::GetFlag(FLAGS_threads);
  if (s.threads < 0) return absl::InvalidArgumentError("--threads: must be >= 0");
  s.calibration_profile = absl::GetFlag(FLAGS_calibration_profile);
  s.usage_profile = absl::GetFlag(FLAGS_usage_profile);
  s.full_stats = absl::GetFlag(FLAGS_full_stats);
  return s;
}

// The model's context bounds every scenario; checked before anything runs so
// a long run never fails at its last point.
absl::Status CheckAgainstModel(const Settings& s, const ModelConfig& c) {
  const int64_t context = c.max_position_embeddings;
  auto too_long = [&](const std::string& flag, int64_t prompt, int64_t generated) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": a ", prompt, "-token prompt + ", generated, " generated token(s) needs ",
                     prompt + generated, " positions; the model's context (max_position_embeddings) is ", context));
  };
  for (int p : s.prefills) {
    // TTFT generates the first token: the generator counts its position too.
    if (p + 1 > context) return too_long("--prefills", p, 1);
  }
  for (int in : s.inputs) {
    for (int out : s.outputs) {
      if (in + out > context) return too_long("--inputs/--outputs", in, out);
    }
  }
  if (!s.beam_widths.empty() && s.beam_input + s.beam_output > context) {
    return too_long("--beam_input/--beam_output", s.beam_input, s.beam_output);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- output

class Output {
 public:
  static absl::StatusOr<std::unique_ptr<Output>> Open(const std::string& path, Json base) {
    auto out = std::unique_ptr<Output>(new Output());
    out->base_ = std::move(base);
    if (!path.empty()) {
      out->file_ = std::fopen(path.c_str(), "w");
      if (out->file_ == nullptr) return absl::InvalidArgumentError(absl::StrCat("--out: cannot open ", path));
    }
    return out;
  }
  ~Output() {
    if (file_ != stdout) std::fclose(file_);
  }
  // The record's own fields first, then the shared ones, then the machine's
  // stamp (bench/json_lines.h).
  void Emit(Json line) const {
    for (auto it = base_.begin(); it != base_.end(); ++it) line[it.key()] = it.value();
    const nlohmann::json stamp = BenchStamp();
    for (auto it = stamp.begin(); it != stamp.end(); ++it)
      if (!line.contains(it.key())) line[it.key()] = it.value();
    // Flushed per line: a run cut short still leaves whole lines.
    std::fputs((line.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n").c_str(), file_);
    std::fflush(file_);
  }

 private:
  Output() = default;
  std::FILE* file_ = stdout;
  Json base_;
};

// ---------------------------------------------------------------- measuring

// Deterministic token ids in [3, vocab): the same prompt for every policy.
std::vector<int32_t> Prompt(int n, int64_t vocab, int salt) {
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ids.push_back(
        static_cast<int32_t>(3 + (static_cast<int64_t>(i) * 7919 + static_cast<int64_t>(salt) * 104729) % (vocab - 3)));
  }
  return ids;
}

// FNV-1a of the generated ids, hex: equal across policies when the outputs are.
std::string Fingerprint(const std::vector<int32_t>& ids) {
  uint64_t h = 1469598103934665603ull;
  for (int32_t id : ids) {
    for (int b = 0; b < 4; ++b) {
      h ^= (static_cast<uint32_t>(id) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return absl::StrFormat("%016x", h);
}

// The counters that explain a point's number; the whole stats on request.
Json OrchestratorJson(const OrchestratorStats& s, bool full) {
  const OrchestratorLayerStats& t = s.total;
  Json j = {
      {"num_slots", s.num_slots},
      {"placed", s.placed},
      {"expert_runs", t.expert_runs},
      {"gpu_hits", t.gpu_hits},
      {"hit_rate", t.expert_runs > 0 ? static_cast<double>(t.gpu_hits) / static_cast<double>(t.expert_runs) : 0.0},
      {"inflight_waits", t.inflight_waits},
      {"planner_migrations", t.planner_migrations},
      {"cpu_runs", t.cpu_runs},
      {"cache_migrations", t.cache_migrations},
      {"evictions", t.evictions},
      {"migrations_completed", s.pool.migrations_completed},
      {"bytes_copied", s.pool.bytes_copied},
      {"migration_gb_s", s.pool.MigrationGbPerSecond()},
      {"pageable_copies", s.pool.pageable_copies},
      {"predicted_makespan_ms", s.predicted_makespan_us / 1e3},
      {"measured_makespan_ms", s.measured_makespan_us / 1e3},
      {"makespan_mape_percent", s.accuracy.makespan.mape_percent},
      {"cpu_ms", s.cpu_us / 1e3},
      {"pool_compute_ms", s.pool_compute_us / 1e3},
      {"pool_wait_ms", s.pool_wait_us / 1e3},
      {"plan_ms", s.plan_us / 1e3},
  };
  if (full) j["full"] = Json::parse(s.ToJson());
  return j;
}

// One point's measurements across repeats.
struct PointRuns {
  std::vector<double> values;  // the headline metric per run
  Json runs = Json::array();   // every run's details
  std::string fingerprint;     // of the first run's ids
};

// The geometric mean per (scenario, policy), for the summaries.
struct PolicyScores {
  std::map<std::string, std::vector<double>> by_scenario;  // "e2e_tokens_per_s" → one value per point
};

class PolicyRun {
 public:
  PolicyRun(const Settings& s, std::string budget_name, const PolicySpec& policy, LocalRuntime* rt, const Output& out,
            Json record_base)
      : s_(s),
        budget_name_(std::move(budget_name)),
        policy_(policy),
        rt_(*rt),
        out_(out),
        base_(std::move(record_base)) {}

  absl::Status Run(PolicyScores* scores) {
    // Warm-up: first touch of the weights and KV blocks, the pool's first
    // copies; identical for every policy, then the counters start afresh.
    GenerationRequest warm;
    warm.prompt_ids = Prompt(32, vocab(), 99);
    warm.max_tokens = 16;
    warm.ignore_eos = true;
    TANDEM_RETURN_IF_ERROR(rt_.generator().Generate(warm).status());
    for (int in : s_.inputs) {
      for (int outn : s_.outputs) TANDEM_RETURN_IF_ERROR(E2e(in, outn, scores));
    }
    for (int p : s_.prefills) TANDEM_RETURN_IF_ERROR(Ttft(p, scores));
    for (int w : s_.beam_widths) TANDEM_RETURN_IF_ERROR(Beam(w, scores));
    return absl::OkStatus();
  }

 private:
  int64_t vocab() const { return rt_.model().config.vocab_size; }

  void ResetStats() {
    if (rt_.orchestrator() != nullptr) rt_.orchestrator()->ResetStats();
  }

  Json Record(const std::string& kind) const {
    Json j = {{"record", kind}};
    for (auto it = base_.begin(); it != base_.end(); ++it) j[it.key()] = it.value();
    return j;
  }

  void AddStats(Json* j) const {
    if (rt_.orchestrator() != nullptr) {
      (*j)["orchestrator"] = OrchestratorJson(rt_.orchestrator()->stats(), s_.full_stats);
    } else {
      (*j)["orchestrator"] = nullptr;
    }
  }

  absl::StatusOr<GenerationResult> Generate(int prompt_tokens, int max_tokens, int salt) {
    GenerationRequest request;
    request.prompt_ids = Prompt(prompt_tokens, vocab(), salt);
    request.max_tokens = max_tokens;
    request.ignore_eos = true;         // every policy generates exactly max_tokens
    request.sampling.temperature = 0;  // greedy
    return rt_.generator().Generate(request);
  }

  absl::Status E2e(int in, int outn, PolicyScores* scores) {
    ResetStats();
    PointRuns point;
    for (int r = 0; r < s_.repeats; ++r) {
      TANDEM_ASSIGN_OR_RETURN(GenerationResult result, Generate(in, outn, in * 1000 + outn));
      const GenerationTiming& t = result.timing;
      // Fiddler's end-to-end figure: generated tokens over the whole
      // request's time, prefill included.
      const double tokens_per_s = t.total_ms > 0 ? static_cast<double>(t.generated_tokens) / (t.total_ms / 1e3) : 0;
      point.values.push_back(tokens_per_s);
      point.runs.push_back({{"tokens_per_s", tokens_per_s},
                            {"total_ms", t.total_ms},
                            {"ttft_ms", t.time_to_first_token_ms},
                            {"decode_tokens_per_s", t.decode_tokens_per_s},
                            {"generated_tokens", t.generated_tokens}});
      if (r == 0) {
        std::vector<int32_t> ids;
        for (const GeneratedToken& token : result.tokens) ids.push_back(token.id);
        point.fingerprint = Fingerprint(ids);
      }
    }
    Json j = Record("e2e");
    j["input_tokens"] = in;
    j["output_tokens"] = outn;
    EmitPoint(std::move(j), "tokens_per_s", "e2e_tokens_per_s", point, scores,
              absl::StrFormat("e2e in %d out %d: %.2f tokens/s", in, outn, Median(point.values)));
    return absl::OkStatus();
  }

  absl::Status Ttft(int prefill, PolicyScores* scores) {
    ResetStats();
    PointRuns point;
    for (int r = 0; r < s_.repeats; ++r) {
      TANDEM_ASSIGN_OR_RETURN(GenerationResult result, Generate(prefill, 1, prefill));
      const GenerationTiming& t = result.timing;
      point.values.push_back(t.time_to_first_token_ms);
      point.runs.push_back({{"ttft_ms", t.time_to_first_token_ms},
                            {"prefill_ms", t.prefill_ms},
                            {"prefill_tokens_per_s", t.prefill_tokens_per_s}});
      if (r == 0 && !result.tokens.empty()) point.fingerprint = Fingerprint({result.tokens[0].id});
    }
    Json j = Record("ttft");
    j["prefill_tokens"] = prefill;
    EmitPoint(std::move(j), "ttft_ms", "ttft_ms", point, scores,
              absl::StrFormat("ttft prefill %d: %.1f ms", prefill, Median(point.values)));
    return absl::OkStatus();
  }

  // Through the scheduler in this process: its thread owns the engine while
  // it lives (one per point), and runs every live beam as one batch.
  absl::Status Beam(int width, PolicyScores* scores) {
    ResetStats();
    PointRuns point;
    for (int r = 0; r < s_.repeats; ++r) {
      SchedulerOptions options;
      options.max_sequences = std::max(16, width);
      options.max_batch_tokens = std::max<int64_t>(256, options.max_sequences);
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Scheduler> scheduler,
                              Scheduler::Create(&rt_.model(), &rt_.engine(), &rt_.kv_pool(), options));
      BeamSearchJob job;
      job.prompt_ids = Prompt(s_.beam_input, vocab(), 7 * width);
      job.params.beam_width = width;
      job.params.max_tokens = s_.beam_output;
      job.ignore_eos = true;  // every width runs all beam_output steps
      const auto start = Clock::now();
      TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<RequestStream> stream, scheduler->SubmitBeamSearch(std::move(job)));
      std::optional<StreamEvent> done;
      while (!done) {
        std::optional<StreamEvent> event = stream->Next(absl::Minutes(30));
        if (!event) return absl::DeadlineExceededError(absl::StrCat("beam width ", width, ": no event in 30 minutes"));
        if (event->done) done = std::move(event);
      }
      const double seconds = SecondsSince(start);
      TANDEM_RETURN_IF_ERROR(done->status);
      scheduler.reset();  // the engine is this thread's again
      const int64_t steps = done->usage.generated_tokens;
      const double beam_tokens_per_s = seconds > 0 ? static_cast<double>(steps * width) / seconds : 0;
      point.values.push_back(beam_tokens_per_s);
      point.runs.push_back({{"beam_tokens_per_s", beam_tokens_per_s},
                            {"steps_per_s", seconds > 0 ? static_cast<double>(steps) / seconds : 0},
                            {"seconds", seconds},
                            {"steps", steps},
                            {"ttft_ms", done->usage.time_to_first_token_ms}});
      if (r == 0 && !done->beams.empty()) point.fingerprint = Fingerprint(done->beams.front().ids);
    }
    Json j = Record("beam");
    j["beam_width"] = width;
    j["input_tokens"] = s_.beam_input;
    j["output_tokens"] = s_.beam_output;
    EmitPoint(std::move(j), "beam_tokens_per_s", "beam_tokens_per_s", point, scores,
              absl::StrFormat("beam width %d: %.2f beam tokens/s", width, Median(point.values)));
    return absl::OkStatus();
  }

  // One point's record: its median under `metric`, the runs, the ids'
  // fingerprint and the orchestrator's counters; the median also goes to
  // the policy's `scenario` scores for the summary.
  void EmitPoint(Json j, const char* metric, const char* scenario, const PointRuns& point, PolicyScores* scores,
                 const std::string& progress) {
    const double median = Median(point.values);
    j[metric] = median;
    j["runs"] = point.runs;
    j["output_fingerprint"] = point.fingerprint;
    AddStats(&j);
    out_.Emit(j);
    Progress(progress);
    scores->by_scenario[scenario].push_back(median);
  }

  void Progress(const std::string& what) const {
    std::fprintf(stderr, "tandem-scenario-bench: [%s] %s: %s\n", budget_name_.c_str(), policy_.name.c_str(),
                 what.c_str());
  }

  const Settings& s_;
  const std::string budget_name_;
  const PolicySpec& policy_;
  LocalRuntime& rt_;
  const Output& out_;
  Json base_;
};

double GeoMean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double log_sum = 0;
  for (double x : v) log_sum += std::log(std::max(x, 1e-12));
  return std::exp(log_sum / static_cast<double>(v.size()));
}

// One budget's ranking: per scenario, the policies by their geometric mean
// over the points, best first, with the ratio to gpu-only (the offloading
// baseline) where it ran.
Json Summary(const Budget& budget, const std::vector<PolicySpec>& policies,
             const std::map<std::string, PolicyScores>& scores) {
  Json j = {{"record", "summary"}, {"budget", budget.name}};
  Json scenarios = Json::object();
  for (const char* metric : {"e2e_tokens_per_s", "ttft_ms", "beam_tokens_per_s"}) {
    const bool lower_is_better = std::string(metric) == "ttft_ms";
    std::vector<std::pair<std::string, double>> ranked;
    for (const PolicySpec& p : policies) {
      auto it = scores.find(p.name);
      if (it == scores.end()) continue;
      auto m = it->second.by_scenario.find(metric);
      if (m == it->second.by_scenario.end() || m->second.empty()) continue;
      ranked.emplace_back(p.name, GeoMean(m->second));
    }
    if (ranked.empty()) continue;
    std::stable_sort(ranked.begin(), ranked.end(), [&](const auto& a, const auto& b) {
      return lower_is_better ? a.second < b.second : a.second > b.second;
    });
    double baseline = 0;
    for (const auto& [name, value] : ranked) {
      if (name == "gpu-only") baseline = value;
    }
    Json list = Json::array();
    for (const auto& [name, value] : ranked) {
      Json entry = {{"policy", name}, {"geomean", value}};
      // Speed-up over gpu-only: >1 is better, for TTFT too.
      if (baseline > 0 && value > 0) entry["vs_gpu_only"] = lower_is_better ? baseline / value : value / baseline;
      list.push_back(entry);
    }
    scenarios[metric] = {{"best", ranked.front().first}, {"ranking", list}};
  }
  j["scenarios"] = scenarios;
  return j;
}

// ---------------------------------------------------------------- main

int64_t KvTokens(const Settings& s, int64_t block) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  int64_t tokens = 32 + 16;  // the warm-up
  for (int p : s.prefills) tokens = std::max<int64_t>(tokens, p + 1);
  for (int in : s.inputs) {
    for (int out : s.outputs) tokens = std::max<int64_t>(tokens, in + out);
  }
  for (int w : s.beam_widths) {
    // The scheduler's worst-case reservation for a beam search.
    const int64_t prompt = s.beam_input;
    const int64_t blocks = ceil_div(prompt, block) + w * (ceil_div(prompt + s.beam_output, block) - prompt / block);
    tokens = std::max(tokens, blocks * block);
  }
  return tokens + block;  // blocks are allocated lazily: a margin costs nothing
}

Json FlagsJson(const Settings& s) {
  return {{"model", absl::GetFlag(FLAGS_model)},
          {"synthetic", absl::GetFlag(FLAGS_synthetic)},
          {"synthetic_seed", absl::GetFlag(FLAGS_synthetic_seed)},
          {"policies", absl::GetFlag(FLAGS_policies)},
          {"expert_pool", absl::GetFlag(FLAGS_expert_pool)},
          {"backend", absl::GetFlag(FLAGS_backend)},
          {"cuda_device", s.cuda_device},
          {"gpu_memory_mb", absl::GetFlag(FLAGS_gpu_memory_mb)},
          {"gpu_slots", absl::GetFlag(FLAGS_gpu_slots)},
          {"staging_buffers", s.staging_buffers},
          {"inputs", absl::GetFlag(FLAGS_inputs)},
          {"outputs", absl::GetFlag(FLAGS_outputs)},
          {"prefills", absl::GetFlag(FLAGS_prefills)},
          {"beam_widths", absl::GetFlag(FLAGS_beam_widths)},
          {"beam_input", s.beam_input},
          {"beam_output", s.beam_output},
          {"repeats", s.repeats},
          {"threads", s.threads},
          {"calibration_profile", s.calibration_profile},
          {"usage_profile", s.usage_profile},
          {"full_stats", s.full_stats}};
}

// The GPU's name when one is used, else why there is none.
std::string DeviceName(const Settings& s) {
  if (s.pool != ExpertPoolKind::kCuda && s.backend != BackendKind::kCuda) {
    return "none: host expert pool (no-GPU stand-in) and CPU backend";
  }
  absl::StatusOr<std::vector<CudaDeviceInfo>> devices = ListCudaDevices();
  if (!devices.ok()) return absl::StrCat("unavailable: ", devices.status().message());
  if (s.cuda_device >= static_cast<int>(devices->size())) return "unavailable: no such --cuda_device";
  const CudaDeviceInfo& d = (*devices)[static_cast<size_t>(s.cuda_device)];
  return absl::StrFormat("%s (%.1f GiB, cc %d.%d)", d.name, d.total_memory_bytes / double(1 << 30),
                         d.compute_capability_major, d.compute_capability_minor);
}

int Main(int argc, char** argv) {
  // The command as given, program name without its directory.
  std::vector<std::string> words = {"tandem-scenario-bench"};
  for (int a = 1; a < argc; ++a) words.emplace_back(argv[a]);
  const std::string command = absl::StrJoin(words, " ");
  tandem::SetProgramUsage("The papers' three scenarios in one run, every execution policy side by side.");
  tandem::ParseProgramFlags(argc, argv);
  auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "tandem-scenario-bench: %s\n", std::string(status.message()).c_str());
    return 1;
  };

  absl::StatusOr<Settings> parsed = SettingsFromFlags();
  if (!parsed.ok()) return fail(parsed.status());
  const Settings& s = *parsed;
  const int threads = s.threads > 0 ? s.threads : AvailableCores();

  // Once, for every policy (see the file comment). No tokenizer: the
  // prompts are token ids.
  ModelLoadOptions load;
  load.num_threads = threads;
  load.tokenizer = false;
  absl::StatusOr<std::unique_ptr<Model>> loaded = LoadModelFrom(s.source, load);
  if (!loaded.ok()) return fail(loaded.status());
  const std::shared_ptr<const Model> model(std::move(*loaded));
  const ModelConfig& c = model->config;
  if (absl::Status status = CheckAgainstModel(s, c); !status.ok()) return fail(status);

  const Json base = {{"bench", "scenario"},
                     {"machine", MachineDescription()},
                     {"device", DeviceName(s)},
                     {"model", model->origin},
                     {"expert_pool", s.pool == ExpertPoolKind::kCuda ? "cuda" : "host"},
                     {"backend", s.backend == BackendKind::kCuda ? "cuda" : "cpu"},
                     {"threads", threads},
                     {"command", command},
                     {"flags", FlagsJson(s)}};
  absl::StatusOr<std::unique_ptr<Output>> out = Output::Open(absl::GetFlag(FLAGS_out), base);
  if (!out.ok()) return fail(out.status());

  const int64_t experts = c.num_hidden_layers * c.num_local_experts;
  const int64_t expert_bytes = model->weights->expert_bytes / std::max<int64_t>(1, experts);
  (*out)->Emit({{"record", "model"},
                {"architecture", c.architecture_name},
                {"layers", c.num_hidden_layers},
                {"experts", experts},
                {"experts_per_token", c.num_experts_per_tok},
                {"hidden_size", c.hidden_size},
                {"intermediate_size", c.intermediate_size},
                {"max_position_embeddings", c.max_position_embeddings},
                {"weight_bytes", model->weights->total_bytes},
                {"expert_bytes", expert_bytes}});

  LocalRuntimeOptions options;
  options.num_threads = threads;
  options.backend = s.backend;
  options.cuda.device = s.cuda_device;
  options.kv_cache_tokens = KvTokens(s, options.kv_block_size);
  std::optional<CostModelParams> shared_cost;  // the first calibration, reused (see --calibration_profile)
  std::string cost_from;
  std::map<std::string, PolicyScores> budget_free;  // run once, ranked under every budget
  int failures = 0;

  for (const Budget& budget : s.budgets) {
    std::map<std::string, PolicyScores> scores;
    for (const PolicySpec& policy : s.policies) {
      if (policy.BudgetFree() && budget_free.count(policy.name)) {
        scores[policy.name] = budget_free[policy.name];
        continue;
      }
      LocalRuntimeOptions o = options;
      LocalOrchestratorOptions& orch = o.orchestrator;
      orch.enabled = !policy.plain;
      orch.pool = s.pool;
      orch.cuda_device = s.cuda_device;
      orch.execution = policy.execution;
      orch.cache = policy.cache;
      orch.placement = policy.placement;
      orch.balance_layers = policy.balance_layers;
      orch.gpu_slots = budget.slots;
      orch.gpu_memory_bytes = budget.memory_mb << 20;
      orch.staging_buffers = s.staging_buffers;
      orch.usage_profile = s.usage_profile;
      orch.calibration_profile = s.calibration_profile;
      orch.cost = shared_cost;
      const std::string budget_name = policy.BudgetFree() ? "any" : budget.name;
      Json record_base = {{"budget", budget_name},
                          {"policy", policy.name},
                          {"execution_policy", policy.plain ? "none" : ExecutionPolicyName(policy.execution)},
                          {"cache_policy", policy.plain ? "none" : CachePolicyKindName(policy.cache)},
                          {"placement", policy.plain            ? "none"
                                        : policy.balance_layers ? "popularity-balanced"
                                                                : PlacementPolicyName(policy.placement)}};
      std::fprintf(stderr, "tandem-scenario-bench: [%s] %s: creating the runtime\n", budget_name.c_str(),
                   policy.name.c_str());
      PolicyScores policy_scores;
      absl::Status status;
      {
        // Destroyed before the next policy's runtime is created (a CUDA pool
        // unregisters the weights' pages first; host memory is freed).
        absl::StatusOr<std::unique_ptr<LocalRuntime>> rt = LocalRuntime::Create(model, o);
        if (rt.ok()) {
          if ((*rt)->calibration() && !shared_cost) {
            shared_cost = (*rt)->calibration()->profile.cost;
            cost_from = policy.name;
            (*out)->Emit({{"record", "calibration"},
                          {"policy", policy.name},
                          {"from_cache", (*rt)->calibration()->from_cache},
                          {"seconds", (*rt)->calibration()->seconds},
                          {"note", "every later orchestrated runtime of this run reuses this cost model"}});
          }
          if ((*rt)->orchestrator() != nullptr) {
            record_base["num_slots"] = (*rt)->expert_pool()->num_slots();
            record_base["cost_model_from"] = cost_from.empty() ? "--calibration_profile" : cost_from;
          }
          PolicyRun run(s, budget_name, policy, rt->get(), **out, record_base);
          status = run.Run(&policy_scores);
        } else {
          status = rt.status();
        }
      }
      if (!status.ok()) {
        ++failures;
        std::fprintf(stderr, "tandem-scenario-bench: [%s] %s: %s\n", budget_name.c_str(), policy.name.c_str(),
                     std::string(status.message()).c_str());
        Json error = {{"record", "error"}, {"message", std::string(status.message())}};
        for (auto it = record_base.begin(); it != record_base.end(); ++it) error[it.key()] = it.value();
        (*out)->Emit(error);
        continue;
      }
      if (policy.BudgetFree()) budget_free[policy.name] = policy_scores;
      scores[policy.name] = std::move(policy_scores);
    }
    (*out)->Emit(Summary(budget, s.policies, scores));
  }
  return failures > 0 ? 1 : 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
