// The machine as the CPU workers see it: NUMA nodes, the physical cores of
// each, and the memory local to each (ARCHITECTURE.md, Processes: one
// cpu_worker per node, threads and memory bound to it). Discovered with hwloc;
// placement and binding are plain functions so that the worker's main, the
// launch scripts' dry runs and tests all share one plan.
//
// Cpu ids are the kernel's (hwloc OS indexes), as sched_setaffinity, taskset
// and /proc/<pid>/status use them. Node ids are the kernel's too (mbind,
// numactl, /sys/devices/system/node/node<N>).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/thread_pool.h"

namespace tandem {

struct NumaNode {
  int os_index = 0;  // the kernel's node id
  // One PU per physical core, in core order: the first PU of each core we may
  // run on. Compute threads go one per core; an SMT sibling shares the core's
  // FMA units and load ports and would only slow its twin down.
  std::vector<int> cpus;
  std::vector<int> all_cpus;  // every PU we may run on, SMT siblings included, ascending
  int64_t memory_bytes = 0;   // memory local to the node; 0 when unknown
};

struct NumaTopology {
  // In the kernel's node order. A node with no cpus (memory only: CXL, HBM,
  // or every core outside our affinity) is listed with cpus empty.
  std::vector<NumaNode> nodes;
  // False when the machine reports no NUMA nodes: then `nodes` is one node
  // (os_index 0) with every core, and binding memory is a no-op.
  bool has_numa = true;

  int num_cores() const;  // sum of nodes[i].cpus.size()
  // "2 nodes: node0 8 cores [0,2,...] 64 GiB; node1 ..." for logs.
  std::string ToString() const;
};

// The machine we run on, restricted to the cpus this process may use
// (sched_getaffinity: taskset, numactl --cpunodebind, cgroup cpusets), so a
// worker launched on a subset plans on that subset. A core in several nodes'
// cpusets (KNL's MCDRAM nodes) belongs to the first. Internal when hwloc fails.
absl::StatusOr<NumaTopology> DiscoverTopology();

// The topology hwloc builds from a synthetic description (hwloc's syntax, e.g.
// "package:2 numa:1 core:8 pu:2"), not restricted by our affinity: lets tests
// check multi-socket plans on any machine. InvalidArgument naming the
// description when hwloc rejects it.
absl::StatusOr<NumaTopology> TopologyFromSynthetic(const std::string& hwloc_synthetic);

// Where one CPU worker process runs.
struct WorkerPlacement {
  int worker_index = 0;
  int numa_node = 0;      // the kernel's node id: bind memory here
  std::vector<int> cpus;  // one per compute thread, pinned; never shared with another worker
  int node_slot = 0;      // this worker is the node_slot-th of the node_workers on its node
  int node_workers = 1;
  int num_threads() const { return static_cast<int>(cpus.size()); }
  // A pool whose threads are named "numa<node>-w<i>" (or "numa<node>.<k>-w<i>"
  // when the node hosts several workers) and pinned: thread i to cpus[i]. The
  // pool's thread 0 is the caller, so the caller pins itself to cpus[0] with
  // PinCurrentThreadToCpu.
  ThreadPoolOptions PoolOptions() const;
};

// Places `num_workers` workers (0: one per node that has cores) with
// `threads_per_worker` threads each (0: all cores of the worker's share of
// its node). Workers go to nodes in order, as evenly as the count allows
// (3 workers on 2 nodes: workers 0, 1 on node 0, worker 2 on node 1), and
// workers sharing a node get disjoint contiguous runs of its cores. No cpu is
// ever given twice. InvalidArgument naming the parameter for a negative
// count, or when a node cannot give its workers one core each or
// `threads_per_worker` cores each; FailedPrecondition when no node has cores.
absl::StatusOr<std::vector<WorkerPlacement>> PlanWorkers(const NumaTopology& topology, int num_workers,
                                                         int threads_per_worker);

// Pins the calling thread to one cpu. InvalidArgument naming the cpu when it
// is out of range or not allowed (sched_setaffinity's EINVAL).
absl::Status PinCurrentThreadToCpu(int cpu);

// Binds the pages of [addr, addr + bytes) to `node` (mbind MPOL_BIND), so
// pages touched later are allocated there; pages already present are moved.
// Call before first touch. For a MAP_SHARED shm mapping the policy is stored
// with the shm object, so every process mapping it sees the same placement.
// Strict: when the node runs out of memory, allocation fails (the OOM killer)
// rather than spilling to another node, so size regions to the node.
// `addr` must be page-aligned. A no-op (debug log) on a machine with one node
// or without NUMA support. InvalidArgument naming the node when it does not
// exist; the errno's status otherwise.
absl::Status BindMemoryToNode(void* addr, size_t bytes, int node);

// The cpus thread `tid` of this process may run on, from
// /proc/self/task/<tid>/status (Cpus_allowed_list): what the kernel actually
// enforces, for tests and start-up checks. NotFound when the thread does not
// exist; DataLoss naming the file when the line is missing or malformed.
absl::StatusOr<std::vector<int>> ThreadAffinityFromProc(pid_t tid);

// Kernel cpu-list syntax, "0-3,8,10-11" <-> {0,1,2,3,8,10,11} (ascending,
// duplicates removed). InvalidArgument quoting the text when malformed.
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);
std::string FormatCpuList(const std::vector<int>& cpus);

}  // namespace tandem
