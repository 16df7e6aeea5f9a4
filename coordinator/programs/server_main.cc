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
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
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
#include "common/platform/open_file_limit.h"
#include "common/platform/unix_socket.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/runtime/local_runtime.h"
#include "coordinator/runtime/runtime_flags.h"
#include "coordinator/serving/health_monitor.h"
#include "coordinator/serving/http/http_server.h"
#include "coordinator/serving/inference_service.h"
#include "coordinator/serving/server_listeners.h"

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
          "let --http_listen bind a non-loopback host; needs --api_key or --api_key_file (or --insecure_no_auth)");
ABSL_FLAG(bool, insecure_no_auth, false,
          "with --http_allow_remote: serve the HTTP API to the network without an API key (anyone who can reach "
          "the port can use it)");
ABSL_FLAG(std::string, api_key, "",
          "HTTP API key: every endpoint but /health and / needs \"Authorization: Bearer KEY\" (visible in ps: prefer "
          "--api_key_file)");
ABSL_FLAG(std::string, api_key_file, "", "a file (mode 600) holding the HTTP API key");
ABSL_FLAG(std::vector<std::string>, cors_origins, {},
          "comma-separated browser origins (https://app.example) allowed to call the HTTP API cross-site; * for any");
ABSL_FLAG(std::vector<std::string>, http_allowed_hosts, {},
          "comma-separated names the HTTP Host header may carry besides the listen address (and localhost for a "
          "loopback one); * for any");
ABSL_FLAG(int32_t, http_max_connections, 64, "HTTP requests handled at once; more wait in a queue");
ABSL_FLAG(int32_t, http_max_queued, 256, "HTTP requests waiting for a handler; more are answered 503 (Retry-After)");
ABSL_FLAG(int32_t, http_max_open_connections, 512,
          "open HTTP connections; at the cap the one idle longest is closed for a new one");
ABSL_FLAG(int64_t, http_max_body_bytes, 8 << 20, "largest HTTP request body accepted, chunked or not (larger: 413)");
ABSL_FLAG(int64_t, http_max_request_memory_mb, 1024,
          "MiB that HTTP requests in flight may hold together (bodies and parsed JSON); beyond it 503 (Retry-After)");
ABSL_FLAG(double, http_header_timeout_s, 10,
          "seconds a client has to send a request header (or to start the next one)");
ABSL_FLAG(double, http_body_timeout_s, 60, "seconds a client has to send a request body");
ABSL_FLAG(double, shutdown_grace_s, 5,
          "on SIGTERM/SIGINT, seconds requests in flight get to finish; then streams end with an error event");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's name in the HTTP API (/v1/models, responses); default: the model folder's name");
ABSL_FLAG(std::string, chat_template, "",
          "a Jinja chat template file for /v1/chat/completions, instead of the model folder's own");
ABSL_FLAG(std::string, reasoning_format, "auto",
          "a thinking model's <think>...</think> in chat responses: auto (as reasoning_content, apart from "
          "content, when the chat template thinks) or none (left in content)");
ABSL_FLAG(int32_t, max_unread_events, 256,
          "a client this many stream events behind is paused (its sequence not decoded) until it reads");
ABSL_FLAG(bool, prompt_cache, true,
          "reuse the KV cache of a prompt prefix already computed (e.g. a system prompt or a conversation "
          "so far): a request prefills only the rest. Cached blocks no request holds are freed least "
          "recently used first when the KV cache needs room");
ABSL_FLAG(double, max_stall_s, 30,
          "a client paused this long has its request stopped with RESOURCE_EXHAUSTED and its KV cache freed; an HTTP "
          "client that takes none of a write for this long (plus 1 s) is disconnected");
ABSL_FLAG(int32_t, max_connections, 1024,
          "open connections per --listen address; one more is closed at once (a flood cannot exhaust descriptors)");
ABSL_FLAG(int32_t, max_streams_per_connection, 128, "concurrent RPCs on one connection (HTTP/2 streams)");
ABSL_FLAG(int32_t, max_rpc_threads, 1024, "RPCs handled at once, all connections together; more: RESOURCE_EXHAUSTED");
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

using tandem::ServerListenAddress;

// One "host:port" or bare port entry of --listen (a bare port, 50051 or
// :50051, means TCP on localhost only). Refuses a port outside 1..65535:
// gRPC would log it and bind a random one.
absl::StatusOr<ServerListenAddress> ParseTcpListen(absl::string_view part) {
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
  ServerListenAddress out;
  out.address = digits_only ? absl::StrCat("127.0.0.1:", port) : std::string(part);
  out.host = digits_only ? "127.0.0.1" : std::string(part.substr(0, colon));
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']') {
    out.host = out.host.substr(1, out.host.size() - 2);  // [::1]
  }
  out.port = value;
  return out;
}

