// The body of the attention kernel, written once over a vector type and
// included by each ISA translation unit (attention_block_avx2.cc,
// attention_block_avx512.cc) inside its own namespace, after it defines
// `Vec` (kLanes f32 lanes, kRegisters vector registers, Zero/Load/LoadN/
// Store/StoreN/Set1/Fma/Mul/Max/Sub/Add/Masked/Exp/ReduceMax/Transpose/Iota,
// kKeysInLanesMaxRows, kKeysInLanesRowsPerPass). No #include here: the
// including unit has <immintrin.h>, <cmath> (INFINITY), <cstdint> and
// attention_block_types.h, and no <algorithm> (a std::min instantiated under
// this unit's flags could be the one the linker keeps).
//
// Two shapes, one arithmetic. Both replace the per-(row, key) dot product
// with a horizontal sum per product and a scalar exp per score, which is
// slower wherever a block has 4 rows or more, the more so the more rows
// (docs/BENCHMARKS.md, Attention).
//   - Queries in lanes (prefill blocks): the block's query rows are
//     transposed once (Qt [head_dim][R], R rows padded to whole vectors), so
//     the scores of one key for all rows are FMAs of a broadcast key element
//     against Qt columns, with no horizontal sum; scores stay transposed
//     (St [keys][R]), so the softmax runs across rows in vectors.
//   - Keys in lanes (a decode row's GQA group, small blocks): with few rows
//     most of Qt's lanes would be padding (4 rows in 16 lanes: 4x the FMAs),
//     so a tile of kLanes keys x kLanes elements is transposed in registers
//     and each row's scores for kLanes keys are FMAs of a broadcast query
//     element against the transposed key columns; scores are S [R][keys].
// Both then accumulate P.V as vectors of V rows against broadcast
// probabilities, a register tile of rows x columns at a time over L1-sized
// tiles of keys.
//
// Arithmetic order, the same in both shapes and at every vector width: a
// score is a sequential FMA chain over head_dim (q * k + acc from 0), times
// the scale; a row's max is exact; its sum of exponentials adds its keys in
// order from 0 (masked keys adding exact zeros); a row's output sums its
// keys in order. So a row's result does not depend on which rows share its
// block, on the shape that ran it, or on the machine's vector width.

using VT = typename Vec::T;
constexpr int64_t kL = Vec::kLanes;

inline int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
inline int64_t Min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t Max(int64_t a, int64_t b) { return a > b ? a : b; }
// The width of value and output rows (AttentionBlockArgs::value_dim).
inline int64_t ValueDim(const AttentionBlockArgs& a) { return a.value_dim > 0 ? a.value_dim : a.head_dim; }

// Where the block's keys and scratch sections are. Probabilities of row r
// and relative key j at st[j * key_stride + r * row_stride].
struct Plan {
  int64_t lo = 0, hi = 0, width = 0;  // keys [lo, hi) cover every row
  int64_t rpad = 0;                   // rows with scores: padded to whole vectors (queries in lanes)
  int64_t value_rows = 0;             // rows P.V computes in tiles of 4 (the rest one by one)
  float* qt = nullptr;                // [head_dim][rpad] (queries in lanes)
  float* st = nullptr;                // scores, then probabilities
  int64_t key_stride = 0, row_stride = 0;
  float* first = nullptr;    // [rpad] each row's first key (as float)
  float* end = nullptr;      // [rpad] one past its last key
  float* inv_sum = nullptr;  // [rpad]
  float* o = nullptr;        // [rpad][opad] P.V accumulators
  int64_t opad = 0;          // value_dim padded to whole vectors
};

