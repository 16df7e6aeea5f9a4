#include "common/platform/numa_topology.h"

#include <hwloc.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// RAII for hwloc objects: a topology that failed half-way must still be destroyed.
struct TopologyDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using TopologyPtr = std::unique_ptr<hwloc_topology, TopologyDeleter>;
struct BitmapDeleter {
  void operator()(hwloc_bitmap_s* bitmap) const { hwloc_bitmap_free(bitmap); }
};
using BitmapPtr = std::unique_ptr<hwloc_bitmap_s, BitmapDeleter>;

absl::StatusOr<TopologyPtr> NewTopology() {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0)
    return absl::InternalError(absl::StrCat("hwloc_topology_init failed: ", std::strerror(errno)));
  return TopologyPtr(raw);
}

std::vector<int> BitmapToVector(hwloc_const_bitmap_t bitmap) {
  std::vector<int> ids;
  if (bitmap == nullptr || hwloc_bitmap_iszero(bitmap)) return ids;
  if (hwloc_bitmap_weight(bitmap) < 0) return ids;  // infinite: never for a cpuset we read
  for (int id = hwloc_bitmap_first(bitmap); id >= 0; id = hwloc_bitmap_next(bitmap, id)) ids.push_back(id);
  return ids;
}

// The PUs of `cpuset` we may use (`allowed`, null: all), one per core.
void CollectCpus(hwloc_topology_t topology, hwloc_const_cpuset_t cpuset, hwloc_const_bitmap_t allowed,
                 std::set<int>& claimed, NumaNode& node) {
  const int num_pus = hwloc_get_nbobjs_inside_cpuset_by_type(topology, cpuset, HWLOC_OBJ_PU);
  std::set<int64_t> cores_seen;
  for (int i = 0; i < num_pus; ++i) {
    hwloc_obj_t pu = hwloc_get_obj_inside_cpuset_by_type(topology, cpuset, HWLOC_OBJ_PU, static_cast<unsigned>(i));
    if (pu == nullptr) continue;
    const int cpu = static_cast<int>(pu->os_index);
    if (allowed != nullptr && !hwloc_bitmap_isset(allowed, static_cast<unsigned>(cpu))) continue;
    // A core in two nodes' cpusets (an MCDRAM node beside DRAM) stays with
    // the first, so no plan can hand it to two workers.
    if (!claimed.insert(cpu).second) continue;
    node.all_cpus.push_back(cpu);
    // A PU without a core above it (an OS that reports none) is its own core.
    hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(topology, HWLOC_OBJ_CORE, pu);
    const int64_t core_key = core != nullptr ? static_cast<int64_t>(core->logical_index) : -1 - int64_t{cpu};
    if (cores_seen.insert(core_key).second) node.cpus.push_back(cpu);
  }
  std::sort(node.all_cpus.begin(), node.all_cpus.end());
}

// Nodes, cores and memory of a loaded topology; `allowed` null = every PU.
NumaTopology ReadTopology(hwloc_topology_t topology, hwloc_const_bitmap_t allowed) {
  NumaTopology result;
  std::vector<hwloc_obj_t> numa_objects;
  const int num_nodes = hwloc_get_nbobjs_by_type(topology, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < num_nodes; ++i)
    numa_objects.push_back(hwloc_get_obj_by_type(topology, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i)));
  std::erase(numa_objects, nullptr);
  std::sort(numa_objects.begin(), numa_objects.end(),
            [](hwloc_obj_t a, hwloc_obj_t b) { return a->os_index < b->os_index; });

  std::set<int> claimed;
  if (numa_objects.empty()) {
    // No NUMA information: the whole machine is one node.
    result.has_numa = false;
    NumaNode node;
    hwloc_obj_t root = hwloc_get_root_obj(topology);
    CollectCpus(topology, root->cpuset, allowed, claimed, node);
    if (root->total_memory > 0) node.memory_bytes = static_cast<int64_t>(root->total_memory);
    result.nodes.push_back(std::move(node));
    return result;
  }
  for (hwloc_obj_t object : numa_objects) {
    NumaNode node;
    node.os_index = static_cast<int>(object->os_index);
    node.memory_bytes = static_cast<int64_t>(object->attr->numanode.local_memory);
    if (object->cpuset != nullptr) CollectCpus(topology, object->cpuset, allowed, claimed, node);
    result.nodes.push_back(std::move(node));
  }
  return result;
}

std::string FormatGiB(int64_t bytes) { return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30)); }

}  // namespace

int NumaTopology::num_cores() const {
  int cores = 0;
  for (const NumaNode& node : nodes) cores += static_cast<int>(node.cpus.size());
  return cores;
}

std::string NumaTopology::ToString() const {
  std::vector<std::string> parts;
  for (const NumaNode& node : nodes) {
    parts.push_back(absl::StrCat(
        "node", node.os_index, " ", node.cpus.size(), " cores [", FormatCpuList(node.cpus), "]",
        node.all_cpus.size() > node.cpus.size() ? absl::StrCat(" (", node.all_cpus.size(), " PUs)") : std::string(),
        " ", FormatGiB(node.memory_bytes)));
  }
  return absl::StrCat(nodes.size(),
                      has_numa ? " NUMA node(s): " : " node (no NUMA information): ", absl::StrJoin(parts, "; "));
}

