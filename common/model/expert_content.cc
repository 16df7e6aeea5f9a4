// Legend: D hidden size, I intermediate size, S rows of I in one slice.
#include "common/model/expert_content.h"

#include <algorithm>
#include <atomic>
#include <memory>

// XXH3 inlined, so it is compiled for this machine's vector width
// (-march=native: AVX-512 on Zen 4/5). GCC 12 warns about the
// _mm512_undefined_* idiom inside it; the warning is a false positive
// (clang has no such warning).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/parallel_status.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_tensor_source.h"
#include "common/quant/block_order.h"
#include "common/quant/quantize.h"

namespace tandem {
namespace {

// One task hashes about this many bytes: enough to amortise the task
// counter, small enough to spread a slice over every thread.
constexpr int64_t kTaskBytes = int64_t{1} << 20;

// A run of stored rows of one matrix of one slice.
struct RowRun {
  size_t slice;
  WeightRole role;
  int64_t first, last;  // stored rows [first, last): w1/w3 rows of the slice, w2 rows of D
};

std::vector<RowRun> RowRuns(std::span<const ExpertSlice> slices, int64_t hidden, int64_t element) {
  std::vector<RowRun> runs;
  for (size_t i = 0; i < slices.size(); ++i) {
    const int64_t size = slices[i].size();
    const int64_t w13 = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, hidden * element));
    const int64_t w2 = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(1, size * element));
    for (WeightRole role : {WeightRole::kExpertW1, WeightRole::kExpertW3}) {
      for (int64_t r = 0; r < size; r += w13) runs.push_back({i, role, r, std::min(size, r + w13)});
    }
    for (int64_t r = 0; r < hidden; r += w2) runs.push_back({i, WeightRole::kExpertW2, r, std::min(hidden, r + w2)});
  }
  return runs;
}

// Runs `hash_run` (returning the sum of one run's row hashes) over every run
// on `pool`, and sums per slice.
template <class HashRun>
std::vector<uint64_t> SumRuns(size_t num_slices, const std::vector<RowRun>& runs, ThreadPool* pool,
                              const HashRun& hash_run) {
  std::unique_ptr<std::atomic<uint64_t>[]> sums(new std::atomic<uint64_t>[num_slices]);
  for (size_t i = 0; i < num_slices; ++i) sums[i].store(0);
  auto run = [&](int64_t t, int thread) {
    const RowRun& r = runs[static_cast<size_t>(t)];
    sums[r.slice].fetch_add(hash_run(r, thread), std::memory_order_relaxed);  // wraps: mod 2^64
  };
  if (pool != nullptr) {
    pool->ParallelFor(static_cast<int64_t>(runs.size()), run);
  } else {
    for (size_t t = 0; t < runs.size(); ++t) run(static_cast<int64_t>(t), 0);
  }
  std::vector<uint64_t> out(num_slices);
  for (size_t i = 0; i < num_slices; ++i) out[i] = sums[i].load();
  return out;
}

// `size` bytes of matrix `m`'s row at `bytes` in ggml's order, over which
// hashes are defined: as they are, or put back into `scratch` when `m` is a
// group-major copy. (A view has that order only for a type that has it,
// and hashed rows are whole blocks, which ToGgmlOrder asks of them.)
const uint8_t* InGgmlOrder(const LinearWeight& m, const uint8_t* bytes, size_t size, std::vector<uint8_t>& scratch) {
  if (m.order == BlockOrder::kGgml) return bytes;
  scratch.assign(bytes, bytes + size);
  (void)ToGgmlOrder(GgmlFromDType(m.dtype), absl::MakeSpan(scratch));
  return scratch.data();
}

}  // namespace

uint64_t ExpertRowSeed(int layer, int expert, WeightRole role, int64_t row, int64_t column) {
  const int64_t identity[5] = {layer, expert, static_cast<int64_t>(role), row, column};
  return XXH3_64bits_withSeed(identity, sizeof(identity), /*"tandem"*/ 0x74616e64656dULL);
}

uint64_t HashExpertRow(const void* data, size_t size, uint64_t seed) { return XXH3_64bits_withSeed(data, size, seed); }

