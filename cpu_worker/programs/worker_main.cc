// tandem-cpu-worker: one CPU expert worker process (one per NUMA node).
//   tandem-cpu-worker --model DIR --socket /run/tandem/w0.sock --worker_index 0 --num_workers 2 --division split
//   tandem-cpu-worker --synthetic tiny:2 --synthetic_seed 7 --socket /tmp/w0.sock --transport shm
// (a synthetic worker generates only its own slices of the experts)
//
// Start-up: discover the topology, place this worker (its node and cores, or
// --numa_node / --cpus), start its pinned compute pool, load the model, copy
// this worker's slices into its expert store (a named shm region on its
// node), create the tensor arena (--transport shm), then serve
// tandem.v1.ExpertWorker on the unix socket until SIGTERM/SIGINT, when it
// stops serving, unlinks its regions and removes its socket and lock file.
//
// A lock file (<socket>.lock, held with an OFD lock) makes one worker per
// socket: a second one refuses to start. The lock file also lists the
// worker's shm regions, whose names end in a random suffix (so no other user
// can take them first): a successor of a killed worker removes those it
// finds there, if they are this user's, and `tandem-cpu-worker --reclaim
// --socket S` does the same without starting a worker (tandem-launch.sh stop).
#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/base/cpu_features.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/progress.h"
#include "common/base/runtime_dir.h"
#include "common/base/status_macros.h"
#include "common/base/thread_pool.h"
#include "common/kernels/kernel_calibration.h"
#include "common/kernels/kernel_plan.h"
#include "common/kernels/linear.h"
#include "common/model/expert_content.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/model/synthetic_model.h"
#include "common/model/tensor_names.h"
#include "common/platform/numa_topology.h"
#include "common/platform/open_file_limit.h"
#include "common/platform/unix_socket.h"
#include "common/programs/kernel_flags.h"
#include "cpu_worker/expert_store.h"
#include "cpu_worker/store_expert_executor.h"
#include "cpu_worker/worker_service.h"

ABSL_FLAG(std::string, model, "", "model directory (config.json + *.safetensors) or GGUF file");
ABSL_FLAG(std::string, synthetic, "",
          "instead of --model: a synthetic preset generated in memory, PRESET[:layers] (as tandem-make-model)");
ABSL_FLAG(uint64_t, synthetic_seed, 0, "seed of the --synthetic weights (as tandem-make-model --seed)");
ABSL_FLAG(std::string, gguf_experts, "auto",
          "GGUF files: store the experts in their quantized blocks, computed by the quantized CPU kernels "
          "(quantized, or auto, the default: this worker computes them on its CPU), or dequantized to BF16 "
          "(bf16). Must agree with the coordinator's --gguf_experts: it refuses a worker whose expert types "
          "differ");
ABSL_FLAG(std::string, socket, "", "unix socket path to serve on");
ABSL_FLAG(int32_t, worker_index, 0, "this worker's index in [0, num_workers)");
ABSL_FLAG(int32_t, num_workers, 1, "how many workers share the experts");
ABSL_FLAG(std::string, division, "split", "split | shard: how experts are divided between workers");
ABSL_FLAG(int32_t, numa_node, -1, "NUMA node to run on and bind memory to; -1 = planned from worker_index");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = every core of this worker's share of its node");
ABSL_FLAG(std::string, cpus, "", "explicit cpu list for the compute threads, e.g. 0-7 (overrides the plan)");
ABSL_FLAG(std::string, transport, "shm", "inline | shm: shm adds the shared-memory arena and its doorbell to gRPC");
ABSL_FLAG(std::string, region_prefix, "",
          "prefix of this worker's shm region names (\"/name\"); default derived from --socket");
ABSL_FLAG(int32_t, arena_slots, 2, "input (and output) slots in the arena");
ABSL_FLAG(int64_t, arena_slot_mb, 64, "MiB per arena slot (one layer's rows for this worker must fit)");
ABSL_FLAG(int32_t, spin_us, 50,
          "after a request (doorbell or async gRPC), busy-wait this long for the next one before sleeping");
ABSL_FLAG(bool, echo, false, "benchmarks only: output = input, no weights (the model's config is still read)");
ABSL_FLAG(bool, reclaim, false,
          "instead of serving: remove what a killed worker on --socket left behind (the shm regions its lock file "
          "lists, the stale socket, the lock file) and exit; refused while a live worker holds the lock");
