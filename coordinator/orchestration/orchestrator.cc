#include "coordinator/orchestration/orchestrator.h"

#include <pthread.h>

#include <algorithm>
#include <limits>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

std::string KeyName(ExpertKey key) { return absl::StrCat("layer ", key.layer, " expert ", key.expert); }

void Add(const OrchestratorLayerStats& d, OrchestratorLayerStats* s) {
  s->expert_runs += d.expert_runs;
  s->gpu_hits += d.gpu_hits;
  s->inflight_waits += d.inflight_waits;
  s->planner_migrations += d.planner_migrations;
  s->cpu_runs += d.cpu_runs;
  s->cache_migrations += d.cache_migrations;
  s->cache_admissions += d.cache_admissions;
  s->evictions += d.evictions;
  s->expert_us += d.expert_us;
}

nlohmann::ordered_json LayerJson(const OrchestratorLayerStats& s) {
  nlohmann::ordered_json j;
  j["expert_runs"] = s.expert_runs;
  j["gpu_hits"] = s.gpu_hits;
  j["misses"] = s.misses();
  j["inflight_waits"] = s.inflight_waits;
  j["planner_migrations"] = s.planner_migrations;
  j["cpu_runs"] = s.cpu_runs;
  j["cache_migrations"] = s.cache_migrations;
  j["cache_admissions"] = s.cache_admissions;
  j["evictions"] = s.evictions;
  j["expert_us"] = s.expert_us;
  return j;
}

nlohmann::ordered_json AccuracyJson(const TermAccuracy& a) {
  nlohmann::ordered_json j;
  j["observations"] = a.observations;
  j["window"] = a.window;
  j["mape_percent"] = a.mape_percent;
  return j;
}

absl::Status CheckCreateArguments(const ModelConfig& config, ExpertExecutor* cpu, ExpertPool* pool,
                                  const CostModel& cost, const OrchestratorOptions& options) {
  if (cpu == nullptr) return absl::InvalidArgumentError("cpu: the orchestrator needs a CPU expert executor");
  if (pool == nullptr) return absl::InvalidArgumentError("pool: the orchestrator needs an expert pool");
  const int num_layers = static_cast<int>(config.num_hidden_layers);
  const int num_experts = static_cast<int>(config.num_local_experts);
  if (pool->num_layers() != num_layers || pool->num_experts() != num_experts) {
    return absl::InvalidArgumentError(absl::StrCat("pool holds experts of ", pool->num_layers(), " layers x ",
                                                   pool->num_experts(), ", the model has ", num_layers, " x ",
                                                   num_experts));
  }
  for (const PoolSlot& slot : pool->SlotTable()) {
    if (slot.expert) return absl::InvalidArgumentError("pool: must be empty (the orchestrator places its experts)");
  }
  if (cost.num_cpu_workers() != options.planner.num_cpu_workers) {
    return absl::InvalidArgumentError(absl::StrCat("planner.num_cpu_workers is ", options.planner.num_cpu_workers,
                                                   " but the cost model has ", cost.num_cpu_workers(), " CPU workers"));
  }
  if (cost.params().expert_bytes != pool->expert_bytes()) {
    LOG_WARNING("orchestrator: the cost model's expert_bytes (", cost.params().expert_bytes,
                ") differs from the pool's (", pool->expert_bytes(), ")");
  }
  return absl::OkStatus();
}

// `options` with the defaults that depend on the pool and the model filled in.
absl::StatusOr<OrchestratorOptions> CompleteOptions(const ModelConfig& config, const ExpertPool& pool,
                                                    const OrchestratorOptions& options) {
  const int num_experts = static_cast<int>(config.num_local_experts);
  OrchestratorOptions o = options;
  o.placement.num_slots = pool.num_slots();
  o.placement.dense_layers = config.dense_layers;
  // Slots are shared among the MoE layers; a dense layer holds no expert.
  const int moe_layers = static_cast<int>(config.num_moe_layers());
  if (o.cache.kind == CachePolicyKind::kLru && o.cache.lru.num_ways == 0) {
    // Default: the slots spread over every layer they can cover.
    o.cache.lru.num_ways = std::clamp(pool.num_slots() / moe_layers, 1, num_experts);
    o.cache.lru.num_indexes = LayersCoveringMoeLayers(static_cast<int>(config.num_hidden_layers), config.dense_layers,
                                                      std::min(moe_layers, pool.num_slots() / o.cache.lru.num_ways));
  }
  if (o.placement.policy == PlacementPolicy::kFirstLayers && o.placement.ways == 0) {
    o.placement.ways = o.cache.kind == CachePolicyKind::kLru
                           ? o.cache.lru.num_ways
                           : std::clamp(pool.num_slots() / moe_layers, 1, num_experts);
  }
  o.cache.adaptive.division = o.planner.division;
  o.cache.adaptive.num_experts_per_token = static_cast<int>(config.num_experts_per_tok);
  if (o.placement.policy == PlacementPolicy::kPopularity && !o.usage) {
    return absl::InvalidArgumentError("usage: popularity placement needs an expert usage profile");
  }
  return o;
}

}  // namespace

