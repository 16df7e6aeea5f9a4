// tandem-server: the coordinator as a server. Loads the model, runs attention
// and routing here and the experts in this process or in tandem-cpu-worker
// processes, and serves tandem.v1.Inference (and grpc.health.v1.Health) on a
// unix socket and/or TCP until SIGINT or SIGTERM.
//   tandem-server --model models/demo
//   tandem-server --model DIR --listen unix:/run/tandem/server.sock,127.0.0.1:50051 --max_sequences 32
//   tandem-server --model DIR --workers unix:/run/tandem/worker-0.sock,unix:/run/tandem/worker-1.sock
//   tandem-server --synthetic mixtral-8x7b --synthetic_seed 1   (generated in memory, ~93 GB of RAM)
//   tandem-server --model DIR --http_listen 8080   (also the OpenAI-compatible HTTP API, docs/http.md)
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/flags_usage.h"
#include "common/base/log.h"
#include "common/base/runtime_dir.h"
#include "common/base/status_macros.h"
#include "common/platform/unix_socket.h"
#include "coordinator/http/http_server.h"
#include "coordinator/inference_service.h"
#include "coordinator/scheduler.h"
#include "runtime/local_runtime.h"
#include "runtime/runtime_flags.h"

ABSL_FLAG(std::string, listen, "",
          "comma-separated addresses: unix:/path/to.sock and/or TCP as PORT (localhost) or host:port (give "
          "0.0.0.0 only if you mean to expose the server); default unix:<runtime dir>/server.sock");
ABSL_FLAG(int32_t, max_sequences, 16, "sequences decoding at once (a beam search counts its beam width)");
ABSL_FLAG(int64_t, max_batch_tokens, 256, "rows per forward step: decodes plus prompt chunks");
ABSL_FLAG(int32_t, max_waiting, 256, "requests queued beyond the running ones; more are refused");
ABSL_FLAG(int64_t, kv_cache_tokens, 32768, "KV cache capacity in tokens, all sequences together");
ABSL_FLAG(int64_t, kv_block_size, 16, "positions per KV cache block");
ABSL_FLAG(std::string, http_listen, "",
          "also serve the OpenAI-compatible HTTP API (docs/http.md) on PORT (127.0.0.1) or HOST:PORT; off when empty");
ABSL_FLAG(bool, http_allow_remote, false,
          "let --http_listen bind a non-loopback host (the HTTP API has no authentication)");
ABSL_FLAG(int32_t, http_max_connections, 64, "HTTP requests handled at once; further connections wait");
ABSL_FLAG(int64_t, http_max_body_bytes, 8 << 20, "largest HTTP request body accepted (larger: 413)");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's name in the HTTP API (/v1/models, responses); default: the model folder's name");
ABSL_FLAG(std::string, chat_template, "",
          "a Jinja chat template file for /v1/chat/completions, instead of the model folder's own");
ABSL_FLAG(bool, exit_with_parent, false, "shut down when the parent process exits (tests, supervisors)");

namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tandem-server: %s\n", std::string(status.message()).c_str());
  return 1;
}

// Blocks SIGINT and SIGTERM: every thread started from here on inherits the
// mask, and main waits for the signals itself.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// One --listen entry: what gRPC binds, and for a unix socket its path.
struct ListenAddress {
  std::string address;    // for grpc::ServerBuilder: unix:/path or host:port
  std::string unix_path;  // empty for TCP
};

// One "host:port" or bare port entry of --listen (a bare port, 50051 or
// :50051, means TCP on localhost only). Refuses a port outside 1..65535:
// gRPC would log it and bind a random one.
absl::StatusOr<ListenAddress> ParseTcpListen(absl::string_view part) {
  const absl::string_view bare = absl::StripPrefix(part, ":");
  const size_t colon = part.rfind(':');
  const bool digits_only = std::all_of(bare.begin(), bare.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits_only && (colon == absl::string_view::npos || colon == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: \"", part, "\" is neither unix:/path, a port, nor host:port"));
  }
  const absl::string_view port = digits_only ? bare : part.substr(colon + 1);
  int value = 0;
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen: \"", part, "\": port \"", port, "\" is not a number in 1..65535"));
  }
  return ListenAddress{digits_only ? absl::StrCat("127.0.0.1:", port) : std::string(part), ""};
}

