#include "coordinator/engine/engine.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/status_macros.h"
#include "coordinator/engine/cpu_ops.h"

namespace tandem {
Engine::Engine(const ModelConfig& config, ComputeBackend* backend, ExpertExecutor* experts, EngineOptions options)
    : config_(config), backend_(backend), experts_(experts), options_(std::move(options)) {}

void ForwardTiming::Add(const ForwardTiming& t, double sign) {
  const auto i = static_cast<int64_t>(sign);
  rows += i * t.rows;
  routed_rows += i * t.routed_rows;
  for (auto [to, from] : {std::pair{&embed_us, t.embed_us},
                          {&attention_us, t.attention_us},
                          {&router_us, t.router_us},
                          {&experts_us, t.experts_us},
                          {&combine_us, t.combine_us},
                          {&shared_expert_us, t.shared_expert_us},
                          {&dense_mlp_us, t.dense_mlp_us},
                          {&logits_us, t.logits_us},
                          {&total_us, t.total_us}}) {
    *to += sign * from;
  }
  if (layers.size() < t.layers.size()) layers.resize(t.layers.size());
  for (size_t l = 0; l < t.layers.size(); ++l) {
    LayerTimingUs& to = layers[l];
    const LayerTimingUs& from = t.layers[l];
    to.attention_us += sign * from.attention_us;
    to.router_us += sign * from.router_us;
    to.experts_us += sign * from.experts_us;
    to.combine_us += sign * from.combine_us;
    to.shared_expert_us += sign * from.shared_expert_us;
    to.dense_mlp_us += sign * from.dense_mlp_us;
  }
}

absl::Status Engine::Forward(std::span<const ForwardInput> inputs, std::vector<float>* logits) {
  step_begun_ = false;
  absl::Status status = ForwardLayers(inputs, logits);
  total_timing_.Add(timing_);
  if (step_begun_) {
    for (ForwardObserver* observer : options_.observers) observer->OnStepEnd(step_, status);
  }
  return status;
}

void Engine::DescribeStep(std::span<const SequenceSlice> slices) {
  step_sequences_.clear();
  step_ = ForwardStep{};
  step_.index = steps_++;
  for (const SequenceSlice& s : slices) {
    StepSequence seq;
    auto it = sequence_ids_.find(s.kv);
    seq.new_sequence = s.start_position == 0 || !s.kv->started();
    if (seq.new_sequence || it == sequence_ids_.end()) {
      // KV objects are reused (and addresses recycled): position 0, or a
      // first run past a cached prompt prefix, always starts a new sequence;
      // a KV first seen later (a forked beam) gets an id of its own but
      // starts nothing.
      seq.id = next_sequence_id_++;
      sequence_ids_[s.kv] = seq.id;
    } else {
      seq.id = it->second;
    }
    seq.start_position = s.start_position;
    seq.num_tokens = s.num_tokens;
    seq.row_offset = s.row_offset;
    seq.prefill = s.num_tokens > 1 || s.start_position == 0;
    step_.rows += s.num_tokens;
    step_.prefill = step_.prefill || seq.prefill;
    step_.new_sequence = step_.new_sequence || seq.new_sequence;
    step_sequences_.push_back(seq);
  }
  step_.sequences = step_sequences_;
}

absl::Status Engine::ForwardLayers(std::span<const ForwardInput> inputs, std::vector<float>* logits) {
  const auto start = std::chrono::steady_clock::now();
  timing_ = ForwardTiming{};
  timing_.layers.resize(static_cast<size_t>(config_.num_hidden_layers));
  std::vector<SequenceSlice> slices;
  std::vector<int64_t> logit_rows;
  TANDEM_RETURN_IF_ERROR(LayOutBatch(inputs, &slices, &logit_rows));
  const int64_t rows = static_cast<int64_t>(tokens_.size());
  timing_.rows = rows;
  TANDEM_RETURN_IF_ERROR(GrowRunState(rows));
  if (!options_.observers.empty() || options_.layer_hook != nullptr) {
    DescribeStep(slices);
    step_begun_ = true;
    for (ForwardObserver* observer : options_.observers) observer->OnStepBegin(step_);
  }

  auto t = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(backend_->Embed(tokens_, hidden_.data()));  // [T, D]
  timing_.embed_us = MicrosSince(t);
  Dump("embedding", -1, hidden_.data(), rows, config_.hidden_size);
  routing_step_ = &step_;
  int64_t layer_rows = rows;
  for (int layer = 0; layer < config_.num_hidden_layers; ++layer) {
    const bool last = layer == config_.num_hidden_layers - 1;
    TANDEM_RETURN_IF_ERROR(RunAttention(layer, slices, layer_rows, last ? logit_rows : std::span<const int64_t>()));
    if (last) layer_rows = KeepOutputRows(slices, &logit_rows);
    Dump("attention_out", layer, hidden_.data(), layer_rows, config_.hidden_size);
    TANDEM_RETURN_IF_ERROR(RunFeedForward(layer, layer_rows));
  }
  t = std::chrono::steady_clock::now();
  logits->resize(logit_rows.size() * static_cast<size_t>(config_.vocab_size));
  TANDEM_RETURN_IF_ERROR(backend_->Logits(logit_rows, hidden_.data(), logits->data()));
  timing_.logits_us = MicrosSince(t);
  Dump("logits", -1, logits->data(), static_cast<int64_t>(logit_rows.size()), config_.vocab_size);

  for (const SequenceSlice& s : slices) {
    s.kv->set_length(s.start_position + s.num_tokens);
    s.kv->MarkStarted();
  }
  timing_.total_us = MicrosSince(start);
  return absl::OkStatus();
}

// Lays the batch out: each input is one slice of consecutive rows of
// tokens_; its KV cache reserved; the rows whose logits it wants.
absl::Status Engine::LayOutBatch(std::span<const ForwardInput> inputs, std::vector<SequenceSlice>* slices,
                                 std::vector<int64_t>* logit_rows) {
  tokens_.clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ForwardInput& in = inputs[i];
    if (in.kv == nullptr || in.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("forward input ", i, " has no sequence or no tokens"));
    }
    const int64_t start_position = in.kv->length();
    const int64_t end = start_position + static_cast<int64_t>(in.tokens.size());
    if (end > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence would reach ", end,
                                                     " positions, past max_position_embeddings (",
                                                     config_.max_position_embeddings, ")"));
    }
    TANDEM_RETURN_IF_ERROR(in.kv->Reserve(end));
    const int64_t row_offset = static_cast<int64_t>(tokens_.size());
    slices->push_back({in.kv, start_position, static_cast<int64_t>(in.tokens.size()), row_offset});
    tokens_.insert(tokens_.end(), in.tokens.begin(), in.tokens.end());
    if (in.all_logits) {
      for (size_t j = 0; j < in.tokens.size(); ++j) logit_rows->push_back(row_offset + static_cast<int64_t>(j));
    } else {
      logit_rows->push_back(row_offset + static_cast<int64_t>(in.tokens.size()) - 1);
    }
  }
  return absl::OkStatus();
}