absl::StatusOr<std::vector<uint64_t>> HashExpertSlices(const ModelWeights& weights, std::span<const ExpertSlice> slices,
                                                       ThreadPool* pool) {
  const ModelConfig& config = weights.config;
  const int64_t hidden = config.hidden_size, intermediate = config.intermediate_size;
  if (slices.empty()) return std::vector<uint64_t>();
  DType dtype = DType::kBF16;
  for (const ExpertSlice& s : slices) {
    if (s.layer < 0 || static_cast<size_t>(s.layer) >= weights.layers.size() || s.expert < 0 ||
        static_cast<size_t>(s.expert) >= weights.layers[static_cast<size_t>(s.layer)].experts.size() ||
        s.intermediate_begin < 0 || s.intermediate_end > intermediate || s.size() < 1) {
      return absl::InvalidArgumentError(absl::StrCat("expert slice layer ", s.layer, " expert ", s.expert, " [",
                                                     s.intermediate_begin, ", ", s.intermediate_end,
                                                     ") is outside the model"));
    }
    const ExpertWeights& w = weights.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    for (const auto* m : {&w.w1, &w.w3, &w.w2}) {
      if (m->data == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", s.layer, " expert ", s.expert, ": this process holds no bytes of it to hash"));
      }
    }
    // A block-quantized w2 slice is whole blocks of each row, as the
    // worker's store cuts it (PartitionExperts with ExpertSplitBlockOf).
    const int64_t block = DTypeBlockSize(w.w2.dtype);
    if (s.intermediate_begin % block != 0 || s.size() % block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert slice layer ", s.layer, " expert ", s.expert, " [", s.intermediate_begin, ", ", s.intermediate_end,
          ") cuts its ", std::string(DTypeName(w.w2.dtype)), " down_proj inside a ", block, "-value block"));
    }
    dtype = w.w1.dtype;
  }
  // Task sizes only: about a byte per value for the block types.
  const int64_t element = std::max<int64_t>(1, static_cast<int64_t>(DTypeSize(dtype)));
  const std::vector<RowRun> runs = RowRuns(slices, hidden, element);
  std::vector<std::vector<uint8_t>> scratch(static_cast<size_t>(pool != nullptr ? pool->num_threads() : 1));
  return SumRuns(slices.size(), runs, pool, [&](const RowRun& r, int thread) {
    const ExpertSlice& s = slices[r.slice];
    const ExpertWeights& w = weights.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    std::vector<uint8_t>& row_scratch = scratch[static_cast<size_t>(thread)];
    uint64_t sum = 0;
    for (int64_t row = r.first; row < r.last; ++row) {
      if (r.role == WeightRole::kExpertW2) {
        const auto* bytes = static_cast<const uint8_t*>(w.w2.data) + row * w.w2.row_bytes() +
                            DTypeRowBytes(w.w2.dtype, s.intermediate_begin);
        const size_t size = static_cast<size_t>(DTypeRowBytes(w.w2.dtype, s.size()));
        sum += HashExpertRow(InGgmlOrder(w.w2, bytes, size, row_scratch), size,
                             ExpertRowSeed(s.layer, s.expert, r.role, row, s.intermediate_begin));
      } else {
        const LinearWeight& m = r.role == WeightRole::kExpertW1 ? w.w1 : w.w3;
        const int64_t full_row = s.intermediate_begin + row;
        const auto* bytes = static_cast<const uint8_t*>(m.data) + full_row * m.row_bytes();
        const size_t size = static_cast<size_t>(m.row_bytes());
        sum += HashExpertRow(InGgmlOrder(m, bytes, size, row_scratch), size,
                             ExpertRowSeed(s.layer, s.expert, r.role, full_row, 0));
      }
    }
    return sum;
  });
}