// "50051", ":50051" (127.0.0.1), "host:port", "[::1]:port", "unix:/path".
// Refuses what would bind something other than what was asked: a bad port,
// an empty or abstract unix path (no file permissions). Checks only the
// syntax; the socket path itself is checked by PrepareSocketPath.
absl::StatusOr<std::vector<ListenAddress>> ParseListen(const std::string& listen) {
  std::vector<ListenAddress> out;
  for (absl::string_view part : absl::StrSplit(listen, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::StartsWith(part, "unix:") || absl::StartsWith(part, "unix-abstract:")) {
      ListenAddress a;
      TANDEM_ASSIGN_OR_RETURN(a.unix_path, tandem::ParseUnixAddress(std::string(part), "--listen"));
      a.address = absl::StrCat("unix:", a.unix_path);
      out.push_back(a);
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(ListenAddress a, ParseTcpListen(part));
    out.push_back(a);
  }
  if (out.empty()) return absl::InvalidArgumentError("--listen: no address given");
  return out;
}

// Before binding a unix socket: its folder (the runtime dir must be ours
// and private) and whatever is at the path (a stale socket of ours is
// removed; a live server's socket, another user's or any other file is left
// alone and refused).
absl::Status PrepareUnixSocket(const std::string& path) {
  const std::filesystem::path socket(path);
  if (socket.parent_path() == std::filesystem::path(tandem::DefaultRuntimeDir())) {
    TANDEM_RETURN_IF_ERROR(tandem::EnsurePrivateDir(socket.parent_path().string()));
  }
  return tandem::PrepareSocketPath(path, "--listen");
}

// The server's own flags, checked before anything is loaded.
struct ServerSettings {
  std::string listen;
  std::vector<ListenAddress> listen_addresses;
  tandem::SchedulerOptions scheduler;
  tandem::ModelSource source;
};

absl::StatusOr<ServerSettings> SettingsFromFlags() {
  // --model / --synthetic / --synthetic_seed are runtime_flags.cc's; checked first, so
  // a bad one fails before anything is loaded or generated.
  auto source = tandem::ModelSourceFromFlags();
  if (!source.ok()) return source.status();
  ServerSettings settings;
  settings.source = *source;
  settings.listen = absl::GetFlag(FLAGS_listen);
  if (settings.listen.empty()) settings.listen = tandem::DefaultServerAddress();
  // Every address checked before the model is loaded (minutes for a large
  // one), and each unix path again just before it is bound.
  TANDEM_ASSIGN_OR_RETURN(settings.listen_addresses, ParseListen(settings.listen));
  for (const ListenAddress& a : settings.listen_addresses) {
    if (!a.unix_path.empty()) TANDEM_RETURN_IF_ERROR(PrepareUnixSocket(a.unix_path));
  }
  if (absl::GetFlag(FLAGS_kv_cache_tokens) < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv_cache_tokens ", absl::GetFlag(FLAGS_kv_cache_tokens), ": must be >= 1"));
  }
  if (absl::GetFlag(FLAGS_kv_block_size) < 1 || absl::GetFlag(FLAGS_kv_block_size) > tandem::kMaxKvBlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_block_size ", absl::GetFlag(FLAGS_kv_block_size),
                                                   ": must be in [1, ", tandem::kMaxKvBlockSize, "] positions"));
  }
  settings.scheduler.max_sequences = absl::GetFlag(FLAGS_max_sequences);
  settings.scheduler.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  settings.scheduler.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  if (absl::Status status = settings.scheduler.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", status.message()));
  }
  return settings;
}

