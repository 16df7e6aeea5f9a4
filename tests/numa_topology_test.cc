// NUMA discovery and worker placement: multi-socket plans on synthetic hwloc
// topologies (this machine has one node), and real pinning checked through
// /proc, which is what the kernel enforces.
#include "common/platform/numa_topology.h"

#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;

constexpr char kTwoSockets[] = "package:2 numa:1 core:8 pu:2";

std::vector<int> Range(int first, int count, int step = 1) {
  std::vector<int> v;
  for (int i = 0; i < count; ++i) v.push_back(first + i * step);
  return v;
}

std::vector<int> AffinityCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

// Every cpu of a plan appears once, in the node the worker is placed on.
void ExpectDisjointAndLocal(const NumaTopology& topology, const std::vector<WorkerPlacement>& plan) {
  std::set<int> seen;
  for (const WorkerPlacement& p : plan) {
    const NumaNode* node = nullptr;
    for (const NumaNode& n : topology.nodes)
      if (n.os_index == p.numa_node) node = &n;
    ASSERT_NE(node, nullptr) << "worker " << p.worker_index;
    EXPECT_FALSE(p.cpus.empty()) << "worker " << p.worker_index;
    for (int cpu : p.cpus) {
      EXPECT_TRUE(seen.insert(cpu).second) << "cpu " << cpu << " given twice";
      EXPECT_NE(std::find(node->cpus.begin(), node->cpus.end(), cpu), node->cpus.end())
          << "cpu " << cpu << " is not a core of node " << p.numa_node;
    }
  }
}

TEST(NumaTopologyTest, SyntheticTwoSocketsHasTwoNodesOfEightCoresOnePuEach) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic(kTwoSockets);
  ASSERT_OK(topology);
  ASSERT_EQ(topology->nodes.size(), 2u) << topology->ToString();
  EXPECT_TRUE(topology->has_numa);
  EXPECT_EQ(topology->num_cores(), 16);
  for (int n = 0; n < 2; ++n) {
    const NumaNode& node = topology->nodes[static_cast<size_t>(n)];
    EXPECT_EQ(node.os_index, n);
    // PUs are numbered 2 per core: the first PU of each core, never its sibling.
    EXPECT_EQ(node.cpus, Range(16 * n, 8, 2)) << topology->ToString();
    EXPECT_EQ(node.all_cpus, Range(16 * n, 16)) << topology->ToString();
  }
}

TEST(NumaTopologyTest, SyntheticWithoutNumaLevelIsOneNodeWithEveryCore) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic("core:4 pu:1");
  ASSERT_OK(topology);
  ASSERT_EQ(topology->nodes.size(), 1u) << topology->ToString();
  EXPECT_EQ(topology->nodes[0].cpus, Range(0, 4));
}

TEST(NumaTopologyTest, BadSyntheticDescriptionIsInvalidArgumentNamingIt) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic("socket:banana");
  ASSERT_FALSE(topology.ok());
  EXPECT_EQ(topology.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(topology.status().message(), "socket:banana")) << topology.status();
}

TEST(NumaTopologyTest, PlanOneWorkerPerNodeByDefault) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic(kTwoSockets);
  ASSERT_OK(topology);
  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(*topology, 0, 0);
  ASSERT_OK(plan);
  ASSERT_EQ(plan->size(), 2u);
  for (int w = 0; w < 2; ++w) {
    const WorkerPlacement& p = (*plan)[static_cast<size_t>(w)];
    EXPECT_EQ(p.worker_index, w);
    EXPECT_EQ(p.numa_node, w);
    EXPECT_EQ(p.cpus, Range(16 * w, 8, 2));
    const ThreadPoolOptions options = p.PoolOptions();
    EXPECT_EQ(options.num_threads, 8);
    EXPECT_EQ(options.name, absl::StrCat("numa", w));
    EXPECT_EQ(options.cpus, p.cpus);
  }
  ExpectDisjointAndLocal(*topology, *plan);
}

TEST(NumaTopologyTest, PlanTwoWorkersWithThreadLimit) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic(kTwoSockets);
  ASSERT_OK(topology);
  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(*topology, 2, 4);
  ASSERT_OK(plan);
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_THAT((*plan)[0].cpus, ElementsAre(0, 2, 4, 6));
  EXPECT_EQ((*plan)[1].cpus, Range(16, 4, 2));
  EXPECT_EQ((*plan)[1].numa_node, 1);
  ExpectDisjointAndLocal(*topology, *plan);
}

