#include "coordinator/orchestration/remote_expert_executor.h"

#include <grpcpp/grpcpp.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/kernels/kernel_plan.h"
#include "common/model/expert_content.h"
#include "common/platform/shm_transport.h"
#include "tandem/v1/expert_worker.grpc.pb.h"
#include "tandem/v1/expert_worker_convert.h"

namespace tandem {
namespace {

constexpr uint64_t kRowAlignment = 64;  // each expert's rows start on a cache line of the slot
// How long a lazy reconnect waits for a restarted worker to accept the
// connection before the request fails with UNAVAILABLE.
constexpr absl::Duration kReconnectWait = absl::Milliseconds(300);

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

std::string ShareText(int layer, int expert, int64_t begin, int64_t end) {
  return absl::StrCat("layer ", layer, " expert ", expert, " [", begin, ", ", end, ")");
}

// A random nonzero session id: this executor's claim on its workers.
uint64_t NewSession() {
  uint64_t session = 0;
  while (session == 0) {
    if (getrandom(&session, sizeof(session), 0) != static_cast<ssize_t>(sizeof(session))) {
      session = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
                static_cast<uint64_t>(getpid());
    }
  }
  return session;
}

// How long the destructor waits for each worker to take its Release.
constexpr absl::Duration kReleaseWait = absl::Milliseconds(300);

}  // namespace

absl::StatusOr<WorkerTransport> ParseWorkerTransport(const std::string& name) {
  if (name == "inline") return WorkerTransport::kInline;
  if (name == "shm-grpc") return WorkerTransport::kShmGrpc;
  if (name == "shm") return WorkerTransport::kShmDoorbell;
  return absl::InvalidArgumentError(
      absl::StrCat("worker transport must be \"inline\", \"shm-grpc\" or \"shm\", got \"", name, "\""));
}

std::string WorkerTransportName(WorkerTransport transport) {
  switch (transport) {
    case WorkerTransport::kInline: return "inline";
    case WorkerTransport::kShmGrpc: return "shm-grpc";
    case WorkerTransport::kShmDoorbell: return "shm";
  }
  return "?";
}

// The engine thread's completion queue: it drives the gRPC calls' I/O itself
// while it waits, so a reply costs no thread hop.
struct RemoteExpertExecutor::Rpc {
  grpc::CompletionQueue cq;

  // The next completion: polled without sleeping until `spin_until`, then
  // waited for asleep. False only after Shutdown.
  bool Next(std::chrono::steady_clock::time_point spin_until, void** tag, bool* ok) {
    while (std::chrono::steady_clock::now() < spin_until) {
      if (cq.AsyncNext(tag, ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) == grpc::CompletionQueue::GOT_EVENT) return true;
    }
    return cq.Next(tag, ok);
  }
};

struct RemoteExpertExecutor::Worker {
  int index = 0;
  std::string address;
  WorkerTransport transport = WorkerTransport::kShmDoorbell;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ExpertWorker::Stub> stub;
  bool connected = false;
  bool claimed = false;  // a Describe succeeded: the worker holds our session until Release
  std::optional<std::vector<uint64_t>> expected_content;  // per share, from options.expected_content (computed once)
  std::optional<std::string> expected_dtypes;             // from options.expected_dtypes (computed once)
  std::string description;                                // from Describe, for Summary and logs
  std::string weights_region;                             // from Describe: the worker's expert store (empty: none)
  std::unique_ptr<ShmArena> arena;
  uint32_t next_slot = 0;

  // One call's state, reused across calls.
  std::vector<size_t> entries;    // indices into the call's work
  std::vector<uint64_t> offsets;  // shm: byte offset of each entry's rows in the slots
  bool via_shm = false;
  bool via_doorbell = false;
  uint32_t slot = 0;
  uint32_t doorbell_seq = 0;
  v1::RunExpertsRequest request;
  v1::RunExpertsResponse response;
  std::string serialized;
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::RunExpertsResponse>> reader;
  grpc::Status grpc_status;
  bool grpc_pending = false;
  // The worker's own compute time in its last gRPC reply: a reply is
  // expected soon (worth polling for) when it is short. 0 before any.
  double last_grpc_compute_us = 0;
  absl::Status status;
  std::chrono::steady_clock::time_point sent;
  double round_trip_us = 0;

  std::string name() const {
    return absl::StrCat("worker ", index, " (", address, ", ", WorkerTransportName(transport), ")");
  }
  absl::Status Prefixed(const absl::Status& s) const {
    return s.ok() ? s : absl::Status(s.code(), absl::StrCat(name(), ": ", s.message()));
  }