// Runs the CPU executor's calls on their own thread, one at a time, so the
// engine thread can drive the pool meanwhile (overlap_cpu).
class Orchestrator::CpuLane {
 public:
  explicit CpuLane(ExpertExecutor* cpu) : cpu_(cpu), thread_([this] { Loop(); }) {}
  ~CpuLane() {
    {
      absl::MutexLock lock(&mutex_);
      stop_ = true;
    }
    cv_.SignalAll();
    thread_.join();
  }

  // The engine thread: Start a layer's CPU work, then Wait for it.
  void Start(int layer, std::span<const ExpertWork> work) ABSL_LOCKS_EXCLUDED(mutex_) {
    {
      absl::MutexLock lock(&mutex_);
      layer_ = layer;
      work_ = work;
      pending_ = true;
      done_ = false;
    }
    cv_.SignalAll();
  }

  absl::Status Wait(double* us) ABSL_LOCKS_EXCLUDED(mutex_) {
    absl::MutexLock lock(&mutex_);
    while (!done_) cv_.Wait(&mutex_);
    *us = us_;
    return status_;
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mutex_) {
    pthread_setname_np(pthread_self(), "cpu-lane");
    mutex_.Lock();
    while (true) {
      while (!stop_ && !pending_) cv_.Wait(&mutex_);
      if (!pending_) break;
      pending_ = false;
      const int layer = layer_;
      const std::span<const ExpertWork> work = work_;
      mutex_.Unlock();
      const auto start = std::chrono::steady_clock::now();
      absl::Status status = cpu_->RunExperts(layer, work);
      const double us = MicrosSince(start);
      mutex_.Lock();
      status_ = std::move(status);
      us_ = us;
      done_ = true;
      cv_.SignalAll();
    }
    mutex_.Unlock();
  }

  ExpertExecutor* cpu_;
  absl::Mutex mutex_;
  absl::CondVar cv_;  // pending_, done_ or stop_ changed
  bool stop_ ABSL_GUARDED_BY(mutex_) = false;
  bool pending_ ABSL_GUARDED_BY(mutex_) = false;
  bool done_ ABSL_GUARDED_BY(mutex_) = false;
  int layer_ ABSL_GUARDED_BY(mutex_) = 0;
  std::span<const ExpertWork> work_ ABSL_GUARDED_BY(mutex_);
  absl::Status status_ ABSL_GUARDED_BY(mutex_);
  double us_ ABSL_GUARDED_BY(mutex_) = 0;
  std::thread thread_;  // last: starts once the rest exists
};