absl::StatusOr<NumaTopology> DiscoverTopology() {
  TANDEM_ASSIGN_OR_RETURN(TopologyPtr topology, NewTopology());
  if (hwloc_topology_load(topology.get()) != 0)
    return absl::InternalError(absl::StrCat("hwloc_topology_load failed: ", std::strerror(errno)));
  // The union of every thread's affinity: what taskset / numactl gave the
  // process, even when the caller itself is already pinned to one cpu.
  BitmapPtr allowed(hwloc_bitmap_alloc());
  if (allowed == nullptr) return absl::ResourceExhaustedError("hwloc_bitmap_alloc failed");
  if (hwloc_get_cpubind(topology.get(), allowed.get(), HWLOC_CPUBIND_PROCESS) != 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
      return absl::InternalError(absl::StrCat("sched_getaffinity failed: ", std::strerror(errno)));
    hwloc_bitmap_zero(allowed.get());
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) hwloc_bitmap_set(allowed.get(), static_cast<unsigned>(cpu));
  }
  NumaTopology result = ReadTopology(topology.get(), allowed.get());
  if (result.num_cores() == 0)
    return absl::InternalError(absl::StrCat("hwloc found no cores this process may run on (affinity ",
                                            FormatCpuList(BitmapToVector(allowed.get())), ")"));
  return result;
}

absl::StatusOr<NumaTopology> TopologyFromSynthetic(const std::string& hwloc_synthetic) {
  TANDEM_ASSIGN_OR_RETURN(TopologyPtr topology, NewTopology());
  if (hwloc_topology_set_synthetic(topology.get(), hwloc_synthetic.c_str()) != 0)
    return absl::InvalidArgumentError(absl::StrCat("hwloc rejected the synthetic topology \"", hwloc_synthetic, "\""));
  if (hwloc_topology_load(topology.get()) != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("hwloc could not load the synthetic topology \"", hwloc_synthetic, "\": ", std::strerror(errno)));
  return ReadTopology(topology.get(), nullptr);
}

ThreadPoolOptions WorkerPlacement::PoolOptions() const {
  ThreadPoolOptions options;
  options.num_threads = std::max(1, num_threads());
  options.name = node_workers > 1 ? absl::StrCat("numa", numa_node, ".", node_slot) : absl::StrCat("numa", numa_node);
  options.cpus = cpus;
  return options;
}

absl::StatusOr<std::vector<WorkerPlacement>> PlanWorkers(const NumaTopology& topology, int num_workers,
                                                         int threads_per_worker) {
  if (num_workers < 0)
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers must be >= 0 (0: one per NUMA node), got ", num_workers));
  if (threads_per_worker < 0)
    return absl::InvalidArgumentError(absl::StrCat(
        "threads_per_worker must be >= 0 (0: every core of the worker's share), got ", threads_per_worker));
  std::vector<const NumaNode*> usable;
  for (const NumaNode& node : topology.nodes)
    if (!node.cpus.empty()) usable.push_back(&node);
  if (usable.empty())
    return absl::FailedPreconditionError(
        absl::StrCat("no NUMA node has cores to run workers on (", topology.ToString(), ")"));

  const int num_nodes = static_cast<int>(usable.size());
  const int workers = num_workers == 0 ? num_nodes : num_workers;
  std::vector<WorkerPlacement> plan;
  plan.reserve(static_cast<size_t>(workers));
  // Nodes in order, counts differing by at most one: fewer workers than nodes
  // leave the last nodes idle rather than stretching a worker over two nodes,
  // which would put half its threads far from its memory.
  for (int n = 0; n < num_nodes; ++n) {
    const int on_node = workers / num_nodes + (n < workers % num_nodes ? 1 : 0);
    if (on_node == 0) continue;
    const NumaNode& node = *usable[static_cast<size_t>(n)];
    const int cores = static_cast<int>(node.cpus.size());
    if (on_node > cores)
      return absl::InvalidArgumentError(absl::StrCat("num_workers=", workers, " puts ", on_node,
                                                     " workers on NUMA node ", node.os_index, ", which has only ",
                                                     cores, " cores (one per worker at least)"));
    if (threads_per_worker > 0 && static_cast<int64_t>(threads_per_worker) * on_node > cores)
      return absl::InvalidArgumentError(
          absl::StrCat("threads_per_worker=", threads_per_worker, " needs ", int64_t{threads_per_worker} * on_node,
                       " cores on NUMA node ", node.os_index, " for its ", on_node, " worker(s), but it has ", cores,
                       " (at most ", cores / on_node, " per worker; SMT siblings are not counted)"));
    int next = 0;
    for (int slot = 0; slot < on_node; ++slot) {
      const int count =
          threads_per_worker > 0 ? threads_per_worker : cores / on_node + (slot < cores % on_node ? 1 : 0);
      WorkerPlacement placement;
      placement.worker_index = static_cast<int>(plan.size());
      placement.numa_node = node.os_index;
      placement.node_slot = slot;
      placement.node_workers = on_node;
      placement.cpus.assign(node.cpus.begin() + next, node.cpus.begin() + next + count);
      next += count;
      plan.push_back(std::move(placement));
    }
  }
  return plan;
}