  // ConnectWorker's steps: the Describe call, then the worker's arena.
  absl::Status Describe(absl::Time deadline, bool initial, uint64_t session, v1::DescribeResponse* d);
  absl::Status OpenArena(const v1::DescribeResponse& d, absl::Time deadline, absl::Duration spin);
  // One RunExperts call: where each entry's rows go in the slot (returns the
  // bytes needed), the request with the rows in the slot or inline, posting
  // it, checking the reply and reading entry k's output.
  uint64_t LayOutSlot(std::span<const ExpertWork> work, int64_t d);
  void WriteShmRows(std::span<const ExpertWork> work, int64_t d);
  void WriteInlineRows(std::span<const ExpertWork> work, int64_t d);
  void RingDoorbell();
  void StartGrpcCall(absl::Time deadline, grpc::CompletionQueue* cq);
  void CheckReply(int layer, std::span<const ExpertWork> work, int64_t d);
  const float* output(size_t k) const;
};

// What DispatchAll leaves for AwaitGrpcReplies: how many gRPC replies are
// outstanding, and until when to poll for them rather than sleep.
struct RemoteExpertExecutor::Dispatched {
  int grpc_pending = 0;
  std::chrono::steady_clock::time_point spin_until;
};

RemoteExpertExecutor::RemoteExpertExecutor() : session_(NewSession()), rpc_(std::make_unique<Rpc>()) {}

RemoteExpertExecutor::~RemoteExpertExecutor() {
  // Free every worker we claimed for the next coordinator (one that has
  // exited is freed anyway: the worker checks whether its holder still runs).
  for (auto& worker : workers_) {
    if (!worker->claimed) continue;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kReleaseWait));
    v1::ReleaseRequest request;
    request.set_session(session_);
    v1::ReleaseResponse response;
    const grpc::Status status = worker->stub->Release(&context, request, &response);
    if (!status.ok()) LOG_DEBUG("remote experts: releasing ", worker->name(), ": ", status.error_message());
  }
  rpc_->cq.Shutdown();
  void* tag;
  bool ok;
  while (rpc_->cq.Next(&tag, &ok)) {
  }
}

absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> RemoteExpertExecutor::Connect(
    const ModelConfig& config, const ModelFingerprint& expected, const RemoteExpertExecutorOptions& options) {
  const size_t n = options.addresses.size();
  if (n == 0) return absl::InvalidArgumentError("RemoteExpertExecutorOptions.addresses is empty");
  if (options.transports.size() > 1 && options.transports.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("RemoteExpertExecutorOptions.transports has ",
                                                   options.transports.size(),
                                                   " entries; give none (shm), 1 or one per worker (", n, ")"));
  }
  if (options.call_timeout <= absl::ZeroDuration() || options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("RemoteExpertExecutorOptions: call_timeout and connect_timeout must be > 0");
  }
  auto executor = std::unique_ptr<RemoteExpertExecutor>(new RemoteExpertExecutor());
  executor->config_ = config;
  executor->expected_ = expected;
  executor->options_ = options;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // inline tensors of a long prefill exceed 4 MB
  args.SetMaxSendMessageSize(-1);
  // A restarted worker is found again quickly (gRPC's default backoff grows to 2 min).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Per-layer round trips: no retry buffering; a flow-control window and
  // frames large enough that an inline layer (MBs) needs no WINDOW_UPDATE
  // round trips (the default window is 64 KiB).
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
  for (size_t i = 0; i < n; ++i) {
    auto worker = std::make_unique<Worker>();
    worker->index = static_cast<int>(i);
    worker->address = options.addresses[i];
    worker->transport = options.transports.empty()       ? WorkerTransport::kShmDoorbell
                        : options.transports.size() == 1 ? options.transports[0]
                                                         : options.transports[i];
    // One channel per worker for the executor's lifetime; gRPC reconnects it.
    worker->channel = grpc::CreateCustomChannel(worker->address, grpc::InsecureChannelCredentials(), args);
    worker->stub = v1::ExpertWorker::NewStub(worker->channel);
    {
      absl::MutexLock lock(&executor->stats_mutex_);
      RemoteWorkerStats& stats = executor->worker_stats_.emplace_back();
      stats.address = worker->address;
      stats.transport = WorkerTransportName(worker->transport);
    }
    executor->workers_.push_back(std::move(worker));
  }
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  for (auto& worker : executor->workers_) {
    TANDEM_RETURN_IF_ERROR(executor->ConnectWorker(*worker, deadline, /*initial=*/true));
  }
  // Every worker's expected content is known now (reconnects compare with
  // it); the function may read a model that does not outlive this executor.
  executor->options_.expected_content = nullptr;
  executor->options_.expected_dtypes = nullptr;
  if (executor->division_ == ExpertDivision::kShard) {
    const int64_t e = config.num_local_experts;
    executor->owner_.assign(static_cast<size_t>(config.num_hidden_layers * e), -1);
    for (int w = 0; w < static_cast<int>(n); ++w) {
      TANDEM_ASSIGN_OR_RETURN(
          std::vector<ExpertSlice> slices,
          PartitionExperts(config, ExpertDivision::kShard, w, static_cast<int>(n), executor->options_.split_block));
      for (const ExpertSlice& s : slices) executor->owner_[static_cast<size_t>(s.layer * e + s.expert)] = w;
    }
  }
  LOG_INFO("remote experts: ", executor->Summary());
  return executor;
}

