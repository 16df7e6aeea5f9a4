// Round-trip latency of one layer's expert dispatch across the process
// boundary, by payload, for each transport (the cost model's ipc_t term):
//   inproc    — EchoExpertExecutor called directly (the floor: one memcpy)
//   shm       — rows in the worker's arena, request through the doorbell
//   shm-grpc  — rows in the arena, descriptors in a gRPC call
//   inline    — rows inside the gRPC messages (unix socket)
// and, to split the gRPC transports' time:
//   grpc-ping — an empty Health RPC through the same channel, completion
//               queue and wait (the RPC's fixed cost; printed once, rows 0)
//   serialize — the inline messages' cpu cost without an RPC: the request
//               built as the executor builds it, serialized and parsed as
//               gRPC does, the worker's echo response likewise, copied out
// The worker is a real tandem-cpu-worker in --echo mode (output = input, no
// weights), so the transport dominates. One call = RemoteExpertExecutor::
// RunExperts for one expert with R rows x D floats: copy in, signal, worker
// memcpy, reply, copy out. Calls follow each other at once (the worker's
// spin catches the next request), or --gap_us apart (the worker falls
// asleep first, as between the layers of a real decode step). Prints one
// JSON line per (transport, rows): median, p99, mean and min in
// microseconds, and the worker's own compute time per call.
//
//   tandem-ipc-bench --rows 1,8,64,512 --iterations 2000
//
// Legend: R rows, D hidden size (4096: the mixtral-8x7b preset's).
#include <malloc.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "common/base/clock.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/thread_pool.h"
#include "common/model/synthetic_model.h"
#include "common/platform/numa_topology.h"
#include "coordinator/orchestration/remote_expert_executor.h"
#include "cpu_worker/worker_service.h"
#include "nlohmann/json.hpp"

extern char** environ;

ABSL_FLAG(std::string, rows, "1,8,64,512", "rows per call, comma-separated");
ABSL_FLAG(std::string, transports, "inproc,shm,shm-grpc,inline", "transports to time, comma-separated");
ABSL_FLAG(int32_t, iterations, 2000, "timed calls per (transport, rows); 512 rows get a quarter");
ABSL_FLAG(int32_t, warmup, 200, "untimed calls first");
ABSL_FLAG(std::string, preset, "mixtral-8x7b:1",
          "synthetic config (PRESET[:layers]) the echo worker reports: D = its hidden size");
ABSL_FLAG(std::string, worker_binary, "", "tandem-cpu-worker; default: beside this program");
ABSL_FLAG(int32_t, worker_cpu, 0, "cpu the worker runs on; -1 = unpinned");
ABSL_FLAG(int32_t, bench_cpu, 1, "cpu this process runs on; -1 = unpinned");
ABSL_FLAG(int32_t, spin_us, 50, "worker (doorbell and gRPC) and coordinator (doorbell) busy-wait before sleeping");
ABSL_FLAG(int32_t, grpc_spin_us, 250, "coordinator: poll for a gRPC reply this long before sleeping");
ABSL_FLAG(int32_t, gap_us, 0,
          "busy-wait this long between calls (the coordinator computing the next layer): a gap longer than the "
          "worker's spin makes every request find the worker asleep");
ABSL_FLAG(std::string, worker_flags, "", "extra flags for the worker, space-separated (e.g. --spin_us=0)");

namespace tandem {
namespace {

using Json = nlohmann::json;

// The inline messages' cpu cost alone (the "serialize" transport): what the
// executor and the worker do to one RunExperts call's messages, without the
// RPC. Messages are fresh per call on the worker's side and reused on the
// coordinator's, as there.
class MessageRoundTrip final : public ExpertExecutor {
 public:
  explicit MessageRoundTrip(int64_t hidden_size) : d_(hidden_size) {}
  absl::Status RunExperts(int layer, std::span<const ExpertWork> work) override {
    using RequestTraits = grpc::SerializationTraits<v1::RunExpertsRequest>;
    using ResponseTraits = grpc::SerializationTraits<v1::RunExpertsResponse>;
    request_.Clear();
    request_.set_request_id(1);
    request_.set_layer(layer);
    request_.set_transport(v1::TRANSPORT_INLINE);
    for (const ExpertWork& w : work) {
      v1::ExpertTask* task = request_.add_tasks();
      task->set_expert(w.expert);
      task->set_num_rows(w.num_rows);
      task->set_inline_rows(reinterpret_cast<const char*>(w.input),
                            static_cast<size_t>(w.num_rows * d_) * sizeof(float));
    }
    grpc::ByteBuffer wire;
    bool own = false;
    if (!RequestTraits::Serialize(request_, &wire, &own).ok()) return absl::InternalError("serialize request");
    v1::RunExpertsRequest received;  // the worker's side
    if (!RequestTraits::Deserialize(&wire, &received).ok()) return absl::InternalError("parse request");
    v1::RunExpertsResponse answer;
    for (const v1::ExpertTask& task : received.tasks()) {
      v1::ExpertResult* result = answer.add_results();
      result->set_expert(task.expert());
      result->set_num_rows(task.num_rows());
      std::string* out = result->mutable_inline_output();
      out->resize(task.inline_rows().size());
      CopyFloats(reinterpret_cast<float*>(out->data()), reinterpret_cast<const float*>(task.inline_rows().data()),
                 out->size() / sizeof(float));
    }
    grpc::ByteBuffer reply;
    if (!ResponseTraits::Serialize(answer, &reply, &own).ok()) return absl::InternalError("serialize response");
    if (!ResponseTraits::Deserialize(&reply, &response_).ok()) return absl::InternalError("parse response");
    for (size_t k = 0; k < work.size(); ++k) {
      const std::string& out = response_.results(static_cast<int>(k)).inline_output();
      CopyFloats(work[k].output, reinterpret_cast<const float*>(out.data()), out.size() / sizeof(float));
    }
    return absl::OkStatus();
  }