// What Info and Health report: where the experts run, the orchestrator's and
// precalc's stats, the workers' health.
tandem::InferenceServiceOptions ServiceOptions(tandem::LocalRuntime* rt, tandem::RemoteExpertExecutor* remote) {
  tandem::InferenceServiceOptions service_options;
  service_options.model_dir = rt->model().origin;  // the folder, or "synthetic:PRESET:LAYERS seed N"
  service_options.kv_cache_tokens = rt->kv_pool().max_blocks() * rt->kv_pool().options().block_size;
  service_options.num_cpu_workers = remote ? remote->num_workers() : 0;
  if (remote) service_options.division = remote->division();
  service_options.placement_summary =
      absl::StrCat(rt->backend_name(), "; ",
                   remote ? absl::StrCat("experts on CPU workers: ", remote->Summary())
                          : absl::StrCat("experts in this process on ", rt->pool().num_threads(), " CPU threads"));
  if (tandem::Orchestrator* orchestrator = rt->orchestrator(); orchestrator != nullptr) {
    absl::StrAppend(&service_options.placement_summary, "; orchestrated over the ", orchestrator->stats().pool_kind,
                    " (", orchestrator->stats().num_slots, " slots)");
  }
  if (rt->orchestrator() != nullptr || rt->precalc_stats().policy != "off") {
    service_options.orchestrator_json = [rt] {
      nlohmann::json out = nlohmann::json::object();
      if (rt->orchestrator() != nullptr)
        out["orchestrator"] = nlohmann::json::parse(rt->orchestrator()->stats().ToJson());
      const tandem::PrecalcStats precalc = rt->precalc_stats();
      if (precalc.policy != "off") out["precalc"] = nlohmann::json::parse(precalc.ToJson());
      return out.dump();
    };
  }
  if (remote) {
    service_options.worker_health = [remote] {
      std::vector<tandem::WorkerHealthInfo> out;
      for (const tandem::RemoteWorkerStats& w : remote->stats()) {
        // Every failure is followed by a reconnect once the worker is back.
        out.push_back({w.address, w.failures <= w.reconnects,
                       absl::StrCat(w.transport, ": ", w.calls, " calls, ", w.failures, " failures, ", w.reconnects,
                                    " reconnects, last round trip ", w.last_round_trip_us, " us")});
      }
      return out;
    };
  }
  return service_options;
}

// The gRPC server serving `service` (and grpc.health.v1.Health) on every
// --listen address: unix:/path, host:port, or a bare port (TCP on localhost).
// A socket file we bound, removed at exit only if it is still ours.
struct BoundSocket {
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
};

struct Listening {
  std::unique_ptr<grpc::Server> server;
  std::vector<std::string> addresses;
  std::vector<BoundSocket> sockets;  // unix sockets' files, removed at shutdown if still ours
};

absl::StatusOr<Listening> Listen(const ServerSettings& settings, grpc::Service* service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  Listening out;
  for (const ListenAddress& a : settings.listen_addresses) {
    if (!a.unix_path.empty()) TANDEM_RETURN_IF_ERROR(PrepareUnixSocket(a.unix_path));
    builder.AddListeningPort(a.address, grpc::InsecureServerCredentials());
    out.addresses.push_back(a.address);
  }
  builder.RegisterService(service);
  // gRPC creates the socket files: with this umask they are 0600 from the
  // start (only this user may connect), not 0755 until the chmod below.
  const mode_t umask_before = umask(077);
  out.server = builder.BuildAndStart();
  umask(umask_before);
  if (out.server == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", settings.listen, " (address in use, or the folder is not writable?)"));
  }
  for (const ListenAddress& a : settings.listen_addresses) {
    if (a.unix_path.empty()) continue;
    struct stat st {};
    if (chmod(a.unix_path.c_str(), 0600) != 0 || lstat(a.unix_path.c_str(), &st) != 0) {
      return absl::PermissionDeniedError(absl::StrCat("--listen ", a.address, ": cannot make the socket 0600"));
    }
    out.sockets.push_back({a.unix_path, st.st_dev, st.st_ino});
  }
  out.server->GetHealthCheckService()->SetServingStatus(true);
  return out;
}

void LogServing(tandem::LocalRuntime& runtime, const tandem::InferenceServiceOptions& service_options,
                const tandem::SchedulerOptions& scheduler_options, const std::vector<std::string>& addresses) {
  const tandem::Model& m = runtime.model();
  LOG_INFO("tandem-server: model ", m.origin, " (", m.config.architecture_name, ", ", m.config.num_hidden_layers,
           " layers, ", m.config.num_local_experts, " experts, top-", m.config.num_experts_per_tok, ")");
  LOG_INFO("tandem-server: ", service_options.placement_summary);
  LOG_INFO("tandem-server: KV cache ", service_options.kv_cache_tokens, " tokens in blocks of ",
           runtime.kv_pool().options().block_size, " (", runtime.kv_pool().bytes_per_block(),
           " bytes each), max_sequences ", scheduler_options.max_sequences, ", max_batch_tokens ",
           scheduler_options.max_batch_tokens);
  LOG_INFO("tandem-server: listening on ", absl::StrJoin(addresses, ","));
}

