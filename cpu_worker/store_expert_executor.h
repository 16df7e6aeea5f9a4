// The CPU worker's executor: computes each requested expert from this
// worker's part of it in an ExpertStore. Under `split` that is a partial
// output over the worker's rows of I,
//   p_w = W2[:, range_w] . (silu(W1[range_w] x) * (W3[range_w] x)),
// which the coordinator sums over workers in worker order (out = p_0;
// out += p_1; ...); LocalExpertExecutor with split_ways = N computes the same
// sum in one process, bit for bit. Under `shard` it is the whole FFN_e,
// identical to LocalExpertExecutor with split_ways = 1.
//
// Legend: D hidden size, R rows routed to one expert, S rows of I this
// worker holds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/base/expert_executor.h"
#include "common/base/thread_pool.h"
#include "cpu_worker/expert_call_stats.h"
#include "cpu_worker/expert_ffn.h"
#include "cpu_worker/expert_store.h"

namespace tandem {

class StoreExpertExecutor final : public ExpertExecutor {
 public:
  // `store` and `pool` are not owned and must outlive the executor; `pool`
  // (the worker's pinned threads) may be null: single thread.
  StoreExpertExecutor(const ExpertStore* store, ThreadPool* pool, LinearOptions options = {});

  // For each entry writes this worker's part of FFN_e(input) to its output
  // ([R, D] f32; the partial under split, the whole FFN under shard).
  // InvalidArgument naming the layer/expert, before anything is computed,
  // for a layer or expert out of range, one this worker holds no part of
  // (a shard held elsewhere), a negative row count, or null input/output;
  // otherwise ExpertFfn's status. The entries run as one ExpertFfn batch
  // (two parallel passes over the pool for all of them).
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override;

  ExpertCallStats stats() const { return recorder_.totals(); }  // since construction or ResetStats
  ExpertCallStats last_call() const { return recorder_.last_call(); }
  void ResetStats() { recorder_.Reset(); }

  const ExpertStore& store() const { return *store_; }

 private:
  const ExpertStore* store_;
  ExpertFfn ffn_;                     // owns the [R, S] scratch, reused across calls
  std::vector<ExpertFfnCall> calls_;  // the batch of the running call

  ExpertCallRecorder recorder_;
};

}  // namespace tandem
