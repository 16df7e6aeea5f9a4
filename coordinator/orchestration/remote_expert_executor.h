// The coordinator's executor for experts that live in CPU worker processes:
// one layer's expert work is fanned out to every worker at once and gathered.
//
//   split — every worker holds a slice of every expert's intermediate
//           dimension and returns a partial output; the coordinator sums the
//           partials in worker order (out = p_0; out += p_1; ...), as
//           LocalExpertExecutor with split_ways = N does in one process, so
//           results are bit-for-bit the same;
//   shard — each expert goes to the one worker that holds it.
//
// Transports, chosen per worker (same results):
//   kInline      — gRPC RunExperts with the rows inside the messages;
//   kShmGrpc     — rows in the worker's arena (common/shm_transport.h),
//                  descriptors in a gRPC RunExperts;
//   kShmDoorbell — rows in the arena, the request itself through the arena's
//                  doorbell control block: no socket on the hot path.
// A layer whose rows do not fit an arena slot goes inline over gRPC.
//
// Connect checks every worker: protocol version, its index, the division,
// the types of its stored experts (options.expected_dtypes: a GGUF's blocks
// kept or dequantized must be the same on both sides; FailedPrecondition
// naming both), model fingerprint (against the coordinator's own model:
// FailedPrecondition naming both), that its shares are exactly PartitionExperts', and that the
// bytes it stores hash to what the coordinator's model gives for the same
// shares (options.expected_content; FailedPrecondition naming the worker,
// both hashes and the first share that differs). Describe also claims the
// worker for this executor's session (a worker serves one coordinator at a
// time); the destructor releases it. Every call
// has a deadline (options.call_timeout): a dead worker makes the call fail
// with Unavailable, a hung one with DeadlineExceeded, never a hang; the
// worker is then re-Described (and re-checked) lazily at the next call, which
// succeeds once it is back.
//
// Legend: R rows of one expert, D hidden size.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/expert_executor.h"
#include "common/model/expert_partition.h"
#include "common/model/model_config.h"
#include "common/model/model_fingerprint.h"

namespace tandem {
namespace v1 {
class DescribeResponse;
}  // namespace v1

enum class WorkerTransport { kInline, kShmGrpc, kShmDoorbell };
// "inline" | "shm-grpc" | "shm" (shm + doorbell, the fast path)
absl::StatusOr<WorkerTransport> ParseWorkerTransport(const std::string& name);
std::string WorkerTransportName(WorkerTransport transport);

struct RemoteExpertExecutorOptions {
  std::vector<std::string> addresses;  // worker i at addresses[i], e.g. "unix:/run/tandem/w0.sock"
  // One for every worker, or one per worker; empty: kShmDoorbell, the
  // fastest (tandem-ipc-bench), for all.
  std::vector<WorkerTransport> transports;
  absl::Duration call_timeout = absl::Seconds(5);     // one RunExperts call, all workers together
  absl::Duration connect_timeout = absl::Seconds(5);  // Connect waits this long for every worker to answer
  absl::Duration spin = absl::Microseconds(50);       // doorbell: busy-wait before sleeping on the futex
  // gRPC transports: the engine thread polls its completion queue without
  // sleeping for up to this long after dispatching when a reply is expected
  // within it, i.e. the worker's last reply reported less compute than this
  // (a transport-bound call: waking a sleeping thread costs tens of µs on a
  // VM, tandem-ipc-bench); replies behind longer compute (real experts) are
  // awaited asleep, wasting no cpu. 0: always sleep.
  absl::Duration grpc_spin = absl::Microseconds(250);
  // The content hash of each of `slices` (expert_content.h) in the
  // coordinator's model, asked once per worker at its first connect. Unset:
  // a worker that holds weights is refused (it cannot be checked); an echo
  // worker (no weights; its fingerprint says so) needs none.
  std::function<absl::StatusOr<std::vector<uint64_t>>(std::span<const ExpertSlice> slices)> expected_content;
  // The types of the coordinator's experts for `slices` (ExpertDTypesText),
  // asked once per worker at its first connect, compared with the worker's
  // Describe experts_dtypes. Unset: not checked.
  std::function<std::string(std::span<const ExpertSlice> slices)> expected_dtypes;
  // The coordinator's experts' down_proj blocks (ExpertSplitBlockOf): a
  // split cuts them on block boundaries, as the workers' stores do.
  ExpertSplitBlock split_block;
};

// Per worker, since Connect.
struct RemoteWorkerStats {
  std::string address;
  std::string transport;
  int64_t calls = 0;       // RunExperts round trips that succeeded
  int64_t failures = 0;    // that failed (the call returned an error)
  int64_t reconnects = 0;  // successful re-Describes after a failure
  // The worker's state now: whether the latest of its RunExperts call,
  // re-Describe or Probe succeeded (counts only grow, so they cannot say
  // whether a worker that failed several times in one outage is back).
  bool healthy = true;
  std::string last_error;  // of the latest failure while unhealthy; empty when healthy
  int64_t rows = 0;
  int64_t inline_fallbacks = 0;  // shm calls sent inline because a slot was too small
  double round_trip_us = 0;      // sum over calls: dispatch to response, as the coordinator saw it
  double worker_compute_us = 0;  // sum of the worker's own compute time
  double last_round_trip_us = 0;
};

class RemoteExpertExecutor final : public ExpertExecutor {
 public:
  // Connects to and checks every worker (see the file comment); `expected`
  // is the coordinator's own model's fingerprint. Unavailable / DeadlineExceeded
  // naming the worker when one does not answer within connect_timeout.
  static absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> Connect(const ModelConfig& config,
                                                                       const ModelFingerprint& expected,
                                                                       const RemoteExpertExecutorOptions& options);
  ~RemoteExpertExecutor() override;