ABSL_FLAG(absl::Duration, progress_interval, absl::Seconds(2),
          "how often filling the expert store (and generating --synthetic weights) logs its progress");
ABSL_FLAG(bool, exit_with_parent, false, "exit (as on SIGTERM) when the parent process dies (tests)");

namespace tandem {
namespace {

// The flags, copied once and checked together.
struct WorkerConfig {
  ModelSource model;  // --model, or --synthetic and --synthetic_seed
  bool reclaim = false;
  std::string socket;
  int worker_index = 0;
  int num_workers = 1;
  ExpertDivision division = ExpertDivision::kSplit;
  int numa_node = -1;
  int threads = 0;
  std::vector<int> cpus;
  bool shm = true;
  std::string region_prefix;
  uint32_t arena_slots = 2;
  uint64_t arena_slot_bytes = 64ull << 20;
  absl::Duration spin;
  bool echo = false;
  bool measure_kernel_plan = false;
  BlockOrder block_order = BlockOrder::kGgml;  // --block_order, after the ISA cap and plan
  bool quantized_experts = false;              // --gguf_experts quantized|auto: a GGUF's expert blocks kept

  // Without the random suffix ShmRegion appends (ShmCreateOptions::unique_suffix).
  std::string experts_region() const { return absl::StrCat(region_prefix, "-w", worker_index, "-experts"); }
  std::string arena_region() const { return absl::StrCat(region_prefix, "-w", worker_index, "-arena"); }
};

absl::StatusOr<WorkerConfig> ConfigFromFlags() {
  WorkerConfig c;
  c.reclaim = absl::GetFlag(FLAGS_reclaim);
  // The same parsing and messages as tandem-server and tandem-generate
  // (reclaiming needs no model).
  if (!c.reclaim) {
    TANDEM_ASSIGN_OR_RETURN(c.model, ParseModelSource(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_synthetic),
                                                      absl::GetFlag(FLAGS_synthetic_seed)));
  }
  c.socket = absl::GetFlag(FLAGS_socket);
  if (c.socket.empty()) return absl::InvalidArgumentError("--socket is required (a unix socket path)");
  if (c.socket.size() > 100) {
    return absl::InvalidArgumentError(absl::StrCat("--socket \"", c.socket, "\" is longer than a unix socket allows"));
  }
  c.worker_index = absl::GetFlag(FLAGS_worker_index);
  c.num_workers = absl::GetFlag(FLAGS_num_workers);
  if (c.num_workers < 1) return absl::InvalidArgumentError(absl::StrCat("--num_workers ", c.num_workers, " < 1"));
  if (c.worker_index < 0 || c.worker_index >= c.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker_index ", c.worker_index, " not in [0, --num_workers ", c.num_workers, ")"));
  }
  auto division = ParseExpertDivision(absl::GetFlag(FLAGS_division));
  if (!division.ok()) return absl::InvalidArgumentError(absl::StrCat("--division: ", division.status().message()));
  c.division = *division;
  c.numa_node = absl::GetFlag(FLAGS_numa_node);
  c.threads = absl::GetFlag(FLAGS_threads);
  if (c.threads < 0) return absl::InvalidArgumentError(absl::StrCat("--threads ", c.threads, " < 0"));
  if (!absl::GetFlag(FLAGS_cpus).empty()) {
    auto cpus = ParseCpuList(absl::GetFlag(FLAGS_cpus));
    if (!cpus.ok()) return absl::InvalidArgumentError(absl::StrCat("--cpus: ", cpus.status().message()));
    c.cpus = *cpus;
    if (c.cpus.empty()) return absl::InvalidArgumentError("--cpus names no cpu");
  }
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport != "inline" && transport != "shm") {
    return absl::InvalidArgumentError(absl::StrCat("--transport \"", transport, "\": expected inline or shm"));
  }
  c.shm = transport == "shm";
  TANDEM_ASSIGN_OR_RETURN(const KernelFlags kernel, ApplyKernelFlags());
  c.measure_kernel_plan = kernel.measure_kernel_plan;
  c.block_order = kernel.block_order;
  c.region_prefix = absl::GetFlag(FLAGS_region_prefix);
  if (c.region_prefix.empty()) {
    // Unique per socket path, stable across restarts of the same worker.
    const std::string stem = std::filesystem::path(c.socket).stem().string();
    c.region_prefix = absl::StrFormat("/tandem-%s-%08x", stem.substr(0, 64),
                                      static_cast<uint32_t>(std::hash<std::string>{}(
                                          std::filesystem::absolute(c.socket).lexically_normal().string())));
  }
  // The longest name with its random suffix ("-" + 16 hex digits) must be valid.
  TANDEM_RETURN_IF_ERROR(ValidateShmName(absl::StrCat(c.experts_region(), "-0123456789abcdef"), "--region_prefix"));
  const int slots = absl::GetFlag(FLAGS_arena_slots);
  if (slots < 1 || slots > static_cast<int>(kMaxArenaSlots)) {
    return absl::InvalidArgumentError(absl::StrCat("--arena_slots ", slots, " not in [1, ", kMaxArenaSlots, "]"));
  }
  c.arena_slots = static_cast<uint32_t>(slots);
  const int64_t slot_mb = absl::GetFlag(FLAGS_arena_slot_mb);
  if (slot_mb < 1 || slot_mb > 65536)
    return absl::InvalidArgumentError(absl::StrCat("--arena_slot_mb ", slot_mb, " not in [1, 65536]"));
  c.arena_slot_bytes = static_cast<uint64_t>(slot_mb) << 20;
  const int spin_us = absl::GetFlag(FLAGS_spin_us);
  if (spin_us < 0) return absl::InvalidArgumentError(absl::StrCat("--spin_us ", spin_us, " < 0"));
  c.spin = absl::Microseconds(spin_us);
  c.echo = absl::GetFlag(FLAGS_echo);
  const std::string gguf_experts = absl::GetFlag(FLAGS_gguf_experts);
  if (gguf_experts != "bf16" && gguf_experts != "quantized" && gguf_experts != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gguf_experts \"", gguf_experts, "\": expected auto, quantized or bf16"));
  }
  c.quantized_experts = gguf_experts != "bf16";
  return c;
}

