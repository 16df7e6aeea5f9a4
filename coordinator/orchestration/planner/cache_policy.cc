#include "coordinator/orchestration/planner/cache_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

absl::Status CheckTableShape(const ResidencyTable& table, int num_layers, int num_experts, const std::string& policy) {
  if (table.num_layers() != num_layers || table.num_experts() != num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(policy, " policy was made for ", num_layers, " layers x ",
                                                   num_experts, " experts but the residency table has ",
                                                   table.num_layers(), " x ", table.num_experts()));
  }
  return absl::OkStatus();
}

// Experts by rows descending, ties by id: the larger batch is served first.
void SortByRowsDescending(std::span<const int32_t> rows, std::vector<int>* experts) {
  std::sort(experts->begin(), experts->end(), [&](int a, int b) {
    const int32_t ra = rows[static_cast<size_t>(a)], rb = rows[static_cast<size_t>(b)];
    return ra != rb ? ra > rb : a < b;
  });
}

}  // namespace

absl::Status ApplyCacheDecisions(std::span<const CacheDecision> decisions, double now_us, double migrate_us,
                                 double* copy_engine_free_at_us, ResidencyTable* table) {
  for (const CacheDecision& d : decisions) {
    if (d.kind == CacheDecision::Kind::kMigrate) {
      const double ready = std::max(now_us, *copy_engine_free_at_us) + migrate_us;
      TANDEM_RETURN_IF_ERROR(table->BeginMigration(d.expert, ready, d.evict));
      *copy_engine_free_at_us = ready;
    } else {
      TANDEM_RETURN_IF_ERROR(table->Admit(d.expert, d.evict));
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- lru

absl::StatusOr<std::unique_ptr<LruCachePolicy>> LruCachePolicy::Create(const LruOptions& options, int num_layers,
                                                                       int num_experts) {
  if (num_layers < 1) return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 1, got ", num_layers));
  if (num_experts < 1) return absl::InvalidArgumentError(absl::StrCat("num_experts must be >= 1, got ", num_experts));
  if (options.num_ways < 1 || options.num_ways > num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("lru num_ways must be in [1, ", num_experts, "] (experts per layer), got ", options.num_ways));
  }
  if (options.num_indexes < 0 || options.num_indexes > num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("lru num_indexes must be in [0, ", num_layers, "] (layers), got ", options.num_indexes));
  }
  return std::unique_ptr<LruCachePolicy>(new LruCachePolicy(options, num_layers, num_experts));
}

LruCachePolicy::LruCachePolicy(const LruOptions& options, int num_layers, int num_experts)
    : options_(options),
      num_layers_(num_layers),
      num_experts_(num_experts),
      last_use_(static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts), 0) {}

absl::Status LruCachePolicy::Reset(const ResidencyTable& residency) {
  TANDEM_RETURN_IF_ERROR(CheckTableShape(residency, num_layers_, num_experts_, "lru"));
  std::fill(last_use_.begin(), last_use_.end(), 0);
  clock_ = 0;
  return absl::OkStatus();
}

bool LruCachePolicy::Insert(const CacheStep& step, int expert, CacheDecision::Kind kind,
                            std::vector<CacheDecision>* decisions) {
  const ResidencyTable& table = *step.residency;
  const int layer = step.layer;
  const bool way_free = table.UsedInLayer(layer) + pending_layer_new_ < options_.num_ways;
  const bool slot_free = table.free_slots() - pending_new_ > 0;
  if (way_free && slot_free) {
    decisions->push_back({kind, {layer, expert}, std::nullopt});
    ++pending_new_;
    ++pending_layer_new_;
    last_use_[Index({layer, expert})] = clock_;
    return true;
  }
  // The least recently used way that is resident (a copy in flight cannot
  // be overwritten), not in use in this step, not already chosen.
  int victim = -1;
  for (int v = 0; v < num_experts_; ++v) {
    if (table.residency({layer, v}) != Residency::kResident) continue;
    if (step.rows[static_cast<size_t>(v)] > 0) continue;
    if (std::find(pending_victims_.begin(), pending_victims_.end(), v) != pending_victims_.end()) continue;
    if (victim < 0 || last_use_[Index({layer, v})] < last_use_[Index({layer, victim})]) victim = v;
  }
  if (victim < 0) return false;
  decisions->push_back({kind, {layer, expert}, ExpertKey{layer, victim}});
  pending_victims_.push_back(victim);
  last_use_[Index({layer, expert})] = clock_;
  return true;
}