// Queries in lanes: St [width][rpad]. Keys in lanes: S [rows][width padded
// to whole vectors]. Both fit AttentionBlockScratchFloats (rows <= 32).
inline Plan MakePlan(const AttentionBlockArgs& a, float* scratch, bool keys_in_lanes) {
  Plan p;
  p.lo = a.first_key[0];
  for (int64_t r = 0; r < a.rows; ++r) {
    p.lo = Min(p.lo, a.first_key[r]);
    p.hi = Max(p.hi, a.first_key[r] + a.num_keys[r]);
  }
  p.width = p.hi - p.lo;
  p.rpad = keys_in_lanes ? a.rows : RoundUp(a.rows, kL);
  p.value_rows = keys_in_lanes ? a.rows / 4 * 4 : RoundUp(a.rows, 4);
  p.qt = scratch;
  p.first = p.qt + (keys_in_lanes ? 0 : RoundUp(a.head_dim * p.rpad, 16));
  p.end = p.first + kAttentionBlockMaxRows;
  p.inv_sum = p.end + kAttentionBlockMaxRows;
  p.opad = RoundUp(ValueDim(a), 16);
  p.o = p.inv_sum + kAttentionBlockMaxRows;
  p.st = p.o + p.rpad * p.opad;
  p.key_stride = keys_in_lanes ? 1 : p.rpad;
  p.row_stride = keys_in_lanes ? RoundUp(p.width, kL) : 1;
  // Padded rows attend every key: finite scores, results never written.
  for (int64_t r = 0; r < p.rpad; ++r) {
    const bool real = r < a.rows;
    p.first[r] = static_cast<float>(real ? a.first_key[r] - p.lo : 0);
    p.end[r] = static_cast<float>(real ? a.first_key[r] + a.num_keys[r] - p.lo : p.width);
  }
  return p;
}

// Qt: column r is query row r (zeros past the block's rows).
inline void TransposeQueries(const AttentionBlockArgs& a, const Plan& p) {
  for (int64_t d = 0; d < a.head_dim; ++d) {
    float* column = p.qt + d * p.rpad;
    for (int64_t r = 0; r < a.rows; ++r) column[r] = a.q[r * a.q_stride + d];
    for (int64_t r = a.rows; r < p.rpad; ++r) column[r] = 0.0f;
  }
}

// One key's row a few keys ahead, into L1: a head's key rows are a cache
// row apart (4 KB at Mixtral's width), a stride the prefetcher skips.
// kHint _MM_HINT_T1 (L2) for rows wanted a whole L1-sized tile later.
// (decltype: GCC's hints are an enum, clang's plain ints.)
template <decltype(_MM_HINT_T0) kHint = _MM_HINT_T0>
inline void PrefetchRow(const float* row, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) _mm_prefetch(reinterpret_cast<const char*>(row + i), kHint);
}
inline constexpr int64_t kKeysAhead = 8;

// Scores of kKeys keys from relative key j for all rpad rows (kChunks
// vectors): Qt columns against broadcast key elements, then scaled, with
// keys outside a row's range set to -inf.
template <int kChunks, int kKeys>
inline void ScoreKeys(const AttentionBlockArgs& a, const Plan& p, int64_t j) {
  const float* key[kKeys];
  for (int g = 0; g < kKeys; ++g) key[g] = a.keys[p.lo + j + g] + a.kv_offset;
  for (int g = 0; g < kKeys; ++g)
    if (j + g + kKeysAhead < p.width) PrefetchRow(a.keys[p.lo + j + g + kKeysAhead] + a.kv_offset, a.head_dim);
  VT acc[kKeys][kChunks];
  for (int g = 0; g < kKeys; ++g)
    for (int c = 0; c < kChunks; ++c) acc[g][c] = Vec::Zero();
  for (int64_t d = 0; d < a.head_dim; ++d) {
    VT q[kChunks];
    for (int c = 0; c < kChunks; ++c) q[c] = Vec::Load(p.qt + d * p.rpad + c * kL);
    for (int g = 0; g < kKeys; ++g) {
      const VT k = Vec::Set1(key[g][d]);
      for (int c = 0; c < kChunks; ++c) acc[g][c] = Vec::Fma(q[c], k, acc[g][c]);
    }
  }
  const VT scale = Vec::Set1(a.scale);
  for (int g = 0; g < kKeys; ++g) {
    const VT at = Vec::Set1(static_cast<float>(j + g));
    for (int c = 0; c < kChunks; ++c) {
      const VT s = Vec::Mul(acc[g][c], scale);
      Vec::Store(p.st + (j + g) * p.rpad + c * kL,
                 Vec::Masked(s, at, Vec::Load(p.first + c * kL), Vec::Load(p.end + c * kL)));
    }
  }
}

