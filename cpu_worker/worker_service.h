// The CPU worker's side of tandem.v1.ExpertWorker: Describe, RunExperts,
// Calibrate, Health and Stats (WorkerService: plain methods on messages),
// served over gRPC by WorkerServer, plus the arena's doorbell loop on its own
// thread for RunExperts without gRPC.
//
// One coordinator at a time: Describe claims the worker for the caller's
// session (refused while another live coordinator holds it; a holder whose
// process has exited is replaced), RunExperts and Calibrate must carry that
// session, Release gives it back. Describe refuses a protocol version this
// worker does not speak. WorkerServer accepts connections only from this
// user or root (SO_PEERCRED) and tells the handlers who called.
//
// Every request is validated completely before anything is computed or
// written (layer and experts in range, distinct, held by this worker; inline
// payload sizes; arena descriptors via ShmArena::Resolve; output ranges not
// overlapping), so a malformed request is refused with InvalidArgument /
// DataLoss naming the field and changes nothing; the worker keeps serving.
// RunExperts from the two paths are serialised by one compute mutex (the
// executor has one caller at a time), and the thread that computes is pinned
// to the worker's first cpu, the pool's thread 0.
//
// Legend: R rows of one expert, D hidden size.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>  // std::once_flag
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/expert_executor.h"
#include "common/model/expert_partition.h"
#include "common/model/model_config.h"
#include "common/model/model_fingerprint.h"
#include "common/platform/shm_transport.h"
#include "common/platform/unix_socket.h"
#include "tandem/v1/expert_worker.grpc.pb.h"

namespace tandem {

struct WorkerServiceOptions {
  std::string worker_id;  // e.g. "worker0@node0"
  ModelConfig config;
  ModelFingerprint fingerprint;
  ExpertDivision division = ExpertDivision::kSplit;
  int worker_index = 0;
  int num_workers = 1;
  std::vector<ExpertSlice> slices;  // what this worker holds (PartitionExperts)
  // Computes FFN_e (split: the partial output of this worker's slice) for the
  // slices above; not owned, must outlive the service.
  ExpertExecutor* executor = nullptr;
  int numa_node = 0;
  std::vector<int> cpus;  // the compute threads' cpus; the computing thread pins to cpus[0]
  std::string weights_region;
  uint64_t weights_region_bytes = 0;
  // The stored bytes' hashes (ExpertStore::slice_hashes, slices order) and
  // their combination; empty / 0 for an echo worker.
  std::vector<uint64_t> slice_hashes;
  uint64_t content_hash = 0;
  // The stored matrices' types (ExpertStore::dtypes), e.g. "BF16" or
  // "Q4_K+Q6_K"; empty for an echo worker.
  std::string experts_dtypes;
  // The tensor arena for TRANSPORT_SHM and the doorbell; nullopt: inline only.
  std::optional<ArenaOptions> arena;
  absl::Duration doorbell_spin = absl::Microseconds(50);  // busy-wait before the futex sleep
  std::string compute = "store";                          // "store" | "echo", reported by Describe
  std::vector<std::string> kernels;
};

// Who sent an RPC and until when it may run: over gRPC, the connection's
// SO_PEERCRED and the call's deadline; through the doorbell, no peer (the
// arena is this user's region) and no deadline.
struct RpcCaller {
  std::optional<PeerCredentials> peer;
  absl::Time deadline = absl::InfiniteFuture();
};

class WorkerService {
 public:
  // Creates the arena (if asked) and starts the doorbell thread.
  // InvalidArgument naming the option that is inconsistent.
  static absl::StatusOr<std::unique_ptr<WorkerService>> Create(WorkerServiceOptions options);
  ~WorkerService();