  // Engine thread only. InvalidArgument for a bad entry (checked before any
  // worker is contacted); the failing worker's status, prefixed with its
  // index and address, when one fails.
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override;

  // One empty Health round trip to worker `index` through the channel and
  // completion queue RunExperts uses, waited for the same way: the gRPC
  // transports' fixed cost (tandem-ipc-bench). Engine thread only.
  absl::Status Ping(int index);

  ExpertDivision division() const { return division_; }
  int num_workers() const { return static_cast<int>(workers_.size()); }
  std::vector<RemoteWorkerStats> stats() const ABSL_LOCKS_EXCLUDED(stats_mutex_);  // any thread
  // One Health round trip to worker `index` with `timeout`, on the worker's
  // own channel but not the engine's completion queue: any thread, while
  // requests run. Records the outcome as the worker's health (stats()): a
  // restarted worker is healthy again before a request re-Describes it, a
  // dead or stopped one unhealthy before a request fails on it.
  absl::Status Probe(int index, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(stats_mutex_);

  // Each worker's expert-store region (worker order; empty for a worker
  // without one), as its last Describe said. Engine thread only.
  std::vector<std::string> weights_regions() const;
  // "2 workers (split): 0 unix:/a shm [worker0@node0 pid 12 cpus 0-7], ..."
  std::string Summary() const;

 private:
  struct Worker;
  struct Dispatched;
  RemoteExpertExecutor();
  absl::Status ConnectWorker(Worker& worker, absl::Time deadline, bool initial);
  // ConnectWorker's checks of a worker's Describe reply (worker 0's
  // division, at start-up, becomes the executor's).
  absl::Status CheckIdentity(Worker& worker, const v1::DescribeResponse& d, bool initial);
  absl::Status CheckShares(const Worker& worker, const v1::DescribeResponse& d) const;
  // The worker's experts_dtypes against options_.expected_dtypes.
  absl::Status CheckDTypes(Worker& worker, const v1::DescribeResponse& d);
  // The worker's content hash (Describe) against options_.expected_content
  // for its shares (PartitionExperts', already checked to be the worker's).
  absl::Status CheckContent(Worker& worker, const v1::DescribeResponse& d);
  static void WarnOnOtherKernelPlan(const Worker& worker, const v1::DescribeResponse& d);

  // RunExperts' steps, in order.
  absl::Status CheckWork(int layer, std::span<const ExpertWork> work) const;
  void AssignEntries(int layer, std::span<const ExpertWork> work);
  absl::Status ReconnectWorkers(absl::Time deadline);
  Dispatched DispatchAll(int layer, std::span<const ExpertWork> work, absl::Time deadline);
  void BuildRequest(Worker& w, int layer, std::span<const ExpertWork> work);
  void AwaitGrpcReplies(const Dispatched& dispatched);
  void AwaitDoorbells(absl::Time deadline);
  absl::Status RecordCall(std::span<const ExpertWork> work);
  void MarkHealth(Worker& worker, const absl::Status& status) ABSL_LOCKS_EXCLUDED(stats_mutex_);
  // `worker`'s entry of worker_stats_.
  RemoteWorkerStats& StatsOf(const Worker& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(stats_mutex_);
  void Gather(std::span<const ExpertWork> work);

  ModelConfig config_;
  ModelFingerprint expected_;
  RemoteExpertExecutorOptions options_;
  ExpertDivision division_ = ExpertDivision::kSplit;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<int> owner_;  // shard: [layer * E + expert] -> worker index
  uint64_t next_request_id_ = 1;
  uint64_t session_ = 0;  // random, nonzero: this executor's claim on its workers
  struct Rpc;
  std::unique_ptr<Rpc> rpc_;  // the completion queue the engine thread drives
  // The workers' stats, read by any thread (stats(), Probe); every other
  // field of a Worker is the engine thread's.
  mutable absl::Mutex stats_mutex_;
  std::vector<RemoteWorkerStats> worker_stats_ ABSL_GUARDED_BY(stats_mutex_);  // [worker index]
};

}  // namespace tandem
