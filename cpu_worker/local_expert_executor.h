// The in-process CPU expert executor: every expert of every layer is a set of
// weights in this process's memory, computed with ExpertFfn on one pool.
//
// Legend: D hidden size, R rows routed to one expert.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/base/expert_executor.h"
#include "common/base/thread_pool.h"
#include "common/model/expert_partition.h"
#include "cpu_worker/expert_call_stats.h"
#include "cpu_worker/expert_ffn.h"

namespace tandem {

// split_ways: the multi-process system must give bit-for-bit the logits of
// a single process. Under the `split` division (common/expert_partition.h)
// each of N workers computes a partial FFN over its rows of I,
//   p_w = W2[:, range_w] . (silu(W1[range_w] x) * (W3[range_w] x)),
// and the coordinator sums them in worker order, out = p_0; out += p_1; ...
// Float addition is not associative, so that differs in the last bits from
// one full-width W2 product. With split_ways = N > 1 this executor computes
// each expert exactly that way, over the ranges SplitIntermediate(I, N) gives
// (the ranges PartitionExperts(kSplit) gives worker w), with the same kernels
// and the same summation, so one process reproduces an N-worker split run
// bit for bit. The kernels' per-element arithmetic does not depend on the
// thread count, so the pools need not match. split_ways = 1 is the plain
// full-width FFN, which is also what N `shard` workers compute.
// The W2 column slice a partial needs is strided in the model's [D, I]
// layout and the kernels take contiguous rows only, so each call copies it
// into a scratch buffer (D x I/N weights): split_ways > 1 reads W2 about
// twice. It is a parity mode, not a fast path.
class LocalExpertExecutor final : public ExpertExecutor {
 public:
  // `experts` is indexed [layer][expert]; the weight memory it points to must
  // outlive the executor. `pool` may be null (single thread) and is not owned.
  // split_ways >= 1 (see above); a value an expert's I cannot be split into
  // is reported by RunExperts as InvalidArgument.
  LocalExpertExecutor(std::vector<std::vector<ExpertFfnWeights>> experts, ThreadPool* pool, LinearOptions options = {},
                      int split_ways = 1);

  // InvalidArgument naming the layer/expert for an index out of range, a
  // negative row count or null input/output; otherwise ExpertFfn's status.
  // The entries run as one ExpertFfn batch (two parallel passes over the
  // pool for all of them); with split_ways > 1, one after the other.
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override;

  ExpertCallStats stats() const { return recorder_.totals(); }  // since construction or ResetStats
  ExpertCallStats last_call() const { return recorder_.last_call(); }
  void ResetStats() { recorder_.Reset(); }

  int num_layers() const { return static_cast<int>(experts_.size()); }
  int split_ways() const { return split_ways_; }

 private:
  // FFN_e as split_ways partials summed in worker order, into `output`.
  absl::Status RunSplit(const ExpertFfnWeights& weights, const float* input, int64_t rows, float* output);

  std::vector<std::vector<ExpertFfnWeights>> experts_;  // [layer][expert]
  ThreadPool* pool_;
  int split_ways_;
  int64_t split_block_ = 1;           // a split cuts W2 into whole blocks of this many values
  ExpertFfn ffn_;                     // owns the [R, I] scratch, reused across calls
  std::vector<ExpertFfnCall> calls_;  // the batch of the running call
  std::vector<uint8_t> w2_part_;      // [D, S] one W2 column slice, contiguous (split_ways > 1)
  std::vector<float> partial_;        // [R, D] p_w for w > 0 (split_ways > 1)
  std::vector<float> sum_;            // [R, D] p_0 + p_1 + ... (split_ways > 1)

  ExpertCallRecorder recorder_;
};

}  // namespace tandem