absl::StatusOr<std::vector<uint64_t>> HashSyntheticExpertSlices(const SyntheticModelSpec& spec,
                                                                std::span<const ExpertSlice> slices, ThreadPool* pool) {
  TANDEM_ASSIGN_OR_RETURN(const ModelConfig config, SyntheticConfig(spec));
  const int64_t hidden = config.hidden_size, intermediate = config.intermediate_size;
  for (const ExpertSlice& s : slices) {
    if (s.layer < 0 || s.layer >= config.num_hidden_layers || s.expert < 0 || s.expert >= config.num_local_experts ||
        s.intermediate_begin < 0 || s.intermediate_end > intermediate || s.size() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(SyntheticModelName(spec), ": expert slice layer ", s.layer,
                                                     " expert ", s.expert, " is outside the model"));
    }
  }
  const int64_t element = static_cast<int64_t>(DTypeSize(spec.dtype));
  const std::vector<RowRun> runs = RowRuns(slices, hidden, element);
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  // One scratch row per thread, as long as the longest stored row.
  const int64_t longest = std::max(hidden, intermediate) * element;
  std::vector<std::vector<uint8_t>> scratch(static_cast<size_t>(threads),
                                            std::vector<uint8_t>(static_cast<size_t>(longest)));
  return SumRuns(slices.size(), runs, pool, [&](const RowRun& r, int thread) {
    const ExpertSlice& s = slices[r.slice];
    const WeightSpec w{WeightName(config, r.role, s.layer, s.expert), r.role, s.layer, s.expert,
                       WeightShape(config, r.role)};
    uint8_t* row_bytes = scratch[static_cast<size_t>(thread)].data();
    uint64_t sum = 0;
    for (int64_t row = r.first; row < r.last; ++row) {
      if (r.role == WeightRole::kExpertW2) {
        const int64_t begin = row * intermediate + s.intermediate_begin;
        FillSyntheticRange(config, w, spec.seed, spec.dtype, row_bytes, begin, begin + s.size(), begin);
        sum += HashExpertRow(row_bytes, static_cast<size_t>(s.size() * element),
                             ExpertRowSeed(s.layer, s.expert, r.role, row, s.intermediate_begin));
      } else {
        const int64_t full_row = s.intermediate_begin + row;
        FillSyntheticRange(config, w, spec.seed, spec.dtype, row_bytes, full_row * hidden, (full_row + 1) * hidden,
                           full_row * hidden);
        sum += HashExpertRow(row_bytes, static_cast<size_t>(hidden * element),
                             ExpertRowSeed(s.layer, s.expert, r.role, full_row, 0));
      }
    }
    return sum;
  });
}

