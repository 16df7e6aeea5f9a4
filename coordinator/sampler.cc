#include "coordinator/sampler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

double LogSumExp(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  return max_logit + std::log(sum);
}

int32_t Argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

absl::Status SamplingParams::Validate() const {
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
  return absl::OkStatus();
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt_ids)
    : params_(params), rng_(params.seed) {
  if (params_.repetition_penalty != 1.0f) prompt_tokens_.insert(prompt_ids.begin(), prompt_ids.end());
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
  const std::span<const float> logits = Penalized(raw_logits);
  int32_t id = 0;
  if (params_.temperature == 0.0f) {
    id = Argmax(logits);
  } else {
    id = SampleFiltered(logits);
  }
  if (params_.has_penalties()) ++generated_counts_[id];
  return id;
}

int32_t Sampler::SampleFiltered(std::span<const float> logits) {
  // Candidates sorted by logit, cut by top-k, then by top-p over the
  // temperature-scaled probabilities.
  candidates_.clear();
  for (size_t i = 0; i < logits.size(); ++i) candidates_.emplace_back(logits[i], static_cast<int32_t>(i));
  size_t keep = candidates_.size();
  if (params_.top_k > 0) keep = std::min(keep, static_cast<size_t>(params_.top_k));
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<ptrdiff_t>(keep), candidates_.end(),
                    by_logit);
  candidates_.resize(keep);
  const double max_logit = candidates_[0].first;
  std::vector<double> probs(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].first - max_logit) / params_.temperature);
    sum += probs[i];
  }
  if (params_.top_p < 1.0f) {
    double cumulative = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / sum;
      if (cumulative >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    probs.resize(cut);
  }
  if (params_.min_p > 0.0f) {
    // probs[0] is the most likely token's (sorted); the rest are cut below min_p of it.
    const double floor = probs[0] * params_.min_p;
    size_t cut = 1;
    while (cut < probs.size() && probs[cut] >= floor) ++cut;
    probs.resize(cut);
  }
  std::discrete_distribution<size_t> pick(probs.begin(), probs.end());
  return candidates_[pick(rng_)].second;
}

absl::Status CheckFiniteLogits(std::span<const float> logits) {
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
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  const size_t keep = std::min(ids.size(), static_cast<size_t>(std::max(k, 0)));
  std::partial_sort(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(keep), ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<std::pair<int32_t, double>> out;
  for (size_t i = 0; i < keep; ++i) out.emplace_back(ids[i], logits[ids[i]] - lse);
  return out;
}

}  // namespace tandem
