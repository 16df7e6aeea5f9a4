#include "coordinator/orchestration/planner/synthetic_trace.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, " ", what));
}

// How often a fresh pick lands in a given set of K experts by chance.
double ChanceOverlap(const SyntheticTraceOptions& o) {
  return static_cast<double>(o.num_experts_per_token) / o.num_experts;
}

// Routes tokens one at a time. Each of a token's K experts in layer l is,
// with probability copy_token, one the previous token used in layer l; else
// with probability copy_layer one this token used in layer l-1; else a fresh
// draw from the layer's weights. Fresh draws land in those sets by chance
// (K/E), so the copy probabilities are (target - K/E) / (1 - K/E).
class TokenRouter {
 public:
  TokenRouter(const SyntheticTraceOptions& o, std::mt19937_64* rng)
      : o_(o),
        rng_(rng),
        copy_token_(std::max(0.0, (o.token_reuse - ChanceOverlap(o)) / (1 - ChanceOverlap(o)))),
        copy_layer_(std::max(0.0, (o.layer_same_id - ChanceOverlap(o)) / (1 - ChanceOverlap(o)))) {}

  using Sets = std::vector<std::vector<int>>;  // [L][<= K]

  // Routes one token given the previous token's sets (updated in place) and
  // adds its rows to `rows` [L * E].
  void Route(const std::vector<double>& weights, Sets* previous, std::vector<int32_t>* rows) {
    Sets current(static_cast<size_t>(o_.num_layers));
    for (int l = 0; l < o_.num_layers; ++l) {
      std::vector<int>& chosen = current[static_cast<size_t>(l)];
      for (int j = 0; j < o_.num_experts_per_token; ++j) {
        const double u = uniform_(*rng_);
        int pick = -1;
        if (u < copy_token_) {
          pick = PickFrom((*previous)[static_cast<size_t>(l)], chosen);
        } else if (u < copy_token_ + copy_layer_ && l > 0) {
          pick = PickFrom(current[static_cast<size_t>(l) - 1], chosen);
        }
        if (pick < 0) pick = Draw(weights, l, chosen);
        chosen.push_back(pick);
        ++(*rows)[static_cast<size_t>(l) * static_cast<size_t>(o_.num_experts) + static_cast<size_t>(pick)];
      }
    }
    *previous = std::move(current);
  }

 private:
  int PickFrom(const std::vector<int>& set, const std::vector<int>& chosen) {
    int candidates[64];
    int n = 0;
    for (int e : set) {
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end() && n < 64) candidates[n++] = e;
    }
    if (n == 0) return -1;
    return candidates[std::uniform_int_distribution<int>(0, n - 1)(*rng_)];
  }

  int Draw(const std::vector<double>& weights, int layer, const std::vector<int>& chosen) {
    const double* w = weights.data() + static_cast<size_t>(layer) * static_cast<size_t>(o_.num_experts);
    double total = 0;
    for (int e = 0; e < o_.num_experts; ++e) {
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) total += w[e];
    }
    double x = uniform_(*rng_) * total;
    int last = -1;
    for (int e = 0; e < o_.num_experts; ++e) {
      if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
      last = e;
      x -= w[e];
      if (x < 0) return e;
    }
    return last;
  }

  const SyntheticTraceOptions& o_;
  std::mt19937_64* rng_;
  double copy_token_;
  double copy_layer_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

}  // namespace