std::string OrchestratorStats::ToJson() const {
  nlohmann::ordered_json j;
  j["pool_kind"] = pool_kind;
  j["execution_policy"] = execution_policy;
  j["cache_policy"] = cache_policy;
  j["placement"] = placement;
  j["num_slots"] = num_slots;
  j["num_staging_buffers"] = num_staging_buffers;
  j["placed"] = placed;
  j["steps"] = steps;
  j["prefill_steps"] = prefill_steps;
  j["decode_steps"] = decode_steps;
  j["layer_plans"] = layer_plans;
  j["refused_decisions"] = refused_decisions;
  j["total"] = LayerJson(total);
  j["hit_rate"] =
      total.expert_runs > 0 ? static_cast<double>(total.gpu_hits) / static_cast<double>(total.expert_runs) : 0.0;
  nlohmann::ordered_json per_layer = nlohmann::ordered_json::array();
  for (const OrchestratorLayerStats& l : layers) per_layer.push_back(LayerJson(l));
  j["layers"] = per_layer;
  // [L][E] each: the heatmap of where experts are and where they ran.
  nlohmann::ordered_json residency_rows = nlohmann::ordered_json::array();
  nlohmann::ordered_json gpu_rows = nlohmann::ordered_json::array();
  nlohmann::ordered_json cpu_rows = nlohmann::ordered_json::array();
  for (size_t l = 0; num_experts > 0 && l < layers.size(); ++l) {
    const size_t from = l * static_cast<size_t>(num_experts), to = from + static_cast<size_t>(num_experts);
    residency_rows.push_back(std::vector<int>(residency.begin() + from, residency.begin() + to));
    gpu_rows.push_back(std::vector<int64_t>(expert_gpu_runs.begin() + from, expert_gpu_runs.begin() + to));
    cpu_rows.push_back(std::vector<int64_t>(expert_cpu_runs.begin() + from, expert_cpu_runs.begin() + to));
  }
  j["experts"] = {{"residency", residency_rows}, {"gpu_runs", gpu_rows}, {"cpu_runs", cpu_rows}};
  j["time_us"] = {{"plan", plan_us},
                  {"predicted_makespan", predicted_makespan_us},
                  {"measured_makespan", measured_makespan_us},
                  {"cpu", cpu_us},
                  {"pool_wait", pool_wait_us},
                  {"pool_compute", pool_compute_us}};
  auto curve = [](const RooflineCurve& c) {
    return nlohmann::ordered_json{{"plateau_us", c.plateau_us}, {"base_us", c.base_us}, {"per_row_us", c.per_row_us}};
  };
  auto transfer = [](const TransferCost& t) {
    return nlohmann::ordered_json{{"fixed_us", t.fixed_us}, {"gb_per_s", t.GbPerSecond()}};
  };
  nlohmann::ordered_json cpu_workers = nlohmann::ordered_json::array();
  for (const CpuWorkerCost& w : cost_model.cpu_workers) cpu_workers.push_back(curve(w.compute));
  nlohmann::ordered_json transports = nlohmann::ordered_json::object();
  for (const NamedTransferCost& t : cost_model.transports) transports[t.name] = transfer(t.cost);
  j["cost_model"] = {{"cpu_workers", cpu_workers},
                     {"gpu", curve(cost_model.gpu)},
                     {"migrate", transfer(cost_model.migrate)},
                     {"migrate_us", cost_model.migrate.Us(static_cast<double>(cost_model.expert_bytes))},
                     {"dma", transfer(cost_model.dma)},
                     {"ipc", transports}};
  j["cost_model_mape"] = {{"makespan", AccuracyJson(accuracy.makespan)}, {"cpu", AccuracyJson(accuracy.cpu)},
                          {"gpu", AccuracyJson(accuracy.gpu)},           {"migrate", AccuracyJson(accuracy.migrate)},
                          {"dma", AccuracyJson(accuracy.dma)},           {"ipc", AccuracyJson(accuracy.ipc)}};
  j["pool"] = {{"kind", pool.kind},
               {"num_slots", pool.num_slots},
               {"used_slots", pool.used_slots},
               {"num_staging_buffers", pool.num_staging_buffers},
               {"expert_bytes", pool.expert_bytes},
               {"placements", pool.placements},
               {"migrations_started", pool.migrations_started},
               {"migrations_completed", pool.migrations_completed},
               {"staging_copies", pool.staging_copies},
               {"bytes_copied", pool.bytes_copied},
               {"copy_us", pool.copy_us},
               {"migration_gb_s", pool.MigrationGbPerSecond()},
               {"pageable_copies", pool.pageable_copies},
               {"admissions", pool.admissions},
               {"evictions", pool.evictions},
               {"slot_runs", pool.slot_runs},
               {"staging_runs", pool.staging_runs},
               {"wait_us", pool.wait_us},
               {"compute_us", pool.compute_us}};
  j["precalc"] = nlohmann::ordered_json::parse(precalc.ToJson());
  return j.dump();
}

