// One expert's SwiGLU FFN on the CPU:  y = W2 · ( silu(W1 · x) ⊙ (W3 · x) ).
//
// Legend: R rows routed to the expert, D hidden size, I intermediate size.
// x: [R, D] f32.  W1 (gate), W3 (up): [I, D].  W2 (down): [D, I].  y: [R, D] f32.
// Weights are BF16, F16, F32 or ggml blocks as stored; accumulation is f32. The three
// products run through common/kernels/linear's kernels, chosen by R under
// the options' (by default the process's) kernel plan; with bf16_dot the
// products' inputs x and h are rounded to bf16 (see linear.h, Numerics).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/base/scratch_memory.h"
#include "common/base/thread_pool.h"
#include "common/kernels/linear.h"
#include "common/model/model_weights.h"

namespace tandem {

// The expert's three matrices (w1 gate [I, D], w2 down [D, I], w3 up [I, D]),
// as the model's weights hold them.
using ExpertFfnWeights = ExpertWeights;

// One expert's share of a batch: x [rows, D] -> y [rows, D]. `expert`
// only names the call in errors ("expert 3: ExpertFfn: ...").
struct ExpertFfnCall {
  const ExpertFfnWeights* weights = nullptr;
  const float* x = nullptr;
  int64_t rows = 0;
  float* y = nullptr;
  int expert = 0;
};

// Owns scratch buffers for the intermediate activations; not thread-safe (one
// caller at a time), parallel inside through `pool`.
class ExpertFfn {
 public:
  explicit ExpertFfn(ThreadPool* pool, LinearOptions options = {});
  absl::Status Run(const ExpertFfnWeights& weights, const float* x, int64_t rows, float* y);
  // Several experts (one layer's) in two parallel passes over the pool:
  // every call's gate and up slices as the tasks of one loop, then every
  // call's down slices as the tasks of another, so the pool is waited on
  // twice per batch rather than twice per expert, and one expert's few
  // tasks do not end in an idle tail of their own. Each y has the same bits
  // as Run of that call alone. A call's y may be another call's x: every x
  // is read before any y is written. Calls are checked before any runs; an
  // error names the call's expert.
  absl::Status Run(std::span<const ExpertFfnCall> calls);

 private:
  // Where one call's buffers sit in the shared scratch, and its kernels.
  struct CallPlan {
    const LinearKernel* gate_kernel = nullptr;
    const LinearKernel* up_kernel = nullptr;
    const LinearKernel* down_kernel = nullptr;
    int64_t ldx = 0, ldh = 0;                                          // row strides of x's copy and of gate/up
    int64_t x_at = -1, gate_at = 0, up_at = 0;                         // in floats_ (x_at < 0: x is read in place)
    int64_t x_prepared_at = 0, up_prepared_at = 0, h_prepared_at = 0;  // in prepared_
    int64_t gate_features = 1, down_features = 1;                      // output features per task
  };
  // name_experts: errors say which call's expert they come from.
  absl::Status RunCalls(std::span<const ExpertFfnCall> calls, bool name_experts);
  absl::Status PlanCalls(std::span<const ExpertFfnCall> calls);
  absl::Status PrepareInputs(std::span<const ExpertFfnCall> calls, bool name_experts);
  absl::Status GateUpPass(std::span<const ExpertFfnCall> calls, bool name_experts);
  absl::Status DownPass(std::span<const ExpertFfnCall> calls, bool name_experts);

  ThreadPool* pool_;
  LinearOptions options_;
  std::vector<CallPlan> plans_;  // one per call of the running batch
  ScratchArray<float> floats_;   // every call's strided copy of x and [R, ldh] gate and up activations
  ScratchMemory prepared_;       // every call's x (and h) in its kernels' layouts
};

}  // namespace tandem