void LruCachePolicy::OnRouting(const CacheStep& step, std::vector<CacheDecision>* decisions) {
  if (step.layer < 0 || step.layer >= options_.num_indexes) return;  // beyond the cache's coverage: CPU only
  ++clock_;
  pending_new_ = pending_layer_new_ = 0;
  pending_victims_.clear();
  misses_.clear();
  const ResidencyTable& table = *step.residency;
  for (int e = 0; e < num_experts_; ++e) {
    if (step.rows[static_cast<size_t>(e)] <= 0) continue;
    if (table.residency({step.layer, e}) == Residency::kAbsent) {
      misses_.push_back(e);
    } else {
      last_use_[Index({step.layer, e})] = clock_;  // a hit (or a copy on its way): most recent
    }
  }
  SortByRowsDescending(step.rows, &misses_);
  // Post-fetch: the planner runs a miss on the CPU now; its weights are
  // copied for the tokens after this one.
  for (int e : misses_) Insert(step, e, CacheDecision::Kind::kMigrate, decisions);
}

void LruCachePolicy::OnExecuted(const CacheStep& step, const LayerPlan& plan, std::vector<CacheDecision>* decisions) {
  if (step.layer < 0 || step.layer >= options_.num_indexes) return;
  pending_new_ = pending_layer_new_ = 0;
  pending_victims_.clear();
  misses_.clear();
  for (size_t e = 0; e < plan.experts.size(); ++e) {
    if (plan.experts[e].placement == ExpertPlacement::kMigrateThenGpu &&
        step.residency->residency({step.layer, static_cast<int>(e)}) == Residency::kAbsent) {
      misses_.push_back(static_cast<int>(e));
    }
  }
  SortByRowsDescending(step.rows, &misses_);
  // The planner already copied these: keeping them is a free post-fetch.
  for (int e : misses_) Insert(step, e, CacheDecision::Kind::kAdmit, decisions);
}

// ---------------------------------------------------------------- sequence

absl::StatusOr<std::unique_ptr<SequenceCachePolicy>> SequenceCachePolicy::Create(const SequenceOptions& options) {
  if (!std::isfinite(options.swap_threshold) || options.swap_threshold < 1 || options.swap_threshold > 1e6) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence swap_threshold must be in [1, 1e6], got ", options.swap_threshold));
  }
  if (!(options.swap_fraction > 0 && options.swap_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sequence swap_fraction must be in (0, 1], got ", options.swap_fraction));
  }
  return std::unique_ptr<SequenceCachePolicy>(new SequenceCachePolicy(options));
}

bool SequenceCachePolicy::AtLeastRatio(int64_t hot, int64_t cold, double threshold) {
  constexpr int64_t kPartsPerUnit = 1'000'000;
  const int64_t threshold_ppm = std::llround(threshold * kPartsPerUnit);
  return static_cast<__int128>(hot) * kPartsPerUnit >= static_cast<__int128>(threshold_ppm) * cold;
}

