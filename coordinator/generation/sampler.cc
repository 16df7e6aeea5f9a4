#include "coordinator/generation/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/kernels/logit_reductions.h"

namespace tandem {

absl::Status SamplingParams::Validate(int64_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return absl::InvalidArgumentError(absl::StrCat("temperature must be a finite number >= 0, got ", temperature));
  }
  if (top_k < 0) return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0 = off), got ", top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("top_p must be in (0, 1], got ", top_p));
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("min_p must be in [0, 1] (0 = off), got ", min_p));
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("presence_penalty must be in [-2, 2], got ", presence_penalty));
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return absl::InvalidArgumentError(absl::StrCat("frequency_penalty must be in [-2, 2], got ", frequency_penalty));
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be a finite number > 0 (1 = off), got ", repetition_penalty));
  }
  return ValidateLogitBias(logit_bias, vocab_size);
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids)
    : params_(params), rng_(params.seed) {
  if (params_.repetition_penalty != 1.0f) prompt_tokens_.insert(prompt_ids.begin(), prompt_ids.end());
  if (params_.grammar != nullptr) constraint_ = std::make_unique<GrammarConstraint>(params_.grammar);
}

std::span<const float> Sampler::Biased(std::span<const float> logits) {
  if (params_.logit_bias.empty()) return logits;
  biased_.assign(logits.begin(), logits.end());
  ApplyLogitBias(params_.logit_bias, biased_);
  return biased_;
}

std::span<const float> Sampler::Penalized(std::span<const float> logits) {
  if (!params_.has_penalties()) return logits;
  penalized_.assign(logits.begin(), logits.end());
  auto repeat = [&](int32_t id) {
    float& l = penalized_[static_cast<size_t>(id)];
    l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
  };
  for (const auto& [id, count] : generated_counts_) {
    if (id < 0 || static_cast<size_t>(id) >= penalized_.size()) continue;
    penalized_[static_cast<size_t>(id)] -= params_.presence_penalty + params_.frequency_penalty * count;
    if (params_.repetition_penalty != 1.0f) repeat(id);
  }
  for (int32_t id : prompt_tokens_) {
    if (id < 0 || static_cast<size_t>(id) >= penalized_.size() || generated_counts_.contains(id)) continue;
    repeat(id);
  }
  return penalized_;
}

int32_t Sampler::Sample(std::span<const float> raw_logits) {
  biased_view_ = Biased(raw_logits);
  const std::span<const float> logits = Penalized(biased_view_);
  const int32_t id = constraint_          ? SampleConstrained(logits)
                     : params_.temperature == 0.0f ? FirstArgmax(logits)
                                                   : SampleFiltered(logits);
  if (params_.has_penalties()) ++generated_counts_[id];
  return id;
}

// Greedy tries the model's favourites one by one (the first usually
// follows the grammar: no mask is needed); sampling masks the whole
// vocabulary and draws from what is left, so the draw is from the
// model's distribution restricted to what the grammar allows.
int32_t Sampler::SampleConstrained(std::span<const float> logits) {
  constexpr int kGreedyTries = 8;
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  int32_t id = -1;
  if (params_.temperature == 0.0f) {
    std::span<const float> view = logits;
    for (int i = 0; i < kGreedyTries && id < 0; ++i) {
      const int32_t best = FirstArgmax(view);
      if (constraint_->Allows(best)) {
        id = best;
      } else {
        if (view.data() != masked_.data()) {
          masked_.assign(logits.begin(), logits.end());
          view = masked_;
        }
        masked_[static_cast<size_t>(best)] = kBanned;
      }
    }
  }
  if (id < 0) {
    constraint_->AllowedTokens(&allowed_);
    masked_.assign(logits.begin(), logits.end());
    bool any = false;
    for (size_t i = 0; i < masked_.size(); ++i) {
      if (i >= allowed_.size() || allowed_[i] == 0) {
        masked_[i] = kBanned;
      } else {
        any = true;
      }
    }
    if (!any) {
      // Nothing follows (the vocabulary cannot spell what the grammar
      // needs): end the output rather than break the grammar.
      id = constraint_->EndId();
      return id >= 0 ? id : FirstArgmax(logits);
    }
    id = params_.temperature == 0.0f ? FirstArgmax(masked_) : SampleFiltered(masked_);
    // The vectorised exp floors a banned token's weight near 1e-38, not 0.
    if (allowed_[static_cast<size_t>(id)] == 0) id = FirstArgmax(masked_);
  }
  constraint_->Accept(id).IgnoreError();  // allowed: it follows
  return id;
}

// softmax(logits / T) cut to the top-k tokens (by logit, ties to the lower
// id), then to the shortest prefix of them whose probability reaches top_p,
// then to those within min_p of the most likely; one draw from what is left.
// No cut draws every token by its weight in id order. The vocabulary is
// never sorted (at 32K tokens a sort cost more than the model's decode
// step): top-k takes the k largest by a counting threshold (TopIndices),
// top-p alone a logit threshold holding its mass, and only a band of a
// few dozen at the edge of the cut is ordered.
int32_t Sampler::SampleFiltered(std::span<const float> logits) {
  const size_t vocab = logits.size();
  const float max_logit = MaxValue(logits);
  weights_.resize(vocab);
  const double total = ExpWeights(logits, max_logit, 1.0f / params_.temperature, weights_.data());
  const bool top_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < vocab;
  if (!top_k && params_.top_p >= 1.0f) {
    if (params_.min_p == 0.0f) {
      std::uniform_real_distribution<double> uniform(0.0, total);
      return static_cast<int32_t>(FirstCumulativeAbove(weights_, uniform(rng_)));
    }
    IndicesAtLeast(weights_, params_.min_p, kept_ids_);  // min_p alone: the top weight is 1
    return DrawFromKept();
  }
  SelectPrefix(logits, max_logit, total, top_k ? static_cast<size_t>(params_.top_k) : vocab);
  return DrawFromKept();
}