// <socket>.lock, held with an OFD write lock while the worker lives: "pid\n"
// then one shm region name per line. Opened without following a symlink and
// only if it is this user's regular file.
class SocketLock {
 public:
  static absl::StatusOr<std::unique_ptr<SocketLock>> Acquire(const std::string& socket) {
    auto lock = std::unique_ptr<SocketLock>(new SocketLock());
    lock->path_ = socket + ".lock";
    lock->fd_ = open(lock->path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lock->fd_ < 0) {
      return absl::UnavailableError(absl::StrCat("cannot open lock file ", lock->path_, ": ", std::strerror(errno),
                                                 errno == ELOOP ? " (it is a symlink: not following it)" : ""));
    }
    struct stat st {};
    if (fstat(lock->fd_, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "lock file ", lock->path_, " is not a regular file of yours (uid ", st.st_uid, "): refusing to use it"));
    }
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(lock->fd_, F_OFD_SETLK, &fl) != 0) {
      const std::string previous = lock->Read();
      return absl::AlreadyExistsError(absl::StrCat("another worker (pid ", previous.substr(0, previous.find('\n')),
                                                   ") serves ", socket, " (", lock->path_, " is locked)"));
    }
    lock->previous_ = lock->Read();
    lock->held_ = true;
    lock->Write({});
    return lock;
  }
  ~SocketLock() {
    if (held_) unlink(path_.c_str());  // before closing, so a successor never loses its fresh file
    if (fd_ >= 0) close(fd_);
  }

  // The region names a killed predecessor listed (its first line is its pid).
  std::vector<std::string> PreviousRegions() const {
    std::vector<std::string> names = absl::StrSplit(previous_, '\n', absl::SkipEmpty());
    if (!names.empty()) names.erase(names.begin());
    return names;
  }
  // Rewrites the file: our pid, then `regions`.
  void Write(const std::vector<std::string>& regions) {
    std::string text = absl::StrCat(getpid(), "\n");
    for (const std::string& r : regions) absl::StrAppend(&text, r, "\n");
    if (ftruncate(fd_, 0) != 0 || pwrite(fd_, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      LOG_WARNING("cannot write to ", path_);
    }
  }

 private:
  SocketLock() = default;
  std::string Read() const {
    char buffer[4096] = {};
    const ssize_t n = pread(fd_, buffer, sizeof(buffer) - 1, 0);
    return n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
  }
  std::string path_;
  int fd_ = -1;
  bool held_ = false;
  std::string previous_;
};