TEST(NumaTopologyTest, PlanFourWorkersSplitsEachNode) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic(kTwoSockets);
  ASSERT_OK(topology);
  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(*topology, 4, 0);
  ASSERT_OK(plan);
  ASSERT_EQ(plan->size(), 4u);
  const int nodes[] = {0, 0, 1, 1};
  for (int w = 0; w < 4; ++w) {
    const WorkerPlacement& p = (*plan)[static_cast<size_t>(w)];
    EXPECT_EQ(p.numa_node, nodes[w]);
    EXPECT_EQ(p.cpus, Range(8 * w, 4, 2)) << "worker " << w;
    EXPECT_EQ(p.node_workers, 2);
    EXPECT_EQ(p.node_slot, w % 2);
  }
  EXPECT_EQ((*plan)[3].PoolOptions().name, "numa1.1");
  ExpectDisjointAndLocal(*topology, *plan);

  absl::StatusOr<std::vector<WorkerPlacement>> limited = PlanWorkers(*topology, 4, 2);
  ASSERT_OK(limited);
  EXPECT_THAT((*limited)[1].cpus, ElementsAre(4, 6));  // second worker of node 0: the next cores
  ExpectDisjointAndLocal(*topology, *limited);
}

TEST(NumaTopologyTest, PlanUnevenCounts) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic(kTwoSockets);
  ASSERT_OK(topology);
  // Three workers: two share node 0, one has node 1.
  absl::StatusOr<std::vector<WorkerPlacement>> three = PlanWorkers(*topology, 3, 0);
  ASSERT_OK(three);
  ASSERT_EQ(three->size(), 3u);
  EXPECT_EQ((*three)[0].cpus.size(), 4u);
  EXPECT_EQ((*three)[1].cpus.size(), 4u);
  EXPECT_EQ((*three)[2].numa_node, 1);
  EXPECT_EQ((*three)[2].cpus.size(), 8u);
  ExpectDisjointAndLocal(*topology, *three);
  // One worker: node 0 only, never stretched over both sockets.
  absl::StatusOr<std::vector<WorkerPlacement>> one = PlanWorkers(*topology, 1, 0);
  ASSERT_OK(one);
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].numa_node, 0);
  EXPECT_EQ((*one)[0].cpus.size(), 8u);
  // 16 workers: one core each.
  absl::StatusOr<std::vector<WorkerPlacement>> sixteen = PlanWorkers(*topology, 16, 0);
  ASSERT_OK(sixteen);
  for (const WorkerPlacement& p : *sixteen) EXPECT_EQ(p.cpus.size(), 1u);
  ExpectDisjointAndLocal(*topology, *sixteen);
}

TEST(NumaTopologyTest, ImpossiblePlansAreErrorsNamingTheParameter) {
  absl::StatusOr<NumaTopology> topology = TopologyFromSynthetic(kTwoSockets);
  ASSERT_OK(topology);
  struct Case {
    int workers, threads;
    std::string mentions;
  };
  const Case cases[] = {
      {-1, 0, "num_workers"},         {0, -2, "threads_per_worker"}, {2, 9, "threads_per_worker=9"},
      {4, 5, "threads_per_worker=5"}, {18, 0, "num_workers=18"},     {1, 16, "threads_per_worker=16"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(*topology, c.workers, c.threads);
    ASSERT_FALSE(plan.ok()) << c.workers << " workers x " << c.threads;
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
    EXPECT_TRUE(absl::StrContains(plan.status().message(), c.mentions)) << plan.status();
  }
  NumaTopology no_cores;
  no_cores.nodes.push_back(NumaNode{.os_index = 0});
  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(no_cores, 0, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition) << plan.status();
}

TEST(NumaTopologyTest, MemoryOnlyNodeGetsNoWorker) {
  NumaTopology topology;
  topology.nodes.push_back(NumaNode{.os_index = 0, .cpus = {0, 1}, .all_cpus = {0, 1}});
  topology.nodes.push_back(NumaNode{.os_index = 1});  // CXL / HBM: memory, no cores
  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(topology, 0, 0);
  ASSERT_OK(plan);
  ASSERT_EQ(plan->size(), 1u);
  EXPECT_EQ((*plan)[0].numa_node, 0);
}

TEST(NumaTopologyTest, DiscoversThisMachineWithinOurAffinity) {
  absl::StatusOr<NumaTopology> topology = DiscoverTopology();
  ASSERT_OK(topology);
  ASSERT_GE(topology->nodes.size(), 1u);
  std::set<int> all;
  for (const NumaNode& node : topology->nodes) {
    for (int cpu : node.cpus)
      EXPECT_NE(std::find(node.all_cpus.begin(), node.all_cpus.end(), cpu), node.all_cpus.end());
    for (int cpu : node.all_cpus) EXPECT_TRUE(all.insert(cpu).second) << "cpu " << cpu << " in two nodes";
  }
  const std::vector<int> affinity = AffinityCpus();
  EXPECT_EQ(std::vector<int>(all.begin(), all.end()), affinity) << topology->ToString();
  EXPECT_GE(topology->num_cores(), 1);
  EXPECT_FALSE(topology->ToString().empty());

  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(*topology, 0, 0);
  ASSERT_OK(plan);
  ExpectDisjointAndLocal(*topology, *plan);
}

// The pool's threads by name, from /proc/self/task/<tid>/comm.
std::map<std::string, pid_t> ThreadsByName() {
  std::map<std::string, pid_t> threads;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return threads;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::ifstream comm(absl::StrCat("/proc/self/task/", entry->d_name, "/comm"));
    std::string name;
    std::getline(comm, name);
    threads[name] = static_cast<pid_t>(std::stoi(entry->d_name));
  }
  closedir(dir);
  return threads;
}