bool Sampler::ByLogit(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// kept_ids_ = the top-k tokens, cut to their top_p prefix, in any order.
void Sampler::SelectPrefix(std::span<const float> logits, float max_logit, double total, size_t k) {
  if (k < logits.size()) {
    TopIndices(logits, k, kept_ids_);  // largest first, ties to the lower id
    if (params_.top_p < 1.0f) {
      // top_p of the k tokens' own mass.
      double kept = 0.0, cumulative = 0.0;
      for (int32_t id : kept_ids_) kept += weights_[static_cast<size_t>(id)];
      size_t cut = 0;
      while (cut < kept_ids_.size() && cumulative < params_.top_p * kept)
        cumulative += weights_[static_cast<size_t>(kept_ids_[cut++])];
      kept_ids_.resize(cut);
    }
    return;
  }
  // Top-p alone: a logit threshold whose tokens hold top_p of the mass. hi
  // never does, lo does; the band of tokens between them shrinks to a few
  // dozen (ties may stop it sooner).
  const double target = params_.top_p * total;
  float hi = std::nextafter(max_logit, std::numeric_limits<float>::infinity());
  CountAndSum at_hi{}, at_lo{};
  float step = 0.5f * params_.temperature, lo = max_logit - step;
  for (;;) {
    at_lo = CountAndSumAtLeast(logits, lo, weights_.data());
    if (at_lo.sum >= target || lo == -std::numeric_limits<float>::infinity()) break;  // (-inf: all of them)
    hi = lo, at_hi = at_lo;
    step *= 2;
    lo = max_logit - step;
  }
  for (int i = 0; i < 32 && at_lo.count - at_hi.count > 48; ++i) {
    const float mid = lo + (hi - lo) / 2;
    if (mid <= lo || mid >= hi) break;
    const CountAndSum at_mid = CountAndSumAtLeast(logits, mid, weights_.data());
    if (at_mid.sum >= target) {
      lo = mid, at_lo = at_mid;
    } else {
      hi = mid, at_hi = at_mid;
    }
  }
  // Every token at or above hi is in the prefix; the band [lo, hi) is
  // ordered and walked to the cut.
  IndicesAtLeast(logits, lo, ids_);
  candidates_.clear();
  for (int32_t id : ids_) candidates_.emplace_back(logits[static_cast<size_t>(id)], id);
  const auto band =
      std::partition(candidates_.begin(), candidates_.end(), [&](const auto& c) { return c.first >= hi; });
  std::sort(band, candidates_.end(), ByLogit);
  size_t cut = static_cast<size_t>(band - candidates_.begin());
  double cumulative = at_hi.sum;
  while (cut < candidates_.size() && cumulative < target)
    cumulative += weights_[static_cast<size_t>(candidates_[cut++].second)];
  kept_ids_.clear();
  for (size_t i = 0; i < cut; ++i) kept_ids_.push_back(candidates_[i].second);
}

// One draw among kept_ids_ (never empty: the top token is kept) by weight,
// after min_p's floor (the top token's weight is 1, and it always passes).
int32_t Sampler::DrawFromKept() {
  size_t n = 0;
  int32_t top = kept_ids_.empty() ? 0 : kept_ids_[0];
  for (int32_t id : kept_ids_) {
    const float w = weights_[static_cast<size_t>(id)];
    if (w > weights_[static_cast<size_t>(top)]) top = id;
    if (w >= params_.min_p) kept_ids_[n++] = id;
  }
  if (n == 0) return top;
  kept_ids_.resize(n);
  kept_.resize(n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += kept_[i] = weights_[static_cast<size_t>(kept_ids_[i])];
  std::uniform_real_distribution<double> uniform(0.0, sum);
  return kept_ids_[std::min(FirstCumulativeAbove(kept_, uniform(rng_)), n - 1)];
}

absl::Status CheckFiniteLogits(std::span<const float> logits) {
  if (AllFinite(logits)) return absl::OkStatus();
  size_t nan = 0, inf = 0, first = logits.size();
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isfinite(logits[i])) continue;
    (std::isnan(logits[i]) ? nan : inf) += 1;
    if (first == logits.size()) first = i;
  }
  if (first == logits.size()) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "the model produced non-finite logits (", nan, " NaN, ", inf, " Inf of ", logits.size(), "; first at index ",
      first, " = ", logits[first], "): its weights hold NaN or Inf, or its activations overflowed; no token sampled"));
}

double LogProbability(std::span<const float> logits, int32_t id) {
  return logits[static_cast<size_t>(id)] - LogSumExp(logits);
}

std::vector<std::pair<int32_t, double>> TopLogprobs(std::span<const float> logits, int32_t k) {
  const double lse = LogSumExp(logits);
  std::vector<int32_t> ids;
  TopIndices(logits, static_cast<size_t>(std::max(k, 0)), ids);
  std::vector<std::pair<int32_t, double>> out;
  for (int32_t id : ids) out.emplace_back(id, logits[static_cast<size_t>(id)] - lse);
  return out;
}

}  // namespace tandem
