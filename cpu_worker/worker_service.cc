#include "cpu_worker/worker_service.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <utility>

#include <grpcpp/server_posix.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"
#include "common/model/expert_content.h"
#include "common/platform/numa_topology.h"
#include "tandem/v1/expert_worker_convert.h"

namespace tandem {
namespace {

// A payload larger than this many f32 elements is refused before any size
// arithmetic could overflow (2^40 floats = 4 TiB).
constexpr int64_t kMaxElements = int64_t{1} << 40;

// /proc/<pid>/stat's starttime (field 22, clock ticks after boot): with the
// pid, it names one process (a pid may be reused). 0 when unreadable.
uint64_t StartTicks(pid_t pid) {
  if (pid <= 0) return 0;
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string stat = text.str();
  const size_t paren = stat.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos) return 0;
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  // After ")": state is field 3, so starttime (22) is the 20th.
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) {
      uint64_t ticks = 0;
      return absl::SimpleAtoi(field, &ticks) ? ticks : 0;
    }
  }
  return 0;
}

// Whether the process that was `pid` (started at `start_ticks`) still runs.
// An unknown pid counts as alive: the worker is then freed by Release only.
bool ProcessAlive(pid_t pid, uint64_t start_ticks) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  return start_ticks == 0 || StartTicks(pid) == start_ticks;
}

std::string SessionText(uint64_t session) { return absl::StrFormat("%016x", session); }

// Where an output lands in the arena, to refuse two experts writing one range.
struct OutputRange {
  uint32_t slot;
  uint64_t begin, end;
  int expert;
};

std::string TaskName(int layer, int expert) { return absl::StrCat("layer ", layer, " expert ", expert); }

}  // namespace

absl::Status EchoExpertExecutor::RunExperts(int layer, std::span<const ExpertWork> work) {
  for (const ExpertWork& w : work) {
    if (w.num_rows > 0) CopyFloats(w.output, w.input, static_cast<size_t>(w.num_rows * hidden_size_));
  }
  return absl::OkStatus();
}

ModelFingerprint EchoFingerprint(const ModelConfig& config) {
  ModelFingerprint f = FingerprintConfig(config, DType::kBF16);
  f.architecture = absl::StrCat("echo:", config.architecture_name);
  return f;
}

absl::StatusOr<std::unique_ptr<WorkerService>> WorkerService::Create(WorkerServiceOptions options) {
  const ModelConfig& c = options.config;
  if (options.executor == nullptr) return absl::InvalidArgumentError("WorkerServiceOptions.executor is null");
  if (c.hidden_size <= 0 || c.num_hidden_layers <= 0 || c.num_local_experts <= 0) {
    return absl::InvalidArgumentError("WorkerServiceOptions.config has no layers, experts or hidden size");
  }
  if (options.cpus.empty()) return absl::InvalidArgumentError("WorkerServiceOptions.cpus is empty");
  auto service = std::unique_ptr<WorkerService>(new WorkerService(std::move(options)));
  const WorkerServiceOptions& o = service->options_;
  const int64_t e = c.num_local_experts;
  service->slice_of_.assign(static_cast<size_t>(c.num_hidden_layers * e), -1);
  for (size_t i = 0; i < o.slices.size(); ++i) {
    const ExpertSlice& s = o.slices[i];
    if (s.layer < 0 || s.layer >= c.num_hidden_layers || s.expert < 0 || s.expert >= e) {
      return absl::InvalidArgumentError(
          absl::StrCat("WorkerServiceOptions.slices[", i, "]: layer ", s.layer, " expert ", s.expert, " out of range"));
    }
    service->slice_of_[static_cast<size_t>(s.layer * e + s.expert)] = static_cast<int32_t>(i);
  }
  if (o.arena) {
    TANDEM_ASSIGN_OR_RETURN(service->arena_, ShmArena::Create(*o.arena));
    // The worker's memory lives on its node, the arena included (a no-op on one node).
    const ShmRegion& region = service->arena_->region();
    if (absl::Status bound = BindMemoryToNode(region.data(), region.size(), o.numa_node); !bound.ok()) {
      LOG_WARNING("worker ", o.worker_index, ": binding arena ", region.name(), " to node ", o.numa_node, ": ",
                  bound.message());
    }
    service->doorbell_thread_ = std::thread([s = service.get()] { s->DoorbellLoop(); });
    pthread_setname_np(service->doorbell_thread_.native_handle(),
                       absl::StrCat("doorbell-w", o.worker_index).substr(0, 15).c_str());
  }
  return service;
}

WorkerService::~WorkerService() { StopDoorbell(); }

void WorkerService::StopDoorbell() {
  stop_.store(true);
  if (arena_) arena_->Interrupt();
  if (doorbell_thread_.joinable()) doorbell_thread_.join();
}