// This worker's node and cpus: --cpus, else --numa_node's cores, else PlanWorkers.
absl::StatusOr<WorkerPlacement> Place(const WorkerConfig& c, const NumaTopology& topology) {
  WorkerPlacement p;
  p.worker_index = c.worker_index;
  auto node_of = [&](int cpu) {
    for (const NumaNode& node : topology.nodes)
      for (int x : node.all_cpus)
        if (x == cpu) return node.os_index;
    return 0;
  };
  if (!c.cpus.empty()) {
    p.cpus = c.cpus;
    p.numa_node = c.numa_node >= 0 ? c.numa_node : node_of(c.cpus[0]);
  } else if (c.numa_node >= 0) {
    const NumaNode* node = nullptr;
    for (const NumaNode& n : topology.nodes)
      if (n.os_index == c.numa_node) node = &n;
    if (node == nullptr || node->cpus.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--numa_node ", c.numa_node, " has no cores we may run on (", topology.ToString(), ")"));
    }
    p.numa_node = c.numa_node;
    p.cpus = node->cpus;
  } else {
    absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(topology, c.num_workers, c.threads);
    if (!plan.ok() && c.threads > 0) {
      return absl::Status(plan.status().code(), absl::StrCat("--threads ", c.threads, ": ", plan.status().message()));
    }
    if (!plan.ok()) return plan.status();
    p = (*plan)[static_cast<size_t>(c.worker_index)];
  }
  if (c.threads > 0) {
    if (static_cast<int>(p.cpus.size()) < c.threads) {
      return absl::InvalidArgumentError(absl::StrCat("--threads ", c.threads, " but only ", p.cpus.size(),
                                                     " cores are available to this worker: ", FormatCpuList(p.cpus)));
    }
    p.cpus.resize(static_cast<size_t>(c.threads));
  }
  return p;
}

absl::StatusOr<ModelConfig> LoadConfigOnly(const WorkerConfig& c) {
  if (c.model.synthetic) return SyntheticConfig(*c.model.synthetic);
  return LoadModelConfigAt(c.model.model_dir);
}

// The model this worker takes its slices from. A synthetic one is generated
// without experts, dense matrices or tokenizer (only the small vectors the
// loader reads): the store generates this worker's slices straight into its
// region (SyntheticStoreFill), so no expert byte exists twice and none of
// another worker's share exists at all.
// A GGUF's quantized experts are kept as views of their blocks
// (--gguf_experts quantized: the store copies this worker's blocks), or
// dequantized to BF16 at load: only the experts this worker holds a slice of.
// The dense matrices, which a worker never reads, stay views either way
// (mapped pages never touched take no memory).
absl::StatusOr<std::unique_ptr<Model>> LoadWorkerModel(const WorkerConfig& c, int num_threads) {
  if (!c.model.synthetic && IsGgufPath(c.model.model_dir) && c.quantized_experts) {
    return LoadModel(c.model.model_dir,
                     ModelLoadOptions{.num_threads = num_threads, .quantized = QuantizedWeights::kKeep});
  }
  if (!c.model.synthetic && IsGgufPath(c.model.model_dir)) {
    TANDEM_ASSIGN_OR_RETURN(const ModelConfig config, LoadModelConfigAt(c.model.model_dir));
    ModelLoadOptions load{.num_threads = num_threads, .quantized = QuantizedWeights::kKeepDense};
    load.experts.mode = SyntheticExperts::Mode::kSlices;
    TANDEM_ASSIGN_OR_RETURN(load.experts.slices, PartitionExperts(config, c.division, c.worker_index, c.num_workers));
    return LoadModel(c.model.model_dir, load);
  }
  if (!c.model.synthetic) return LoadModel(c.model.model_dir);
  ModelLoadOptions load{.num_threads = num_threads, .dense_matrices = false, .tokenizer = false};
  load.experts.mode = SyntheticExperts::Mode::kNone;
  return LoadSyntheticModel(*c.model.synthetic, load);
}