TEST(NumaTopologyTest, PinnedPoolThreadsRunOnlyOnTheirCpu) {
  absl::StatusOr<NumaTopology> topology = DiscoverTopology();
  ASSERT_OK(topology);
  absl::StatusOr<std::vector<WorkerPlacement>> plan = PlanWorkers(*topology, 1, 0);
  ASSERT_OK(plan);
  ThreadPoolOptions options = (*plan)[0].PoolOptions();
  options.name = "pintest";
  // One thread more than cpus: the pool wraps around (thread i -> cpus[i % n]).
  const std::vector<int> cpus = options.cpus;
  options.num_threads = static_cast<int>(cpus.size()) + 1;
  ThreadPool pool(options);
  const std::map<std::string, pid_t> threads = ThreadsByName();
  for (int t = 1; t < options.num_threads; ++t) {
    const std::string name = absl::StrCat("pintest-w", t);
    auto it = threads.find(name);
    ASSERT_NE(it, threads.end()) << "no thread named " << name;
    absl::StatusOr<std::vector<int>> affinity = ThreadAffinityFromProc(it->second);
    ASSERT_OK(affinity);
    EXPECT_THAT(*affinity, ElementsAre(cpus[static_cast<size_t>(t) % cpus.size()])) << name;
  }
}

TEST(NumaTopologyTest, PinCurrentThreadToCpu) {
  const std::vector<int> affinity = AffinityCpus();
  ASSERT_FALSE(affinity.empty());
  const int target = affinity.back();
  absl::Status pinned;
  absl::StatusOr<std::vector<int>> seen;
  std::thread thread([&] {
    pinned = PinCurrentThreadToCpu(target);
    seen = ThreadAffinityFromProc(static_cast<pid_t>(syscall(SYS_gettid)));
  });
  thread.join();
  ASSERT_OK(pinned);
  ASSERT_OK(seen);
  EXPECT_THAT(*seen, ElementsAre(target));

  absl::Status out_of_range = PinCurrentThreadToCpu(CPU_SETSIZE);
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument) << out_of_range;
  int not_allowed = CPU_SETSIZE - 1;
  while (std::find(affinity.begin(), affinity.end(), not_allowed) != affinity.end()) --not_allowed;
  std::thread other([&] { pinned = PinCurrentThreadToCpu(not_allowed); });
  other.join();
  EXPECT_EQ(pinned.code(), absl::StatusCode::kInvalidArgument) << pinned;
  EXPECT_TRUE(absl::StrContains(pinned.message(), absl::StrCat(not_allowed))) << pinned;
}

TEST(NumaTopologyTest, ThreadAffinityFromProcOfMissingThreadIsNotFound) {
  absl::StatusOr<std::vector<int>> affinity = ThreadAffinityFromProc(-5);
  ASSERT_FALSE(affinity.ok());
  EXPECT_EQ(affinity.status().code(), absl::StatusCode::kNotFound) << affinity.status();
}

TEST(NumaTopologyTest, CpuListsRoundTrip) {
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList("0-3,8, 10-11\n");
  ASSERT_OK(cpus);
  EXPECT_THAT(*cpus, ElementsAre(0, 1, 2, 3, 8, 10, 11));
  EXPECT_EQ(FormatCpuList(*cpus), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({5, 3, 4, 9}), "3-5,9");
  EXPECT_OK(ParseCpuList(""));
  for (const char* bad : {"1-", "a", "3-1", "1,,2", "-1", "99999"}) {
    absl::StatusOr<std::vector<int>> parsed = ParseCpuList(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(NumaTopologyTest, BindMemoryToNode) {
  const size_t bytes = 1 << 20;
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(memory, MAP_FAILED);
  absl::StatusOr<NumaTopology> topology = DiscoverTopology();
  ASSERT_OK(topology);
  const int node = topology->nodes[0].os_index;
  absl::Status bound = BindMemoryToNode(memory, bytes, node);
  EXPECT_OK(bound);
  static_cast<char*>(memory)[0] = 1;  // the first touch, under the policy
  absl::Status missing = BindMemoryToNode(memory, bytes, 4095);
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument) << missing;
  absl::Status negative = BindMemoryToNode(memory, bytes, -2);
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument) << negative;
  absl::Status unaligned = BindMemoryToNode(static_cast<char*>(memory) + 8, 64, node);
  EXPECT_EQ(unaligned.code(), absl::StatusCode::kInvalidArgument) << unaligned;
  munmap(memory, bytes);
}

}  // namespace
}  // namespace tandem