const ExpertSlice* WorkerService::FindSlice(int layer, int expert) const {
  const int64_t e = options_.config.num_local_experts;
  if (layer < 0 || layer >= options_.config.num_hidden_layers || expert < 0 || expert >= e) return nullptr;
  const int32_t i = slice_of_[static_cast<size_t>(layer * e + expert)];
  return i < 0 ? nullptr : &options_.slices[static_cast<size_t>(i)];
}

void WorkerService::PinComputeThread() {
  // Whichever thread computes is the pool's thread 0: it runs on cpus[0].
  thread_local bool pinned = false;
  if (pinned) return;
  pinned = true;
  absl::Status s = PinCurrentThreadToCpu(options_.cpus[0]);
  if (!s.ok()) LOG_WARNING("worker ", options_.worker_index, ": pinning a compute thread: ", s.message());
}

// A RunExperts request checked completely and resolved into work: what
// ParseRequest and ParseTask collect while they walk the tasks.
struct WorkerService::ParsedRequest {
  int layer = 0;
  bool shm = false;                           // TRANSPORT_SHM: rows and outputs in the arena
  std::vector<char> seen;                     // [E] named by a task already
  std::vector<OutputRange> outputs;           // shm: where the outputs land so far
  std::vector<std::vector<float>> realigned;  // inline rows whose bytes are not float-aligned (never in practice)
  std::vector<ExpertWork> work;
};

absl::Status WorkerService::Run(const v1::RunExpertsRequest& request, v1::RunExpertsResponse* response,
                                bool via_doorbell) {
  const auto start = std::chrono::steady_clock::now();
  response->set_request_id(request.request_id());
  // Only the coordinator holding the worker computes on it.
  if (request.session() == 0 || request.session() != holder_session_.load(std::memory_order_acquire)) {
    return Reject(request, via_doorbell, CheckSession(request.session(), "RunExpertsRequest"), response);
  }
  ParsedRequest parsed;
  absl::Status valid = ParseRequest(request, via_doorbell, response, &parsed);
  if (!valid.ok()) return Reject(request, via_doorbell, std::move(valid), response);
  TANDEM_ASSIGN_OR_RETURN(const int64_t compute_ns, Compute(parsed.layer, parsed.work, response));
  CountRun(parsed.work, via_doorbell, compute_ns);
  response->set_compute_us(compute_ns / 1000);
  response->set_total_us(NanosSince(start) / 1000);
  return absl::OkStatus();
}

absl::Status WorkerService::Reject(const v1::RunExpertsRequest& request, bool via_doorbell, absl::Status status,
                                   v1::RunExpertsResponse* response) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  LOG_WARNING("worker ", options_.worker_index, ": rejected RunExperts request ", request.request_id(),
              via_doorbell ? " (doorbell)" : " (gRPC)", ": ", status.ToString());
  response->clear_results();
  return status;
}

absl::Status WorkerService::ParseRequest(const v1::RunExpertsRequest& request, bool via_doorbell,
                                         v1::RunExpertsResponse* response, ParsedRequest* parsed) const {
  const ModelConfig& c = options_.config;
  const int layer = request.layer();
  if (layer < 0 || layer >= c.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunExpertsRequest.layer ", layer, " out of range [0, ", c.num_hidden_layers, ")"));
  }
  const bool shm = request.transport() == v1::TRANSPORT_SHM;
  if (!shm && request.transport() != v1::TRANSPORT_INLINE) {
    return absl::InvalidArgumentError(absl::StrCat("RunExpertsRequest.transport ",
                                                   static_cast<int>(request.transport()),
                                                   " is neither TRANSPORT_INLINE nor TRANSPORT_SHM"));
  }
  if (shm && !arena_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", options_.worker_index, " offers no shared-memory arena (started with --transport inline)"));
  }
  if (via_doorbell && !shm) {
    return absl::InvalidArgumentError(
        "RunExpertsRequest.transport: doorbell requests carry arena descriptors "
        "(TRANSPORT_SHM), not inline rows");
  }
  parsed->layer = layer;
  parsed->shm = shm;
  parsed->seen.assign(static_cast<size_t>(c.num_local_experts), 0);
  parsed->work.reserve(static_cast<size_t>(request.tasks_size()));
  for (int i = 0; i < request.tasks_size(); ++i) {
    TANDEM_RETURN_IF_ERROR(ParseTask(i, request.tasks(i), response, parsed));
  }
  return absl::OkStatus();
}

