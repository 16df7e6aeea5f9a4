// Helpers for the HTTP front end's tests: a tandem-server with --http_listen
// on a free loopback port (and gRPC on a unix socket), JSON requests, and
// server-sent events split into their JSON payloads.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "tests/server_process_testlib.h"

namespace tandem {

// A port nothing listens on now (bound to 127.0.0.1:0 and released).
absl::StatusOr<int> FreeLoopbackPort();

struct HttpReply {
  int status = 0;
  std::string body;
  std::string content_type;
  nlohmann::json json;  // the body parsed, or null when it is not JSON
};

absl::StatusOr<HttpReply> HttpGet(int port, const std::string& path);
absl::StatusOr<HttpReply> HttpPost(int port, const std::string& path, const std::string& body);
inline absl::StatusOr<HttpReply> HttpPost(int port, const std::string& path, const nlohmann::json& body) {
  return HttpPost(port, path, body.dump());
}

// The `data:` payloads of an event stream, in order; "[DONE]" kept as a string.
// InvalidArgument when a payload is neither JSON nor [DONE].
absl::StatusOr<std::vector<nlohmann::json>> SseData(const std::string& body);

// tandem-server with its HTTP API on a free port: ServerProcess plus
// --http_listen 127.0.0.1:PORT.
// Greedy text through the server's gRPC Generate, for a prompt text (with
// BOS when add_bos: as the HTTP completions endpoint adds it) or token ids;
// the stream's final status as the error.
absl::StatusOr<std::string> GrpcGreedyText(ServerProcess& server, const std::string& text,
                                           const std::vector<int32_t>& ids, bool add_bos, int max_tokens);

struct HttpServerProcess {
  std::unique_ptr<ServerProcess> server;
  int port = 0;
};
absl::StatusOr<HttpServerProcess> StartHttpServer(const std::filesystem::path& model_dir,
                                                  const std::filesystem::path& work_dir,
                                                  std::vector<std::string> extra_args, const std::string& name);

// A chatml template, for a model folder that has none.
inline constexpr char kChatmlTemplate[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

}  // namespace tandem