// ExpertStoreOptions::fill for a synthetic model: the values
// FillSyntheticTensor gives those elements.
std::function<void(int, int, WeightRole, int64_t, int64_t, void*)> SyntheticStoreFill(const ModelConfig& config,
                                                                                      const SyntheticModelSpec& spec) {
  return [config, spec](int layer, int expert, WeightRole role, int64_t begin, int64_t end, void* out) {
    const WeightSpec w{WeightName(config, role, layer, expert), role, layer, expert, WeightShape(config, role)};
    FillSyntheticRange(config, w, spec.seed, spec.dtype, out, begin, end, /*out_first=*/begin);
  };
}

// The regions a killed predecessor listed in the lock file (we hold the
// lock, so no live worker of ours uses them): removed when they carry our
// prefix and are this user's, left alone otherwise.
void RemoveStaleRegions(const WorkerConfig& c, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    const bool ours_by_name =
        absl::StartsWith(name, c.experts_region() + "-") || absl::StartsWith(name, c.arena_region() + "-");
    if (!ours_by_name || !ValidateShmName(name).ok()) {
      LOG_WARNING("lock file lists \"", name, "\", which is not one of this worker's region names: left alone");
      continue;
    }
    const int fd = shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) continue;  // already gone
    struct stat st {};
    const bool mine = fstat(fd, &st) == 0 && st.st_uid == geteuid();
    close(fd);
    if (mine && shm_unlink(name.c_str()) == 0) LOG_WARNING("removed stale shm region ", name, " of a previous worker");
  }
}

int Fail(const absl::Status& status) {
  LOG_ERROR("tandem-cpu-worker: ", status.ToString());
  return 1;
}

// What computes the experts: the expert store and its executor, or echo.
// The store outlives the executor that reads it.
struct WorkerCompute {
  std::unique_ptr<ExpertStore> store;
  std::unique_ptr<ExpertExecutor> executor;
};

WorkerServiceOptions BaseServiceOptions(const WorkerConfig& c, const WorkerPlacement& p) {
  WorkerServiceOptions options;
  options.worker_id = absl::StrCat("worker", c.worker_index, "@node", p.numa_node, "/pid", getpid());
  options.division = c.division;
  options.worker_index = c.worker_index;
  options.num_workers = c.num_workers;
  options.numa_node = p.numa_node;
  options.cpus = p.cpus;
  options.doorbell_spin = c.spin;
  return options;
}

// --echo: the model's config only; output = input.
absl::StatusOr<WorkerCompute> EchoCompute(const WorkerConfig& c, WorkerServiceOptions* options) {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, LoadConfigOnly(c));
  options->config = config;
  options->fingerprint = EchoFingerprint(config);
  TANDEM_ASSIGN_OR_RETURN(options->slices, PartitionExperts(config, c.division, c.worker_index, c.num_workers));
  WorkerCompute compute;
  compute.executor = std::make_unique<EchoExpertExecutor>(config.hidden_size);
  options->compute = "echo";
  options->kernels = {"memcpy"};
  return compute;
}

// --kernel_plan measure: timed on this worker's own slices of the first experts.
absl::Status MeasureWorkerKernelPlan(const WorkerConfig& c, const ExpertStore& store, ThreadPool* pool) {
  std::vector<std::vector<LinearWeight>> groups;
  for (const ExpertSlice& slice : store.slices()) {
    if (groups.size() == 2) break;
    if (const ExpertWeights* w = store.Find(slice.layer, slice.expert)) groups.push_back({w->w1, w->w3, w->w2});
  }
  TANDEM_ASSIGN_OR_RETURN(KernelCalibration measured, MeasureKernelPlan(groups, pool));
  LOG_INFO("worker ", c.worker_index, ": kernel plan measured: ", measured.plan.Spec());
  SetProcessKernelPlan(std::move(measured.plan));
  return absl::OkStatus();
}