absl::StatusOr<std::vector<uint64_t>> HashDequantizedExpertSlices(const ModelWeights& blocks,
                                                                  std::span<const ExpertSlice> slices, DType to,
                                                                  ThreadPool* pool) {
  const ModelConfig& config = blocks.config;
  const int64_t hidden = config.hidden_size, intermediate = config.intermediate_size;
  if (to != DType::kBF16 && to != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("dequantized expert hashes: to must be BF16 or F32, got ", std::string(DTypeName(to))));
  }
  for (const ExpertSlice& s : slices) {
    if (s.layer < 0 || static_cast<size_t>(s.layer) >= blocks.layers.size() || s.expert < 0 ||
        static_cast<size_t>(s.expert) >= blocks.layers[static_cast<size_t>(s.layer)].experts.size() ||
        s.intermediate_begin < 0 || s.intermediate_end > intermediate || s.size() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert slice layer ", s.layer, " expert ", s.expert, " is outside the model"));
    }
    const ExpertWeights& w = blocks.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    for (const LinearWeight* m : {&w.w1, &w.w3, &w.w2}) {
      if (m->data == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", s.layer, " expert ", s.expert, ": this process holds no blocks of it to hash"));
      }
    }
  }
  const int64_t element = static_cast<int64_t>(DTypeSize(to));
  const std::vector<RowRun> runs = RowRuns(slices, hidden, element);
  const int threads = pool != nullptr ? pool->num_threads() : 1;
  const size_t longest = static_cast<size_t>(std::max(hidden, intermediate));
  std::vector<std::vector<float>> values(static_cast<size_t>(threads), std::vector<float>(longest));
  std::vector<std::vector<uint8_t>> stored(static_cast<size_t>(threads), std::vector<uint8_t>(longest * 4));
  std::vector<std::vector<uint8_t>> reordered(static_cast<size_t>(threads));
  FirstError error;  // a row that fails to dequantize (its hash is then dropped)
  // The bytes a store of `to` holds for row `row`, columns [col0, col0 + n).
  auto stored_row = [&](const LinearWeight& m, int64_t row, int64_t col0, int64_t n, int thread) -> const uint8_t* {
    const auto* src = static_cast<const uint8_t*>(m.data) + row * m.row_bytes();
    if (!IsQuantized(m.dtype)) return src + col0 * static_cast<int64_t>(DTypeSize(m.dtype));
    src = InGgmlOrder(m, src, static_cast<size_t>(m.row_bytes()), reordered[static_cast<size_t>(thread)]);
    std::vector<float>& f = values[static_cast<size_t>(thread)];
    absl::Status s = DequantizeRow(GgmlFromDType(m.dtype), {src, static_cast<size_t>(m.row_bytes())},
                                   absl::MakeSpan(f.data(), static_cast<size_t>(m.k)));
    if (!s.ok()) error.Record(std::move(s));
    uint8_t* out = stored[static_cast<size_t>(thread)].data();
    for (int64_t i = 0; i < n; ++i) StoreAsDType(out, to, static_cast<size_t>(i), f[static_cast<size_t>(col0 + i)]);
    return out;
  };
  std::vector<uint64_t> sums = SumRuns(slices.size(), runs, pool, [&](const RowRun& r, int thread) {
    const ExpertSlice& s = slices[r.slice];
    const ExpertWeights& w = blocks.layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)];
    uint64_t sum = 0;
    for (int64_t row = r.first; row < r.last; ++row) {
      if (r.role == WeightRole::kExpertW2) {
        const int64_t bytes = IsQuantized(w.w2.dtype) ? s.size() * element : DTypeRowBytes(w.w2.dtype, s.size());
        sum += HashExpertRow(stored_row(w.w2, row, s.intermediate_begin, s.size(), thread), static_cast<size_t>(bytes),
                             ExpertRowSeed(s.layer, s.expert, r.role, row, s.intermediate_begin));
      } else {
        const LinearWeight& m = r.role == WeightRole::kExpertW1 ? w.w1 : w.w3;
        const int64_t full_row = s.intermediate_begin + row;
        const int64_t bytes = IsQuantized(m.dtype) ? hidden * element : m.row_bytes();
        sum += HashExpertRow(stored_row(m, full_row, 0, hidden, thread), static_cast<size_t>(bytes),
                             ExpertRowSeed(s.layer, s.expert, r.role, full_row, 0));
      }
    }
    return sum;
  });
  if (const absl::Status s = error.status(); !s.ok())
    return absl::InvalidArgumentError(absl::StrCat("dequantizing an expert row to hash it: ", s.message()));
  return sums;
}

uint64_t CombineExpertContentHashes(std::span<const ExpertSlice> slices, std::span<const uint64_t> hashes) {
  std::vector<int64_t> entries;
  entries.reserve(5 * slices.size());
  for (size_t i = 0; i < slices.size() && i < hashes.size(); ++i) {
    entries.insert(entries.end(), {slices[i].layer, slices[i].expert, slices[i].intermediate_begin,
                                   slices[i].intermediate_end, static_cast<int64_t>(hashes[i])});
  }
  return XXH3_64bits_withSeed(entries.data(), entries.size() * sizeof(int64_t), 0x74616e64656dULL);
}

std::string ContentHashString(uint64_t hash) { return absl::StrFormat("%016x", hash); }

std::string ExpertDTypesText(std::span<const ExpertWeights> experts) {
  uint32_t seen = 0;  // bit i: DType i
  for (const ExpertWeights& e : experts) {
    for (const LinearWeight* m : {&e.w1, &e.w3, &e.w2}) seen |= 1u << static_cast<uint32_t>(m->dtype);
  }
  std::string text;
  for (uint32_t i = 0; i < 32; ++i) {
    if ((seen & (1u << i)) == 0) continue;
    absl::StrAppend(&text, text.empty() ? "" : "+", std::string(DTypeName(static_cast<DType>(i))));
  }
  return text;
}

}  // namespace tandem