// "50051", ":50051" (127.0.0.1), "host:port", "[::1]:port", "unix:/path".
// Refuses what would bind something other than what was asked: a bad port,
// an empty or abstract unix path (no file permissions). Checks only the
// syntax; the socket path itself is checked by PrepareSocketPath.
absl::StatusOr<std::vector<ServerListenAddress>> ParseListen(const std::string& listen) {
  std::vector<ServerListenAddress> out;
  for (absl::string_view part : absl::StrSplit(listen, ',', absl::SkipWhitespace())) {
    part = absl::StripAsciiWhitespace(part);
    if (absl::StartsWith(part, "unix:") || absl::StartsWith(part, "unix-abstract:")) {
      ServerListenAddress a;
      TANDEM_ASSIGN_OR_RETURN(a.unix_path, tandem::ParseUnixAddress(std::string(part), "--listen"));
      a.address = absl::StrCat("unix:", a.unix_path);
      out.push_back(a);
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(ServerListenAddress a, ParseTcpListen(part));
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
  std::vector<ServerListenAddress> listen_addresses;
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
  for (const ServerListenAddress& a : settings.listen_addresses) {
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
  for (const auto& [name, value] :
       {std::pair<const char*, int32_t>{"max_connections", absl::GetFlag(FLAGS_max_connections)},
        {"max_streams_per_connection", absl::GetFlag(FLAGS_max_streams_per_connection)},
        {"max_rpc_threads", absl::GetFlag(FLAGS_max_rpc_threads)}}) {
    if (value < 1) return absl::InvalidArgumentError(absl::StrCat("--", name, " ", value, ": must be >= 1"));
  }
  settings.scheduler.max_sequences = absl::GetFlag(FLAGS_max_sequences);
  settings.scheduler.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  settings.scheduler.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  settings.scheduler.max_unread_events = absl::GetFlag(FLAGS_max_unread_events);
  settings.scheduler.prompt_cache = absl::GetFlag(FLAGS_prompt_cache);
  const double stall_s = absl::GetFlag(FLAGS_max_stall_s);
  if (!(stall_s > 0 && stall_s <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat("--max_stall_s ", stall_s, ": must be in (0, 86400]"));
  }
  settings.scheduler.max_stall = absl::Seconds(stall_s);
  if (absl::Status status = settings.scheduler.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", status.message()));
  }
  return settings;
}

// How long a health check waits for each worker's answer: a stopped worker
// makes the check (and /health, GetStats) this slow, no slower.
constexpr absl::Duration kWorkerProbeTimeout = absl::Milliseconds(500);
// How often the grpc.health.v1 status is brought up to date.
constexpr absl::Duration kHealthInterval = absl::Seconds(1);

// Every worker probed now (all at once, each within kWorkerProbeTimeout):
// healthy when it answers, so the answer is the workers' state now, not
// their history. Any thread.
std::vector<tandem::WorkerHealthInfo> ProbeWorkers(tandem::RemoteExpertExecutor* remote) {
  std::vector<std::thread> probes;
  for (int i = 0; i < remote->num_workers(); ++i) {
    probes.emplace_back([remote, i] { remote->Probe(i, kWorkerProbeTimeout).IgnoreError(); });
  }
  for (std::thread& probe : probes) probe.join();
  std::vector<tandem::WorkerHealthInfo> out;
  for (const tandem::RemoteWorkerStats& w : remote->stats()) {
    out.push_back({w.address, w.healthy,
                   absl::StrCat(w.transport, ": ", w.calls, " calls, ", w.failures, " failures, ", w.reconnects,
                                " reconnects, last round trip ", w.last_round_trip_us, " us",
                                w.healthy ? "" : absl::StrCat("; down: ", w.last_error))});
  }
  return out;
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
    service_options.worker_health = [remote] { return ProbeWorkers(remote); };
  }
  return service_options;
}

// The gRPC server serving `service` (and grpc.health.v1.Health) on every
// --listen address: unix:/path, host:port, or a bare port (TCP on localhost),
// through tandem's own listeners (runtime/server_listeners.h: they survive
// EMFILE and cap the connections of each).
struct Listening {
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<tandem::ServerListeners> listeners;
  std::vector<std::string> addresses;
};

absl::StatusOr<Listening> Listen(const ServerSettings& settings, grpc::Service* service) {
  Listening out;
  for (const ServerListenAddress& a : settings.listen_addresses) {
    if (!a.unix_path.empty()) TANDEM_RETURN_IF_ERROR(PrepareUnixSocket(a.unix_path));
    out.addresses.push_back(a.address);
  }
  TANDEM_ASSIGN_OR_RETURN(
      out.listeners, tandem::ServerListeners::Bind(settings.listen_addresses, absl::GetFlag(FLAGS_max_connections)));
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  // Bounds on what one client can make the server hold: streams per
  // connection, and handler threads (each RPC in progress holds one; beyond
  // the quota a new RPC is refused with RESOURCE_EXHAUSTED).
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, absl::GetFlag(FLAGS_max_streams_per_connection));
  grpc::ResourceQuota quota("tandem-server");
  quota.SetMaxThreads(absl::GetFlag(FLAGS_max_rpc_threads));
  builder.SetResourceQuota(quota);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr) return absl::UnavailableError("could not start the gRPC server");
  out.listeners->Start(out.server.get());
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

// The HTTP transport's limits from the --http_* flags, each checked.
absl::Status HttpTransportFromFlags(tandem::HttpTransportOptions* t) {
  auto positive = [](const char* flag, double value) {
    return value > 0 ? absl::OkStatus()
                     : absl::InvalidArgumentError(absl::StrCat("--", flag, " must be > 0, got ", value));
  };
  TANDEM_RETURN_IF_ERROR(positive("http_max_connections", absl::GetFlag(FLAGS_http_max_connections)));
  TANDEM_RETURN_IF_ERROR(positive("http_max_open_connections", absl::GetFlag(FLAGS_http_max_open_connections)));
  TANDEM_RETURN_IF_ERROR(
      positive("http_max_body_bytes", static_cast<double>(absl::GetFlag(FLAGS_http_max_body_bytes))));
  TANDEM_RETURN_IF_ERROR(
      positive("http_max_request_memory_mb", static_cast<double>(absl::GetFlag(FLAGS_http_max_request_memory_mb))));
  TANDEM_RETURN_IF_ERROR(positive("http_header_timeout_s", absl::GetFlag(FLAGS_http_header_timeout_s)));
  TANDEM_RETURN_IF_ERROR(positive("http_body_timeout_s", absl::GetFlag(FLAGS_http_body_timeout_s)));
  if (absl::GetFlag(FLAGS_http_max_queued) < 0) return absl::InvalidArgumentError("--http_max_queued must be >= 0");
  if (absl::GetFlag(FLAGS_http_max_connections) > 4096 || absl::GetFlag(FLAGS_http_max_open_connections) > 65536) {
    return absl::InvalidArgumentError("--http_max_connections is at most 4096, --http_max_open_connections 65536");
  }
  t->max_request_threads = absl::GetFlag(FLAGS_http_max_connections);
  t->max_queued_requests = absl::GetFlag(FLAGS_http_max_queued);
  t->max_open_connections = absl::GetFlag(FLAGS_http_max_open_connections);
  t->max_body_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_http_max_body_bytes));
  t->max_request_memory_bytes = absl::GetFlag(FLAGS_http_max_request_memory_mb) << 20;
  if (t->max_request_memory_bytes < static_cast<int64_t>(t->max_body_bytes)) {
    return absl::InvalidArgumentError("--http_max_request_memory_mb must hold at least one --http_max_body_bytes body");
  }
  t->header_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_header_timeout_s));
  t->body_timeout = absl::Seconds(absl::GetFlag(FLAGS_http_body_timeout_s));
  // A blocked event-stream write is bounded by the same stall limit as an
  // unread gRPC stream (--max_stall_s, checked with the scheduler's flags).
  t->write_timeout = absl::Seconds(absl::GetFlag(FLAGS_max_stall_s)) + absl::Seconds(1);
  return absl::OkStatus();
}