// DAOP Algorithm 1, lines 5-13, for the layer in `step`.
void SequenceCachePolicy::OnRouting(const CacheStep& step, std::vector<CacheDecision>* decisions) {
  if (step.phase != Phase::kPrefill) return;  // migrations only during prefill; decode keeps the layout
  const ResidencyTable& table = *step.residency;
  const int num_experts = static_cast<int>(step.rows.size());
  const int swap_num = static_cast<int>(std::floor(options_.swap_fraction * num_experts));
  hot_.clear();
  cold_.clear();
  for (int e = 0; e < num_experts; ++e) {
    const Residency r = table.residency({step.layer, e});
    // Hot: active CPU experts. Cold: GPU experts, idle ones first; a copy in
    // flight is not swapped out again.
    if (r == Residency::kAbsent && step.rows[static_cast<size_t>(e)] > 0) hot_.push_back(e);
    if (r == Residency::kResident) cold_.push_back(e);
  }
  SortByRowsDescending(step.rows, &hot_);                    // getTopKActiveExperts(ExpsCPU, SwapNum)
  std::sort(cold_.begin(), cold_.end(), [&](int a, int b) {  // getBottomKActiveExperts(ExpsGPU, SwapNum)
    const int32_t ra = step.rows[static_cast<size_t>(a)], rb = step.rows[static_cast<size_t>(b)];
    return ra != rb ? ra < rb : a < b;
  });
  const size_t pairs = std::min({hot_.size(), cold_.size(), static_cast<size_t>(swap_num)});
  for (size_t i = 0; i < pairs; ++i) {  // zip(HotExps, ColdExps): every pair is tested
    const int hot = hot_[i], cold = cold_[i];
    if (AtLeastRatio(step.rows[static_cast<size_t>(hot)], step.rows[static_cast<size_t>(cold)],
                     options_.swap_threshold)) {
      decisions->push_back({CacheDecision::Kind::kMigrate, {step.layer, hot}, ExpertKey{step.layer, cold}});
    }
  }
}

// ---------------------------------------------------------------- adaptive