absl::StatusOr<std::unique_ptr<Orchestrator>> Orchestrator::Create(const ModelConfig& config, ExpertExecutor* cpu,
                                                                   ExpertPool* pool, CostModel cost,
                                                                   const OrchestratorOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckCreateArguments(config, cpu, pool, cost, options));
  const int num_layers = static_cast<int>(config.num_hidden_layers);
  const int num_experts = static_cast<int>(config.num_local_experts);
  TANDEM_ASSIGN_OR_RETURN(Planner planner, Planner::Create(options.planner));
  TANDEM_ASSIGN_OR_RETURN(ResidencyTable table, ResidencyTable::Create(num_layers, num_experts, pool->num_slots()));
  TANDEM_ASSIGN_OR_RETURN(const OrchestratorOptions o, CompleteOptions(config, *pool, options));

  auto orchestrator = std::unique_ptr<Orchestrator>(
      new Orchestrator(config, cpu, pool, std::move(cost), o, std::move(planner), nullptr, std::move(table)));
  TANDEM_ASSIGN_OR_RETURN(const int placed, orchestrator->StartPolicies(config));
  orchestrator->InitStats(placed);
  orchestrator->LogSetup();
  return orchestrator;
}

// The cache policy, the initial placement (into the table and the pool), the
// CPU lane and precalc. Returns how many experts were placed.
absl::StatusOr<int> Orchestrator::StartPolicies(const ModelConfig& config) {
  const OrchestratorOptions& o = options_;
  // The adaptive policy reads the orchestrator's own (refined) cost model.
  TANDEM_ASSIGN_OR_RETURN(cache_, MakeCachePolicy(o.cache, num_layers_, num_experts_, &cost_));
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExpertKey> placed,
                          PlaceExperts(o.placement, num_layers_, num_experts_, o.usage ? &*o.usage : nullptr));
  for (const ExpertKey& key : placed) {
    TANDEM_RETURN_IF_ERROR(table_.Place(key));
    TANDEM_RETURN_IF_ERROR(pool_->Place(key));
  }
  TANDEM_RETURN_IF_ERROR(cache_->Reset(table_));
  if (o.overlap_cpu) cpu_lane_ = std::make_unique<CpuLane>(cpu_);
  TANDEM_RETURN_IF_ERROR(ValidatePrecalcOptions(o.precalc));
  if (o.precalc.policy == PrecalcPolicy::kDaop) {
    TANDEM_ASSIGN_OR_RETURN(precalc_, DaopPrecalc::Create(config, cpu_, nullptr, &table_, o.precalc));
    const PrecalcStats precalc = precalc_->stats();
    absl::MutexLock lock(&stats_mutex_);  // not shared yet: uncontended, for the analysis
    stats_.precalc = precalc;
  }
  return static_cast<int>(placed.size());
}

void Orchestrator::InitStats(int placed) {
  const OrchestratorOptions& o = options_;
  absl::MutexLock lock(&stats_mutex_);  // not shared yet: uncontended, for the analysis
  stats_.pool_kind = pool_->kind();
  stats_.cost_model = cost_.params();
  stats_.execution_policy = ExecutionPolicyName(o.planner.policy);
  stats_.cache_policy = CachePolicyKindName(o.cache.kind);
  stats_.placement =
      PlacementPolicyName(o.placement.policy) +
      (o.placement.policy == PlacementPolicy::kPopularity && o.placement.balance_layers ? "-balanced" : "");
  stats_.num_slots = pool_->num_slots();
  stats_.num_staging_buffers = pool_->num_staging_buffers();
  stats_.placed = placed;
  stats_.layers.assign(static_cast<size_t>(num_layers_), OrchestratorLayerStats{});
  stats_.num_experts = num_experts_;
  const size_t cells = static_cast<size_t>(num_layers_) * static_cast<size_t>(num_experts_);
  stats_.expert_gpu_runs.assign(cells, 0);
  stats_.expert_cpu_runs.assign(cells, 0);
  stats_.residency.assign(cells, 0);
  for (int l = 0; l < num_layers_; ++l) SnapshotResidency(l);
}

void Orchestrator::SnapshotResidency(int layer) {
  for (int e = 0; e < num_experts_; ++e) {
    stats_.residency[static_cast<size_t>(layer * num_experts_ + e)] =
        static_cast<uint8_t>(table_.residency(ExpertKey{layer, e}));
  }
}