absl::Status RemoteExpertExecutor::ConnectWorker(Worker& worker, absl::Time deadline, bool initial) {
  v1::DescribeResponse d;
  TANDEM_RETURN_IF_ERROR(worker.Describe(deadline, initial, session_, &d));
  TANDEM_RETURN_IF_ERROR(CheckIdentity(worker, d, initial));
  TANDEM_RETURN_IF_ERROR(CheckShares(worker, d));
  TANDEM_RETURN_IF_ERROR(CheckContent(worker, d));
  worker.weights_region = d.weights_region();
  worker.arena.reset();
  if (worker.transport != WorkerTransport::kInline)
    TANDEM_RETURN_IF_ERROR(worker.OpenArena(d, deadline, options_.spin));
  worker.description = absl::StrCat(
      d.worker_id(), " pid ", d.pid(), " node ", d.numa_node(), " cpus ", absl::StrJoin(d.cores(), ","), ", ",
      d.experts_size(), " shares", d.experts_dtypes().empty() ? "" : absl::StrCat(" of ", d.experts_dtypes()),
      absl::StrFormat(" in %.1f MiB, ", d.weights_region_bytes() / 1048576.0), d.compute());
  WarnOnOtherKernelPlan(worker, d);
  worker.connected = true;
  if (!initial) {
    MarkHealth(worker, absl::OkStatus());
    absl::MutexLock lock(&stats_mutex_);
    ++StatsOf(worker).reconnects;
    LOG_INFO("remote experts: reconnected to ", worker.name(), ": ", worker.description);
  }
  return absl::OkStatus();
}

// A worker whose kernel plan differs from this process's computes the same
// experts with other kernels: right, but not the same bits as a single
// process (workers report "plan <spec>" among their kernels).
void RemoteExpertExecutor::WarnOnOtherKernelPlan(const Worker& worker, const v1::DescribeResponse& d) {
  const std::string own_plan = absl::StrCat("plan ", ProcessKernelPlan().Spec());
  for (const std::string& kernel : d.kernels()) {
    if (kernel.rfind("plan ", 0) == 0 && kernel != own_plan) {
      LOG_WARNING("remote experts: ", worker.name(), " runs kernel ", kernel, ", this process ", own_plan,
                  ": outputs will differ from a single process's in the last bits (give both the same --kernel_plan)");
    }
  }
}

absl::Status RemoteExpertExecutor::Worker::Describe(absl::Time deadline, bool initial, uint64_t session,
                                                    v1::DescribeResponse* d) {
  grpc::ClientContext context;
  if (initial) {
    context.set_deadline(absl::ToChronoTime(deadline));
    context.set_wait_for_ready(true);  // at start-up a worker may still be loading
  } else {
    // Lazily, after a failure: one fresh connection attempt now. Resetting
    // the backoff only starts that attempt; without wait_for_ready the call
    // would fail at once on the channel's old TRANSIENT_FAILURE state even
    // when the worker is back, so wait for it, but briefly: a worker still
    // down fails the request fast.
    grpc::experimental::ChannelResetConnectionBackoff(channel.get());
    context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + kReconnectWait)));
    context.set_wait_for_ready(true);
  }
  v1::DescribeRequest request;
  request.set_protocol_version(kExpertWorkerProtocolVersion);
  request.set_session(session);
  request.set_coordinator_pid(static_cast<int32_t>(getpid()));
  request.set_coordinator(absl::StrCat("pid ", getpid()));
  const grpc::Status rpc = stub->Describe(&context, request, d);
  if (!rpc.ok()) return Prefixed(FromGrpcStatus(rpc, "Describe"));
  claimed = true;
  return absl::OkStatus();
}

absl::Status RemoteExpertExecutor::CheckIdentity(Worker& worker, const v1::DescribeResponse& d, bool initial) {
  const int n = num_workers();
  if (d.protocol_version() != kExpertWorkerProtocolVersion) {
    return worker.Prefixed(
        absl::FailedPreconditionError(absl::StrCat("speaks expert-worker protocol version ", d.protocol_version(),
                                                   ", the coordinator ", kExpertWorkerProtocolVersion)));
  }
  if (d.worker_index() != worker.index || d.num_workers() != n) {
    return worker.Prefixed(absl::FailedPreconditionError(
        absl::StrCat("reports worker_index ", d.worker_index(), " of num_workers ", d.num_workers(),
                     " but is listed as worker ", worker.index, " of ", n)));
  }
  auto division = FromProto(d.division());
  if (!division.ok()) return worker.Prefixed(absl::FailedPreconditionError(division.status().message()));
  if (initial && worker.index == 0) division_ = *division;
  if (*division != division_) {
    return worker.Prefixed(absl::FailedPreconditionError(absl::StrCat(
        "divides experts by ", ExpertDivisionName(*division), ", worker 0 by ", ExpertDivisionName(division_))));
  }
  // Before the fingerprint, which differs too (it hashes the tensors'
  // types) but would not say why.
  TANDEM_RETURN_IF_ERROR(CheckDTypes(worker, d));
  const ModelFingerprint theirs = FromProto(d.fingerprint());
  if (!(theirs == expected_)) {
    return worker.Prefixed(absl::FailedPreconditionError(absl::StrCat("serves model [", FingerprintString(theirs),
                                                                      "] but the coordinator's model is [",
                                                                      FingerprintString(expected_), "]")));
  }
  return absl::OkStatus();
}

