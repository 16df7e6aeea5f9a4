// Serving throughput through the real gRPC service: an in-process server
// (the scheduler and InferenceService that tandem-server runs, on a unix
// socket) and clients on their own channels. Prints JSON lines:
//   - beam search: tokens/s of one request per beam width (Fiddler's setting:
//     input 32, output 64), and how the width-W request's time compares with
//     W times the width-1 request — the beams run as one batch, so W beams
//     cost far less than W requests;
//   - concurrency: N clients each generating (greedy, input 32, output 64) at
//     once: aggregate tokens/s and the p50/p99 inter-token latency clients saw.
//
//   tandem-serving-bench --preset mixtral-8x7b:2 --beam_widths 1,4,8,12,16 --clients 1,4,16
//   tandem-serving-bench --preset demo
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

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
#include "common/platform/hardware_probe.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/runtime/local_runtime.h"
#include "coordinator/serving/inference_service.h"

ABSL_FLAG(std::string, preset, "mixtral-8x7b:2", "synthetic model generated in memory, preset[:layers]");
ABSL_FLAG(std::string, beam_widths, "1,4,8,12,16", "beam widths, comma-separated (empty: skip)");
ABSL_FLAG(std::string, clients, "1,4,16", "concurrent client counts, comma-separated (empty: skip)");
ABSL_FLAG(int32_t, input_tokens, 32, "prompt length");
ABSL_FLAG(int32_t, output_tokens, 64, "tokens generated per request (beam search: steps)");
ABSL_FLAG(int32_t, threads, 0, "compute threads; 0 = all available cores");
ABSL_FLAG(int32_t, max_sequences, 16, "the scheduler's max_sequences");

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::vector<int32_t> Prompt(int n, int64_t vocab, int salt) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>(3 + (i * 7919 + salt * 104729) % (vocab - 3)));
  return ids;
}

struct ClientRun {
  grpc::Status status;
  int64_t tokens = 0;
  std::vector<double> gaps_ms;  // between consecutive tokens as the client received them
};

