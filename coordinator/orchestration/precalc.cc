#include "coordinator/orchestration/precalc.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/status_macros.h"
#include "common/model/routing.h"

namespace tandem {
namespace {

bool Contains(const int32_t* set, int64_t k, int32_t e) { return std::find(set, set + k, e) != set + k; }

// Sets of distinct experts, order ignored.
bool SameSet(const int32_t* a, const int32_t* b, int64_t k) {
  for (int64_t j = 0; j < k; ++j) {
    if (!Contains(b, k, a[j])) return false;
  }
  return true;
}

void Add(const PrecalcStats& d, PrecalcStats* s) {
  s->predicted_steps += d.predicted_steps;
  s->predictions += d.predictions;
  s->correct += d.correct;
  s->used_true_routing += d.used_true_routing;
  s->precomputed_rows += d.precomputed_rows;
  s->precomputed_experts += d.precomputed_experts;
  s->degradations += d.degradations;
  s->no_alternative += d.no_alternative;
  s->precompute_us += d.precompute_us;
}

}  // namespace

std::string PrecalcPolicyName(PrecalcPolicy policy) { return policy == PrecalcPolicy::kDaop ? "daop" : "off"; }

absl::StatusOr<PrecalcPolicy> ParsePrecalcPolicy(std::string_view name, std::string_view flag) {
  if (name == "off" || name.empty()) return PrecalcPolicy::kOff;
  if (name == "daop") return PrecalcPolicy::kDaop;
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(flag), ": unknown pre-calculation policy \"", std::string(name), "\" (off | daop)"));
}

absl::Status ValidatePrecalcOptions(const PrecalcOptions& options) {
  if (options.policy == PrecalcPolicy::kDaop && options.start_layer < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "precalc_start_layer: must be >= 1 (layer i+1 is predicted at layer i), got ", options.start_layer));
  }
  return absl::OkStatus();
}

std::string PrecalcStats::ToJson() const {
  nlohmann::ordered_json j;
  j["policy"] = policy;
  if (policy != "off") j["lossy"] = "daop pre-calculation";
  j["start_layer"] = start_layer;
  j["predicted_steps"] = predicted_steps;
  j["predictions"] = predictions;
  j["correct"] = correct;
  j["accuracy"] = accuracy();
  j["used_true_routing"] = used_true_routing;
  j["precomputed_rows"] = precomputed_rows;
  j["precomputed_experts"] = precomputed_experts;
  j["degradations"] = degradations;
  j["no_alternative"] = no_alternative;
  j["precompute_us"] = precompute_us;
  return j.dump();
}

absl::StatusOr<std::unique_ptr<DaopPrecalc>> DaopPrecalc::Create(const ModelConfig& config, ExpertExecutor* cpu,
                                                                 ExpertExecutor* inner, const ResidencyTable* residency,
                                                                 const PrecalcOptions& options) {
  TANDEM_RETURN_IF_ERROR(ValidatePrecalcOptions(options));
  if (options.policy != PrecalcPolicy::kDaop) {
    return absl::InvalidArgumentError("precalc: DaopPrecalc needs policy daop");
  }
  if (cpu == nullptr) return absl::InvalidArgumentError("cpu: pre-calculation needs a CPU expert executor");
  const int num_layers = static_cast<int>(config.num_hidden_layers);
  // Clamped: the last layer is the last that can be predicted.
  const int start = std::min(options.start_layer, std::max(1, num_layers - 1));
  return std::unique_ptr<DaopPrecalc>(new DaopPrecalc(config, cpu, inner, residency, start));
}

DaopPrecalc::DaopPrecalc(const ModelConfig& config, ExpertExecutor* cpu, ExpertExecutor* inner,
                         const ResidencyTable* residency, int start_layer)
    : config_(config), cpu_(cpu), inner_(inner), residency_(residency), start_layer_(start_layer) {
  stats_.policy = "daop";
  stats_.start_layer = start_layer;
}

bool DaopPrecalc::Resident(int layer, int expert) const {
  return residency_ != nullptr && residency_->residency({layer, expert}) == Residency::kResident;
}

absl::Status DaopPrecalc::OnLayerRouted(const ForwardStep& step, ComputeBackend* backend, const RoutedLayer& routed) {
  PrecalcStats delta;
  if (routed.layer == config_.first_moe_layer()) next_.layer = -1;  // a new step: nothing carries over
  current_.layer = -1;
  if (next_.layer == routed.layer) {
    if (next_.rows != routed.rows) {
      return absl::InternalError(absl::StrCat("precalc: layer ", routed.layer, " predicted for ", next_.rows,
                                              " rows, the step has ", routed.rows));
    }
    std::swap(current_, next_);
    ApplyPrediction(routed, &delta);
  }
  next_.layer = -1;
  const int next_layer = routed.layer + 1;
  // Prefill is exact: only all-decode steps predict; a dense layer has no
  // router to predict.
  if (!step.prefill && next_layer >= start_layer_ && next_layer < config_.num_hidden_layers &&
      config_.moe_layer(next_layer)) {
    if (routed.layer + 1 == start_layer_) ++delta.predicted_steps;
    TANDEM_RETURN_IF_ERROR(Predict(backend, routed, &delta));
  }
  absl::MutexLock lock(&stats_mutex_);
  Add(delta, &stats_);
  return absl::OkStatus();
}