  // The RPCs, independent of how they arrive (WorkerServer binds them to gRPC).
  // Describe: FailedPrecondition for another protocol version or while
  // another live coordinator holds the worker (naming it); InvalidArgument
  // for a zero session.
  absl::Status Describe(const v1::DescribeRequest& request, v1::DescribeResponse* response,
                        const RpcCaller& caller = {});
  absl::Status RunExperts(const v1::RunExpertsRequest& request, v1::RunExpertsResponse* response,
                          const RpcCaller& caller = {}) {
    return Run(request, response, /*via_doorbell=*/false);
  }
  // Blocks for the measurement (reps x rows computations), bounded (see
  // kMaxCalibrate*) and stopped with DeadlineExceeded at the caller's deadline.
  absl::Status Calibrate(const v1::CalibrateRequest& request, v1::CalibrateResponse* response,
                         const RpcCaller& caller = {});
  absl::Status Health(const v1::HealthRequest& request, v1::HealthResponse* response, const RpcCaller& caller = {});
  absl::Status Stats(const v1::StatsRequest& request, v1::StatsResponse* response, const RpcCaller& caller = {});
  // Frees the worker for another coordinator if `request.session` holds it.
  absl::Status Release(const v1::ReleaseRequest& request, v1::ReleaseResponse* response, const RpcCaller& caller = {});

  // A connection WorkerServer refused (its peer's uid is not trusted).
  void CountRefusedConnection() { refused_connections_.fetch_add(1, std::memory_order_relaxed); }

  // The common core of both paths; `via_doorbell` only changes the checks on
  // the transport field and the stats.
  absl::Status Run(const v1::RunExpertsRequest& request, v1::RunExpertsResponse* response, bool via_doorbell);

  // Stops the doorbell thread (idempotent); further doorbell requests go unanswered.
  void StopDoorbell();

  const WorkerServiceOptions& options() const { return options_; }
  const ShmArena* arena() const { return arena_.get(); }

 private:
  explicit WorkerService(WorkerServiceOptions options) : options_(std::move(options)) {}
  void DoorbellLoop();
  void PinComputeThread() ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mutex_);
  const ExpertSlice* FindSlice(int layer, int expert) const;
  // OK when `session` holds the worker; FailedPrecondition naming the holder
  // otherwise. `what` names the request.
  absl::Status CheckSession(uint64_t session, const std::string& what) const ABSL_LOCKS_EXCLUDED(holder_mutex_);
  // Describe's steps: the caller claims the worker (or is refused while
  // another live coordinator holds it), then the reply is filled.
  absl::Status Claim(const v1::DescribeRequest& request, const RpcCaller& caller) ABSL_LOCKS_EXCLUDED(holder_mutex_);
  void FillDescription(v1::DescribeResponse* response) const;
  // Calibrate's bounds, checked before anything is allocated; the largest
  // row count asked.
  absl::StatusOr<int64_t> CheckCalibrateRequest(const v1::CalibrateRequest& request) const;

  // The coordinator holding this worker (Describe), if any.
  struct Holder {
    uint64_t session = 0;
    pid_t pid = 0;             // 0: unknown
    uint64_t start_ticks = 0;  // /proc/<pid>/stat starttime: a reused pid is not the holder
    std::string who;           // for messages
    absl::Time since;
  };
  mutable absl::Mutex holder_mutex_;
  std::optional<Holder> holder_ ABSL_GUARDED_BY(holder_mutex_);
  std::atomic<uint64_t> holder_session_{0};  // holder_->session, for the per-request check

