#include "coordinator/generation/beam_search.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/kernels/logit_reductions.h"

namespace tandem {

absl::Status BeamSearchParams::Validate(int64_t vocab_size) const {
  if (beam_width < 1 || beam_width > 64) {
    return absl::InvalidArgumentError(absl::StrCat("beam_width must be in [1, 64], got ", beam_width));
  }
  if (max_tokens < 1) return absl::InvalidArgumentError(absl::StrCat("max_tokens must be >= 1, got ", max_tokens));
  // Scores are sum / length^penalty: beyond +-10 they overflow to +-inf (or
  // collapse to 0) for ordinary lengths, and every beam then ties.
  if (!std::isfinite(length_penalty) || std::fabs(length_penalty) > kMaxLengthPenalty) {
    return absl::InvalidArgumentError(absl::StrCat("length_penalty must be a number in [-", kMaxLengthPenalty, ", ",
                                                   kMaxLengthPenalty, "], got ", length_penalty));
  }
  if (num_return_sequences < 1 || num_return_sequences > beam_width) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_return_sequences must be in [1, beam_width = ", beam_width, "], got ", num_return_sequences));
  }
  for (size_t i = 0; i < end_ids.size(); ++i) {
    if (end_ids[i] < 0 || end_ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("end_ids[", i, "] = ", end_ids[i], " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return ValidateLogitBias(logit_bias, vocab_size);
}

void LogSoftmax(std::span<const float> logits, std::vector<double>* out) {
  out->resize(logits.size());
  const double log_z = LogSumExp(logits);
  for (size_t i = 0; i < logits.size(); ++i) (*out)[i] = static_cast<double>(logits[i]) - log_z;
}

BeamSearchState::BeamSearchState(BeamSearchParams params) : params_(std::move(params)) { live_.push_back({}); }

double BeamSearchState::Score(double sum_logprob, size_t length) const {
  return sum_logprob / std::pow(static_cast<double>(std::max<size_t>(length, 1)), params_.length_penalty);
}

bool BeamSearchState::IsEnd(int32_t token) const {
  return std::find(params_.end_ids.begin(), params_.end_ids.end(), token) != params_.end_ids.end();
}

void BeamSearchState::AddHypothesis(BeamHypothesis hypothesis) {
  // Stable: an equal score keeps the earlier hypothesis first.
  auto at = std::upper_bound(finished_.begin(), finished_.end(), hypothesis.score,
                             [](double score, const BeamHypothesis& h) { return score > h.score; });
  finished_.insert(at, std::move(hypothesis));
  if (finished_.size() > static_cast<size_t>(params_.beam_width)) finished_.pop_back();
}

std::vector<BeamChoice> BeamSearchState::Step(std::span<const float> logits, int64_t vocab) {
  const int32_t width = params_.beam_width;
  const size_t offers_per_beam = std::min<size_t>(2 * static_cast<size_t>(width), static_cast<size_t>(vocab));
  struct Offer {
    double sum_logprob;
    int32_t beam;
    int32_t token;
  };
  std::vector<Offer> offers;
  std::vector<double> logprobs;
  std::vector<float> biased;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (size_t b = 0; b < live_.size(); ++b) {
    std::span<const float> row = logits.subspan(b * vocab, vocab);
    if (!params_.logit_bias.empty()) {
      biased.assign(row.begin(), row.end());
      ApplyLogitBias(params_.logit_bias, biased);
      row = biased;
    }
    LogSoftmax(row, &logprobs);
    for (int32_t t = 0; t < vocab; ++t) order[t] = t;
    std::partial_sort(order.begin(), order.begin() + offers_per_beam, order.end(), [&](int32_t x, int32_t y) {
      return logprobs[x] != logprobs[y] ? logprobs[x] > logprobs[y] : x < y;
    });
    for (size_t i = 0; i < offers_per_beam; ++i) {
      offers.push_back({live_[b].sum_logprob + logprobs[order[i]], static_cast<int32_t>(b), order[i]});
    }
  }
  std::stable_sort(offers.begin(), offers.end(), [](const Offer& x, const Offer& y) {
    return std::tie(y.sum_logprob, x.beam, x.token) < std::tie(x.sum_logprob, y.beam, y.token);
  });
  if (offers.size() > 2 * static_cast<size_t>(width)) offers.resize(2 * static_cast<size_t>(width));

  ++step_;
  std::vector<LiveBeam> next;
  std::vector<BeamChoice> choices;
  for (size_t rank = 0; rank < offers.size() && next.size() < static_cast<size_t>(width); ++rank) {
    const Offer& offer = offers[rank];
    std::vector<int32_t> ids = live_[offer.beam].ids;
    ids.push_back(offer.token);
    if (IsEnd(offer.token)) {
      if (rank >= static_cast<size_t>(width)) continue;
      const double score = Score(offer.sum_logprob, ids.size());
      AddHypothesis({std::move(ids), offer.sum_logprob, score, BeamEnd::kEndToken});
      continue;
    }
    next.push_back({std::move(ids), offer.sum_logprob});
    choices.push_back({offer.beam, offer.token});
  }
  live_ = std::move(next);

  if (live_.empty()) {
    done_ = true;
  } else if (finished_.size() >= static_cast<size_t>(width)) {
    const double best_live = Score(live_.front().sum_logprob, static_cast<size_t>(step_));
    done_ = params_.early_stopping || finished_.back().score >= best_live;
  }
  if (!done_ && step_ >= params_.max_tokens) {
    for (LiveBeam& beam : live_) {
      const double score = Score(beam.sum_logprob, beam.ids.size());
      AddHypothesis({std::move(beam.ids), beam.sum_logprob, score, BeamEnd::kMaxTokens});
    }
    live_.clear();
    done_ = true;
  }
  if (done_) choices.clear();
  return choices;
}

std::vector<BeamHypothesis> BeamSearchState::Results() const {
  std::vector<BeamHypothesis> out(finished_.begin(),
                                  finished_.begin() + std::min<size_t>(finished_.size(), params_.num_return_sequences));
  return out;
}

}  // namespace tandem