template <int kChunks>
inline void Scores(const AttentionBlockArgs& a, const Plan& p) {
  // Accumulators plus the Qt vectors and one broadcast in registers.
  constexpr int kFit = (Vec::kRegisters - kChunks - 1) / kChunks;
  constexpr int kKeys = kFit < 1 ? 1 : (kFit > 8 ? 8 : kFit);
  int64_t j = 0;
  for (; j + kKeys <= p.width; j += kKeys) ScoreKeys<kChunks, kKeys>(a, p, j);
  for (; j < p.width; ++j) ScoreKeys<kChunks, 1>(a, p, j);
}

// Softmax across keys, for all rows at once: St becomes exp(s - max) (masked
// keys exactly 0) and inv_sum 1 / their sum; the division waits for P.V.
inline void Softmax(const Plan& p) {
  for (int64_t c = 0; c < p.rpad; c += kL) {
    VT max = Vec::Set1(-INFINITY);
    for (int64_t j = 0; j < p.width; ++j) max = Vec::Max(max, Vec::Load(p.st + j * p.rpad + c));
    VT sum = Vec::Zero();
    for (int64_t j = 0; j < p.width; ++j) {
      float* s = p.st + j * p.rpad + c;
      const VT e = Vec::Exp(Vec::Sub(Vec::Load(s), max));
      Vec::Store(s, e);
      sum = Vec::Add(sum, e);
    }
    Vec::Store(p.inv_sum + c, Vec::Div(Vec::Set1(1.0f), sum));
  }
}

// ---- Keys in lanes ----

// Rows [r0, r0 + kRows) times the transposed key tile t (element d0 + e of
// kLanes keys in t[e]) for the tile's first n elements (kLanes unless it
// is the row's tail). The full tile's loop is unrolled so that t stays in
// registers; the tail goes through memory (a variable index would send
// the whole array there).
template <int kRows>
inline void TileFmas(const AttentionBlockArgs& a, int64_t r0, int64_t d0, int64_t n, const VT (&t)[kL],
                     VT (&acc)[kRows]) {
  // Element-major, the rows innermost: each row's chain is sequential in
  // head_dim, and the rows' chains overlap (row-major left one 4-cycle FMA
  // chain at a time in flight: 16-22 ns per key at 4 rows, head_dim 64).
  const float* q[kRows];
  for (int r = 0; r < kRows; ++r) q[r] = a.q + (r0 + r) * a.q_stride + d0;
  if (n == kL) {
#pragma GCC unroll 16
    for (int e = 0; e < kL; ++e) {
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) acc[r] = Vec::Fma(Vec::Set1(q[r][e]), t[e], acc[r]);
    }
    return;
  }
  alignas(64) float tile[kL * kL];
  for (int e = 0; e < kL; ++e) Vec::Store(tile + e * kL, t[e]);
  for (int64_t e = 0; e < n; ++e)
    for (int r = 0; r < kRows; ++r) acc[r] = Vec::Fma(Vec::Set1(q[r][e]), Vec::Load(tile + e * kL), acc[r]);
}

// Scores of rows [r0, r0 + kRows) for kLanes keys from relative key j
// (past the block's keys: its first key again, masked): each tile of
// kLanes x kLanes key elements transposed once for all the rows.
template <int kRows>
inline void ScoreKeysInLanes(const AttentionBlockArgs& a, const Plan& p, int64_t r0, int64_t j) {
  const float* key[kL];
  for (int g = 0; g < kL; ++g) key[g] = a.keys[p.lo + (j + g < p.width ? j + g : 0)] + a.kv_offset;
  for (int64_t g = j + kL; g < Min(j + 2 * kL, p.width); ++g) PrefetchRow(a.keys[p.lo + g] + a.kv_offset, a.head_dim);
  VT acc[kRows];
  for (int r = 0; r < kRows; ++r) acc[r] = Vec::Zero();
  for (int64_t d0 = 0; d0 < a.head_dim; d0 += kL) {
    const int64_t n = Min(kL, a.head_dim - d0);
    VT t[kL];
    for (int g = 0; g < kL; ++g) t[g] = n == kL ? Vec::Load(key[g] + d0) : Vec::LoadN(key[g] + d0, n);
    Vec::Transpose(t);
    TileFmas<kRows>(a, r0, d0, n, t, acc);
  }
  const VT scale = Vec::Set1(a.scale), at = Vec::Add(Vec::Iota(), Vec::Set1(static_cast<float>(j)));
  for (int r = 0; r < kRows; ++r) {
    const VT s = Vec::Mul(acc[r], scale);
    Vec::Store(p.st + (r0 + r) * p.row_stride + j,
               Vec::Masked(s, at, Vec::Set1(p.first[r0 + r]), Vec::Set1(p.end[r0 + r])));
  }
}