 private:
  int64_t d_;
  v1::RunExpertsRequest request_;
  v1::RunExpertsResponse response_;
};

// The echo worker process: started here, always stopped on the way out.
class EchoWorker {
 public:
  ~EchoWorker() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status;
      waitpid(pid_, &status, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  absl::Status Start(const std::string& binary, const std::string& preset, int cpu, int spin_us,
                     const std::string& extra_flags) {
    char pattern[] = "/tmp/tandem-ipc-XXXXXX";
    if (mkdtemp(pattern) == nullptr) return absl::InternalError("mkdtemp failed");
    dir_ = pattern;
    socket_ = (dir_ / "w0.sock").string();
    std::vector<std::string> args = {binary,
                                     "--synthetic",
                                     preset,
                                     "--echo",
                                     "--socket",
                                     socket_,
                                     "--transport",
                                     "shm",
                                     "--spin_us",
                                     absl::StrCat(spin_us),
                                     "--region_prefix",
                                     absl::StrCat("/tandem-ipc-", getpid()),
                                     "--exit_with_parent"};
    if (cpu >= 0) {
      args.push_back("--cpus");
      args.push_back(absl::StrCat(cpu));
    }
    for (absl::string_view flag : absl::StrSplit(extra_flags, ' ', absl::SkipWhitespace())) args.emplace_back(flag);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int err = posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), environ);
    if (err != 0) return absl::InternalError(absl::StrCat("posix_spawn ", binary, ": ", strerror(err)));
    return absl::OkStatus();
  }
  std::string address() const { return "unix:" + socket_; }

