// The cache-blocking loops of the packed f32 GEMM, shared by the AVX2 and
// AVX-512 translation units (linear_avx2.cc, linear_avx512.cc): y[M, slice]
// from x and W's slice already widened into f32 panels, one register tile
// of the ISA's micro-kernel at a time.
//
// Each unit instantiates this with its own micro-kernel, a lambda of its
// anonymous namespace: every instantiation is then local to that unit and
// compiled with its instructions, so the linker never hands one ISA's copy
// to another's callers (linear_types.h says why that matters). For the same
// reason nothing here calls an inline function of a shared header.
//
// Legend as in linear.h: M rows, K input features, N output features.
#pragma once

#include <cstdint>

#include "common/kernels/linear_types.h"

namespace tandem {

// The ISA's blocking: features per panel, rows per micro-kernel call, and
// the row and K blocks that keep x and a panel block in L2 and L1.
struct PanelBlocking {
  int64_t panel;
  int64_t tile_rows;
  int64_t block_rows;
  int64_t block_k;
};

// packed: [panels, K, b.panel] f32, panel p holding features
// a.n_begin + p * b.panel onwards. micro(rows, x, ldx, panel, kb, c, ldc,
// accumulate) adds (or writes, when !accumulate) rows x kb times a panel's
// K block to c[rows, b.panel] (row stride ldc). The bias, if any, is added
// last.
template <PanelBlocking b, typename MicroKernel>
void MultiplyPanels(const LinearSliceArgs& a, int64_t k, const float* packed, const MicroKernel& micro) {
  const int64_t m = a.m, ldx = a.ldx, ldy = a.ldy, n_begin = a.n_begin, n_end = a.n_end;
  const int64_t panels = (n_end - n_begin + b.panel - 1) / b.panel;
  const int64_t panel_stride = b.panel * k;
  const float* x = a.x;
  float* y = a.y;
  // Row blocks outermost, so the block's y tiles stay in L2 across all K
  // blocks; within a K block the x block is reused from L2 by every panel,
  // and each panel's K block from L1 by every tile of rows.
  for (int64_t m0 = 0; m0 < m; m0 += b.block_rows) {
    const int64_t m1 = m < m0 + b.block_rows ? m : m0 + b.block_rows;
    for (int64_t k0 = 0; k0 < k; k0 += b.block_k) {
      const int64_t kb = b.block_k < k - k0 ? b.block_k : k - k0;
      const bool accumulate = k0 > 0;
      for (int64_t p = 0; p < panels; ++p) {
        const float* panel = packed + p * panel_stride + k0 * b.panel;
        const int64_t n0 = n_begin + p * b.panel;
        const int64_t cols = b.panel < n_end - n0 ? b.panel : n_end - n0;
        for (int64_t r0 = m0; r0 < m1; r0 += b.tile_rows) {
          const int rows = static_cast<int>(b.tile_rows < m1 - r0 ? b.tile_rows : m1 - r0);
          const float* xr = x + r0 * ldx + k0;
          if (cols == b.panel) {
            micro(rows, xr, ldx, panel, kb, y + r0 * ldy + n0, ldy, accumulate);
            continue;
          }
          // Last, partial panel: through a full-width scratch tile so the
          // kernel never writes past n_end.
          alignas(64) float tile[b.tile_rows * b.panel];
          for (int r = 0; r < rows; ++r)
            for (int64_t j = 0; j < cols; ++j) tile[r * b.panel + j] = accumulate ? y[(r0 + r) * ldy + n0 + j] : 0.0f;
          micro(rows, xr, ldx, panel, kb, tile, b.panel, accumulate);
          for (int r = 0; r < rows; ++r)
            for (int64_t j = 0; j < cols; ++j) y[(r0 + r) * ldy + n0 + j] = tile[r * b.panel + j];
        }
      }
    }
  }
  if (a.bias != nullptr)
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = n_begin; j < n_end; ++j) y[r * ldy + j] += a.bias[j];
}

}  // namespace tandem