absl::Status RemoteExpertExecutor::CheckDTypes(Worker& worker, const v1::DescribeResponse& d) {
  if (d.compute() == "echo") return absl::OkStatus();  // no weights
  if (!worker.expected_dtypes) {
    if (!options_.expected_dtypes) return absl::OkStatus();
    absl::StatusOr<std::vector<ExpertSlice>> shares =
        PartitionExperts(config_, division_, worker.index, num_workers(), options_.split_block);
    if (!shares.ok()) return worker.Prefixed(shares.status());
    worker.expected_dtypes = options_.expected_dtypes(*shares);
  }
  if (d.experts_dtypes() == *worker.expected_dtypes) return absl::OkStatus();
  return worker.Prefixed(absl::FailedPreconditionError(absl::StrCat(
      "stores its experts as ", d.experts_dtypes().empty() ? std::string("(unreported)") : d.experts_dtypes(),
      " but the coordinator's model has them as ", *worker.expected_dtypes,
      ": start the server and its workers with the same --gguf_experts (quantized keeps a GGUF's blocks, bf16 "
      "dequantizes them)")));
}

absl::Status RemoteExpertExecutor::CheckShares(const Worker& worker, const v1::DescribeResponse& d) const {
  const int n = num_workers();
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExpertSlice> want,
                          PartitionExperts(config_, division_, worker.index, n, options_.split_block));
  for (size_t i = 0; i < std::max(want.size(), static_cast<size_t>(d.experts_size())); ++i) {
    const bool have_want = i < want.size(), have_got = i < static_cast<size_t>(d.experts_size());
    if (have_want && have_got) {
      const ExpertSlice& w = want[i];
      const v1::ExpertShare& g = d.experts(static_cast<int>(i));
      if (g.layer() == w.layer && g.expert() == w.expert && g.intermediate_begin() == w.intermediate_begin &&
          g.intermediate_end() == w.intermediate_end) {
        continue;
      }
    }
    return worker.Prefixed(absl::FailedPreconditionError(absl::StrCat(
        "its expert shares differ from PartitionExperts(", ExpertDivisionName(division_), ", worker ", worker.index,
        " of ", n, ") at share ", i, ": it holds ",
        have_got ? ShareText(d.experts(static_cast<int>(i)).layer(), d.experts(static_cast<int>(i)).expert(),
                             d.experts(static_cast<int>(i)).intermediate_begin(),
                             d.experts(static_cast<int>(i)).intermediate_end())
                 : std::string("nothing"),
        ", expected ",
        have_want ? ShareText(want[i].layer, want[i].expert, want[i].intermediate_begin, want[i].intermediate_end)
                  : std::string("nothing"))));
  }
  return absl::OkStatus();
}

absl::Status RemoteExpertExecutor::CheckContent(Worker& worker, const v1::DescribeResponse& d) {
  if (d.compute() == "echo") return absl::OkStatus();  // no weights; its fingerprint ("echo:...") was checked
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExpertSlice> shares,
                          PartitionExperts(config_, division_, worker.index, num_workers(), options_.split_block));
  if (!worker.expected_content) {
    if (!options_.expected_content) {
      return worker.Prefixed(absl::FailedPreconditionError(
          "holds expert weights, but this coordinator has no content hashes to check them against"));
    }
    const absl::Time start = absl::Now();
    absl::StatusOr<std::vector<uint64_t>> expected = options_.expected_content(shares);
    if (!expected.ok()) return worker.Prefixed(expected.status());
    if (expected->size() != shares.size()) {
      return worker.Prefixed(absl::InternalError("expected_content returned a hash count unlike the share count"));
    }
    worker.expected_content = std::move(*expected);  // reconnects compare with these
    LOG_INFO("remote experts: ", worker.name(), ": content hash of its ", shares.size(), " shares computed in ",
             absl::FormatDuration(absl::Now() - start));
  }
  const std::vector<uint64_t>& expected = *worker.expected_content;
  const uint64_t want = CombineExpertContentHashes(shares, expected);
  if (d.content_hash() == want) return absl::OkStatus();
  std::string first;
  for (size_t i = 0; i < shares.size() && i < static_cast<size_t>(d.experts_size()); ++i) {
    if (d.experts(static_cast<int>(i)).content_hash() != expected[i]) {
      first = absl::StrCat(
          " (first differing share: ",
          ShareText(shares[i].layer, shares[i].expert, shares[i].intermediate_begin, shares[i].intermediate_end), ", ",
          ContentHashString(d.experts(static_cast<int>(i)).content_hash()), " vs ", ContentHashString(expected[i]),
          ")");
      break;
    }
  }
  return worker.Prefixed(absl::FailedPreconditionError(absl::StrCat(
      "holds other expert weights than the coordinator's model: its content hash is ",
      ContentHashString(d.content_hash()), ", the coordinator's ", ContentHashString(want), first,
      "; the same config and shapes with other values (another seed or checkpoint): start the worker on the "
      "coordinator's model")));
}