absl::Status DaopPrecalc::Predict(ComputeBackend* backend, const RoutedLayer& routed, PrecalcStats* delta) {
  const int64_t t_rows = routed.rows, d = config_.hidden_size, e_count = config_.num_local_experts,
                k = config_.num_experts_per_tok;
  const int layer = routed.layer + 1;
  TANDEM_RETURN_IF_ERROR(normed_.Grow(t_rows * d, "the predicted layer's normed input"));
  TANDEM_RETURN_IF_ERROR(logits_.Grow(t_rows * e_count, "the predicted router logits"));
  TANDEM_RETURN_IF_ERROR(route_weights_.Grow(t_rows * k, "the predicted routing weights"));
  Prediction& p = next_;
  p.rows = t_rows;
  p.raw_experts.resize(static_cast<size_t>(t_rows * k));
  // Layer (i+1)'s norm and gate on the residual stream layer i's router saw.
  TANDEM_RETURN_IF_ERROR(backend->Router(layer, t_rows, routed.hidden, normed_.data(), logits_.data(),
                                         p.raw_experts.data(), route_weights_.data()));
  p.used_experts = p.raw_experts;

  // Graceful degradation: all K on the CPU → the lowest-scored one becomes
  // the best-scored resident expert.
  if (residency_ != nullptr) {
    for (int64_t t = 0; t < t_rows; ++t) {
      int32_t* used = p.used_experts.data() + t * k;
      const float* logits = logits_.data() + t * e_count;
      bool all_cpu = true;
      for (int64_t j = 0; j < k && all_cpu; ++j) all_cpu = !Resident(layer, used[j]);
      if (!all_cpu) continue;
      int best = -1;
      for (int e = 0; e < e_count; ++e) {
        if (Resident(layer, e) && !Contains(used, k, e) && (best < 0 || logits[e] > logits[best])) best = e;
      }
      if (best < 0) {
        ++delta->no_alternative;
        continue;
      }
      int64_t lowest = 0;
      for (int64_t j = 1; j < k; ++j) {
        if (logits[used[j]] < logits[used[lowest]]) lowest = j;
      }
      used[lowest] = best;
      ++delta->degradations;
    }
  }

  // Pre-compute the CPU experts of the used sets from layer i's moe_input,
  // grouped by expert in row order (the order the engine groups layer i+1's
  // rows in, since the used sets become its routing).
  p.offsets.assign(static_cast<size_t>(e_count + 1), 0);
  for (int64_t i = 0; i < t_rows * k; ++i) {
    const int32_t e = p.used_experts[static_cast<size_t>(i)];
    if (!Resident(layer, e)) ++p.offsets[static_cast<size_t>(e + 1)];
  }
  for (int64_t e = 0; e < e_count; ++e) p.offsets[e + 1] += p.offsets[e];
  const int64_t total = p.offsets[static_cast<size_t>(e_count)];
  p.layer = layer;
  if (total == 0) return absl::OkStatus();
  TANDEM_RETURN_IF_ERROR(gathered_in_.Grow(total * d, "the pre-calculated experts' inputs"));
  TANDEM_RETURN_IF_ERROR(p.outputs.Grow(total * d, "the pre-calculated experts' outputs"));
  std::vector<int64_t> fill(p.offsets.begin(), p.offsets.end() - 1);
  for (int64_t i = 0; i < t_rows * k; ++i) {
    const int32_t e = p.used_experts[static_cast<size_t>(i)];
    if (Resident(layer, e)) continue;
    const int64_t slot = fill[static_cast<size_t>(e)]++;
    std::copy_n(routed.moe_input + (i / k) * d, d, gathered_in_.data() + slot * d);
  }
  work_.clear();
  for (int64_t e = 0; e < e_count; ++e) {
    const int64_t n = p.offsets[e + 1] - p.offsets[e];
    if (n == 0) continue;
    work_.push_back(
        {static_cast<int>(e), n, gathered_in_.data() + p.offsets[e] * d, p.outputs.data() + p.offsets[e] * d});
  }
  const auto start = std::chrono::steady_clock::now();
  absl::Status status = cpu_->RunExperts(layer, work_);
  if (!status.ok()) {
    p.layer = -1;
    return status;
  }
  delta->precompute_us += MicrosSince(start);
  delta->precomputed_rows += total;
  delta->precomputed_experts += static_cast<int64_t>(work_.size());
  return absl::OkStatus();
}