absl::Status SyntheticTraceOptions::Validate() const {
  if (num_layers < 1) return Bad("num_layers", absl::StrCat("must be >= 1, got ", num_layers));
  if (num_experts < 1) return Bad("num_experts", absl::StrCat("must be >= 1, got ", num_experts));
  if (num_experts_per_token < 1 || num_experts_per_token > num_experts || num_experts_per_token > 64) {
    return Bad("num_experts_per_token",
               absl::StrCat("must be in [1, min(num_experts, 64)], got ", num_experts_per_token));
  }
  if (num_sequences < 1) return Bad("num_sequences", absl::StrCat("must be >= 1, got ", num_sequences));
  if (prompt_tokens < 0) return Bad("prompt_tokens", absl::StrCat("must be >= 0, got ", prompt_tokens));
  if (decode_steps < 0) return Bad("decode_steps", absl::StrCat("must be >= 0, got ", decode_steps));
  if (decode_rows_per_step < 1)
    return Bad("decode_rows_per_step", absl::StrCat("must be >= 1, got ", decode_rows_per_step));
  if (!(popularity_mean > 0 && popularity_mean <= 1)) return Bad("popularity_mean", "must be in (0, 1]");
  if (!(popularity_sd >= 0)) return Bad("popularity_sd", "must be >= 0");
  if (!(token_reuse >= 0 && token_reuse <= 1)) return Bad("token_reuse", "must be in [0, 1]");
  if (!(layer_same_id >= 0 && layer_same_id <= 1)) return Bad("layer_same_id", "must be in [0, 1]");
  const double chance = static_cast<double>(num_experts_per_token) / num_experts;
  if (chance < 1 && (std::max(0.0, token_reuse - chance) + std::max(0.0, layer_same_id - chance)) / (1 - chance) > 1) {
    return Bad("token_reuse", "plus layer_same_id leave no room for fresh draws");
  }
  if (!(sequence_skew >= 0) || !(phase_drift >= 0)) return Bad("sequence_skew", "and phase_drift must be >= 0");
  return absl::OkStatus();
}

absl::StatusOr<RoutingTrace> GenerateSyntheticTrace(const SyntheticTraceOptions& o) {
  TANDEM_RETURN_IF_ERROR(o.Validate());
  const size_t cells = static_cast<size_t>(o.num_layers) * static_cast<size_t>(o.num_experts);
  // Model-wide popularity relative to the top expert (Fiddler App. C).
  std::mt19937_64 model_rng(o.model_seed);
  std::normal_distribution<double> popularity(o.popularity_mean, o.popularity_sd);
  std::vector<double> base(cells);
  for (double& p : base) p = std::clamp(popularity(model_rng), 0.05, 1.0);
  *std::max_element(base.begin(), base.end()) = 1.0;
  std::mt19937_64 rng(o.seed);

  RoutingTrace trace;
  trace.num_layers = o.num_layers;
  trace.num_experts = o.num_experts;
  trace.num_experts_per_token = o.num_experts_per_token;
  TokenRouter router(o, &rng);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (int s = 0; s < o.num_sequences; ++s) {
    std::vector<double> prefill_weights(cells), decode_weights(cells);
    for (size_t i = 0; i < cells; ++i) {
      prefill_weights[i] = base[i] * std::exp(o.sequence_skew * normal(rng));
      decode_weights[i] = prefill_weights[i] * std::exp(o.phase_drift * normal(rng));
    }
    TokenRouter::Sets previous(static_cast<size_t>(o.num_layers));
    if (o.prompt_tokens > 0) {
      TraceStep step{Phase::kPrefill, s, o.prompt_tokens, std::vector<int32_t>(cells, 0)};
      for (int t = 0; t < o.prompt_tokens; ++t) router.Route(prefill_weights, &previous, &step.rows);
      trace.steps.push_back(std::move(step));
    }
    // Each decode row (beam, or sequence of a batch) continues from the prompt.
    std::vector<TokenRouter::Sets> chains(static_cast<size_t>(o.decode_rows_per_step), previous);
    for (int t = 0; t < o.decode_steps; ++t) {
      TraceStep step{Phase::kDecode, s, o.decode_rows_per_step, std::vector<int32_t>(cells, 0)};
      for (TokenRouter::Sets& chain : chains) router.Route(decode_weights, &chain, &step.rows);
      trace.steps.push_back(std::move(step));
    }
  }
  return trace;
}