absl::Status RemoteExpertExecutor::Worker::OpenArena(const v1::DescribeResponse& d, absl::Time deadline,
                                                     absl::Duration spin) {
  if (d.arena_region().empty()) {
    return Prefixed(absl::FailedPreconditionError(
        "offers no shared-memory arena (started with --transport inline); use the inline transport for it"));
  }
  if (transport == WorkerTransport::kShmDoorbell && !d.doorbell()) {
    return Prefixed(absl::FailedPreconditionError("its arena has no doorbell; use shm-grpc for it"));
  }
  auto opened = ShmArena::Open(d.arena_region());
  if (!opened.ok()) return Prefixed(opened.status());
  if ((*opened)->owner_pid() != d.pid()) {
    return Prefixed(absl::FailedPreconditionError(absl::StrCat(
        "arena ", d.arena_region(), " belongs to pid ", (*opened)->owner_pid(), ", not the worker's pid ", d.pid())));
  }
  // A request abandoned at a deadline may still be running: let it finish
  // before the control block and slots are reused.
  if ((*opened)->ResponsePending()) {
    std::string_view ignored;
    absl::Status drained = (*opened)->AwaitResponse((*opened)->last_posted(), deadline, spin, &ignored);
    if (absl::IsDeadlineExceeded(drained) || absl::IsUnavailable(drained)) {
      return Prefixed(
          absl::Status(drained.code(), absl::StrCat("still busy with an abandoned request: ", drained.message())));
    }
  }
  arena = std::move(*opened);
  return absl::OkStatus();
}

absl::Status RemoteExpertExecutor::RunExperts(int layer, std::span<const ExpertWork> work) {
  const absl::Time deadline = absl::Now() + options_.call_timeout;
  TANDEM_RETURN_IF_ERROR(CheckWork(layer, work));
  AssignEntries(layer, work);
  TANDEM_RETURN_IF_ERROR(ReconnectWorkers(deadline));
  // Dispatch to every worker before waiting for any; then the gRPC replies
  // (this thread drives their I/O), then the doorbells (the workers behind
  // them computed meanwhile). Every wait ends by the deadline.
  const Dispatched dispatched = DispatchAll(layer, work, deadline);
  AwaitGrpcReplies(dispatched);
  AwaitDoorbells(deadline);
  for (auto& worker : workers_) worker->CheckReply(layer, work, config_.hidden_size);
  TANDEM_RETURN_IF_ERROR(RecordCall(work));
  Gather(work);
  return absl::OkStatus();
}

absl::Status RemoteExpertExecutor::CheckWork(int layer, std::span<const ExpertWork> work) const {
  const int64_t num_experts = config_.num_local_experts;
  if (layer < 0 || layer >= config_.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("RemoteExpertExecutor: layer ", layer, " out of range [0, ", config_.num_hidden_layers, ")"));
  }
  for (const ExpertWork& w : work) {
    if (w.expert < 0 || w.expert >= num_experts || w.num_rows < 0 ||
        (w.num_rows > 0 && (w.input == nullptr || w.output == nullptr))) {
      return absl::InvalidArgumentError(absl::StrCat("RemoteExpertExecutor: layer ", layer, " expert ", w.expert,
                                                     ": out of range [0, ", num_experts, "), negative rows (",
                                                     w.num_rows, ") or null input/output"));
    }
  }
  return absl::OkStatus();
}

// Who computes what: split — every expert on every worker; shard — its owner.
void RemoteExpertExecutor::AssignEntries(int layer, std::span<const ExpertWork> work) {
  const int64_t num_experts = config_.num_local_experts;
  for (auto& worker : workers_) worker->entries.clear();
  for (size_t i = 0; i < work.size(); ++i) {
    if (work[i].num_rows == 0) continue;
    if (division_ == ExpertDivision::kSplit) {
      for (auto& worker : workers_) worker->entries.push_back(i);
    } else {
      workers_[static_cast<size_t>(owner_[static_cast<size_t>(layer * num_experts + work[i].expert)])]
          ->entries.push_back(i);
    }
  }
}

// Workers that failed before are re-Described (and re-checked) now.
absl::Status RemoteExpertExecutor::ReconnectWorkers(absl::Time deadline) {
  for (auto& worker : workers_) {
    if (worker->entries.empty() || worker->connected) continue;
    absl::Status status = ConnectWorker(*worker, deadline, /*initial=*/false);
    if (!status.ok()) {
      MarkHealth(*worker, status);
      absl::MutexLock lock(&stats_mutex_);
      ++StatsOf(*worker).failures;
      return status;
    }
  }
  return absl::OkStatus();
}