// Task i: its expert (in range, named once, held here) and row count, then
// its input and output; adds its result (and its work unless it has no rows).
absl::Status WorkerService::ParseTask(int i, const v1::ExpertTask& task, v1::RunExpertsResponse* response,
                                      ParsedRequest* parsed) const {
  const ModelConfig& c = options_.config;
  const int64_t d = c.hidden_size;
  const int layer = parsed->layer;
  const int expert = task.expert();
  if (expert < 0 || expert >= c.num_local_experts) {
    return absl::InvalidArgumentError(absl::StrCat("RunExpertsRequest.tasks[", i, "].expert ", expert,
                                                   " out of range [0, ", c.num_local_experts, ")"));
  }
  if (parsed->seen[static_cast<size_t>(expert)]) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunExpertsRequest.tasks[", i, "]: ", TaskName(layer, expert), " appears more than once"));
  }
  parsed->seen[static_cast<size_t>(expert)] = 1;
  if (FindSlice(layer, expert) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunExpertsRequest.tasks[", i, "]: worker ", options_.worker_index, " of ", options_.num_workers,
                     " (", ExpertDivisionName(options_.division), ") holds no part of ", TaskName(layer, expert)));
  }
  const int64_t rows = task.num_rows();
  if (rows < 0 || rows > kMaxElements / d) {
    return absl::InvalidArgumentError(absl::StrCat("RunExpertsRequest.tasks[", i, "].num_rows ", rows,
                                                   " out of range for ", TaskName(layer, expert)));
  }
  v1::ExpertResult* result = response->add_results();
  result->set_expert(expert);
  result->set_num_rows(rows);
  if (rows == 0) return absl::OkStatus();  // an expert with no rows changes nothing
  TANDEM_ASSIGN_OR_RETURN(const float* input, TaskInput(i, task, rows, parsed));
  TANDEM_ASSIGN_OR_RETURN(float* output, TaskOutput(i, task, rows, result, parsed));
  parsed->work.push_back(ExpertWork{expert, rows, input, output});
  return absl::OkStatus();
}

// Task i's [rows, D] f32 input: inline in the request or in the arena.
absl::StatusOr<const float*> WorkerService::TaskInput(int i, const v1::ExpertTask& task, int64_t rows,
                                                      ParsedRequest* parsed) const {
  const int64_t d = options_.config.hidden_size;
  const size_t bytes = static_cast<size_t>(rows * d) * sizeof(float);
  const auto what = [&] { return TaskName(parsed->layer, task.expert()); };  // for messages only
  switch (task.input_case()) {
    case v1::ExpertTask::kInlineRows: {
      if (parsed->shm) {
        return absl::InvalidArgumentError(
            absl::StrCat("RunExpertsRequest.tasks[", i, "]: inline_rows in a TRANSPORT_SHM request (", what(), ")"));
      }
      const std::string& rows_bytes = task.inline_rows();
      if (rows_bytes.size() != bytes) {
        return absl::InvalidArgumentError(absl::StrCat("RunExpertsRequest.tasks[", i,
                                                       "].inline_rows: ", rows_bytes.size(), " bytes, expected [", rows,
                                                       ", ", d, "] f32 = ", bytes, " for ", what()));
      }
      if (reinterpret_cast<uintptr_t>(rows_bytes.data()) % alignof(float) == 0) {
        return reinterpret_cast<const float*>(rows_bytes.data());
      }
      parsed->realigned.emplace_back(static_cast<size_t>(rows * d));
      std::memcpy(parsed->realigned.back().data(), rows_bytes.data(), bytes);
      return parsed->realigned.back().data();
    }
    case v1::ExpertTask::kShmRows: {
      if (!parsed->shm) {
        return absl::InvalidArgumentError(
            absl::StrCat("RunExpertsRequest.tasks[", i, "]: shm_rows in a TRANSPORT_INLINE request (", what(), ")"));
      }
      return arena_->Resolve(FromProto(task.shm_rows(), ArenaSide::kInput), rows, d,
                             [&] { return absl::StrCat("RunExpertsRequest.tasks[", i, "].shm_rows (", what(), ")"); });
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("RunExpertsRequest.tasks[", i, "]: ", rows, " rows but no input for ", what()));
  }
}