  // Run's steps: the request checked completely and resolved into work
  // (task by task: its input, its output), or rejected; then computed and
  // counted.
  struct ParsedRequest;
  absl::Status ParseRequest(const v1::RunExpertsRequest& request, bool via_doorbell, v1::RunExpertsResponse* response,
                            ParsedRequest* parsed) const;
  absl::Status ParseTask(int i, const v1::ExpertTask& task, v1::RunExpertsResponse* response,
                         ParsedRequest* parsed) const;
  absl::StatusOr<const float*> TaskInput(int i, const v1::ExpertTask& task, int64_t rows, ParsedRequest* parsed) const;
  absl::StatusOr<float*> TaskOutput(int i, const v1::ExpertTask& task, int64_t rows, v1::ExpertResult* result,
                                    ParsedRequest* parsed) const;
  absl::Status Reject(const v1::RunExpertsRequest& request, bool via_doorbell, absl::Status status,
                      v1::RunExpertsResponse* response);
  absl::StatusOr<int64_t> Compute(int layer, const std::vector<ExpertWork>& work, v1::RunExpertsResponse* response)
      ABSL_LOCKS_EXCLUDED(compute_mutex_);
  void CountRun(const std::vector<ExpertWork>& work, bool via_doorbell, int64_t compute_ns);

  WorkerServiceOptions options_;
  std::vector<int32_t> slice_of_;  // [layer * E + expert] -> options_.slices index or -1
  std::unique_ptr<ShmArena> arena_;
  std::thread doorbell_thread_;
  std::atomic<bool> stop_{false};

  // One RunExperts/Calibrate at a time: it guards no member, it serialises
  // the calls into options_.executor (which has one caller at a time).
  absl::Mutex compute_mutex_;

  std::atomic<uint64_t> requests_{0}, doorbell_requests_{0}, expert_calls_{0}, rows_{0}, rejected_{0};
  std::atomic<uint64_t> refused_connections_{0};
  std::atomic<int64_t> compute_ns_{0};
};

// Copies input to output: an expert "computation" that costs one memcpy, for
// measuring the transport alone (tandem-ipc-bench, --echo workers).
class EchoExpertExecutor final : public ExpertExecutor {
 public:
  explicit EchoExpertExecutor(int64_t hidden_size) : hidden_size_(hidden_size) {}
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override;

 private:
  int64_t hidden_size_;
};

// The fingerprint an --echo worker reports for `config`: the config's own
// (FingerprintConfig with BF16) under architecture "echo:<architecture>", so
// an echo worker never passes for one holding real weights.
ModelFingerprint EchoFingerprint(const ModelConfig& config);

// One thread drives a completion queue: it reads a request, computes and
// writes the response itself (no thread hop to a handler pool), then polls
// for `spin` before sleeping. A Calibrate holds it up for its duration (the
// compute mutex would hold RunExperts anyway). gRPC's sync and callback
// servers were measured against it and took longer per round trip
// (docs/process-split.md), so this is the only mode.
struct WorkerServerOptions {
  // After each RPC the thread polls (without sleeping) this long before
  // blocking, so a request that follows at once costs no wake-up.
  absl::Duration spin = absl::ZeroDuration();
};

// A gRPC server for one WorkerService on a unix socket. The server accepts
// connections itself (UnixListener: the socket is 0600 from the start) and
// hands gRPC only those whose peer is this user or root (SO_PEERCRED); any
// other is closed at once, logged and counted.
class WorkerServer {
 public:
  // `address` "unix:/run/tandem/w0.sock": a stale socket of ours there is
  // replaced; a live server's socket, another user's or any other file is
  // refused (PrepareSocketPath). Unavailable naming the address when it
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(std::unique_ptr<WorkerService> service,
                                                             const std::string& address,
                                                             WorkerServerOptions options = {});
  ~WorkerServer();
  // Stops accepting, finishes the RPCs in progress (at most `grace`), stops the doorbell.
  void Shutdown(absl::Duration grace = absl::Seconds(2));
  void Wait();
  WorkerService& service() { return *service_; }

  struct Bindings;  // the gRPC service objects and the async thread (worker_service.cc)

 private:
  WorkerServer();
  void AcceptLoop();

  std::unique_ptr<WorkerService> service_;
  std::unique_ptr<Bindings> bindings_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<UnixListener> listener_;
  std::thread accept_thread_;
  std::once_flag shutdown_once_;
};

}  // namespace tandem