absl::Status Engine::GrowRunState(int64_t rows) {
  const int64_t d = config_.hidden_size, e = config_.num_local_experts, k = config_.num_experts_per_tok;
  TANDEM_RETURN_IF_ERROR(hidden_.Grow(rows * d, "the hidden states"));
  TANDEM_RETURN_IF_ERROR(moe_input_.Grow(rows * d, "the MoE input"));
  TANDEM_RETURN_IF_ERROR(router_logits_.Grow(rows * e, "the router logits"));
  TANDEM_RETURN_IF_ERROR(routing_weights_.Grow(rows * k, "the routing weights"));
  return routing_experts_.Grow(rows * k, "the routed experts");
}

void Engine::Dump(std::string_view name, int layer, const float* data, int64_t n, int64_t cols) const {
  if (options_.dump) options_.dump(name, layer, data, n, cols);
}

// A decoder layer's first half on hidden_: attention (every row's keys and
// values reach the cache). With `output_rows` (the last layer), only those
// rows come out right: the backend may skip the others' queries, attention
// and output projection.
absl::Status Engine::RunAttention(int layer, std::span<const SequenceSlice> slices, int64_t rows,
                                  std::span<const int64_t> output_rows) {
  LayerTimingUs& layer_timing = timing_.layers[static_cast<size_t>(layer)];
  const auto t = std::chrono::steady_clock::now();
  // (A backend runs every row in place when every row is an output row.)
  TANDEM_RETURN_IF_ERROR(output_rows.empty()
                             ? backend_->Attention(layer, slices, rows, hidden_.data())
                             : backend_->AttentionForOutputRows(layer, slices, rows, output_rows, hidden_.data()));
  layer_timing.attention_us = MicrosSince(t);
  timing_.attention_us += layer_timing.attention_us;
  return absl::OkStatus();
}