template <int kRows>
inline void ScoreRowsKeysInLanes(const AttentionBlockArgs& a, const Plan& p, int64_t r0) {
  for (int64_t j = 0; j < p.width; j += kL) ScoreKeysInLanes<kRows>(a, p, r0, j);
}

inline void ScoresKeysInLanes(const AttentionBlockArgs& a, const Plan& p) {
  constexpr int kPass = Vec::kKeysInLanesRowsPerPass;
  static_assert(kPass == 4 || kPass == 8);
  int64_t r0 = 0;
  for (; r0 + kPass <= a.rows; r0 += kPass) ScoreRowsKeysInLanes<kPass>(a, p, r0);
  if (kPass > 4 && r0 + 4 <= a.rows) ScoreRowsKeysInLanes<4>(a, p, r0), r0 += 4;
  switch (a.rows - r0) {
    case 1: ScoreRowsKeysInLanes<1>(a, p, r0); break;
    case 2: ScoreRowsKeysInLanes<2>(a, p, r0); break;
    case 3: ScoreRowsKeysInLanes<3>(a, p, r0); break;
    default: break;
  }
}

// Each row's softmax over its keys in vectors, but its sum of exponentials
// in key order (the rows' chains interleaved), as the other shape adds them.
inline void SoftmaxKeysInLanes(const AttentionBlockArgs& a, const Plan& p) {
  const int64_t padded = RoundUp(p.width, kL);
  float sum[kAttentionBlockMaxRows];
  for (int64_t r = 0; r < a.rows; ++r) {
    float* s = p.st + r * p.row_stride;
    VT max = Vec::Set1(-INFINITY);
    for (int64_t j = 0; j < padded; j += kL) max = Vec::Max(max, Vec::Load(s + j));
    const VT row_max = Vec::Set1(Vec::ReduceMax(max));
    for (int64_t j = 0; j < padded; j += kL) Vec::Store(s + j, Vec::Exp(Vec::Sub(Vec::Load(s + j), row_max)));
    sum[r] = 0.0f;
  }
  for (int64_t j = 0; j < p.width; ++j)
    for (int64_t r = 0; r < a.rows; ++r) sum[r] += p.st[r * p.row_stride + j];
  for (int64_t r = 0; r < a.rows; ++r) p.inv_sum[r] = 1.0f / sum[r];
}

// ---- P.V, both shapes ----

// Rows [r0, r0 + kRows) x columns [d0, d0 + kChunks * kL) of the output
// accumulators O (the last chunk `tail` columns when kPartial) over keys
// [begin, end): probabilities times value rows. Keys go tile by tile
// (AttentionValues), so the tile's value rows stay in L1 for every row
// group and column pass: one sweep of all keys per (rows, columns) tile
// ran AVX2's 32-row blocks far slower at long contexts, every sweep touching
// a new 4 KB page per key.
template <int kRows, int kChunks, bool kPartial>
inline void ValueTile(const AttentionBlockArgs& a, const Plan& p, int64_t r0, int64_t d0, int64_t tail, int64_t begin,
                      int64_t end) {
  int64_t from = end, to = begin;
  for (int64_t r = r0; r < r0 + kRows; ++r) {
    from = Min(from, Max(begin, static_cast<int64_t>(p.first[r])));
    to = Max(to, Min(end, static_cast<int64_t>(p.end[r])));
  }
  if (from >= to) return;
  float* o = p.o + r0 * p.opad + d0;
  VT acc[kRows][kChunks];
  for (int g = 0; g < kRows; ++g)
    for (int c = 0; c < kChunks; ++c) acc[g][c] = Vec::Load(o + g * p.opad + c * kL);
  for (int64_t j = from; j < to; ++j) {
    const float* v = a.values[p.lo + j] + a.kv_offset + d0;
    VT value[kChunks];
    for (int c = 0; c < kChunks; ++c)
      value[c] = kPartial && c == kChunks - 1 ? Vec::LoadN(v + c * kL, tail) : Vec::Load(v + c * kL);
    const float* prob = p.st + j * p.key_stride + r0 * p.row_stride;
    for (int g = 0; g < kRows; ++g) {
      const VT w = Vec::Set1(prob[g * p.row_stride]);
      for (int c = 0; c < kChunks; ++c) acc[g][c] = Vec::Fma(w, value[c], acc[g][c]);
    }
  }
  for (int g = 0; g < kRows; ++g)
    for (int c = 0; c < kChunks; ++c) Vec::Store(o + g * p.opad + c * kL, acc[g][c]);
}