RemoteExpertExecutor::Dispatched RemoteExpertExecutor::DispatchAll(int layer, std::span<const ExpertWork> work,
                                                                   absl::Time deadline) {
  const double grpc_spin_us = absl::ToDoubleMicroseconds(options_.grpc_spin);
  const auto start = std::chrono::steady_clock::now();
  Dispatched dispatched;
  dispatched.spin_until = start;  // no polling unless a gRPC worker's reply is expected within grpc_spin
  for (auto& worker_ptr : workers_) {
    Worker& w = *worker_ptr;
    w.status = absl::OkStatus();
    w.via_shm = w.via_doorbell = false;
    if (w.entries.empty()) continue;
    w.sent = std::chrono::steady_clock::now();
    BuildRequest(w, layer, work);
    if (w.via_shm && w.transport == WorkerTransport::kShmDoorbell) {
      w.RingDoorbell();
    } else {
      w.StartGrpcCall(deadline, &rpc_->cq);
      ++dispatched.grpc_pending;
      if (w.last_grpc_compute_us < grpc_spin_us) {
        dispatched.spin_until = start + absl::ToChronoNanoseconds(options_.grpc_spin);
      }
    }
  }
  return dispatched;
}

// Worker w's request for this layer: its rows in its arena slot when they
// fit (shm transports), else inside the message.
void RemoteExpertExecutor::BuildRequest(Worker& w, int layer, std::span<const ExpertWork> work) {
  const int64_t d = config_.hidden_size;
  v1::RunExpertsRequest& request = w.request;
  request.Clear();
  request.set_request_id(next_request_id_++);
  request.set_layer(layer);
  request.set_session(session_);
  if (w.transport != WorkerTransport::kInline) {
    const uint64_t total = w.LayOutSlot(work, d);
    w.via_shm = total <= w.arena->slot_bytes();
    if (!w.via_shm) {
      absl::MutexLock lock(&stats_mutex_);
      if (StatsOf(w).inline_fallbacks++ == 0) {
        LOG_WARNING("remote experts: ", w.name(), ": a layer's ", total, " bytes exceed the arena slot's ",
                    w.arena->slot_bytes(), "; such calls go inline over gRPC (raise --arena_slot_mb)");
      }
    }
  }
  if (w.via_shm) {
    w.WriteShmRows(work, d);
  } else {
    w.WriteInlineRows(work, d);
  }
}

uint64_t RemoteExpertExecutor::Worker::LayOutSlot(std::span<const ExpertWork> work, int64_t d) {
  offsets.clear();
  uint64_t total = 0;
  for (size_t i : entries) {
    offsets.push_back(total);
    total += RoundUp(static_cast<uint64_t>(work[i].num_rows * d) * sizeof(float), kRowAlignment);
  }
  return total;
}

void RemoteExpertExecutor::Worker::WriteShmRows(std::span<const ExpertWork> work, int64_t d) {
  slot = next_slot++ % arena->num_slots();
  const uint64_t in_seq = arena->AdvanceSequence(ArenaSide::kInput, slot);
  const uint64_t out_seq = arena->AdvanceSequence(ArenaSide::kOutput, slot);
  uint8_t* slot_in = arena->slot_data(ArenaSide::kInput, slot);
  request.set_transport(v1::TRANSPORT_SHM);
  for (size_t k = 0; k < entries.size(); ++k) {
    const ExpertWork& e = work[entries[k]];
    CopyFloats(reinterpret_cast<float*>(slot_in + offsets[k]), e.input, static_cast<size_t>(e.num_rows * d));
    v1::ExpertTask* task = request.add_tasks();
    task->set_expert(e.expert);
    task->set_num_rows(e.num_rows);
    ArenaTensorRef ref{ArenaSide::kInput, slot, offsets[k], {e.num_rows, d}, DType::kF32, in_seq};
    ToProto(ref, task->mutable_shm_rows());
    ref.side = ArenaSide::kOutput;
    ref.sequence = out_seq;
    ToProto(ref, task->mutable_shm_output());
  }
}

void RemoteExpertExecutor::Worker::WriteInlineRows(std::span<const ExpertWork> work, int64_t d) {
  request.set_transport(v1::TRANSPORT_INLINE);
  for (size_t i : entries) {
    const ExpertWork& e = work[i];
    v1::ExpertTask* task = request.add_tasks();
    task->set_expert(e.expert);
    task->set_num_rows(e.num_rows);
    task->set_inline_rows(reinterpret_cast<const char*>(e.input), static_cast<size_t>(e.num_rows * d) * sizeof(float));
  }
}

void RemoteExpertExecutor::Worker::RingDoorbell() {
  via_doorbell = true;
  request.SerializeToString(&serialized);
  auto seq = arena->PostRequest(serialized);
  if (!seq.ok()) {
    status = Prefixed(seq.status());
    return;
  }
  doorbell_seq = *seq;
}