// Task i's [rows, D] f32 output: in the arena (not overlapping another
// task's) or in the result's inline bytes.
absl::StatusOr<float*> WorkerService::TaskOutput(int i, const v1::ExpertTask& task, int64_t rows,
                                                 v1::ExpertResult* result, ParsedRequest* parsed) const {
  const int64_t d = options_.config.hidden_size;
  const size_t bytes = static_cast<size_t>(rows * d) * sizeof(float);
  const auto what = [&] { return TaskName(parsed->layer, task.expert()); };  // for messages only
  if (!parsed->shm) {
    std::string* out = result->mutable_inline_output();
    out->resize(bytes);
    float* output = reinterpret_cast<float*>(out->data());
    if (reinterpret_cast<uintptr_t>(output) % alignof(float) != 0) {
      return absl::InternalError("inline output buffer is not float-aligned");
    }
    return output;
  }
  if (!task.has_shm_output()) {
    return absl::InvalidArgumentError(absl::StrCat("RunExpertsRequest.tasks[", i, "]: no shm_output for ", what()));
  }
  TANDEM_ASSIGN_OR_RETURN(float* output,
                          arena_->Resolve(FromProto(task.shm_output(), ArenaSide::kOutput), rows, d, [&] {
                            return absl::StrCat("RunExpertsRequest.tasks[", i, "].shm_output (", what(), ")");
                          }));
  const OutputRange range{task.shm_output().slot(), task.shm_output().offset(), task.shm_output().offset() + bytes,
                          task.expert()};
  for (const OutputRange& other : parsed->outputs) {
    if (other.slot == range.slot && range.begin < other.end && other.begin < range.end) {
      return absl::InvalidArgumentError(absl::StrCat("RunExpertsRequest.tasks[", i, "].shm_output of ", what(),
                                                     " overlaps the output of expert ", other.expert));
    }
  }
  parsed->outputs.push_back(range);
  return output;
}

// The executor's call under the compute mutex; its time in ns.
absl::StatusOr<int64_t> WorkerService::Compute(int layer, const std::vector<ExpertWork>& work,
                                               v1::RunExpertsResponse* response) {
  absl::MutexLock lock(&compute_mutex_);
  PinComputeThread();
  const auto compute_start = std::chrono::steady_clock::now();
  absl::Status status = options_.executor->RunExperts(layer, work);
  const int64_t compute_ns = NanosSince(compute_start);
  if (!status.ok()) {
    response->clear_results();
    return absl::Status(status.code(), absl::StrCat("worker ", options_.worker_index, ": ", status.message()));
  }
  return compute_ns;
}

void WorkerService::CountRun(const std::vector<ExpertWork>& work, bool via_doorbell, int64_t compute_ns) {
  uint64_t rows = 0;
  for (const ExpertWork& w : work) rows += static_cast<uint64_t>(w.num_rows);
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (via_doorbell) doorbell_requests_.fetch_add(1, std::memory_order_relaxed);
  expert_calls_.fetch_add(work.size(), std::memory_order_relaxed);
  rows_.fetch_add(rows, std::memory_order_relaxed);
  compute_ns_.fetch_add(compute_ns, std::memory_order_relaxed);
}

void WorkerService::DoorbellLoop() {
  absl::Status pinned = PinCurrentThreadToCpu(options_.cpus[0]);
  if (!pinned.ok()) LOG_WARNING("worker ", options_.worker_index, ": pinning the doorbell thread: ", pinned.message());
  v1::RunExpertsRequest request;
  v1::RunExpertsResponse response;
  std::string serialized;
  while (!stop_.load(std::memory_order_relaxed)) {
    std::optional<DoorbellRequest> rung = arena_->AwaitRequest(options_.doorbell_spin, absl::Milliseconds(200));
    if (!rung) continue;
    absl::Status status = rung->framing;
    serialized.clear();
    if (status.ok()) {
      request.Clear();
      if (!request.ParseFromString(rung->message)) {
        status = absl::DataLossError(absl::StrCat("arena ", arena_->name(), ": doorbell request ", rung->seq, " (",
                                                  rung->message.size(),
                                                  " bytes) does not parse as tandem.v1.RunExpertsRequest"));
      }
    }
    if (!status.ok()) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      LOG_WARNING("worker ", options_.worker_index, ": rejected doorbell request: ", status.ToString());
    } else {
      response.Clear();
      status = Run(request, &response, /*via_doorbell=*/true);
      if (status.ok()) response.SerializeToString(&serialized);
    }
    arena_->PostResponse(rung->seq, status, serialized);
  }
}

absl::Status WorkerService::CheckSession(uint64_t session, const std::string& what) const {
  absl::MutexLock lock(&holder_mutex_);
  if (holder_ && holder_->session == session && session != 0) return absl::OkStatus();
  if (!holder_) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": worker ", options_.worker_index,
                                                      " serves no coordinator yet (Describe claims it first)"));
  }
  return absl::FailedPreconditionError(absl::StrCat(what, " from session ", SessionText(session), ": worker ",
                                                    options_.worker_index, " serves coordinator ", holder_->who,
                                                    " (session ", SessionText(holder_->session), ")"));
}