void Orchestrator::LogSetup() const {
  const OrchestratorOptions& o = options_;
  absl::MutexLock lock(&stats_mutex_);  // not shared yet: uncontended, for the analysis
  LOG_INFO("orchestrator: execution ", stats_.execution_policy, ", cache ", stats_.cache_policy,
           o.cache.kind == CachePolicyKind::kLru
               ? absl::StrCat(" (", o.cache.lru.num_indexes, " layers x ", o.cache.lru.num_ways, " ways)")
               : std::string(),
           ", placement ", stats_.placement, " (", stats_.placed, " of ", num_layers_ * num_experts_,
           " experts placed); ", pool_->kind(), " with ", pool_->num_slots(), " slots + ", pool_->num_staging_buffers(),
           " staging buffers; ", o.planner.num_cpu_workers, " CPU worker(s), ", ExpertDivisionName(o.planner.division),
           precalc_ ? absl::StrCat("; precalc daop from layer ", stats_.precalc.start_layer,
                                   " (LOSSY: daop pre-calculation changes the outputs)")
                    : std::string("; precalc off (exact)"));
}

Orchestrator::Orchestrator(const ModelConfig& config, ExpertExecutor* cpu, ExpertPool* pool, CostModel cost,
                           const OrchestratorOptions& options, Planner planner, std::unique_ptr<CachePolicy> cache,
                           ResidencyTable table)
    : num_layers_(static_cast<int>(config.num_hidden_layers)),
      num_experts_(static_cast<int>(config.num_local_experts)),
      num_experts_per_token_(static_cast<int>(config.num_experts_per_tok)),
      cpu_(cpu),
      pool_(pool),
      cost_(std::move(cost)),
      options_(options),
      planner_(std::move(planner)),
      cache_(std::move(cache)),
      table_(std::move(table)),
      epoch_(std::chrono::steady_clock::now()),
      rows_(static_cast<size_t>(num_experts_), 0),
      work_index_(static_cast<size_t>(num_experts_), -1) {}

Orchestrator::~Orchestrator() = default;

double Orchestrator::NowUs() const { return MicrosSince(epoch_); }

void Orchestrator::OnStepBegin(const ForwardStep& step) {
  in_step_ = true;
  step_prefill_ = step.prefill;
  if (step.new_sequence) {
    // A new sequence (or batch): the cache policies' per-sequence statistics
    // restart. The engine does not know how long it will decode (0: the
    // policy's default horizon).
    SequenceInfo info;
    info.decode_rows_per_step = std::max<int>(1, static_cast<int>(step.sequences.size()));
    cache_->OnSequenceStart(info);
  }
  absl::MutexLock lock(&stats_mutex_);
  ++stats_.steps;
  ++(step.prefill ? stats_.prefill_steps : stats_.decode_steps);
}

void Orchestrator::OnStepEnd(const ForwardStep& step, const absl::Status& status) { in_step_ = false; }

void Orchestrator::DrainMigrations() {
  for (const MigrationRecord& record : pool_->TakeCompletedMigrations()) {
    if (!record.staging && table_.Contains(record.expert) && table_.residency(record.expert) == Residency::kMigrating) {
      // Cannot fail: it is migrating.
      (void)table_.CompleteMigration(record.expert);
    }
    if (options_.refine_online) cost_.ObserveMigration(record.copy_us, static_cast<double>(record.bytes));
  }
}

absl::Status Orchestrator::ApplyDecisions(std::span<const CacheDecision> decisions, double now_us,
                                          OrchestratorLayerStats* layer) {
  const double migrate_us = cost_.MigrateUs();
  for (const CacheDecision& d : decisions) {
    const bool migrate = d.kind == CacheDecision::Kind::kMigrate;
    // The table first: it checks the decision (a refused one is skipped, the
    // pool never sees it), so table and pool stay in step.
    const double ready = std::max(now_us, copy_free_at_us_) + migrate_us;
    absl::Status status = migrate ? table_.BeginMigration(d.expert, ready, d.evict) : table_.Admit(d.expert, d.evict);
    if (!status.ok()) {
      absl::MutexLock lock(&stats_mutex_);
      ++stats_.refused_decisions;
      if (!warned_refusal_) {
        warned_refusal_ = true;
        LOG_WARNING("orchestrator: ", cache_->name(), " decision for ", KeyName(d.expert),
                    " refused (skipped): ", status.message());
      }
      continue;
    }
    absl::Status applied = migrate ? pool_->Migrate(d.expert, d.evict) : pool_->Admit(d.expert, d.evict);
    if (!applied.ok()) {
      return absl::InternalError(absl::StrCat("orchestrator: the pool refused a ", migrate ? "migration" : "admission",
                                              " of ", KeyName(d.expert),
                                              " its residency table allowed: ", applied.message()));
    }
    if (migrate) {
      copy_free_at_us_ = ready;
      ++layer->cache_migrations;
    } else {
      ++layer->cache_admissions;
    }
    if (d.evict) ++layer->evictions;
  }
  return absl::OkStatus();
}

