#include "tests/beam_reference_testlib.h"

#include <algorithm>
#include <cmath>

namespace tandem {
namespace {

// log p(token | prompt + ids) for every token, recomputed from scratch.
absl::StatusOr<std::vector<double>> NextLogprobs(const ReferenceModel& model, const std::vector<int32_t>& prompt,
                                                 const std::vector<int32_t>& ids) {
  std::vector<int32_t> sequence = prompt;
  sequence.insert(sequence.end(), ids.begin(), ids.end());
  absl::StatusOr<ReferenceForward> forward = model.Forward(sequence);
  if (!forward.ok()) return forward.status();
  const double* last = forward->logits.row(forward->logits.rows - 1);
  const int64_t vocab = forward->logits.cols;
  double max = last[0];
  for (int64_t v = 1; v < vocab; ++v) max = std::max(max, last[v]);
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(last[v] - max);
  std::vector<double> out(static_cast<size_t>(vocab));
  for (int64_t v = 0; v < vocab; ++v) out[v] = last[v] - max - std::log(sum);
  return out;
}

double Score(const NaiveBeamParams& p, double sum_logprob, size_t length) {
  return sum_logprob / std::pow(static_cast<double>(length), p.length_penalty);
}

}  // namespace

absl::StatusOr<std::vector<NaiveBeam>> NaiveBeamSearch(const ReferenceModel& model, const std::vector<int32_t>& prompt,
                                                       const NaiveBeamParams& params) {
  const size_t width = static_cast<size_t>(params.beam_width);
  std::vector<NaiveBeam> live(1);
  std::vector<NaiveBeam> finished;
  auto is_end = [&](int32_t t) {
    return std::find(params.end_ids.begin(), params.end_ids.end(), t) != params.end_ids.end();
  };
  auto add_finished = [&](NaiveBeam beam) {
    finished.push_back(std::move(beam));
    std::stable_sort(finished.begin(), finished.end(),
                     [](const NaiveBeam& a, const NaiveBeam& b) { return a.score > b.score; });
    if (finished.size() > width) finished.pop_back();
  };
  bool done = false;
  for (int step = 1; step <= params.max_tokens && !done; ++step) {
    struct Candidate {
      double sum_logprob;
      size_t beam;
      int32_t token;
    };
    std::vector<Candidate> all;
    for (size_t b = 0; b < live.size(); ++b) {  // one beam at a time
      absl::StatusOr<std::vector<double>> logprobs = NextLogprobs(model, prompt, live[b].ids);
      if (!logprobs.ok()) return logprobs.status();
      for (size_t t = 0; t < logprobs->size(); ++t) {
        all.push_back({live[b].sum_logprob + (*logprobs)[t], b, static_cast<int32_t>(t)});
      }
    }
    std::sort(all.begin(), all.end(), [](const Candidate& a, const Candidate& b) {
      if (a.sum_logprob != b.sum_logprob) return a.sum_logprob > b.sum_logprob;
      if (a.beam != b.beam) return a.beam < b.beam;
      return a.token < b.token;
    });
    std::vector<NaiveBeam> next;
    for (size_t rank = 0; rank < std::min(all.size(), 2 * width) && next.size() < width; ++rank) {
      NaiveBeam beam = live[all[rank].beam];
      beam.ids.push_back(all[rank].token);
      beam.sum_logprob = all[rank].sum_logprob;
      if (is_end(all[rank].token)) {
        if (rank < width) {
          beam.score = Score(params, beam.sum_logprob, beam.ids.size());
          beam.ended_by_token = true;
          add_finished(std::move(beam));
        }
      } else {
        next.push_back(std::move(beam));
      }
    }
    live = std::move(next);
    if (live.empty()) {
      done = true;
    } else if (finished.size() >= width) {
      done = params.early_stopping ||
             finished.back().score >= Score(params, live.front().sum_logprob, static_cast<size_t>(step));
    }
    if (!done && step == params.max_tokens) {
      for (NaiveBeam& beam : live) {
        beam.score = Score(params, beam.sum_logprob, beam.ids.size());
        add_finished(std::move(beam));
      }
    }
  }
  if (finished.size() > static_cast<size_t>(params.num_return_sequences)) {
    finished.resize(static_cast<size_t>(params.num_return_sequences));
  }
  return finished;
}

}  // namespace tandem