absl::Status AdaptiveOptions::Validate() const {
  if (num_experts_per_token < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("adaptive num_experts_per_token must be >= 1, got ", num_experts_per_token));
  }
  if (!(ewma_alpha > 0 && ewma_alpha <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("adaptive ewma_alpha must be in (0, 1], got ", ewma_alpha));
  }
  if (default_horizon_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("adaptive default_horizon_steps must be >= 1, got ", default_horizon_steps));
  }
  if (!std::isfinite(max_copy_backlog_us))
    return absl::InvalidArgumentError("adaptive max_copy_backlog_us must be finite");
  if (!(gain_ratio > 0) || !std::isfinite(gain_ratio)) {
    return absl::InvalidArgumentError(absl::StrCat("adaptive gain_ratio must be finite and > 0, got ", gain_ratio));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AdaptiveCachePolicy>> AdaptiveCachePolicy::Create(const AdaptiveOptions& options,
                                                                                 const CostModel* cost, int num_layers,
                                                                                 int num_experts) {
  TANDEM_RETURN_IF_ERROR(options.Validate());
  if (cost == nullptr) return absl::InvalidArgumentError("cost: the adaptive policy needs the cost model");
  if (num_layers < 1) return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 1, got ", num_layers));
  if (num_experts < 1) return absl::InvalidArgumentError(absl::StrCat("num_experts must be >= 1, got ", num_experts));
  return std::unique_ptr<AdaptiveCachePolicy>(new AdaptiveCachePolicy(options, cost, num_layers, num_experts));
}

AdaptiveCachePolicy::AdaptiveCachePolicy(const AdaptiveOptions& options, const CostModel* cost, int num_layers,
                                         int num_experts)
    : options_(options),
      cost_(cost),
      num_layers_(num_layers),
      num_experts_(num_experts),
      frequency_(static_cast<size_t>(num_layers) * static_cast<size_t>(num_experts), 0.0),
      prefill_tokens_(static_cast<size_t>(num_layers), 0.0) {
  OnSequenceStart({});
}

absl::Status AdaptiveCachePolicy::Reset(const ResidencyTable& residency) {
  TANDEM_RETURN_IF_ERROR(CheckTableShape(residency, num_layers_, num_experts_, "adaptive"));
  OnSequenceStart({});
  return absl::OkStatus();
}

void AdaptiveCachePolicy::OnSequenceStart(const SequenceInfo& info) {
  // Before any routing is seen every expert is equally likely: K of E.
  const double prior = std::min(1.0, static_cast<double>(options_.num_experts_per_token) / num_experts_);
  std::fill(frequency_.begin(), frequency_.end(), prior);
  std::fill(prefill_tokens_.begin(), prefill_tokens_.end(), 0.0);
  horizon_steps_ = info.expected_decode_steps > 0 ? info.expected_decode_steps : options_.default_horizon_steps;
  decode_steps_seen_ = 0;
  decode_rows_per_step_ = std::max(1, info.decode_rows_per_step);
}

void AdaptiveCachePolicy::Observe(const CacheStep& step) {
  int64_t total_rows = 0;
  for (int32_t s : step.rows) total_rows += std::max(0, s);
  if (total_rows == 0) return;
  const double tokens = std::max(1.0, static_cast<double>(total_rows) / options_.num_experts_per_token);
  double& seen = prefill_tokens_[static_cast<size_t>(step.layer)];
  for (int e = 0; e < num_experts_; ++e) {
    const double rows = std::max(0, step.rows[static_cast<size_t>(e)]);
    double& f = frequency_[Index({step.layer, e})];
    if (step.phase == Phase::kPrefill) {
      // The prompt's own frequencies, token-weighted over prefill chunks:
      // they predict decode's (DAOP Table II, ~90% cosine similarity).
      f = (f * seen + std::min(rows, tokens)) / (seen + tokens);
    } else {
      f = (1 - options_.ewma_alpha) * f + options_.ewma_alpha * std::min(1.0, rows / tokens);
    }
  }
  if (step.phase == Phase::kPrefill) {
    seen += tokens;
  } else if (step.layer == 0) {
    ++decode_steps_seen_;
  }
}

double AdaptiveCachePolicy::ExpectedSavingUs(ExpertKey key) const {
  const double p = frequency_[Index(key)];
  if (p <= 0) return 0;
  const double rows_per_step = p * decode_rows_per_step_;
  const double p_active = 1 - std::pow(1 - std::min(p, 1.0), decode_rows_per_step_);
  if (p_active <= 0) return 0;
  const double rows_when_active = std::max(1.0, rows_per_step / p_active);
  const int owner = ShardWorker(key.layer, key.expert, cost_->num_cpu_workers());
  const double saving = cost_->CpuExpertUs(rows_when_active, options_.division, owner) - cost_->GpuUs(rows_when_active);
  if (saving <= 0) return 0;
  const double remaining = static_cast<double>(std::max<int64_t>(1, horizon_steps_ - decode_steps_seen_));
  return remaining * p_active * saving;
}

std::optional<ExpertKey> AdaptiveCachePolicy::CheapestVictim(const CacheStep& step) const {
  const ResidencyTable& table = *step.residency;
  std::optional<ExpertKey> victim;
  double victim_saving = std::numeric_limits<double>::infinity();
  // During a prefill every expert of a layer the step has not reached yet
  // is about to run with many rows: evicting it would cost a copy in this
  // very step. Victims come from the layers already done.
  const int last_layer = step.phase == Phase::kPrefill ? step.layer : num_layers_ - 1;
  for (int l = 0; l <= last_layer; ++l) {
    if (table.UsedInLayer(l) == 0) continue;
    for (int e = 0; e < num_experts_; ++e) {
      const ExpertKey key{l, e};
      if (table.residency(key) != Residency::kResident) continue;
      if (l == step.layer && step.rows[static_cast<size_t>(e)] > 0) continue;  // in use now
      if (std::find(pending_victims_.begin(), pending_victims_.end(), key) != pending_victims_.end()) continue;
      const double saving = ExpectedSavingUs(key);
      if (saving < victim_saving) {
        victim_saving = saving;
        victim = key;
      }
    }
  }
  return victim;
}

void AdaptiveCachePolicy::Consider(const CacheStep& step, int expert, CacheDecision::Kind kind, double cost_us,
                                   std::vector<CacheDecision>* decisions) {
  const ExpertKey key{step.layer, expert};
  const double gain = ExpectedSavingUs(key);
  if (gain <= options_.gain_ratio * cost_us || gain <= 0) return;
  if (kind == CacheDecision::Kind::kMigrate) {
    const double max_backlog = options_.max_copy_backlog_us >= 0 ? options_.max_copy_backlog_us : cost_->MigrateUs();
    if (step.copy_backlog_us + pending_copy_us_ >= max_backlog) return;
  }
  const ResidencyTable& table = *step.residency;
  std::optional<ExpertKey> victim;
  if (table.free_slots() - pending_new_ <= 0) {
    victim = CheapestVictim(step);
    if (!victim) return;
    if (gain <= options_.gain_ratio * (cost_us + ExpectedSavingUs(*victim))) return;
    pending_victims_.push_back(*victim);
  } else {
    ++pending_new_;
  }
  if (kind == CacheDecision::Kind::kMigrate) pending_copy_us_ += cost_->MigrateUs();
  decisions->push_back({kind, key, victim});
}

void AdaptiveCachePolicy::OnRouting(const CacheStep& step, std::vector<CacheDecision>* decisions) {
  Observe(step);
  pending_new_ = 0;
  pending_copy_us_ = 0;
  pending_victims_.clear();
  candidates_.clear();
  for (int e = 0; e < num_experts_; ++e) {
    // Not only this step's experts: a frequent expert that sat this token
    // out is as worth prefetching.
    if (step.residency->residency({step.layer, e}) == Residency::kAbsent) candidates_.push_back(e);
  }
  std::sort(candidates_.begin(), candidates_.end(), [&](int a, int b) {
    const double sa = ExpectedSavingUs({step.layer, a}), sb = ExpectedSavingUs({step.layer, b});
    return sa != sb ? sa > sb : a < b;
  });
  const double migrate_us = cost_->MigrateUs();
  for (int e : candidates_) Consider(step, e, CacheDecision::Kind::kMigrate, migrate_us, decisions);
}

void AdaptiveCachePolicy::OnExecuted(const CacheStep& step, const LayerPlan& plan,
                                     std::vector<CacheDecision>* decisions) {
  pending_new_ = 0;
  pending_copy_us_ = 0;
  pending_victims_.clear();
  for (size_t e = 0; e < plan.experts.size(); ++e) {
    if (plan.experts[e].placement == ExpertPlacement::kMigrateThenGpu &&
        step.residency->residency({step.layer, static_cast<int>(e)}) == Residency::kAbsent) {
      // Already on the GPU: keeping it costs no copy, only the victim's worth.
      Consider(step, static_cast<int>(e), CacheDecision::Kind::kAdmit, 0, decisions);
    }
  }
}

// ---------------------------------------------------------------- factory

absl::StatusOr<CachePolicyKind> ParseCachePolicyKind(const std::string& name) {
  if (name == "static") return CachePolicyKind::kStatic;
  if (name == "lru") return CachePolicyKind::kLru;
  if (name == "sequence") return CachePolicyKind::kSequence;
  if (name == "adaptive") return CachePolicyKind::kAdaptive;
  return absl::InvalidArgumentError(
      absl::StrCat("cache policy \"", name, "\" is not one of static, lru, sequence, adaptive"));
}

std::string CachePolicyKindName(CachePolicyKind kind) {
  switch (kind) {
    case CachePolicyKind::kStatic: return "static";
    case CachePolicyKind::kLru: return "lru";
    case CachePolicyKind::kSequence: return "sequence";
    case CachePolicyKind::kAdaptive: return "adaptive";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<CachePolicy>> MakeCachePolicy(const CachePolicyOptions& options, int num_layers,
                                                             int num_experts, const CostModel* cost) {
  switch (options.kind) {
    case CachePolicyKind::kStatic: return std::unique_ptr<CachePolicy>(new StaticCachePolicy());
    case CachePolicyKind::kLru: {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<LruCachePolicy> lru,
                              LruCachePolicy::Create(options.lru, num_layers, num_experts));
      return std::unique_ptr<CachePolicy>(std::move(lru));
    }
    case CachePolicyKind::kSequence: {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SequenceCachePolicy> sequence,
                              SequenceCachePolicy::Create(options.sequence));
      return std::unique_ptr<CachePolicy>(std::move(sequence));
    }
    case CachePolicyKind::kAdaptive: {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<AdaptiveCachePolicy> adaptive,
                              AdaptiveCachePolicy::Create(options.adaptive, cost, num_layers, num_experts));
      return std::unique_ptr<CachePolicy>(std::move(adaptive));
    }
  }
  return absl::InvalidArgumentError("unknown cache policy kind");
}

}  // namespace tandem