absl::Status WorkerService::Describe(const v1::DescribeRequest& request, v1::DescribeResponse* response,
                                     const RpcCaller& caller) {
  const WorkerServiceOptions& o = options_;
  if (request.protocol_version() != kExpertWorkerProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", o.worker_index, " speaks expert-worker protocol version ", kExpertWorkerProtocolVersion,
        ", the caller version ", request.protocol_version(), ": run a coordinator and workers of the same tandem"));
  }
  if (request.session() == 0) {
    return absl::InvalidArgumentError("DescribeRequest.session must be a nonzero session id (the caller's own)");
  }
  TANDEM_RETURN_IF_ERROR(Claim(request, caller));
  FillDescription(response);
  return absl::OkStatus();
}

// One coordinator at a time: a second one is refused while the first lives,
// so neither sees the other's requests on the arena.
absl::Status WorkerService::Claim(const v1::DescribeRequest& request, const RpcCaller& caller) {
  const WorkerServiceOptions& o = options_;
  {
    const pid_t pid = caller.peer ? caller.peer->pid : static_cast<pid_t>(request.coordinator_pid());
    const std::string who =
        absl::StrCat(request.coordinator().empty() ? absl::StrCat("pid ", pid) : request.coordinator(),
                     caller.peer ? absl::StrCat(" (peer pid ", caller.peer->pid, ", uid ", caller.peer->uid, ")") : "");
    absl::MutexLock lock(&holder_mutex_);
    if (holder_ && holder_->session != request.session()) {
      if (ProcessAlive(holder_->pid, holder_->start_ticks)) {
        return absl::FailedPreconditionError(
            absl::StrCat("worker ", o.worker_index, " already serves coordinator ", holder_->who, " (session ",
                         SessionText(holder_->session), ", since ",
                         absl::FormatTime("%H:%M:%S", holder_->since, absl::LocalTimeZone()),
                         "); a worker serves one coordinator at a time: stop that one, or start workers of your own"));
      }
      LOG_WARNING("worker ", o.worker_index, ": coordinator ", holder_->who, " has exited; now serving ", who);
      holder_.reset();
    }
    if (!holder_) {
      holder_ = Holder{request.session(), pid, StartTicks(pid), who, absl::Now()};
      holder_session_.store(request.session(), std::memory_order_release);
      LOG_INFO("worker ", o.worker_index, ": serving coordinator ", who, " (session ", SessionText(request.session()),
               ")");
    }
  }
  return absl::OkStatus();
}

void WorkerService::FillDescription(v1::DescribeResponse* response) const {
  const WorkerServiceOptions& o = options_;
  response->set_protocol_version(kExpertWorkerProtocolVersion);
  response->set_worker_id(o.worker_id);
  response->set_numa_node(o.numa_node);
  for (int cpu : o.cpus) response->add_cores(cpu);
  response->set_threads(static_cast<int32_t>(o.cpus.size()));
  ToProto(o.fingerprint, response->mutable_fingerprint());
  response->set_division(ToProto(o.division));
  response->set_worker_index(o.worker_index);
  response->set_num_workers(o.num_workers);
  for (size_t i = 0; i < o.slices.size(); ++i) {
    const ExpertSlice& s = o.slices[i];
    v1::ExpertShare* share = response->add_experts();
    share->set_layer(s.layer);
    share->set_expert(s.expert);
    share->set_intermediate_begin(s.intermediate_begin);
    share->set_intermediate_end(s.intermediate_end);
    if (i < o.slice_hashes.size()) share->set_content_hash(o.slice_hashes[i]);
  }
  response->set_content_hash(o.content_hash);
  response->set_experts_dtypes(o.experts_dtypes);
  response->set_weights_region(o.weights_region);
  response->set_weights_region_bytes(o.weights_region_bytes);
  if (arena_) {
    response->set_arena_region(arena_->name());
    response->set_arena_bytes(arena_->total_bytes());
    response->set_arena_slots(arena_->num_slots());
    response->set_arena_slot_bytes(arena_->slot_bytes());
    response->set_doorbell(true);
  }
  for (const std::string& k : o.kernels) response->add_kernels(k);
  response->set_pid(static_cast<int32_t>(getpid()));
  response->set_compute(o.compute);
}

absl::StatusOr<int64_t> WorkerService::CheckCalibrateRequest(const v1::CalibrateRequest& request) const {
  TANDEM_RETURN_IF_ERROR(CheckSession(request.session(), "CalibrateRequest"));
  if (FindSlice(request.layer(), request.expert()) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("CalibrateRequest: worker ", options_.worker_index,
                                                   " holds no part of layer ", request.layer(), " expert ",
                                                   request.expert()));
  }
  if (request.rows_size() < 1 || request.rows_size() > kMaxCalibrateRowCounts) {
    return absl::InvalidArgumentError(absl::StrCat("CalibrateRequest.rows lists ", request.rows_size(),
                                                   " row counts; 1 to ", kMaxCalibrateRowCounts, " are allowed"));
  }
  if (request.reps() < 0 || request.reps() > kMaxCalibrateReps) {
    return absl::InvalidArgumentError(
        absl::StrCat("CalibrateRequest.reps ", request.reps(), " not in [0, ", kMaxCalibrateReps, "] (0: 5)"));
  }
  int64_t max_rows = 0;
  for (int i = 0; i < request.rows_size(); ++i) {
    const int64_t rows = request.rows(i);
    if (rows < 1 || rows > kMaxCalibrateRows) {
      return absl::InvalidArgumentError(
          absl::StrCat("CalibrateRequest.rows[", i, "] = ", rows, " not in [1, ", kMaxCalibrateRows, "]"));
    }
    max_rows = std::max(max_rows, rows);
  }
  return max_rows;
}

