// The content hash of expert weights: what lets a coordinator tell a CPU
// worker holding other weights (another seed, another fine-tune of the same
// shapes) from one holding its own, which the model fingerprint (config,
// names, dtypes, shapes) cannot.
//
// Definition. A worker stores, per expert slice (layer, expert, rows [b, e)
// of I), the rows of w1 and w3 [b, e) (D elements each) and, for every row r
// of w2, its columns [b, e). Each such stored row is hashed with XXH3-64
// (non-cryptographic, ~tens of GB/s) seeded by the row's identity (layer,
// expert, matrix, row, first column), so moving bytes between rows or
// experts changes the hash. A slice's hash is the sum (mod 2^64) of its row
// hashes: rows may be hashed in any order, on any thread, as the store's
// parallel copy writes them. A worker's hash combines its slices' hashes in
// order (CombineExpertContentHashes).
//
// The worker computes it while filling its store (cpu_worker/expert_store);
// the coordinator computes the same over its own model's bytes
// (HashExpertSlices) or, holding no expert bytes (a synthetic model whose
// experts live on the workers), regenerates each row into a scratch buffer
// and hashes it (HashSyntheticExpertSlices): the whole model's experts once,
// never held in memory.
//
// Legend: D hidden size, I intermediate size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"
#include "common/model/expert_partition.h"
#include "common/model/model_weights.h"
#include "common/model/synthetic_model.h"
#include "common/model/tensor_names.h"

namespace tandem {

// The seed of one stored row: w1/w3 row `row` of the full [I, D] matrix
// (column 0), or w2 row `row`'s columns from `column` on.
uint64_t ExpertRowSeed(int layer, int expert, WeightRole role, int64_t row, int64_t column);
// XXH3-64 of `size` bytes with `seed`.
uint64_t HashExpertRow(const void* data, size_t size, uint64_t seed);

// One hash per slice (same order), from `weights`' expert matrices, which
// must have their bytes (InvalidArgument naming the tensor otherwise).
// Rows are hashed on `pool` (null: this thread).
absl::StatusOr<std::vector<uint64_t>> HashExpertSlices(const ModelWeights& weights, std::span<const ExpertSlice> slices,
                                                       ThreadPool* pool);

// The same for the experts of the synthetic model `spec`, regenerated row
// by row (FillSyntheticRange) into per-thread scratch rows: nothing of the
// experts is held. InvalidArgument for a slice outside the model.
absl::StatusOr<std::vector<uint64_t>> HashSyntheticExpertSlices(const SyntheticModelSpec& spec,
                                                                std::span<const ExpertSlice> slices, ThreadPool* pool);

// The hashes a store would have whose experts were dequantized to `to`
// (BF16 or F32) at load (the GGUF loader's fallback: DequantizeRow, then
// rounded to nearest even), from `blocks`' experts in their quantized blocks
// (a GGUF loaded with kKeep or kKeepExperts): each stored row is
// dequantized into a per-thread scratch row and hashed, so a coordinator
// that holds no dequantized experts (workers hold them) checks workers
// started with --gguf_experts bf16. Float matrices are hashed as stored.
// InvalidArgument naming the slice or tensor for a slice outside the model
// or a block that does not decode.
absl::StatusOr<std::vector<uint64_t>> HashDequantizedExpertSlices(const ModelWeights& blocks,
                                                                  std::span<const ExpertSlice> slices, DType to,
                                                                  ThreadPool* pool);

// The worker's hash from its slices and their hashes (same length).
uint64_t CombineExpertContentHashes(std::span<const ExpertSlice> slices, std::span<const uint64_t> hashes);

// "0123456789abcdef"
std::string ContentHashString(uint64_t hash);

// The distinct types of `experts`' matrices, in DType order, joined with
// '+': "BF16", "Q4_K+Q6_K". What a worker says it stores and a coordinator
// compares with its own model's (two processes that dequantize a GGUF
// differently never agree on content hashes; this says why).
std::string ExpertDTypesText(std::span<const ExpertWeights> experts);

}  // namespace tandem