void DaopPrecalc::ApplyPrediction(const RoutedLayer& routed, PrecalcStats* delta) {
  const int64_t e_count = config_.num_local_experts, k = config_.num_experts_per_tok;
  if (static_cast<int64_t>(masked_logits_.size()) < e_count) masked_logits_.resize(static_cast<size_t>(e_count));
  for (int64_t t = 0; t < routed.rows; ++t) {
    int32_t* experts = routed.experts + t * k;
    const int32_t* raw = current_.raw_experts.data() + t * k;
    const int32_t* used = current_.used_experts.data() + t * k;
    ++delta->predictions;
    if (SameSet(raw, experts, k)) ++delta->correct;
    if (SameSet(used, experts, k)) {
      // The true routing, untouched: exact unless an expert was pre-computed.
      ++delta->used_true_routing;
      continue;
    }
    // The used set, weighted by this layer's own router over that set.
    const float* logits = routed.router_logits + t * e_count;
    if (config_.router_kind() == RouterKind::kSigmoidGroupedTopK) {
      // Its weights are the set's own sigmoid scores (the correction bias
      // only chooses): masking the others' logits would let the bias
      // choose a masked expert.
      std::copy_n(used, k, experts);
      SigmoidRouterWeights(logits, experts, k, config_.norm_topk_prob, config_.routed_scaling_factor,
                           routed.weights + t * k);
      continue;
    }
    if (config_.router_kind() == RouterKind::kSoftmaxGroupedTopK) {
      // DeepSeek-V2: the set's own scores in the full softmax (scaled, or
      // renormalised), as its router weighs a chosen set.
      std::copy_n(used, k, experts);
      SoftmaxGroupedRouterWeights(logits, e_count, experts, k, config_.norm_topk_prob, config_.routed_scaling_factor,
                                  routed.weights + t * k);
      continue;
    }
    for (int64_t e = 0; e < e_count; ++e) {
      masked_logits_[static_cast<size_t>(e)] =
          Contains(used, k, static_cast<int32_t>(e)) ? logits[e] : std::numeric_limits<float>::lowest();
    }
    Route(config_, /*correction_bias=*/nullptr, masked_logits_.data(), 1, experts, routed.weights + t * k);
  }
}

absl::Status DaopPrecalc::Serve(int layer, std::span<const ExpertWork> work, std::vector<ExpertWork>* rest) {
  if (current_.layer != layer) {
    rest->insert(rest->end(), work.begin(), work.end());
    return absl::OkStatus();
  }
  current_.layer = -1;
  const int64_t d = config_.hidden_size;
  int64_t served = 0, expected = 0;
  for (size_t e = 0; e + 1 < current_.offsets.size(); ++e) expected += current_.offsets[e + 1] > current_.offsets[e];
  for (const ExpertWork& w : work) {
    const int64_t begin = current_.offsets[static_cast<size_t>(w.expert)];
    const int64_t n = current_.offsets[static_cast<size_t>(w.expert) + 1] - begin;
    if (n == 0) {
      rest->push_back(w);
      continue;
    }
    if (w.num_rows != n) {
      return absl::InternalError(absl::StrCat("precalc: layer ", layer, " expert ", w.expert, " has ", w.num_rows,
                                              " rows, ", n, " were pre-computed (the predicted routing was not used)"));
    }
    std::copy_n(current_.outputs.data() + begin * d, n * d, w.output);
    ++served;
  }
  if (served != expected) {
    return absl::InternalError(absl::StrCat("precalc: layer ", layer, " ran ", served, " of the ", expected,
                                            " pre-computed experts (the predicted routing was not used)"));
  }
  return absl::OkStatus();
}

absl::Status DaopPrecalc::RunExperts(int layer, std::span<const ExpertWork> work) {
  if (inner_ == nullptr) return absl::FailedPreconditionError("precalc: no inner expert executor");
  rest_.clear();
  TANDEM_RETURN_IF_ERROR(Serve(layer, work, &rest_));
  if (rest_.empty()) return absl::OkStatus();
  return inner_->RunExperts(layer, rest_);
}

PrecalcStats DaopPrecalc::stats() const {
  absl::MutexLock lock(&stats_mutex_);
  return stats_;
}

void DaopPrecalc::ResetStats() {
  absl::MutexLock lock(&stats_mutex_);
  PrecalcStats fresh;
  fresh.policy = stats_.policy;
  fresh.start_layer = stats_.start_layer;
  stats_ = fresh;
}

}  // namespace tandem