inline constexpr int64_t kValueTileKeys = 64;  // 64 x 512 B value rows: 32 KB, in L1

// Every column pass of rows [r0, r0 + kRows) over keys [begin, end).
template <int kRows>
inline void ValueRows(const AttentionBlockArgs& a, const Plan& p, int64_t r0, int64_t begin, int64_t end) {
  constexpr int kChunks = Vec::kValueChunks;
  const int64_t full = ValueDim(a) / kL, tail = ValueDim(a) % kL;
  int64_t chunk = 0;
  for (; chunk + kChunks <= full; chunk += kChunks)
    ValueTile<kRows, kChunks, false>(a, p, r0, chunk * kL, 0, begin, end);
  for (; chunk < full; ++chunk) ValueTile<kRows, 1, false>(a, p, r0, chunk * kL, 0, begin, end);
  if (tail != 0) ValueTile<kRows, 1, true>(a, p, r0, full * kL, tail, begin, end);
}

// O = P.V over key tiles, then each real row's O times its 1 / sum into out.
inline void Values(const AttentionBlockArgs& a, const Plan& p) {
  // Tiles of 4 rows up to value_rows (padded rows included when queries
  // are in lanes: 4 divides kL), the rest one row at a time.
  for (int64_t i = 0; i < p.rpad * p.opad; i += kL) Vec::Store(p.o + i, Vec::Zero());
  // Each tile's value rows are prefetched (to L2: L1 holds the tile in
  // use) while the tile before it computes, not right before their own use.
  for (int64_t j = 0; j < Min(p.width, kValueTileKeys); ++j) PrefetchRow(a.values[p.lo + j] + a.kv_offset, ValueDim(a));
  for (int64_t begin = 0; begin < p.width; begin += kValueTileKeys) {
    const int64_t end = Min(p.width, begin + kValueTileKeys);
    for (int64_t j = end; j < Min(p.width, end + kValueTileKeys); ++j)
      PrefetchRow<_MM_HINT_T1>(a.values[p.lo + j] + a.kv_offset, ValueDim(a));
    int64_t r0 = 0;
    for (; r0 < p.value_rows; r0 += 4) ValueRows<4>(a, p, r0, begin, end);
    for (; r0 < a.rows; ++r0) ValueRows<1>(a, p, r0, begin, end);
  }
  for (int64_t r = 0; r < a.rows; ++r) {
    const VT inv = Vec::Set1(p.inv_sum[r]);
    const float* o = p.o + r * p.opad;
    float* y = a.out + r * a.out_stride;
    int64_t d = 0;
    const int64_t width = ValueDim(a);
    for (; d + kL <= width; d += kL) Vec::Store(y + d, Vec::Mul(Vec::Load(o + d), inv));
    if (d < width) Vec::StoreN(y + d, Vec::Mul(Vec::Load(o + d), inv), width - d);
  }
}

inline void AttendBlockBody(const AttentionBlockArgs& a, AttentionBlockShape shape, float* scratch) {
  const bool keys_in_lanes = shape == AttentionBlockShape::kKeysInLanes ||
                             (shape == AttentionBlockShape::kAuto && a.rows <= Vec::kKeysInLanesMaxRows);
  const Plan p = MakePlan(a, scratch, keys_in_lanes);
  if (keys_in_lanes) {
    ScoresKeysInLanes(a, p);
    SoftmaxKeysInLanes(a, p);
  } else {
    TransposeQueries(a, p);
    switch (p.rpad / kL) {
      case 1: Scores<1>(a, p); break;
      case 2: Scores<2>(a, p); break;
      case 3: Scores<3>(a, p); break;
      default: Scores<kAttentionBlockMaxRows / kL>(a, p); break;
    }
    Softmax(p);
  }
  Values(a, p);
}