absl::Status Orchestrator::RunCpu(int layer, std::span<const ExpertWork> work, double* us) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = cpu_->RunExperts(layer, work);
  *us = MicrosSince(start);
  return status;
}

void Orchestrator::ObserveCpu(int layer, std::span<const ExpertWork> work, double measured_us) {
  observed_rows_.clear();
  for (const ExpertWork& w : work) observed_rows_.push_back(static_cast<int32_t>(w.num_rows));
  const int workers = cost_.num_cpu_workers();
  if (workers == 1) {
    cost_.ObserveCpu(0, observed_rows_, measured_us, 1.0);
  } else if (options_.planner.division == ExpertDivision::kSplit) {
    // Every worker computed its slice of every expert, in parallel: the
    // call's time is each one's.
    for (int w = 0; w < workers; ++w) cost_.ObserveCpu(w, observed_rows_, measured_us, 1.0 / workers);
  } else {
    // shard: the call's time is one worker's only when one worker ran them all.
    const int owner = ShardWorker(layer, work.front().expert, workers);
    for (const ExpertWork& w : work) {
      if (ShardWorker(layer, w.expert, workers) != owner) return;
    }
    cost_.ObserveCpu(owner, observed_rows_, measured_us, 1.0);
  }
}

// What Execute measured of one layer's expert work.
struct Orchestrator::Execution {
  double cpu_us = 0;       // the CPU executor's call
  PoolRunTiming pool;      // the pool's waits and compute
  double measured_us = 0;  // wall time of both
};

absl::Status Orchestrator::RunExperts(int layer, std::span<const ExpertWork> work) {
  const auto start = std::chrono::steady_clock::now();
  if (layer < 0 || layer >= num_layers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("orchestrator: layer ", layer, " out of range [0, ", num_layers_, ")"));
  }
  if (precalc_ != nullptr) {
    // Pre-computed experts are done; the rest is planned as usual.
    unserved_.clear();
    TANDEM_RETURN_IF_ERROR(precalc_->Serve(layer, work, &unserved_));
    work = unserved_;
  }
  TANDEM_ASSIGN_OR_RETURN(const int64_t total_rows, IndexWork(layer, work));

  // The cache policy sees the routing first, then the planner plans.
  DrainMigrations();
  const double now = NowUs();
  OrchestratorLayerStats delta;
  CacheStep step = RoutingStep(layer, total_rows, now);
  decisions_.clear();
  cache_->OnRouting(step, &decisions_);
  TANDEM_RETURN_IF_ERROR(ApplyDecisions(decisions_, now, &delta));
  TANDEM_RETURN_IF_ERROR(PlanLayer(layer, now));

  SplitWork(work, &delta);
  Execution execution;
  TANDEM_RETURN_IF_ERROR(Execute(layer, &execution));
  ObserveExecution(layer, execution);
  TANDEM_RETURN_IF_ERROR(AdmitExecuted(step, &delta));
  RecordLayer(layer, delta, execution, MicrosSince(start));
  return absl::OkStatus();
}

// rows_ and work_index_ for `work`, checked: each expert in range, named
// once, with a row count an int32 holds. Returns the total rows.
absl::StatusOr<int64_t> Orchestrator::IndexWork(int layer, std::span<const ExpertWork> work) {
  std::fill(rows_.begin(), rows_.end(), 0);
  std::fill(work_index_.begin(), work_index_.end(), -1);
  int64_t total_rows = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    const ExpertWork& w = work[i];
    if (w.expert < 0 || w.expert >= num_experts_) {
      return absl::InvalidArgumentError(absl::StrCat("orchestrator: layer ", layer, " work[", i, "] names expert ",
                                                     w.expert, ", outside [0, ", num_experts_, ")"));
    }
    if (work_index_[static_cast<size_t>(w.expert)] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("orchestrator: layer ", layer, " work names expert ", w.expert, " twice"));
    }
    if (w.num_rows < 0 || w.num_rows > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("orchestrator: layer ", layer, " expert ", w.expert, " has ", w.num_rows, " rows"));
    }
    work_index_[static_cast<size_t>(w.expert)] = static_cast<int>(i);
    rows_[static_cast<size_t>(w.expert)] = static_cast<int32_t>(w.num_rows);
    total_rows += w.num_rows;
  }
  return total_rows;
}

