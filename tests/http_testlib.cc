#include "tests/http_testlib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <httplib.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {
namespace {

absl::StatusOr<HttpReply> ToReply(const httplib::Result& result, const std::string& what) {
  if (!result) return absl::UnavailableError(absl::StrCat(what, ": ", httplib::to_string(result.error())));
  HttpReply reply;
  reply.status = result->status;
  reply.body = result->body;
  reply.content_type = result->get_header_value("Content-Type");
  reply.json = nlohmann::json::parse(reply.body, nullptr, /*allow_exceptions=*/false);
  if (reply.json.is_discarded()) reply.json = nullptr;
  return reply;
}

std::unique_ptr<httplib::Client> NewClient(int port) {
  auto client = std::make_unique<httplib::Client>("127.0.0.1", port);
  client->set_read_timeout(120, 0);
  client->set_connection_timeout(5, 0);
  return client;
}

}  // namespace

absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return absl::InternalError("cannot bind a loopback port");
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

absl::StatusOr<HttpReply> HttpGet(int port, const std::string& path) {
  return ToReply(NewClient(port)->Get(path), absl::StrCat("GET ", path));
}

absl::StatusOr<HttpReply> HttpPost(int port, const std::string& path, const std::string& body) {
  return ToReply(NewClient(port)->Post(path, body, "application/json"), absl::StrCat("POST ", path));
}

absl::StatusOr<std::vector<nlohmann::json>> SseData(const std::string& body) {
  std::vector<nlohmann::json> out;
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ")) continue;
    if (line == "[DONE]") {
      out.push_back("[DONE]");
      continue;
    }
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("not JSON: ", line));
    out.push_back(std::move(j));
  }
  return out;
}

absl::StatusOr<HttpServerProcess> StartHttpServer(const std::filesystem::path& model_dir,
                                                  const std::filesystem::path& work_dir,
                                                  std::vector<std::string> extra_args, const std::string& name) {
  absl::StatusOr<int> port = FreeLoopbackPort();
  if (!port.ok()) return port.status();
  extra_args.insert(extra_args.end(), {"--http_listen", absl::StrCat("127.0.0.1:", *port)});
  HttpServerProcess out;
  out.port = *port;
  out.server = std::make_unique<ServerProcess>(ServerProcessOptions{.model_dir = model_dir,
                                                                    .socket = work_dir / (name + ".sock"),
                                                                    .extra_args = extra_args,
                                                                    .log = work_dir / (name + ".log")});
  if (absl::Status started = out.server->Start(); !started.ok()) return started;
  return out;
}

absl::StatusOr<std::string> GrpcGreedyText(ServerProcess& server, const std::string& text,
                                           const std::vector<int32_t>& ids, bool add_bos, int max_tokens) {
  v1::GenerateRequest request;
  if (ids.empty()) request.set_prompt(text);
  request.mutable_prompt_ids()->Add(ids.begin(), ids.end());
  request.set_add_bos(add_bos);
  request.set_max_tokens(max_tokens);
  request.set_temperature(0);
  request.set_seed(7);
  grpc::ClientContext context;
  auto reader = server.NewStub()->Generate(&context, request);
  std::string out;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    for (const v1::Token& t : response.tokens()) out += t.text();
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  return out;
}

}  // namespace tandem
