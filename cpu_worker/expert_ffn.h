// One expert's SwiGLU FFN on the CPU:  y = W2 · ( silu(W1 · x) ⊙ (W3 · x) ).
//
// Legend: R rows routed to the expert, D hidden size, I intermediate size.
// x: [R, D] f32.  W1 (gate), W3 (up): [I, D].  W2 (down): [D, I].  y: [R, D] f32.
// Weights are BF16, F16 or F32 as stored; accumulation is f32. The three
// products run through common/kernels/linear's kernels, chosen by R under
// the options' (by default the process's) kernel plan; with bf16_dot the
// products' inputs x and h are rounded to bf16 (see linear.h, Numerics).
#pragma once

#include <cstdint>
#include "absl/status/status.h"
#include "common/base/scratch_memory.h"
#include "common/base/thread_pool.h"
#include "common/kernels/linear.h"
#include "common/model/model_weights.h"

namespace tandem {

// The expert's three matrices (w1 gate [I, D], w2 down [D, I], w3 up [I, D]),
// as the model's weights hold them.
using ExpertFfnWeights = ExpertWeights;

// Owns scratch buffers for the intermediate activations; not thread-safe (one
// caller at a time), parallel inside through `pool`.
class ExpertFfn {
 public:
  explicit ExpertFfn(ThreadPool* pool, LinearOptions options = {});
  absl::Status Run(const ExpertFfnWeights& weights, const float* x, int64_t rows, float* y);

 private:
  ThreadPool* pool_;
  LinearOptions options_;
  ScratchArray<float> x_;                                // [R, ldx] copy of x with an L1-friendly row stride
  ScratchArray<float> gate_;                             // [R, ldh], ldh = ActivationRowStride(I)
  ScratchArray<float> up_;                               // [R, ldh]
  PreparedInput x_prepared_, up_prepared_, h_prepared_;  // x (and h) in a kernel's layout
};

}  // namespace tandem