CacheStep Orchestrator::RoutingStep(int layer, int64_t total_rows, double now) const {
  CacheStep step;
  step.layer = layer;
  if (in_step_) {
    step.phase = step_prefill_ ? Phase::kPrefill : Phase::kDecode;
  } else {
    // No step context (not hooked up as an observer): more than one token
    // (K rows each) is taken for a prefill.
    step.phase = total_rows > num_experts_per_token_ ? Phase::kPrefill : Phase::kDecode;
  }
  step.rows = rows_;
  step.residency = &table_;
  step.copy_backlog_us = std::max(0.0, copy_free_at_us_ - now);
  return step;
}

// The planner's plan for the layer; its own copies queue behind everything
// already queued.
absl::Status Orchestrator::PlanLayer(int layer, double now) {
  table_.LayerStates(layer, now, &states_);
  LayerPlanInput input;
  input.layer = layer;
  input.rows = rows_;
  input.residency = states_;
  input.copy_engine_free_us = std::max(0.0, copy_free_at_us_ - now);
  input.max_new_migrations = pool_->num_staging_buffers();
  TANDEM_RETURN_IF_ERROR(planner_.Plan(input, cost_, &plan_));
  for (int e : plan_.migrations) {
    absl::Status staged = pool_->Stage({layer, e});
    if (!staged.ok()) {
      (void)pool_->ReleaseStaging();
      return staged;
    }
  }
  if (!plan_.migrations.empty()) {
    copy_free_at_us_ =
        std::max(copy_free_at_us_, now) + static_cast<double>(plan_.migrations.size()) * cost_.MigrateUs();
  }
  return absl::OkStatus();
}

// Split the work by the plan into cpu_work_ and pool_work_. The pool runs
// resident experts first (nothing to wait for), then those whose copies
// land first.
void Orchestrator::SplitWork(std::span<const ExpertWork> work, OrchestratorLayerStats* delta) {
  cpu_work_.clear();
  pool_work_.clear();
  std::vector<int> after_inflight;
  for (int e = 0; e < num_experts_; ++e) {
    const int index = work_index_[static_cast<size_t>(e)];
    if (index < 0 || rows_[static_cast<size_t>(e)] == 0) continue;
    ++delta->expert_runs;
    switch (plan_.experts[static_cast<size_t>(e)].placement) {
      case ExpertPlacement::kIdle: break;
      case ExpertPlacement::kGpuResident:
        ++delta->gpu_hits;
        pool_work_.push_back(work[static_cast<size_t>(index)]);
        break;
      case ExpertPlacement::kGpuAfterInflight:
        ++delta->inflight_waits;
        after_inflight.push_back(e);
        break;
      case ExpertPlacement::kMigrateThenGpu: ++delta->planner_migrations; break;
      case ExpertPlacement::kCpu:
        ++delta->cpu_runs;
        cpu_work_.push_back(work[static_cast<size_t>(index)]);
        break;
    }
  }
  std::sort(after_inflight.begin(), after_inflight.end(), [&](int a, int b) {
    return plan_.experts[static_cast<size_t>(a)].gpu_ready_us < plan_.experts[static_cast<size_t>(b)].gpu_ready_us;
  });
  for (int e : after_inflight) pool_work_.push_back(work[static_cast<size_t>(work_index_[static_cast<size_t>(e)])]);
  for (int e : plan_.migrations) pool_work_.push_back(work[static_cast<size_t>(work_index_[static_cast<size_t>(e)])]);
}

// CPU and pool. Sequentially the CPU goes first, so copies in flight land
// meanwhile. On failure the staged copies are released.
absl::Status Orchestrator::Execute(int layer, Execution* execution) {
  const auto exec_start = std::chrono::steady_clock::now();
  absl::Status cpu_status, pool_status;
  const bool overlap = cpu_lane_ != nullptr && !cpu_work_.empty() && !pool_work_.empty();
  if (overlap) {
    cpu_lane_->Start(layer, cpu_work_);
  } else if (!cpu_work_.empty()) {
    cpu_status = RunCpu(layer, cpu_work_, &execution->cpu_us);
  }
  if (cpu_status.ok() && !pool_work_.empty()) pool_status = pool_->RunExperts(layer, pool_work_, &execution->pool);
  if (overlap) cpu_status = cpu_lane_->Wait(&execution->cpu_us);
  execution->measured_us = MicrosSince(exec_start);
  if (!cpu_status.ok() || !pool_status.ok()) {
    (void)pool_->ReleaseStaging();
    return cpu_status.ok() ? pool_status : cpu_status;
  }
  return absl::OkStatus();
}