void RemoteExpertExecutor::Worker::StartGrpcCall(absl::Time deadline, grpc::CompletionQueue* cq) {
  context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  reader = stub->AsyncRunExperts(context.get(), request, cq);
  reader->Finish(&response, &grpc_status, this);
  grpc_pending = true;
}

void RemoteExpertExecutor::AwaitGrpcReplies(const Dispatched& dispatched) {
  int pending = dispatched.grpc_pending;
  while (pending > 0) {
    void* tag = nullptr;
    bool ok = false;
    if (!rpc_->Next(dispatched.spin_until, &tag, &ok)) break;  // only after Shutdown
    Worker& w = *static_cast<Worker*>(tag);
    w.grpc_pending = false;
    --pending;
    w.round_trip_us = MicrosSince(w.sent);
    // A failed call (a hung worker, a deadline) is not expected back soon either.
    w.last_grpc_compute_us = ok && w.grpc_status.ok() ? static_cast<double>(w.response.compute_us())
                                                      : absl::ToDoubleMicroseconds(options_.call_timeout);
    w.status = w.Prefixed(ok ? FromGrpcStatus(w.grpc_status, "RunExperts")
                             : absl::InternalError("RunExperts: the completion queue reported failure"));
  }
}

void RemoteExpertExecutor::AwaitDoorbells(absl::Time deadline) {
  for (auto& worker_ptr : workers_) {
    Worker& w = *worker_ptr;
    if (!w.via_doorbell || !w.status.ok()) continue;
    std::string_view message;
    absl::Status status = w.arena->AwaitResponse(w.doorbell_seq, deadline, options_.spin, &message);
    w.round_trip_us = MicrosSince(w.sent);
    if (status.ok() && !w.response.ParseFromArray(message.data(), static_cast<int>(message.size()))) {
      status = absl::DataLossError(absl::StrCat("doorbell response (", message.size(),
                                                " bytes) does not parse as tandem.v1.RunExpertsResponse"));
    }
    w.status = w.Prefixed(status);
  }
}

// Every reply must answer exactly what was asked.
void RemoteExpertExecutor::Worker::CheckReply(int layer, std::span<const ExpertWork> work, int64_t d) {
  if (entries.empty() || !status.ok()) return;
  const v1::RunExpertsResponse& r = response;
  std::string problem;
  if (r.request_id() != request.request_id()) {
    problem = absl::StrCat("answered request ", r.request_id(), " instead of ", request.request_id());
  } else if (r.results_size() != static_cast<int>(entries.size())) {
    problem = absl::StrCat("returned ", r.results_size(), " results for ", entries.size(), " experts");
  } else {
    for (size_t k = 0; k < entries.size() && problem.empty(); ++k) {
      const ExpertWork& e = work[entries[k]];
      const v1::ExpertResult& res = r.results(static_cast<int>(k));
      if (res.expert() != e.expert || res.num_rows() != e.num_rows) {
        problem = absl::StrCat("result ", k, " is expert ", res.expert(), " with ", res.num_rows(),
                               " rows, expected expert ", e.expert, " with ", e.num_rows);
      } else if (!via_shm && res.inline_output().size() != static_cast<size_t>(e.num_rows * d) * sizeof(float)) {
        problem = absl::StrCat("result ", k, " (expert ", e.expert, ") has ", res.inline_output().size(),
                               " output bytes, expected ", e.num_rows * d * 4);
      }
    }
  }
  if (!problem.empty()) status = Prefixed(absl::DataLossError(absl::StrCat("layer ", layer, ": ", problem)));
}

// Counts the call in every worker's stats; the first worker's error, if any
// (a failed worker is re-Described before the next call).
absl::Status RemoteExpertExecutor::RecordCall(std::span<const ExpertWork> work) {
  absl::Status first_error;
  absl::MutexLock lock(&stats_mutex_);
  for (auto& worker_ptr : workers_) {
    Worker& w = *worker_ptr;
    if (w.entries.empty()) continue;
    if (!w.status.ok()) {
      ++StatsOf(w).failures;
      StatsOf(w).healthy = false;
      StatsOf(w).last_error = std::string(w.status.message());
      w.connected = false;  // re-Describe before the next call
      // Let go of its arena now: a killed worker's region (unlinked by
      // tandem-launch.sh stop or its successor) is freed only once no one
      // maps it; the re-Describe maps the arena it has then.
      w.arena.reset();
      if (first_error.ok()) first_error = w.status;
      continue;
    }
    ++StatsOf(w).calls;
    StatsOf(w).healthy = true;
    StatsOf(w).last_error.clear();
    for (size_t i : w.entries) StatsOf(w).rows += work[i].num_rows;
    StatsOf(w).round_trip_us += w.round_trip_us;
    StatsOf(w).last_round_trip_us = w.round_trip_us;
    StatsOf(w).worker_compute_us += static_cast<double>(w.response.compute_us());
  }
  return first_error;
}