// After the last layer's attention nothing reads a row but through its
// logits, so the rest of the pass runs on the rows whose logits are asked
// for (a prompt's last token): hidden_ keeps those rows, in order, at the
// top; logit_rows becomes 0..R-1; the observers see the sequences' rows so
// placed. Returns R.
int64_t Engine::KeepOutputRows(std::span<const SequenceSlice> slices, std::vector<int64_t>* logit_rows) {
  const int64_t rows = static_cast<int64_t>(tokens_.size());
  const int64_t kept = static_cast<int64_t>(logit_rows->size());
  if (kept == rows) return rows;
  if (step_begun_) {
    // Each slice keeps all its rows or its last; logit_rows ascend.
    output_sequences_.assign(step_sequences_.begin(), step_sequences_.end());
    auto from = logit_rows->begin();
    for (size_t s = 0; s < output_sequences_.size(); ++s) {
      const int64_t end = slices[s].row_offset + slices[s].num_tokens;
      const auto to = std::lower_bound(from, logit_rows->end(), end);
      output_sequences_[s].row_offset = from - logit_rows->begin();
      output_sequences_[s].num_tokens = to - from;
      from = to;
    }
    output_step_ = step_;
    output_step_.rows = kept;
    output_step_.sequences = output_sequences_;
    routing_step_ = &output_step_;
  }
  PackRows(hidden_.data(), config_.hidden_size, *logit_rows);
  std::iota(logit_rows->begin(), logit_rows->end(), int64_t{0});
  return kept;
}

// A decoder layer's second half on hidden_'s first `rows` rows: router,
// experts, combine, shared expert (or a dense layer's MLP).
absl::Status Engine::RunFeedForward(int layer, int64_t rows) {
  const int64_t d = config_.hidden_size;
  LayerTimingUs& layer_timing = timing_.layers[static_cast<size_t>(layer)];
  if (config_.dense_layer(layer)) return RunDenseMlp(layer, rows);

  auto t = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(backend_->Router(layer, rows, hidden_.data(), moe_input_.data(), router_logits_.data(),
                                          routing_experts_.data(), routing_weights_.data()));
  layer_timing.router_us = MicrosSince(t);
  timing_.router_us += layer_timing.router_us;
  Dump("moe_input", layer, moe_input_.data(), rows, d);
  Dump("router_logits", layer, router_logits_.data(), rows, config_.num_local_experts);
  TANDEM_RETURN_IF_ERROR(AnnounceRouting(layer, rows));

  t = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(RunExperts(layer, rows));
  layer_timing.experts_us = MicrosSince(t);
  timing_.experts_us += layer_timing.experts_us;

  t = std::chrono::steady_clock::now();
  if (options_.dump) {
    // The weighted expert sum alone, for parity checks: combine into zeros.
    TANDEM_RETURN_IF_ERROR(moe_out_.Grow(rows * d, "the MoE output dump"));
    std::fill_n(moe_out_.data(), rows * d, 0.0f);
    TANDEM_RETURN_IF_ERROR(backend_->Combine(rows, routing_weights_.data(), expert_out_.data(), moe_out_.data()));
    Dump("moe_out", layer, moe_out_.data(), rows, d);
  }
  TANDEM_RETURN_IF_ERROR(backend_->Combine(rows, routing_weights_.data(), expert_out_.data(), hidden_.data()));
  layer_timing.combine_us = MicrosSince(t);
  timing_.combine_us += layer_timing.combine_us;
  if (config_.shared_expert()) TANDEM_RETURN_IF_ERROR(RunSharedExpert(layer, rows));
  Dump("layer_out", layer, hidden_.data(), rows, d);
  return absl::OkStatus();
}