// The HTTP front end (--http_listen), listening before the model loads so
// /health can say "loading"; null when not asked for.
absl::StatusOr<std::unique_ptr<tandem::HttpServer>> StartHttp(const tandem::ModelSource& source) {
  const std::string http_listen = absl::GetFlag(FLAGS_http_listen);
  if (http_listen.empty()) return nullptr;
  const bool remote = absl::GetFlag(FLAGS_http_allow_remote);
  TANDEM_ASSIGN_OR_RETURN(auto address, tandem::ParseHttpListen(http_listen, remote));
  tandem::HttpServerOptions options;
  options.listen = address;
  TANDEM_ASSIGN_OR_RETURN(options.access.api_key,
                          tandem::LoadApiKey(absl::GetFlag(FLAGS_api_key), absl::GetFlag(FLAGS_api_key_file)));
  if (remote && options.access.api_key.empty()) {
    if (!absl::GetFlag(FLAGS_insecure_no_auth)) {
      return absl::InvalidArgumentError(
          "--http_allow_remote: the HTTP API would be open to the network without authentication; give "
          "--api_key_file FILE (or --api_key), or --insecure_no_auth if that is really meant");
    }
    LOG_WARNING("tandem-server: --insecure_no_auth: the HTTP API on ", http_listen,
                " has NO AUTHENTICATION: anyone who can reach this port can run the model");
  }
  options.access.cors_origins = absl::GetFlag(FLAGS_cors_origins);
  options.access.allowed_hosts = absl::GetFlag(FLAGS_http_allowed_hosts);
  TANDEM_RETURN_IF_ERROR(HttpTransportFromFlags(&options.transport));
  const std::string reasoning = absl::GetFlag(FLAGS_reasoning_format);
  if (reasoning != "auto" && reasoning != "none") {
    return absl::InvalidArgumentError(
        absl::StrCat("--reasoning_format: must be auto or none, got \"", reasoning, "\""));
  }
  options.reasoning_content = reasoning == "auto";
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
                      std::unique_ptr<tandem::Scheduler>& scheduler, const tandem::InferenceServiceOptions& service) {
  // grpc.health.v1 says NOT_SERVING while a CPU worker is down (requests
  // would fail), SERVING once it answers again.
  std::unique_ptr<tandem::HealthMonitor> monitor;
  if (service.worker_health) {
    grpc::HealthCheckServiceInterface* health = listening.server->GetHealthCheckService();
    monitor = std::make_unique<tandem::HealthMonitor>(
        [&service](std::string* reason) {
          for (const tandem::WorkerHealthInfo& w : service.worker_health()) {
            if (!w.healthy) {
              *reason = absl::StrCat("CPU worker ", w.address, " is down (", w.detail, ")");
              return false;
            }
          }
          return true;
        },
        [health](bool serving) { health->SetServingStatus(serving); }, kHealthInterval);
  }
  int signal_number = 0;
  sigwait(&signals, &signal_number);
  LOG_INFO("tandem-server: signal ", signal_number, ", shutting down");
  if (monitor) monitor->Stop();
  listening.server->GetHealthCheckService()->SetServingStatus(false);
  // New HTTP requests get 503 from now; those in flight get the grace
  // period, then their streams end with an error event, while the
  // scheduler still runs.
  if (http != nullptr) http->Stop(absl::Seconds(std::max(0.0, absl::GetFlag(FLAGS_shutdown_grace_s))));
  listening.listeners->Stop();  // no new connection; the socket files removed if still ours
  listening.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(3));
  listening.server.reset();
  scheduler.reset();
}