// The output of entry k, [R, D] f32: in the arena slot or the reply.
const float* RemoteExpertExecutor::Worker::output(size_t k) const {
  if (via_shm) return reinterpret_cast<const float*>(arena->slot_data(ArenaSide::kOutput, slot) + offsets[k]);
  return reinterpret_cast<const float*>(response.results(static_cast<int>(k)).inline_output().data());
}

void RemoteExpertExecutor::Gather(std::span<const ExpertWork> work) {
  const int64_t d = config_.hidden_size;
  if (division_ == ExpertDivision::kSplit) {
    // out = p_0; out += p_1; ... in worker order, as LocalExpertExecutor(split_ways = N).
    const size_t num_entries = workers_[0]->entries.size();
    for (size_t k = 0; k < num_entries; ++k) {
      const ExpertWork& e = work[workers_[0]->entries[k]];
      const size_t count = static_cast<size_t>(e.num_rows * d);
      CopyFloats(e.output, workers_[0]->output(k), count);
      for (size_t w = 1; w < workers_.size(); ++w) {
        const float* partial = workers_[w]->output(k);
        float* out = e.output;
        for (size_t j = 0; j < count; ++j) out[j] += partial[j];
      }
    }
  } else {
    for (auto& worker_ptr : workers_) {
      const Worker& w = *worker_ptr;
      for (size_t k = 0; k < w.entries.size(); ++k) {
        const ExpertWork& e = work[w.entries[k]];
        CopyFloats(e.output, w.output(k), static_cast<size_t>(e.num_rows * d));
      }
    }
  }
}

absl::Status RemoteExpertExecutor::Ping(int index) {
  if (index < 0 || index >= num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("RemoteExpertExecutor::Ping: no worker ", index));
  }
  Worker& w = *workers_[static_cast<size_t>(index)];
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.call_timeout));
  v1::HealthResponse response;
  grpc::Status status;
  const auto sent = std::chrono::steady_clock::now();
  auto reader = w.stub->AsyncHealth(&context, v1::HealthRequest(), &rpc_->cq);
  reader->Finish(&response, &status, &response);
  // Polled for as RunExperts polls for a reply that needs no compute.
  void* tag = nullptr;
  bool ok = false;
  if (!rpc_->Next(sent + absl::ToChronoNanoseconds(options_.grpc_spin), &tag, &ok) || !ok) {
    return w.Prefixed(absl::InternalError("Health: the completion queue reported failure"));
  }
  return w.Prefixed(FromGrpcStatus(status, "Health"));  // the only call in flight: tag == &response
}

absl::Status RemoteExpertExecutor::Probe(int index, absl::Duration timeout) {
  if (index < 0 || index >= num_workers()) {
    return absl::InvalidArgumentError(absl::StrCat("RemoteExpertExecutor::Probe: no worker ", index));
  }
  Worker& w = *workers_[static_cast<size_t>(index)];
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  // A channel in backoff after an outage would fail the call at once even
  // when the worker is back: try a fresh connection, and wait for it within
  // the timeout.
  grpc::experimental::ChannelResetConnectionBackoff(w.channel.get());
  context.set_wait_for_ready(true);
  v1::HealthResponse response;
  absl::Status status = FromGrpcStatus(w.stub->Health(&context, v1::HealthRequest(), &response), "Health");
  if (status.ok() && !response.serving()) status = absl::UnavailableError("Health: the worker is shutting down");
  status = w.Prefixed(status);
  MarkHealth(w, status);
  return status;
}

void RemoteExpertExecutor::MarkHealth(Worker& worker, const absl::Status& status) {
  absl::MutexLock lock(&stats_mutex_);
  if (StatsOf(worker).healthy != status.ok()) {
    if (status.ok()) {
      LOG_INFO("remote experts: ", worker.name(), " is healthy again");
    } else {
      LOG_WARNING("remote experts: ", worker.name(), " is unhealthy: ", status.message());
    }
  }
  StatsOf(worker).healthy = status.ok();
  StatsOf(worker).last_error = status.ok() ? std::string() : std::string(status.message());
}

RemoteWorkerStats& RemoteExpertExecutor::StatsOf(const Worker& worker) {
  return worker_stats_[static_cast<size_t>(worker.index)];
}

std::vector<RemoteWorkerStats> RemoteExpertExecutor::stats() const {
  absl::MutexLock lock(&stats_mutex_);
  return worker_stats_;
}

std::vector<std::string> RemoteExpertExecutor::weights_regions() const {
  std::vector<std::string> regions;
  for (const auto& worker : workers_) regions.push_back(worker->weights_region);
  return regions;
}

std::string RemoteExpertExecutor::Summary() const {
  std::vector<std::string> parts;
  for (const auto& w : workers_) {
    parts.push_back(
        absl::StrCat(w->index, " ", w->address, " ", WorkerTransportName(w->transport), " [", w->description, "]"));
  }
  return absl::StrCat(workers_.size(), " workers (", ExpertDivisionName(division_), "): ", absl::StrJoin(parts, "; "));
}

}  // namespace tandem