absl::Status WorkerService::Calibrate(const v1::CalibrateRequest& request, v1::CalibrateResponse* response,
                                      const RpcCaller& caller) {
  const int64_t d = options_.config.hidden_size;
  const int layer = request.layer(), expert = request.expert();
  // Bounded before anything is allocated or computed.
  TANDEM_ASSIGN_OR_RETURN(const int64_t max_rows, CheckCalibrateRequest(request));
  const int reps = request.reps() > 0 ? request.reps() : 5;
  std::vector<float> input(static_cast<size_t>(max_rows * d)), output(input.size());
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& x : input) x = dist(rng);
  absl::MutexLock lock(&compute_mutex_);
  PinComputeThread();
  int done = 0;
  for (int64_t rows : request.rows()) {
    const ExpertWork work{expert, rows, input.data(), output.data()};
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
      // The caller stops waiting at its deadline; so does the worker.
      if (absl::Now() >= caller.deadline) {
        response->clear_points();
        return absl::DeadlineExceededError(absl::StrCat("CalibrateRequest: the caller's deadline passed after ", done,
                                                        " of ", request.rows_size() * reps, " measurements"));
      }
      const auto start = std::chrono::steady_clock::now();
      TANDEM_RETURN_IF_ERROR(options_.executor->RunExperts(layer, std::span<const ExpertWork>(&work, 1)));
      times.push_back(static_cast<double>(NanosSince(start)) / 1e3);
      ++done;
    }
    std::sort(times.begin(), times.end());
    v1::CalibrationPoint* point = response->add_points();
    point->set_rows(rows);
    point->set_median_us(times[times.size() / 2]);
  }
  return absl::OkStatus();
}

absl::Status WorkerService::Release(const v1::ReleaseRequest& request, v1::ReleaseResponse*, const RpcCaller&) {
  absl::MutexLock lock(&holder_mutex_);
  if (holder_ && holder_->session == request.session()) {
    LOG_INFO("worker ", options_.worker_index, ": coordinator ", holder_->who, " released it");
    holder_.reset();
    holder_session_.store(0, std::memory_order_release);
  }
  return absl::OkStatus();  // releasing what one does not hold changes nothing
}

absl::Status WorkerService::Health(const v1::HealthRequest&, v1::HealthResponse* response, const RpcCaller&) {
  response->set_serving(!stop_.load());
  response->set_worker_id(options_.worker_id);
  return absl::OkStatus();
}

absl::Status WorkerService::Stats(const v1::StatsRequest&, v1::StatsResponse* response, const RpcCaller&) {
  const uint64_t requests = requests_.load();
  const double compute_us = static_cast<double>(compute_ns_.load()) / 1e3;
  response->set_requests(requests);
  response->set_expert_calls(expert_calls_.load());
  response->set_rows(rows_.load());
  response->set_compute_us(compute_us);
  response->set_mean_compute_us_per_request(requests > 0 ? compute_us / static_cast<double>(requests) : 0.0);
  response->set_rejected(rejected_.load());
  response->set_doorbell_requests(doorbell_requests_.load());
  response->set_refused_connections(refused_connections_.load());
  return absl::OkStatus();
}

// ---- WorkerServer ----

namespace {

absl::Time DeadlineOf(const grpc::ServerContextBase& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

}  // namespace

// The credentials of every connection the listener handed to gRPC, by the
// descriptor gRPC names such a peer after ("fd:N"). Any thread.
class PeerRegistry {
 public:
  void Add(int fd, const PeerCredentials& peer) ABSL_LOCKS_EXCLUDED(mutex_) {
    absl::MutexLock lock(&mutex_);
    peers_[fd] = peer;  // a reused descriptor number replaces the closed connection's entry
  }
  RpcCaller CallerOf(const grpc::ServerContextBase& context) const ABSL_LOCKS_EXCLUDED(mutex_) {
    RpcCaller caller;
    caller.deadline = DeadlineOf(context);
    const std::string peer = context.peer();
    int fd = -1;
    if (absl::StartsWith(peer, "fd:") && absl::SimpleAtoi(peer.substr(3), &fd)) {
      absl::MutexLock lock(&mutex_);
      if (auto it = peers_.find(fd); it != peers_.end()) caller.peer = it->second;
    }
    return caller;
  }