absl::Status PinCurrentThreadToCpu(int cpu) {
  if (cpu < 0 || cpu >= CPU_SETSIZE)
    return absl::InvalidArgumentError(absl::StrCat("cpu ", cpu, " is out of range [0, ", CPU_SETSIZE, ")"));
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (error == EINVAL)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot pin to cpu ", cpu, ": not a cpu this process may run on (offline or outside its cpuset)"));
  if (error != 0) return absl::ErrnoToStatus(error, absl::StrCat("pinning the thread to cpu ", cpu));
  return absl::OkStatus();
}

absl::Status BindMemoryToNode(void* addr, size_t bytes, int node) {
  if (bytes == 0) return absl::OkStatus();
  // Checked before the single-node shortcut so that misuse shows on any machine.
  const long page = sysconf(_SC_PAGESIZE);
  if (page > 0 && reinterpret_cast<uintptr_t>(addr) % static_cast<uintptr_t>(page) != 0)
    return absl::InvalidArgumentError(absl::StrCat("BindMemoryToNode: address 0x",
                                                   absl::Hex(reinterpret_cast<uintptr_t>(addr)),
                                                   " is not page-aligned (", page, " bytes)"));
  if (node < 0) return absl::InvalidArgumentError(absl::StrCat("NUMA node ", node, " does not exist"));
  if (numa_available() < 0) {
    LOG_DEBUG("BindMemoryToNode: no NUMA support in this kernel; ", bytes, " bytes left unbound");
    return absl::OkStatus();
  }
  const int max_node = numa_max_node();
  if (node < 0 || node > max_node)
    return absl::InvalidArgumentError(
        absl::StrCat("NUMA node ", node, " does not exist (this machine has nodes 0..", max_node, ")"));
  if (numa_num_configured_nodes() <= 1) {
    // Nothing to choose between; mbind would only cost a system call.
    LOG_DEBUG("BindMemoryToNode: one NUMA node; ", bytes, " bytes left unbound");
    return absl::OkStatus();
  }
  std::unique_ptr<bitmask, decltype(&numa_free_nodemask)> mask(numa_allocate_nodemask(), &numa_free_nodemask);
  if (mask == nullptr) return absl::ResourceExhaustedError("numa_allocate_nodemask failed");
  numa_bitmask_setbit(mask.get(), static_cast<unsigned>(node));
  // maxnode is one more than the mask's bits: the kernel has always ignored
  // the last bit, and libnuma passes size + 1 too.
  if (mbind(addr, bytes, MPOL_BIND, mask->maskp, mask->size + 1, MPOL_MF_MOVE) != 0) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("mbind of ", bytes, " bytes to NUMA node ", node));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> ThreadAffinityFromProc(pid_t tid) {
  const std::string path = absl::StrCat("/proc/self/task/", tid, "/status");
  std::ifstream file(path);
  if (!file.is_open()) return absl::NotFoundError(absl::StrCat("cannot open ", path, " (no such thread?)"));
  constexpr std::string_view kKey = "Cpus_allowed_list:";
  std::string line;
  while (std::getline(file, line)) {
    if (line.compare(0, kKey.size(), kKey) != 0) continue;
    absl::StatusOr<std::vector<int>> cpus = ParseCpuList(line.substr(kKey.size()));
    if (!cpus.ok()) return absl::DataLossError(absl::StrCat(path, ": ", cpus.status().message()));
    return cpus;
  }
  return absl::DataLossError(absl::StrCat(path, " has no Cpus_allowed_list line"));
}

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  std::set<int> cpus;
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  if (stripped.empty()) return std::vector<int>();
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("bad cpu list \"", std::string(stripped), "\": ", why));
  };
  for (absl::string_view item : absl::StrSplit(stripped, ',')) {
    item = absl::StripAsciiWhitespace(item);
    std::vector<absl::string_view> ends = absl::StrSplit(item, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    if (!absl::SimpleAtoi(ends[0], &first) || first < 0) return bad(absl::StrCat("\"", item, "\""));
    last = first;
    if (ends.size() == 2 && (!absl::SimpleAtoi(ends[1], &last) || last < first))
      return bad(absl::StrCat("\"", item, "\""));
    if (last >= CPU_SETSIZE) return bad(absl::StrCat("cpu ", last, " >= ", CPU_SETSIZE));
    for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
  }
  return std::vector<int>(cpus.begin(), cpus.end());
}

std::string FormatCpuList(const std::vector<int>& cpus) {
  std::vector<int> sorted(cpus);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::vector<std::string> ranges;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    ranges.push_back(j == i ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return absl::StrJoin(ranges, ",");
}

}  // namespace tandem