// The measurements refine the cost model (refine_online) and score its makespan.
void Orchestrator::ObserveExecution(int layer, const Execution& execution) {
  if (options_.refine_online) {
    if (!cpu_work_.empty()) ObserveCpu(layer, cpu_work_, execution.cpu_us);
    if (!pool_work_.empty() && execution.pool.compute_us > 0) {
      observed_rows_.clear();
      for (const ExpertWork& w : pool_work_) observed_rows_.push_back(static_cast<int32_t>(w.num_rows));
      cost_.ObserveGpu(observed_rows_, execution.pool.compute_us);
    }
  }
  cost_.ObserveMakespan(plan_.makespan_us, execution.measured_us);
}

// Admissions: the cache policy may keep what the plan copied. The staged
// copies are released either way.
absl::Status Orchestrator::AdmitExecuted(CacheStep& step, OrchestratorLayerStats* delta) {
  DrainMigrations();
  const double after = NowUs();
  step.copy_backlog_us = std::max(0.0, copy_free_at_us_ - after);
  decisions_.clear();
  cache_->OnExecuted(step, plan_, &decisions_);
  absl::Status applied = ApplyDecisions(decisions_, after, delta);
  absl::Status released = pool_->ReleaseStaging();
  TANDEM_RETURN_IF_ERROR(applied);
  return released;
}

void Orchestrator::RecordLayer(int layer, const OrchestratorLayerStats& delta, const Execution& execution,
                               double total_us) {
  absl::MutexLock lock(&stats_mutex_);
  ++stats_.layer_plans;
  Add(delta, &stats_.total);
  Add(delta, &stats_.layers[static_cast<size_t>(layer)]);
  stats_.total.expert_us += execution.measured_us;
  stats_.layers[static_cast<size_t>(layer)].expert_us += execution.measured_us;
  const size_t row = static_cast<size_t>(layer) * static_cast<size_t>(num_experts_);
  for (const ExpertWork& w : cpu_work_) ++stats_.expert_cpu_runs[row + static_cast<size_t>(w.expert)];
  for (const ExpertWork& w : pool_work_) ++stats_.expert_gpu_runs[row + static_cast<size_t>(w.expert)];
  SnapshotResidency(layer);
  stats_.plan_us += total_us - execution.measured_us;
  stats_.predicted_makespan_us += plan_.makespan_us;
  stats_.measured_makespan_us += execution.measured_us;
  stats_.cpu_us += execution.cpu_us;
  stats_.pool_wait_us += execution.pool.wait_us;
  stats_.pool_compute_us += execution.pool.compute_us;
  stats_.accuracy = cost_.Stats();
  stats_.cost_model = cost_.params();
}

OrchestratorStats Orchestrator::stats() const {
  OrchestratorStats s;
  {
    absl::MutexLock lock(&stats_mutex_);
    s = stats_;
  }
  s.pool = pool_->stats();
  if (precalc_ != nullptr) s.precalc = precalc_->stats();
  return s;
}

void Orchestrator::ResetStats() {
  {
    absl::MutexLock lock(&stats_mutex_);
    OrchestratorStats fresh;
    fresh.pool_kind = stats_.pool_kind;
    fresh.execution_policy = stats_.execution_policy;
    fresh.cache_policy = stats_.cache_policy;
    fresh.placement = stats_.placement;
    fresh.num_slots = stats_.num_slots;
    fresh.num_staging_buffers = stats_.num_staging_buffers;
    fresh.placed = stats_.placed;
    fresh.layers.assign(stats_.layers.size(), OrchestratorLayerStats{});
    fresh.num_experts = stats_.num_experts;
    fresh.residency = stats_.residency;  // where experts are is no count
    fresh.expert_gpu_runs.assign(stats_.expert_gpu_runs.size(), 0);
    fresh.expert_cpu_runs.assign(stats_.expert_cpu_runs.size(), 0);
    fresh.accuracy = cost_.Stats();
    fresh.cost_model = cost_.params();
    stats_ = std::move(fresh);
  }
  pool_->ResetStats();
  if (precalc_ != nullptr) precalc_->ResetStats();
}

}  // namespace tandem
