// The forward pass, layer by layer, as the equations read:
//   h = embed(tokens)
//   for each layer:  h += attention(norm(h))            (backend)
//                    x = norm(h); route(x)              (backend)
//                    h += Σ_k w_k · FFN_{e_k}(x)        (expert executor + backend combine)
//                    h += σ(g·x) · FFN_shared(x)         (backend, Qwen2-MoE's shared expert)
//   logits = lm_head(norm(h))                          (backend)
// The last layer's feed-forward (router onward) and the logits run only on
// the rows whose logits are asked for (a prompt's last token, unless
// all_logits): nothing else reads them, and for a short stack of layers it
// is a large share of a prefill (llama.cpp selects its output rows there too).
// The engine owns the run state (activation buffers) and nothing else: the
// config and weights are borrowed, the KV cache belongs to each sequence.
//
// Legend: T rows in the batch, D hidden, E experts, K num_experts_per_tok, V vocab.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "common/base/expert_executor.h"
#include "common/base/scratch_memory.h"
#include "common/model/model_config.h"
#include "coordinator/engine/compute_backend.h"
#include "coordinator/engine/forward_observer.h"
#include "coordinator/engine/layer_hook.h"

namespace tandem {

// Sees every named intermediate of a forward pass, for parity debugging and
// tests: "embedding", "attention_out", "moe_input", "router_logits",
// "moe_out" (the weighted expert sum), "shared_expert_out" (the gated
// shared expert's term, Qwen2-MoE), "layer_out", "logits". layer is -1
// outside layers. data: [rows, cols] f32, valid only during the call; from
// the last layer's "attention_out" on, only the rows whose logits are asked
// for.
using DumpHook = std::function<void(std::string_view name, int layer, const float* data, int64_t rows, int64_t cols)>;

struct EngineOptions {
  DumpHook dump;  // optional
  // Optional, borrowed, called in order on the engine thread (see
  // forward_observer.h): the expert orchestrator, the routing recorder.
  std::vector<ForwardObserver*> observers;
  // Optional, borrowed: may rewrite each layer's routing (layer_hook.h). Set
  // only for lossy policies (DAOP pre-calculation); null: exact.
  LayerHook* layer_hook = nullptr;
};

// One sequence's part of a batch.
struct ForwardInput {
  SequenceKv* kv = nullptr;
  std::span<const int32_t> tokens;  // appended at positions kv->length() ...
  bool all_logits = false;          // logits for every token, else only the last
};

// Wall time of one layer's parts in the last Forward, microseconds.
struct LayerTimingUs {
  double attention_us = 0, router_us = 0, experts_us = 0, combine_us = 0, shared_expert_us = 0, dense_mlp_us = 0;
};

// Wall time of the parts of the last Forward, microseconds.
struct ForwardTiming {
  int64_t rows = 0;
  int64_t routed_rows = 0;  // (row, expert) pairs the routed experts ran, all layers
  double embed_us = 0, attention_us = 0, router_us = 0, experts_us = 0, combine_us = 0, shared_expert_us = 0,
         dense_mlp_us = 0, logits_us = 0, total_us = 0;
  std::vector<LayerTimingUs> layers;  // [L]

  // Field by field (sign -1: subtracts), for sums over several forwards.
  void Add(const ForwardTiming& t, double sign = 1.0);
};

// Engine thread only.
class Engine {
 public:
  Engine(const ModelConfig& config, ComputeBackend* backend, ExpertExecutor* experts, EngineOptions options = {});

  // Runs `inputs` as one batch and writes logits [R, V] (R = Σ rows asked for,
  // in input order). On error no sequence's length changes.
  absl::Status Forward(std::span<const ForwardInput> inputs, std::vector<float>* logits);

  const ForwardTiming& last_timing() const { return timing_; }
  // Every Forward's timing summed since the engine was made (a prompt
  // longer than a prefill chunk takes several).
  const ForwardTiming& total_timing() const { return total_timing_; }

 private:
  absl::Status ForwardLayers(std::span<const ForwardInput> inputs, std::vector<float>* logits);
  // ForwardLayers' steps.
  absl::Status LayOutBatch(std::span<const ForwardInput> inputs, std::vector<SequenceSlice>* slices,
                           std::vector<int64_t>* logit_rows);
  absl::Status GrowRunState(int64_t rows);
  absl::Status RunAttention(int layer, std::span<const SequenceSlice> slices, int64_t rows,
                            std::span<const int64_t> output_rows);
  int64_t KeepOutputRows(std::span<const SequenceSlice> slices, std::vector<int64_t>* logit_rows);
  absl::Status RunFeedForward(int layer, int64_t rows);
  absl::Status AnnounceRouting(int layer, int64_t rows);
  absl::Status RunExperts(int layer, int64_t rows);
  absl::Status RunSharedExpert(int layer, int64_t rows);
  absl::Status RunDenseMlp(int layer, int64_t rows);
  void Dump(std::string_view name, int layer, const float* data, int64_t n, int64_t cols) const;
  // Fills step_ and step_sequences_ for the observers from the batch layout.
  void DescribeStep(std::span<const SequenceSlice> slices);

  const ModelConfig& config_;
  ComputeBackend* backend_;
  ExpertExecutor* experts_;
  EngineOptions options_;
  ForwardTiming timing_, total_timing_;

  // Run state: [T, D] hidden and moe_input, [T, E] router logits, [T, K]
  // routing, [T·K, D] expert inputs/outputs grouped by expert.
  std::vector<int32_t> tokens_;
  // (ScratchArray: grown without zero-filling or copying, in huge pages.)
  ScratchArray<float> hidden_, moe_input_, router_logits_, routing_weights_;
  ScratchArray<int32_t> routing_experts_;
  ScratchArray<float> expert_in_, expert_res_, expert_out_, moe_out_, shared_out_;
  ScratchArray<int64_t> slot_of_row_;  // grouped position of each (t, k)

  // For the observers (only when there are some).
  ForwardStep step_;
  bool step_begun_ = false;  // OnStepBegin was called for the current Forward
  std::vector<StepSequence> step_sequences_;
  // The step as the last layer's feed-forward sees it (only the rows whose
  // logits are asked for), and the one OnRouting and the layer hook get.
  ForwardStep output_step_;
  std::vector<StepSequence> output_sequences_;
  const ForwardStep* routing_step_ = &step_;
  std::unordered_map<const SequenceKv*, int64_t> sequence_ids_;
  int64_t next_sequence_id_ = 0;
  int64_t steps_ = 0;
};

}  // namespace tandem