// The HTTP front end (--http_listen), listening before the model loads so
// /health can say "loading"; null when not asked for.
absl::StatusOr<std::unique_ptr<tandem::HttpServer>> StartHttp(const tandem::ModelSource& source) {
  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  if (http_listen.empty()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(auto address, tandem::ParseHttpListen(http_listen, absl::GetFlag(FLAGS_http_allow_remote)));
  if (absl::GetFlag(FLAGS_http_max_body_bytes) < 1) {
    return absl::InvalidArgumentError("--http_max_body_bytes must be >= 1");
  }
  tandem::HttpServerOptions options;
  options.listen = address;
  options.max_connections = absl::GetFlag(FLAGS_http_max_connections);
  options.max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_http_max_body_bytes));
  options.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  if (options.served_model_name.empty()) {
    std::filesystem::path folder = std::filesystem::path(source.model_dir).lexically_normal();
    if (folder.filename().empty()) folder = folder.parent_path();  // "models/demo/"
    options.served_model_name = source.model_dir.empty() ? source.Describe() : folder.filename().string();
    if (options.served_model_name.empty()) options.served_model_name = source.model_dir;
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<tandem::HttpServer> http, tandem::HttpServer::Create(options));
  LOG_INFO("tandem-server: HTTP listening on ", http->address(), " (loading the model)");
  return http;
}

// Waits for SIGINT or SIGTERM, then stops serving: in-flight calls get a
// moment to finish; the scheduler then fails what is left.
void ServeUntilSignal(const sigset_t& signals, Listening& listening, tandem::HttpServer* http,
                      std::unique_ptr<tandem::Scheduler>& scheduler) {
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  LOG_INFO("tandem-server: signal ", signal_number, ", shutting down");
  listening.server->GetHealthCheckService()->SetServingStatus(false);
  if (http != nullptr) http->Stop();  // cancels its streams while the scheduler still runs
  listening.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  listening.server.reset();
  scheduler.reset();
  for (const BoundSocket& socket : listening.sockets) {
    struct stat st {};
    if (lstat(socket.path.c_str(), &st) == 0 && st.st_dev == socket.dev && st.st_ino == socket.ino) {
      unlink(socket.path.c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "Serve a MoE model over gRPC (tandem.v1.Inference).\n"
      "  tandem-server --model models/demo [--listen unix:/path.sock,127.0.0.1:50051]\n"
      "  tandem-server --synthetic mixtral-8x7b --synthetic_seed 1 [--workers ...]");
  absl::ParseCommandLine(argc, argv);
  const sigset_t signals = BlockShutdownSignals();
  if (absl::GetFlag(FLAGS_exit_with_parent)) prctl(PR_SET_PDEATHSIG, SIGTERM);
  // A client that hangs up is a failed write (and a cancelled request), not a signal.
  signal(SIGPIPE, SIG_IGN);
  auto settings = SettingsFromFlags();
  if (!settings.ok()) return Fail(settings.status());
  auto http = StartHttp(settings->source);
  if (!http.ok()) return Fail(http.status());

  // Threads, CPU workers, the orchestrator, pre-calculation and recording:
  // the flags tandem-generate takes too (runtime/runtime_flags.h).
  tandem::LocalRuntimeOptions runtime_options;
  runtime_options.kv_cache_tokens = absl::GetFlag(FLAGS_kv_cache_tokens);
  runtime_options.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  auto opened = tandem::OpenRuntimeFromFlags(runtime_options);
  if (!opened.ok()) return Fail(opened.status());
  tandem::LocalRuntime& runtime = *opened->runtime;
  auto scheduler =
      tandem::Scheduler::Create(&runtime.model(), &runtime.engine(), &runtime.kv_pool(), settings->scheduler);
  if (!scheduler.ok()) return Fail(scheduler.status());

  const tandem::InferenceServiceOptions service_options = ServiceOptions(&runtime, opened->remote.get());
  tandem::InferenceService service(&runtime.model(), scheduler->get(), service_options);
  if (*http != nullptr) {
    auto chat = tandem::LoadChatSetup(runtime.model(), absl::GetFlag(FLAGS_chat_template));
    if (!chat.ok()) return Fail(chat.status());
    if ((*chat)->chat_template == nullptr) LOG_WARNING("tandem-server: ", (*chat)->no_template_reason);
    (*http)->Serve(&runtime.model(), scheduler->get(), service_options, std::move(*chat));
  }
  auto listening = Listen(*settings, &service);
  if (!listening.ok()) return Fail(listening.status());
  LogServing(runtime, service_options, settings->scheduler, listening->addresses);
  if (*http != nullptr) LOG_INFO("tandem-server: HTTP ready on ", (*http)->address());
  ServeUntilSignal(signals, *listening, http->get(), *scheduler);
  return 0;
}