// The model's slices for this worker, in its expert store on its node.
absl::StatusOr<WorkerCompute> StoreCompute(const WorkerConfig& c, const WorkerPlacement& p, ThreadPool* pool,
                                           WorkerServiceOptions* options) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Model> model, LoadWorkerModel(c, p.num_threads()));
  options->config = model->config;
  TANDEM_ASSIGN_OR_RETURN(options->fingerprint, FingerprintModel(model->config, *model->weights->source));
  WorkerCompute compute;
  TANDEM_ASSIGN_OR_RETURN(
      compute.store,
      ExpertStore::Create(
          *model->weights,
          ExpertStoreOptions{
              .region_name = c.experts_region(),
              .unique_suffix = true,
              .division = c.division,
              .worker_index = c.worker_index,
              .num_workers = c.num_workers,
              .numa_node = p.numa_node,
              .pool = pool,
              .block_order = c.block_order,
              .fill = c.model.synthetic ? SyntheticStoreFill(model->config, *c.model.synthetic) : nullptr}));
  model.reset();  // the store holds this worker's slices; drop the checkpoint (never a full copy per node)
  options->slices = compute.store->slices();
  options->weights_region = compute.store->region_name();
  options->weights_region_bytes = compute.store->region_bytes();
  options->slice_hashes = compute.store->slice_hashes();
  options->content_hash = compute.store->content_hash();
  options->experts_dtypes = compute.store->dtypes();
  if (c.measure_kernel_plan) TANDEM_RETURN_IF_ERROR(MeasureWorkerKernelPlan(c, *compute.store, pool));
  compute.executor = std::make_unique<StoreExpertExecutor>(compute.store.get(), pool);
  options->compute = "store";
  const ExpertStore& store = *compute.store;
  const ExpertWeights* first =
      store.slices().empty() ? nullptr : store.Find(store.slices().front().layer, store.slices().front().expert);
  const DType dtype = first != nullptr ? first->w1.dtype : DType::kBF16;
  options->kernels = {absl::StrCat("isa ", ActiveIsaDescription()), absl::StrCat("plan ", ProcessKernelPlan().Spec()),
                      absl::StrCat(std::string(DTypeName(dtype)), " ", DescribeKernelChoice(dtype))};
  LOG_INFO("worker ", c.worker_index, ": kernels: ", KernelStartupSummary(dtype));
  return compute;
}

// The start-up log line up to the arena (which the service creates).
std::string ServingSummary(const WorkerConfig& c, const WorkerPlacement& p, const WorkerServiceOptions& options) {
  return absl::StrCat(
      "worker ", c.worker_index, "/", c.num_workers, " pid ", getpid(), " serving unix:", c.socket, ": model ",
      c.model.Describe(), " [", FingerprintString(options.fingerprint), "]; node ", p.numa_node, ", cpus ",
      FormatCpuList(p.cpus), " (", p.num_threads(), " threads); ", ExpertDivisionName(c.division), ", ",
      options.slices.size(), " slices",
      c.echo ? " (echo: no weights)"
             : absl::StrFormat(" in %s (%.1f MiB, content %s)", options.weights_region,
                               options.weights_region_bytes / 1048576.0, ContentHashString(options.content_hash)));
}

std::string ArenaText(const WorkerService& service) {
  return service.arena() ? absl::StrFormat("arena %s (%u slots x %.1f MiB, doorbell)", service.arena()->name(),
                                           service.arena()->num_slots(), service.arena()->slot_bytes() / 1048576.0)
                         : std::string("no arena (inline tensors only)");
}

// Signals are blocked in every thread (main blocked them before any thread
// started): wait for one here.
void WaitForShutdownSignal(int worker_index) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  int signal_number = 0;
  sigwait(&set, &signal_number);
  LOG_INFO("worker ", worker_index, ": ", strsignal(signal_number), ", shutting down");
}

// The socket's folder (the lock file lives there too): the runtime dir must
// be ours and private; any other must be safe to put a socket in.
absl::Status CheckSocketDir(const WorkerConfig& c) {
  const std::filesystem::path socket_dir = std::filesystem::path(c.socket).parent_path();
  return socket_dir == std::filesystem::path(DefaultRuntimeDir())
             ? EnsurePrivateDir(socket_dir.string())
             : EnsureSocketDir(socket_dir.empty() ? "." : socket_dir.string(), "--socket's folder");
}

// --reclaim: what a killed worker on c.socket left behind, removed with the
// checks its successor would make (the lock taken, so no live worker uses
// them; only regions with this worker's prefix and of this user; the socket
// only if stale and ours), without starting one.
int Reclaim(const WorkerConfig& c) {
  if (absl::Status dir = CheckSocketDir(c); !dir.ok()) return Fail(dir);
  auto lock = SocketLock::Acquire(c.socket);
  if (!lock.ok()) return Fail(lock.status());
  RemoveStaleRegions(c, (*lock)->PreviousRegions());
  if (absl::Status socket = PrepareSocketPath(c.socket, "--socket"); !socket.ok()) return Fail(socket);
  LOG_INFO("worker ", c.worker_index, ": reclaimed what a previous worker left on ", c.socket);
  return 0;  // the lock file goes with the lock
}

