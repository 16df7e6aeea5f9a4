#include "coordinator/runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/status_macros.h"
#include "coordinator/engine/kv_cache.h"

namespace tandem {
namespace {

// One model's log-probabilities of one logit row, in double: x - max - log Σ exp(x - max).
void LogSoftmax(const float* logits, int64_t v, std::vector<double>* out) {
  out->resize(static_cast<size_t>(v));
  const double max = *std::max_element(logits, logits + v);
  double sum = 0;
  for (int64_t i = 0; i < v; ++i) sum += std::exp(static_cast<double>(logits[i]) - max);
  const double log_z = max + std::log(sum);
  for (int64_t i = 0; i < v; ++i) (*out)[static_cast<size_t>(i)] = static_cast<double>(logits[i]) - log_z;
}

// KL(p || q) from log-probabilities.
double KlDivergence(const std::vector<double>& log_p, const std::vector<double>& log_q) {
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) kl += std::exp(log_p[i]) * (log_p[i] - log_q[i]);
  return kl;
}

int64_t ArgMax(const std::vector<double>& x) {
  return static_cast<int64_t>(std::max_element(x.begin(), x.end()) - x.begin());
}

// Logits [window, V] of one window, run as a fresh sequence.
absl::Status ForwardWindow(LocalRuntime& runtime, std::span<const int32_t> window, std::vector<float>* logits) {
  SequenceKv kv(&runtime.kv_pool());
  const ForwardInput input{.kv = &kv, .tokens = window, .all_logits = true};
  return runtime.engine().Forward({&input, 1}, logits);
}

absl::Status CheckTokens(std::span<const int32_t> tokens, int64_t vocab_size) {
  if (tokens.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("the text has ", tokens.size(), " tokens; perplexity needs at least 2"));
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token ", i, " of the text is id ", tokens[i],
                                                     ", outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// Sums over the scored positions.
struct Totals {
  double nll = 0, kl = 0, max_kl = 0;
  int64_t scored = 0, agree = 0;
};

// Scores targets [first, end) of the window starting at `begin`: the row
// for target j is j - 1 - begin.
void ScoreWindow(std::span<const int32_t> tokens, int64_t begin, int64_t first, int64_t end, int64_t v,
                 const std::vector<float>& logits, const std::vector<float>* reference_logits, Totals* totals) {
  std::vector<double> log_q, log_p;
  for (int64_t j = first; j < end; ++j) {
    const int64_t row = j - 1 - begin;
    LogSoftmax(logits.data() + row * v, v, &log_q);
    totals->nll -= log_q[static_cast<size_t>(tokens[static_cast<size_t>(j)])];
    ++totals->scored;
    if (reference_logits == nullptr) continue;
    LogSoftmax(reference_logits->data() + row * v, v, &log_p);
    const double kl = KlDivergence(log_p, log_q);
    totals->kl += kl;
    totals->max_kl = std::max(totals->max_kl, kl);
    if (ArgMax(log_p) == ArgMax(log_q)) ++totals->agree;
  }
}

}  // namespace

int64_t EffectiveStride(const PerplexityOptions& options) {
  return options.stride > 0 ? options.stride : std::max<int64_t>(1, options.context / 2);
}

absl::Status CheckPerplexityOptions(const PerplexityOptions& options, const ModelConfig& config) {
  if (options.context < 2 || options.context > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", options.context, ": must be in [2, ",
                                                   config.max_position_embeddings,
                                                   "] (the model's max_position_embeddings)"));
  }
  if (options.stride < 0 || options.stride > options.context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stride ", options.stride, ": must be in [1, --context = ", options.context, "], or 0 for --context / 2"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PerplexityResult> MeasurePerplexity(LocalRuntime& model, LocalRuntime* reference,
                                                   std::span<const int32_t> tokens, const PerplexityOptions& options) {
  const ModelConfig& config = model.model().config;
  TANDEM_RETURN_IF_ERROR(CheckPerplexityOptions(options, config));
  if (reference != nullptr) {
    const ModelConfig& ref = reference->model().config;
    TANDEM_RETURN_IF_ERROR(CheckPerplexityOptions(options, ref));
    if (ref.vocab_size != config.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("the reference model (", reference->model().origin, ") has ",
                                                     ref.vocab_size, " vocabulary entries, the model (",
                                                     model.model().origin, ") ", config.vocab_size,
                                                     ": KL needs the same vocabulary"));
    }
  }
  TANDEM_RETURN_IF_ERROR(CheckTokens(tokens, config.vocab_size));
  const SteadyClock::time_point start = SteadyClock::now();
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t stride = EffectiveStride(options);
  PerplexityResult result;
  Totals totals;
  std::vector<float> logits, reference_logits;
  int64_t scored_end = 1;  // targets before this are scored (token 0 has no prediction)
  for (int64_t begin = 0; scored_end < n; begin += stride) {
    const int64_t end = std::min(begin + options.context, n);
    const std::span<const int32_t> window =
        tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
    TANDEM_RETURN_IF_ERROR(ForwardWindow(model, window, &logits));
    if (reference != nullptr) TANDEM_RETURN_IF_ERROR(ForwardWindow(*reference, window, &reference_logits));
    ScoreWindow(tokens, begin, std::max(scored_end, begin + 1), end, config.vocab_size, logits,
                reference != nullptr ? &reference_logits : nullptr, &totals);
    scored_end = end;
    ++result.windows;
  }
  result.tokens = n;
  result.scored = totals.scored;
  result.mean_nll = totals.nll / static_cast<double>(totals.scored);
  result.perplexity = std::exp(result.mean_nll);
  result.has_reference = reference != nullptr;
  if (result.has_reference) {
    result.mean_kl = totals.kl / static_cast<double>(totals.scored);
    result.max_kl = totals.max_kl;
    result.top1_agreement = static_cast<double>(totals.agree) / static_cast<double>(totals.scored);
  }
  result.seconds = SecondsSince(start);
  return result;
}

}  // namespace tandem