 private:
  mutable absl::Mutex mutex_;
  std::map<int, PeerCredentials> peers_ ABSL_GUARDED_BY(mutex_);
};

namespace {

// kAsync: one RPC from being armed (waiting for a request of its method) to
// its response having gone out. The completion queue's tags are AsyncCall*.
class AsyncCall {
 public:
  virtual ~AsyncCall() = default;
  // `ok`: the queue's verdict on the call's last operation.
  virtual void Proceed(bool ok) = 0;
};

}  // namespace

struct WorkerServer::Bindings {
  absl::Duration spin;  // poll this long before sleeping
  WorkerService* service = nullptr;
  PeerRegistry peers;
  v1::ExpertWorker::AsyncService async;
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  std::thread thread;
  absl::Mutex arm_mutex;  // arming a call races cq->Shutdown otherwise (a request on a shut-down queue aborts)
  bool cq_shut_down ABSL_GUARDED_BY(arm_mutex) = false;

  void ArmAll();
  void Serve();
};

namespace {

template <class Request, class Response>
class UnaryCall final : public AsyncCall {
 public:
  using RequestFn = void (v1::ExpertWorker::AsyncService::*)(grpc::ServerContext*, Request*,
                                                             grpc::ServerAsyncResponseWriter<Response>*,
                                                             grpc::CompletionQueue*, grpc::ServerCompletionQueue*,
                                                             void*);
  using HandleFn = absl::Status (WorkerService::*)(const Request&, Response*, const RpcCaller&);

  // Waits for the next request of this method.
  static void Arm(WorkerServer::Bindings* b, RequestFn request_fn, HandleFn handle_fn) {
    absl::MutexLock lock(&b->arm_mutex);
    if (b->cq_shut_down) return;
    auto* call = new UnaryCall(b, request_fn, handle_fn);
    (b->async.*request_fn)(&call->context_, &call->request_, &call->responder_, b->cq.get(), b->cq.get(), call);
  }

  void Proceed(bool ok) override {
    if (answered_ || !ok) {  // the response went out (or the call died), or the server is shutting down
      delete this;
      return;
    }
    answered_ = true;
    // Computed here, on the thread that read the request: no hand-off.
    const absl::Status status =
        (bindings_->service->*handle_fn_)(request_, &response_, bindings_->peers.CallerOf(context_));
    if (status.ok()) {
      responder_.Finish(response_, grpc::Status::OK, this);
    } else {
      responder_.FinishWithError(ToGrpcStatus(status), this);
    }
    // After answering, off the round trip's critical path; a request that
    // arrives meanwhile waits in gRPC until then.
    Arm(bindings_, request_fn_, handle_fn_);
  }

 private:
  UnaryCall(WorkerServer::Bindings* b, RequestFn request_fn, HandleFn handle_fn)
      : bindings_(b), request_fn_(request_fn), handle_fn_(handle_fn), responder_(&context_) {}

  WorkerServer::Bindings* bindings_;
  RequestFn request_fn_;
  HandleFn handle_fn_;
  grpc::ServerContext context_;
  Request request_;
  Response response_;
  grpc::ServerAsyncResponseWriter<Response> responder_;
  bool answered_ = false;
};

}  // namespace

void WorkerServer::Bindings::ArmAll() {
  using Async = v1::ExpertWorker::AsyncService;
  UnaryCall<v1::DescribeRequest, v1::DescribeResponse>::Arm(this, &Async::RequestDescribe, &WorkerService::Describe);
  UnaryCall<v1::RunExpertsRequest, v1::RunExpertsResponse>::Arm(this, &Async::RequestRunExperts,
                                                                &WorkerService::RunExperts);
  UnaryCall<v1::CalibrateRequest, v1::CalibrateResponse>::Arm(this, &Async::RequestCalibrate,
                                                              &WorkerService::Calibrate);
  UnaryCall<v1::HealthRequest, v1::HealthResponse>::Arm(this, &Async::RequestHealth, &WorkerService::Health);
  UnaryCall<v1::StatsRequest, v1::StatsResponse>::Arm(this, &Async::RequestStats, &WorkerService::Stats);
  UnaryCall<v1::ReleaseRequest, v1::ReleaseResponse>::Arm(this, &Async::RequestRelease, &WorkerService::Release);
}

void WorkerServer::Bindings::Serve() {
  void* tag = nullptr;
  bool ok = false;
  for (;;) {
    bool got = false;
    if (spin > absl::ZeroDuration()) {
      const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
      do {
        const grpc::CompletionQueue::NextStatus next = cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC));
        if (next == grpc::CompletionQueue::SHUTDOWN) return;
        got = next == grpc::CompletionQueue::GOT_EVENT;
      } while (!got && std::chrono::steady_clock::now() < until);
    }
    if (!got && !cq->Next(&tag, &ok)) return;  // shut down and drained
    static_cast<AsyncCall*>(tag)->Proceed(ok);
  }
}