TraceStats MeasureTrace(const RoutingTrace& trace) {
  TraceStats stats;
  const size_t L = static_cast<size_t>(trace.num_layers), E = static_cast<size_t>(trace.num_experts);
  if (L == 0 || E == 0) return stats;
  const ExpertUsage usage = TraceUsage(trace);
  const double top = *std::max_element(usage.tokens.begin(), usage.tokens.end());
  if (top > 0) {
    double sum = 0, sum_sq = 0;
    for (double t : usage.tokens) {
      sum += t / top;
      sum_sq += (t / top) * (t / top);
    }
    const double n = static_cast<double>(usage.tokens.size());
    stats.popularity_mean = sum / n;
    stats.popularity_sd = std::sqrt(std::max(0.0, sum_sq / n - stats.popularity_mean * stats.popularity_mean));
  }
  // Reuse statistics from single-row decode steps, where rows are one token's routing.
  int64_t reuse_total = 0, reused = 0, layer_total = 0, same = 0;
  for (size_t i = 0; i < trace.steps.size(); ++i) {
    const TraceStep& step = trace.steps[i];
    if (step.phase != Phase::kDecode || step.tokens != 1) continue;
    const TraceStep* previous = i > 0 ? &trace.steps[i - 1] : nullptr;
    const bool has_previous = previous != nullptr && previous->phase == Phase::kDecode && previous->tokens == 1 &&
                              previous->sequence == step.sequence;
    for (size_t l = 0; l < L; ++l) {
      for (size_t e = 0; e < E; ++e) {
        if (step.rows[l * E + e] == 0) continue;
        if (has_previous) {
          ++reuse_total;
          reused += previous->rows[l * E + e] > 0;
        }
        if (l > 0) {
          ++layer_total;
          same += step.rows[(l - 1) * E + e] > 0;
        }
      }
    }
  }
  stats.token_reuse = reuse_total > 0 ? static_cast<double>(reused) / static_cast<double>(reuse_total) : 0;
  stats.layer_same_id = layer_total > 0 ? static_cast<double>(same) / static_cast<double>(layer_total) : 0;
  // DAOP Eq. 1 per sequence: mean over layers of cos(P_l, D_l).
  std::vector<double> prefill(L * E), decode(L * E);
  double cosine_sum = 0;
  int sequences = 0;
  size_t i = 0;
  while (i < trace.steps.size()) {
    const int sequence = trace.steps[i].sequence;
    std::fill(prefill.begin(), prefill.end(), 0.0);
    std::fill(decode.begin(), decode.end(), 0.0);
    bool has_prefill = false, has_decode = false;
    for (; i < trace.steps.size() && trace.steps[i].sequence == sequence; ++i) {
      const TraceStep& step = trace.steps[i];
      std::vector<double>& into = step.phase == Phase::kPrefill ? prefill : decode;
      (step.phase == Phase::kPrefill ? has_prefill : has_decode) = true;
      for (size_t c = 0; c < L * E; ++c) into[c] += step.rows[c];
    }
    if (!has_prefill || !has_decode) continue;
    double layers_sum = 0;
    for (size_t l = 0; l < L; ++l) {
      double dot = 0, np = 0, nd = 0;
      for (size_t e = 0; e < E; ++e) {
        dot += prefill[l * E + e] * decode[l * E + e];
        np += prefill[l * E + e] * prefill[l * E + e];
        nd += decode[l * E + e] * decode[l * E + e];
      }
      layers_sum += np > 0 && nd > 0 ? dot / std::sqrt(np * nd) : 0;
    }
    cosine_sum += layers_sum / static_cast<double>(L);
    ++sequences;
  }
  stats.prefill_decode_cosine = sequences > 0 ? cosine_sum / sequences : 0;
  return stats;
}

ExpertUsage TraceUsage(const RoutingTrace& trace) {
  ExpertUsage usage{
      trace.num_layers, trace.num_experts,
      std::vector<double>(static_cast<size_t>(trace.num_layers) * static_cast<size_t>(trace.num_experts), 0.0)};
  for (const TraceStep& step : trace.steps) {
    for (size_t c = 0; c < usage.tokens.size(); ++c) usage.tokens[c] += step.rows[c];
  }
  return usage;
}

}  // namespace tandem
