// The plain types every linear-layer kernel shares, kept free of anything
// but <cstdint> and the dtype enum: the per-ISA translation units include
// this and nothing else of ours, so no inline function of a shared header is
// ever compiled there with instructions the baseline CPU may lack (the
// linker could otherwise keep that copy for every caller).
//
// Legend: M rows (tokens), K input features, N output features.
#pragma once

#include <cstdint>

#include "common/base/dtype.h"

namespace tandem {

// W: [N, K] in F32, F16 or BF16, row-major as Hugging Face stores nn.Linear.
struct LinearWeight {
  const void* data = nullptr;  // [N, K]
  DType dtype = DType::kBF16;  // a quantized type packs each row in blocks (dtype.h)
  int64_t n = 0;               // output features
  int64_t k = 0;               // input features
  // Q4_K and Q6_K blocks may be in the VNNI decode GEMV's own order
  // (dtype.h, block_order.h): that kernel reads it as it is, the prefill
  // tile decoders have a decoder of their own for it, the f32 reference
  // paths put each block back in ggml's order first (slow, correct).
  BlockOrder order = BlockOrder::kGgml;

  // Bytes of one row (a quantized row packs K in blocks) and of all of W.
  // Defined in linear.cc, out of line: this header is compiled in the
  // per-ISA translation units too.
  int64_t row_bytes() const;
  int64_t bytes() const;
};

// One task's share of a Linear: rows x[r, :k] (row stride ldx) times W's
// features [n_begin, n_end), written to y[r * ldy + j] for n_begin <= j < n_end.
struct LinearSliceArgs {
  const float* x = nullptr;  // [m, ldx] f32, ldx >= w.k
  int64_t ldx = 0;
  int64_t m = 0;
  const float* bias = nullptr;  // [w.n] f32 or nullptr
  int64_t n_begin = 0;
  int64_t n_end = 0;   // <= w.n
  float* y = nullptr;  // [m, ldy] f32, ldy >= n_end
  int64_t ldy = 0;
  // x in the kernel's own layout, for kernels with a prepare step (the bf16
  // dot product kernel: x rounded to bf16 and interleaved); else null.
  const void* prepared = nullptr;
};

}  // namespace tandem