ClientRun GenerateOnce(const std::string& address, const std::vector<int32_t>& prompt, int max_tokens) {
  auto stub = tandem::v1::Inference::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  tandem::v1::GenerateRequest request;
  request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
  request.set_max_tokens(max_tokens);
  request.set_temperature(0);
  request.set_ignore_eos(true);
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, request);
  ClientRun run;
  tandem::v1::GenerateResponse response;
  Clock::time_point last{};
  while (reader->Read(&response)) {
    for (int i = 0; i < response.tokens_size(); ++i) {
      const auto now = Clock::now();
      if (run.tokens > 0) run.gaps_ms.push_back(tandem::MillisBetween(last, now));
      last = now;
      ++run.tokens;
    }
  }
  run.status = reader->Finish();
  return run;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tandem-serving-bench: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage("Serving throughput through the real gRPC service.");
  tandem::ParseProgramFlags(argc, argv);
  tandem::SetMinLogLevel(tandem::LogLevel::kWarning);
  absl::StatusOr<tandem::SyntheticModelSpec> parsed = tandem::ParseSyntheticPreset(absl::GetFlag(FLAGS_preset), 1);
  if (!parsed.ok()) return Fail(parsed.status());
  tandem::SyntheticModelSpec spec = *parsed;
  const int input = absl::GetFlag(FLAGS_input_tokens), output = absl::GetFlag(FLAGS_output_tokens);
  const std::vector<int> widths = tandem::ParsePositiveList<int>(absl::GetFlag(FLAGS_beam_widths));
  const std::vector<int> client_counts = tandem::ParsePositiveList<int>(absl::GetFlag(FLAGS_clients));
  const int max_width = widths.empty() ? 1 : *std::max_element(widths.begin(), widths.end());
  const int max_clients = client_counts.empty() ? 1 : *std::max_element(client_counts.begin(), client_counts.end());
  const int max_sequences = std::max({absl::GetFlag(FLAGS_max_sequences), max_width, max_clients});

  auto model = tandem::LoadSyntheticModel(spec, /*num_threads=*/2);
  if (!model.ok()) return Fail(model.status());
  tandem::LocalRuntimeOptions options;
  options.num_threads = absl::GetFlag(FLAGS_threads);
  options.kv_cache_tokens = static_cast<int64_t>(max_sequences) * (input + output + 32) * 2;
  auto runtime = tandem::LocalRuntime::Create(std::move(*model), options);
  if (!runtime.ok()) return Fail(runtime.status());
  tandem::SchedulerOptions scheduler_options;
  scheduler_options.max_sequences = max_sequences;
  scheduler_options.max_batch_tokens = std::max<int64_t>(256, max_sequences);
  // Stats over one beam run's steps: the per-part means below describe it alone.
  scheduler_options.stats_window_steps = std::max(1, output - 1);
  auto scheduler =
      tandem::Scheduler::Create(&(*runtime)->model(), &(*runtime)->engine(), &(*runtime)->kv_pool(), scheduler_options);
  if (!scheduler.ok()) return Fail(scheduler.status());
  tandem::InferenceService service(&(*runtime)->model(), scheduler->get(), {});
  const std::filesystem::path socket =
      std::filesystem::temp_directory_path() / absl::StrCat("tandem-serving-bench-", getpid(), ".sock");
  const std::string address = "unix:" + socket.string();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", address)));
  const int64_t vocab = (*runtime)->model().config.vocab_size;
  const json base = {{"preset", absl::GetFlag(FLAGS_preset)},
                     {"threads", (*runtime)->pool().num_threads()},
                     {"input_tokens", input},
                     {"output_tokens", output},
                     {"command", "tandem-serving-bench --preset " + absl::GetFlag(FLAGS_preset) + " --beam_widths " +
                                     absl::GetFlag(FLAGS_beam_widths) + " --clients " + absl::GetFlag(FLAGS_clients)}};

  // Warm-up: first-touch of weights and KV blocks.
  if (ClientRun warm = GenerateOnce(address, Prompt(input, vocab, 99), 4); !warm.status.ok()) {
    return Fail(absl::InternalError(warm.status.error_message()));
  }

  double width1_s = 0;
  for (int width : widths) {
    auto stub = tandem::v1::Inference::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    tandem::v1::BeamSearchRequest request;
    const auto prompt = Prompt(input, vocab, width);
    request.mutable_prompt_ids()->Add(prompt.begin(), prompt.end());
    request.set_beam_width(width);
    request.set_max_tokens(output);
    request.set_ignore_eos(true);  // every width runs all `output` steps
    grpc::ClientContext context;
    const auto start = Clock::now();
    auto reader = stub->BeamSearch(&context, request);
    tandem::v1::BeamSearchResponse response;
    tandem::v1::Usage usage;
    while (reader->Read(&response)) {
      if (response.done()) usage = response.usage();
    }
    const grpc::Status status = reader->Finish();
    const double seconds = tandem::SecondsSince(start);
    if (!status.ok()) return Fail(absl::InternalError(status.error_message()));
    if (width == 1) width1_s = seconds;
    json line = base;
    line["bench"] = "beam_search";
    line["beam_width"] = width;
    line["seconds"] = seconds;
    line["steps"] = usage.generated_tokens();
    line["output_tokens_per_s"] = static_cast<double>(usage.generated_tokens()) / seconds;
    line["beam_tokens_per_s"] = static_cast<double>(usage.generated_tokens()) * width / seconds;
    line["time_to_first_token_ms"] = usage.time_to_first_token_ms();
    line["mean_step_ms"] = usage.mean_inter_token_ms();
    const tandem::ForwardTiming f = (*scheduler)->Stats().mean_forward;
    line["mean_forward_ms"] = {{"attention", f.attention_us / 1e3}, {"router", f.router_us / 1e3},
                               {"experts", f.experts_us / 1e3},     {"combine", f.combine_us / 1e3},
                               {"logits", f.logits_us / 1e3},       {"total", f.total_us / 1e3}};
    if (width1_s > 0) {
      line["time_vs_width1"] = seconds / width1_s;
      line["time_vs_width_times_width1"] = seconds / (width * width1_s);
    }
    tandem::EmitJsonLine(line);
  }

  for (int n : client_counts) {
    std::vector<ClientRun> runs(static_cast<size_t>(n));
    std::vector<std::thread> clients;
    const auto start = Clock::now();
    for (int i = 0; i < n; ++i) {
      clients.emplace_back([&, i] { runs[i] = GenerateOnce(address, Prompt(input, vocab, 1000 + i), output); });
    }
    for (std::thread& t : clients) t.join();
    const double seconds = tandem::SecondsSince(start);
    int64_t tokens = 0;
    std::vector<double> gaps;
    for (const ClientRun& run : runs) {
      if (!run.status.ok()) return Fail(absl::InternalError(run.status.error_message()));
      tokens += run.tokens;
      gaps.insert(gaps.end(), run.gaps_ms.begin(), run.gaps_ms.end());
    }
    json line = base;
    line["bench"] = "concurrent_generate";
    line["clients"] = n;
    line["seconds"] = seconds;
    line["tokens"] = tokens;
    line["aggregate_tokens_per_s"] = static_cast<double>(tokens) / seconds;
    line["p50_inter_token_ms"] = tandem::Percentile(gaps, 0.50);
    line["p99_inter_token_ms"] = tandem::Percentile(gaps, 0.99);
    line["mean_batch_rows"] = (*scheduler)->Stats().mean_batch_rows;
    tandem::EmitJsonLine(line);
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  std::error_code error;
  std::filesystem::remove(socket, error);
  return 0;
}