WorkerServer::WorkerServer() = default;

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(std::unique_ptr<WorkerService> service,
                                                                  const std::string& address,
                                                                  WorkerServerOptions options) {
  TANDEM_ASSIGN_OR_RETURN(const std::string path, ParseUnixAddress(address, "--socket"));
  auto server = std::unique_ptr<WorkerServer>(new WorkerServer());
  server->service_ = std::move(service);
  server->bindings_ = std::make_unique<Bindings>();
  Bindings& b = *server->bindings_;
  b.spin = options.spin;
  b.service = server->service_.get();
  // The socket is ours (0600, bound before gRPC starts); gRPC gets only the
  // connections the accept loop lets through.
  TANDEM_ASSIGN_OR_RETURN(server->listener_, UnixListener::Listen(path, "--socket"));
  grpc::ServerBuilder builder;
  builder.RegisterService(&b.async);
  b.cq = builder.AddCompletionQueue();
  // Inline tensors of a long prefill exceed gRPC's 4 MB default.
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  // Inline layers are MBs: a window and frames that fit one (see the coordinator's channel).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr) {
    if (b.cq) {
      b.cq->Shutdown();
      void* tag;
      bool ok;
      while (b.cq->Next(&tag, &ok)) {
      }
      b.cq.reset();
    }
    return absl::UnavailableError(absl::StrCat("cannot start the gRPC server for ", address));
  }
  if (b.cq) {
    b.ArmAll();
    b.thread = std::thread([&b] { b.Serve(); });
    pthread_setname_np(b.thread.native_handle(),
                       absl::StrCat("rpc-w", b.service->options().worker_index).substr(0, 15).c_str());
  }
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  pthread_setname_np(server->accept_thread_.native_handle(),
                     absl::StrCat("accept-w", b.service->options().worker_index).substr(0, 15).c_str());
  return server;
}

void WorkerServer::AcceptLoop() {
  uint64_t refused = 0;
  for (;;) {
    absl::StatusOr<int> fd = listener_->Accept();  // waits out EMFILE and other transient failures
    if (!fd.ok()) {
      if (absl::IsCancelled(fd.status())) return;
      // Anything else must not end the worker's accepting either: back off, retry.
      LOG_ERROR("worker: accepting on ", listener_->path(), ": ", fd.status().ToString(), "; retrying in 1 s");
      std::this_thread::sleep_for(std::chrono::seconds(1));
      continue;
    }
    absl::StatusOr<PeerCredentials> peer = PeerCredentialsOf(*fd);
    if (!peer.ok() || !TrustedPeerUid(peer->uid)) {
      // Someone else on the host: not a byte of gRPC for them.
      service_->CountRefusedConnection();
      if (refused++ < 10 || refused % 1000 == 0) {
        LOG_WARNING("worker ", service_->options().worker_index, ": refused a connection on ", listener_->path(),
                    peer.ok() ? absl::StrCat(" from pid ", peer->pid, " uid ", peer->uid, " (only uid ", geteuid(),
                                             " and root may connect)")
                              : absl::StrCat(": ", peer.status().message()),
                    refused > 10 ? absl::StrCat(" (", refused, " refused so far)") : "");
      }
      close(*fd);
      continue;
    }
    bindings_->peers.Add(*fd, *peer);
    grpc::AddInsecureChannelFromFd(server_.get(), *fd);  // gRPC owns the descriptor from here
  }
}

WorkerServer::~WorkerServer() { Shutdown(); }

void WorkerServer::Shutdown(absl::Duration grace) {
  std::call_once(shutdown_once_, [&] {
    // No new connection once shutting down: the accept loop ends first.
    if (listener_) listener_->Interrupt();
    if (accept_thread_.joinable()) accept_thread_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(grace));
    if (bindings_ && bindings_->cq) {
      {
        absl::MutexLock lock(&bindings_->arm_mutex);
        bindings_->cq_shut_down = true;
        bindings_->cq->Shutdown();
      }
      if (bindings_->thread.joinable()) bindings_->thread.join();  // it drains the queue, freeing the calls
    }
    if (service_) service_->StopDoorbell();
    listener_.reset();  // closes the socket and removes its file (if still ours)
  });
}

void WorkerServer::Wait() {
  if (server_) server_->Wait();
}

}  // namespace tandem