 private:
  pid_t pid_ = -1;
  std::filesystem::path dir_;
  std::string socket_;
};

int Main(const char* argv0) {
  std::vector<int64_t> rows_list;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_rows), ',', absl::SkipWhitespace())) {
    int64_t r;
    if (!absl::SimpleAtoi(part, &r) || r < 1) {
      std::fprintf(stderr, "--rows: \"%s\" is not a positive integer\n", std::string(part).c_str());
      return 1;
    }
    rows_list.push_back(r);
  }
  const std::string preset_flag = absl::GetFlag(FLAGS_preset);
  std::vector<std::string> preset_parts = absl::StrSplit(preset_flag, ':');
  SyntheticModelSpec spec{.preset = preset_parts[0]};
  if (preset_parts.size() == 2 && !absl::SimpleAtoi(preset_parts[1], &spec.num_layers)) {
    std::fprintf(stderr, "--preset: bad layer count in \"%s\"\n", preset_flag.c_str());
    return 1;
  }
  auto config = SyntheticConfig(spec);
  if (!config.ok()) {
    std::fprintf(stderr, "--preset: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  const int64_t d = config->hidden_size;

  std::string binary = absl::GetFlag(FLAGS_worker_binary);
  if (binary.empty()) binary = (std::filesystem::path(argv0).parent_path() / "tandem-cpu-worker").string();
  const int bench_cpu = absl::GetFlag(FLAGS_bench_cpu), worker_cpu = absl::GetFlag(FLAGS_worker_cpu);
  if (bench_cpu >= 0 && bench_cpu < AvailableCores()) {
    absl::Status pinned = PinCurrentThreadToCpu(bench_cpu);
    if (!pinned.ok()) LOG_WARNING("pinning the benchmark to cpu ", bench_cpu, ": ", pinned.message());
  }
  EchoWorker worker;
  absl::Status started =
      worker.Start(binary, preset_flag, worker_cpu, absl::GetFlag(FLAGS_spin_us), absl::GetFlag(FLAGS_worker_flags));
  if (!started.ok()) {
    std::fprintf(stderr, "%s\n", started.ToString().c_str());
    return 1;
  }

  const int64_t max_rows = *std::max_element(rows_list.begin(), rows_list.end());
  std::vector<float> input(static_cast<size_t>(max_rows * d)), output(input.size());
  for (size_t i = 0; i < input.size(); ++i) input[i] = static_cast<float>(i % 1000) * 1e-3f;

  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_transports), ',', absl::SkipWhitespace())) {
    const std::string transport(name);
    std::unique_ptr<ExpertExecutor> executor;
    RemoteExpertExecutor* remote_executor = nullptr;
    if (transport == "inproc") {
      executor = std::make_unique<EchoExpertExecutor>(d);
    } else if (transport == "serialize") {
      executor = std::make_unique<MessageRoundTrip>(d);
    } else {
      auto t = ParseWorkerTransport(transport == "grpc-ping" ? std::string("inline") : transport);
      if (!t.ok()) {
        std::fprintf(stderr, "--transports: %s\n", std::string(t.status().message()).c_str());
        return 1;
      }
      RemoteExpertExecutorOptions options;
      options.addresses = {worker.address()};
      options.transports = {*t};
      options.connect_timeout = absl::Seconds(30);
      options.spin = absl::Microseconds(absl::GetFlag(FLAGS_spin_us));
      options.grpc_spin = absl::Microseconds(absl::GetFlag(FLAGS_grpc_spin_us));
      auto remote = RemoteExpertExecutor::Connect(*config, EchoFingerprint(*config), options);
      if (!remote.ok()) {
        std::fprintf(stderr, "%s\n", remote.status().ToString().c_str());
        return 1;
      }
      remote_executor = remote->get();
      executor = std::move(*remote);
    }
    const bool ping = transport == "grpc-ping";
    for (int64_t rows : ping ? std::vector<int64_t>{0} : rows_list) {
      const ExpertWork work{0, rows, input.data(), output.data()};
      auto call = [&]() -> absl::Status {
        if (ping) return remote_executor->Ping(0);
        return executor->RunExperts(0, std::span<const ExpertWork>(&work, 1));
      };
      const double compute_before = remote_executor ? remote_executor->stats()[0].worker_compute_us : 0;
      const int64_t calls_before = remote_executor ? remote_executor->stats()[0].calls : 0;
      const int iterations =
          std::max(10, rows >= 512 ? absl::GetFlag(FLAGS_iterations) / 4 : absl::GetFlag(FLAGS_iterations));
      std::vector<double> us;
      us.reserve(static_cast<size_t>(iterations));
      const auto gap = std::chrono::microseconds(absl::GetFlag(FLAGS_gap_us));
      for (int i = 0; i < absl::GetFlag(FLAGS_warmup) + iterations; ++i) {
        if (gap.count() > 0) {
          const auto until = std::chrono::steady_clock::now() + gap;
          while (std::chrono::steady_clock::now() < until) {
          }
        }
        const auto start = std::chrono::steady_clock::now();
        absl::Status status = call();
        const double elapsed = MicrosSince(start);
        if (!status.ok()) {
          std::fprintf(stderr, "%s rows %lld: %s\n", transport.c_str(), static_cast<long long>(rows),
                       status.ToString().c_str());
          return 1;
        }
        if (i >= absl::GetFlag(FLAGS_warmup)) us.push_back(elapsed);
      }
      if (std::memcmp(input.data(), output.data(), static_cast<size_t>(rows * d) * sizeof(float)) != 0) {
        std::fprintf(stderr, "%s rows %lld: the echo came back different\n", transport.c_str(),
                     static_cast<long long>(rows));
        return 1;
      }
      const Summary t = Summarise(us);
      const int64_t calls = remote_executor ? remote_executor->stats()[0].calls - calls_before : 0;
      const double worker_compute_us =
          calls > 0 ? (remote_executor->stats()[0].worker_compute_us - compute_before) / static_cast<double>(calls) : 0;
      EmitJsonLine(Json{{"bench", "ipc_round_trip"},
                        {"transport", transport},
                        {"rows", rows},
                        {"hidden", d},
                        {"payload_bytes", rows * d * 4},
                        {"iterations", iterations},
                        {"median_us", t.median},
                        {"p99_us", t.p99},
                        {"mean_us", t.mean},
                        {"min_us", t.min},
                        {"worker_compute_us", worker_compute_us},
                        {"gap_us", absl::GetFlag(FLAGS_gap_us)},
                        {"grpc_spin_us", absl::GetFlag(FLAGS_grpc_spin_us)},
                        {"worker_flags", absl::GetFlag(FLAGS_worker_flags)}});
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "Round-trip latency of one layer's expert dispatch across the process boundary, by payload, for each transport.");
  tandem::ParseProgramFlags(argc, argv);
  // As tandem-cpu-worker and tandem-generate --workers: MB-sized inline
  // message buffers stay in the heap instead of a fresh mmap per call.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  return tandem::Main(argv[0]);
}