// Dense work on the backend, like attention: never routed, never planned.
absl::Status Engine::RunSharedExpert(int layer, int64_t rows) {
  const int64_t d = config_.hidden_size;
  const auto t = std::chrono::steady_clock::now();
  float* term = nullptr;
  if (options_.dump) {
    TANDEM_RETURN_IF_ERROR(shared_out_.Grow(rows * d, "the shared expert output dump"));
    term = shared_out_.data();
  }
  TANDEM_RETURN_IF_ERROR(backend_->SharedExpert(layer, rows, moe_input_.data(), hidden_.data(), term));
  LayerTimingUs& layer_timing = timing_.layers[static_cast<size_t>(layer)];
  layer_timing.shared_expert_us = MicrosSince(t);
  timing_.shared_expert_us += layer_timing.shared_expert_us;
  if (term != nullptr) Dump("shared_expert_out", layer, term, rows, d);
  return absl::OkStatus();
}

// A dense layer's MLP on the backend: no routing, nothing for the observers,
// the layer hook or the experts.
absl::Status Engine::RunDenseMlp(int layer, int64_t rows) {
  const auto t = std::chrono::steady_clock::now();
  TANDEM_RETURN_IF_ERROR(backend_->DenseMlp(layer, rows, hidden_.data(), moe_input_.data()));
  LayerTimingUs& layer_timing = timing_.layers[static_cast<size_t>(layer)];
  layer_timing.dense_mlp_us = MicrosSince(t);
  timing_.dense_mlp_us += layer_timing.dense_mlp_us;
  Dump("moe_input", layer, moe_input_.data(), rows, config_.hidden_size);
  Dump("layer_out", layer, hidden_.data(), rows, config_.hidden_size);
  return absl::OkStatus();
}

// The router's choice to the observers, then to the layer hook (which may
// change it).
absl::Status Engine::AnnounceRouting(int layer, int64_t rows) {
  const int64_t k = config_.num_experts_per_tok;
  for (ForwardObserver* observer : options_.observers) {
    observer->OnRouting(*routing_step_, layer,
                        std::span<const int32_t>(routing_experts_.data(), static_cast<size_t>(rows * k)),
                        static_cast<int>(k));
  }
  if (options_.layer_hook != nullptr) {
    // After the observers: they record the router's own choice.
    RoutedLayer routed{layer,
                       rows,
                       hidden_.data(),
                       moe_input_.data(),
                       router_logits_.data(),
                       routing_experts_.data(),
                       routing_weights_.data()};
    TANDEM_RETURN_IF_ERROR(options_.layer_hook->OnLayerRouted(*routing_step_, backend_, routed));
  }
  return absl::OkStatus();
}

absl::Status Engine::RunExperts(int layer, int64_t rows) {
  const int64_t d = config_.hidden_size, e = config_.num_local_experts, k = config_.num_experts_per_tok;
  // Group the T·K (token, slot) pairs by expert: counting sort.
  std::vector<int64_t> offsets(static_cast<size_t>(e + 1), 0);
  for (int64_t i = 0; i < rows * k; ++i) ++offsets[static_cast<size_t>(routing_experts_[i] + 1)];
  for (int64_t x = 0; x < e; ++x) offsets[x + 1] += offsets[x];
  TANDEM_RETURN_IF_ERROR(slot_of_row_.Grow(rows * k, "the routed rows' slots"));
  TANDEM_RETURN_IF_ERROR(expert_in_.Grow(rows * k * d, "the experts' inputs"));
  TANDEM_RETURN_IF_ERROR(expert_res_.Grow(rows * k * d, "the experts' outputs"));
  TANDEM_RETURN_IF_ERROR(expert_out_.Grow(rows * k * d, "the routed rows' expert outputs"));
  std::vector<int64_t> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < rows * k; ++i) {
    const int64_t slot = fill[static_cast<size_t>(routing_experts_[i])]++;
    slot_of_row_[i] = slot;
    std::copy_n(moe_input_.data() + (i / k) * d, d, expert_in_.data() + slot * d);
  }
  std::vector<ExpertWork> work;
  for (int64_t x = 0; x < e; ++x) {
    const int64_t n = offsets[x + 1] - offsets[x];
    if (n == 0) continue;  // an expert with no rows costs nothing
    work.push_back({static_cast<int>(x), n, expert_in_.data() + offsets[x] * d, expert_res_.data() + offsets[x] * d});
  }
  TANDEM_RETURN_IF_ERROR(experts_->RunExperts(layer, work));
  timing_.routed_rows += rows * k;
  for (int64_t i = 0; i < rows * k; ++i) {
    std::copy_n(expert_res_.data() + slot_of_row_[i] * d, d, expert_out_.data() + i * d);
  }
  return absl::OkStatus();
}

}  // namespace tandem