int Run(const WorkerConfig& c) {
  if (c.reclaim) return Reclaim(c);
  if (absl::Status dir = CheckSocketDir(c); !dir.ok()) return Fail(dir);
  auto lock = SocketLock::Acquire(c.socket);
  if (!lock.ok()) return Fail(lock.status());
  RemoveStaleRegions(c, (*lock)->PreviousRegions());

  auto topology = DiscoverTopology();
  if (!topology.ok()) return Fail(topology.status());
  auto placement = Place(c, *topology);
  if (!placement.ok()) return Fail(placement.status());
  const WorkerPlacement& p = *placement;
  auto created_pool = ThreadPool::Create(p.PoolOptions());
  if (!created_pool.ok()) return Fail(created_pool.status());
  ThreadPool& pool = **created_pool;
  if (absl::Status s = PinCurrentThreadToCpu(p.cpus[0]); !s.ok()) return Fail(s);  // the pool's thread 0

  WorkerServiceOptions options = BaseServiceOptions(c, p);
  auto compute = c.echo ? EchoCompute(c, &options) : StoreCompute(c, p, &pool, &options);
  if (!compute.ok()) return Fail(compute.status());
  // The lock file lists our regions (random names) for a successor to remove.
  if (compute->store) (*lock)->Write({compute->store->region_name()});
  options.executor = compute->executor.get();
  if (c.shm) {
    options.arena = ArenaOptions{
        .name = c.arena_region(), .num_slots = c.arena_slots, .slot_bytes = c.arena_slot_bytes, .unique_suffix = true};
  }
  const std::string summary = ServingSummary(c, p, options);
  const std::string weights_region = options.weights_region;
  auto service = WorkerService::Create(std::move(options));
  if (!service.ok()) return Fail(service.status());
  if ((*service)->arena() != nullptr) {
    std::vector<std::string> regions = {(*service)->arena()->name()};
    if (!weights_region.empty()) regions.insert(regions.begin(), weights_region);
    (*lock)->Write(regions);
  }
  const std::string arena_text = ArenaText(**service);
  auto server = WorkerServer::Start(std::move(*service), absl::StrCat("unix:", c.socket),
                                    WorkerServerOptions{.spin = c.spin});
  if (!server.ok()) return Fail(server.status());
  LOG_INFO(summary, "; ", arena_text);

  // Shut down in order.
  WaitForShutdownSignal(c.worker_index);
  (*server)->Shutdown();
  server->reset();  // the service and its arena (unlinked) go with it
  compute->executor.reset();
  compute->store.reset();  // unlinks the expert region; the server removed its socket
  LOG_INFO("worker ", c.worker_index, ": stopped");
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  // Before any thread exists, so every thread inherits the mask and only the
  // main thread's sigwait sees SIGTERM/SIGINT.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  tandem::SetProgramUsage(
      "Serve one CPU expert worker on a unix socket.\n"
      "  tandem-cpu-worker --model DIR --socket /run/tandem/w0.sock --worker_index 0 --num_workers 2");
  tandem::ParseProgramFlags(argc, argv);
  // Inline (gRPC) layers allocate MB-sized message buffers per request; keep
  // them in the heap instead of a fresh mmap each time (page faults and
  // zeroing dominated an inline round trip: docs/process-split.md).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  if (absl::GetFlag(FLAGS_exit_with_parent)) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1) return 1;  // the parent is already gone
  }
  // Each coordinator connection is a descriptor: as many as the system allows.
  LOG_INFO("tandem-cpu-worker: ", tandem::DescribeOpenFileLimit(tandem::RaiseOpenFileLimit()));
  if (absl::GetFlag(FLAGS_progress_interval) < absl::ZeroDuration()) {
    std::fprintf(stderr, "tandem-cpu-worker: --progress_interval: must be >= 0\n");
    return 2;
  }
  tandem::SetProgressLogInterval(absl::GetFlag(FLAGS_progress_interval));
  auto config = tandem::ConfigFromFlags();
  if (!config.ok()) {
    std::fprintf(stderr, "tandem-cpu-worker: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  return tandem::Run(*config);
}
