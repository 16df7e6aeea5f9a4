// Who may call the HTTP API, decided from a request's header before its body
// is read, so a refused request costs nothing:
//   Host     must name this server: a page on evil.example whose name was
//            made to resolve to 127.0.0.1 (DNS rebinding) sends
//            "Host: evil.example" and is refused.
//   Origin   a browser request from any page but the server's own is
//            refused unless its origin is in --cors_origins, whose requests
//            (and OPTIONS preflights) get CORS headers.
//   API key  with --api_key, "Authorization: Bearer KEY" on every endpoint
//            but /health and the page at / (which asks for the key itself);
//            compared in constant time.
// Immutable after construction: any thread.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "coordinator/serving/http/http_error.h"
#include "coordinator/serving/http/http_transport.h"

namespace tandem {

struct HttpAccessOptions {
  std::string listen_host;                 // the address bound ("127.0.0.1", "::", ...)
  std::vector<std::string> allowed_hosts;  // further names Host may carry; "*": any
  std::vector<std::string> cors_origins;   // "https://app.example"; "*": any
  std::string api_key;                     // "": no key asked
};

class HttpAccess {
 public:
  explicit HttpAccess(HttpAccessOptions options);

  // nullopt when `head` may go on; else why not: 400 (no Host), 403 (a
  // foreign Host or Origin), 401 (no or a wrong key).
  std::optional<HttpError> Check(const HttpRequest& head) const;
  // The response to an OPTIONS request: a preflight from an allowed origin
  // gets 204 and the CORS headers, anything else 403.
  HttpResponse Preflight(const HttpRequest& head) const;
  // The CORS headers a response to `head` carries (none unless its Origin
  // is one of --cors_origins).
  std::vector<std::pair<std::string, std::string>> CorsHeaders(const HttpRequest& head) const;

  bool requires_key() const { return !options_.api_key.empty(); }

 private:
  std::optional<HttpError> CheckHost(const HttpRequest& head) const;
  std::optional<HttpError> CheckOrigin(const HttpRequest& head) const;
  std::optional<HttpError> CheckKey(const HttpRequest& head) const;
  bool CorsAllowed(absl::string_view origin) const;

  HttpAccessOptions options_;
  bool any_host_ = false;
  std::vector<std::string> host_names_;  // lower-case, without port or brackets
};

// The API key from --api_key (`key`) or --api_key_file (`file`): at most
// one of them. The file must be a regular file only its owner can read or
// write (as ssh demands of a private key), holding one line of 16-4096
// printable characters. InvalidArgument naming the flag otherwise.
absl::StatusOr<std::string> LoadApiKey(const std::string& key, const std::string& file);

// The name part of a Host header ("Example.COM:8080" -> "example.com",
// "[::1]:80" -> "::1"), or "" when malformed.
std::string HostName(absl::string_view host_header);

// Whether two strings are equal, in time that depends on their lengths only.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace tandem