// --help: what a user sets first (the model, where to listen, the context
// and batch), then the runtime's groups, then the front ends' limits.
std::vector<tandem::FlagGroup> ServerFlagGroups() {
  std::vector<std::string> model = tandem::RuntimeModelFlags();
  model.insert(model.end(), {"served_model_name", "chat_template", "reasoning_format"});
  std::vector<tandem::FlagGroup> groups = {
      {"Model", model},
      {"Where it listens, and who may connect",
       {"http_listen", "listen", "api_key_file", "api_key", "http_allow_remote", "insecure_no_auth", "cors_origins",
        "http_allowed_hosts"}},
      {"Context and batching",
       {"kv_cache_tokens", "kv_block_size", "prompt_cache", "max_sequences", "max_batch_tokens", "max_waiting"}},
  };
  for (tandem::FlagGroup& group : tandem::RuntimeFlagGroups()) groups.push_back(std::move(group));
  groups.push_back({"HTTP limits",
                    {"http_max_connections", "http_max_queued", "http_max_open_connections", "http_max_body_bytes",
                     "http_max_request_memory_mb", "http_header_timeout_s", "http_body_timeout_s", "shutdown_grace_s"}});
  groups.push_back({"gRPC limits",
                    {"max_connections", "max_streams_per_connection", "max_rpc_threads", "max_unread_events",
                     "max_stall_s"}});
  return groups;
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "Serve a MoE model over gRPC (tandem.v1.Inference) and the OpenAI HTTP API.\n"
      "  tandem-server --model MODEL.gguf|DIR [--http_listen 8080] [--listen unix:/path.sock,127.0.0.1:50051]\n"
      "  tandem-server --synthetic mixtral-8x7b --synthetic_seed 1 [--workers ...]",
      ServerFlagGroups());
  tandem::ParseProgramFlags(argc, argv);
  const sigset_t signals = BlockShutdownSignals();
  if (absl::GetFlag(FLAGS_exit_with_parent)) prctl(PR_SET_PDEATHSIG, SIGTERM);
  // A client that hangs up is a failed write (and a cancelled request), not a signal.
  signal(SIGPIPE, SIG_IGN);
  auto settings = SettingsFromFlags();
  if (!settings.ok()) return Fail(settings.status());
  // Every connection is a descriptor: as many as the system lets this
  // process have, so the per-listener caps are reached long before EMFILE.
  LOG_INFO("tandem-server: ", tandem::DescribeOpenFileLimit(tandem::RaiseOpenFileLimit()));
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
  ServeUntilSignal(signals, *listening, http->get(), *scheduler, service_options);
  return 0;
}
