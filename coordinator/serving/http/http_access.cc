#include "coordinator/serving/http/http_access.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/base/scoped_fd.h"

namespace tandem {
namespace {

bool IsWildcard(absl::string_view host) { return host == "0.0.0.0" || host == "::" || host.empty(); }

bool IsLoopbackName(absl::string_view host) {
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// Paths a request without the key may reach: the liveness probe, and the
// page (static; its API calls carry the key it asks the user for).
bool KeyExempt(absl::string_view path) { return path == "/health" || path == "/"; }

}  // namespace

namespace {

constexpr size_t kMinKeyBytes = 16;
constexpr size_t kMaxKeyBytes = 4096;

absl::Status CheckKeyText(absl::string_view key, absl::string_view flag) {
  if (key.size() < kMinKeyBytes || key.size() > kMaxKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the key must be ", kMinKeyBytes, "-", kMaxKeyBytes, " characters, got ", key.size()));
  }
  for (char c : key) {
    if (c <= ' ' || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": the key must be printable, without spaces"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> LoadApiKey(const std::string& key, const std::string& file) {
  if (!key.empty() && !file.empty()) {
    return absl::InvalidArgumentError("give --api_key or --api_key_file, not both");
  }
  if (file.empty()) {
    if (!key.empty()) {
      if (absl::Status s = CheckKeyText(key, "--api_key"); !s.ok()) return s;
    }
    return key;
  }
  const std::string flag = absl::StrCat("--api_key_file ", file);
  // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer.
  ScopedFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot open: ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": not a regular file"));
  }
  if ((st.st_mode & 077) != 0 || st.st_uid != ::geteuid()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": must belong to this user and be readable by no one else (chmod 600 ", file, ")"));
  }
  if (st.st_size > static_cast<off_t>(kMaxKeyBytes + 2)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", st.st_size, " bytes; a key file holds one key"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  const ssize_t n = ::read(fd.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read"));
  const absl::string_view stripped = absl::StripTrailingAsciiWhitespace(text);
  if (absl::Status s = CheckKeyText(stripped, flag); !s.ok()) return s;
  return std::string(stripped);
}

std::string HostName(absl::string_view host_header) {
  absl::string_view h = absl::StripAsciiWhitespace(host_header);
  if (h.empty()) return "";
  if (h.front() == '[') {
    const size_t close = h.find(']');
    if (close == absl::string_view::npos) return "";
    const absl::string_view rest = h.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return "";
    return absl::AsciiStrToLower(h.substr(1, close - 1));
  }
  const size_t colon = h.find(':');
  if (colon != absl::string_view::npos && h.find(':', colon + 1) != absl::string_view::npos) return "";
  return absl::AsciiStrToLower(h.substr(0, colon));
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `b` is read whatever `a` holds; only the lengths show.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < b.size(); ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ static_cast<unsigned char>(b[i]));
  }
  return diff == 0;
}

HttpAccess::HttpAccess(HttpAccessOptions options) : options_(std::move(options)) {
  const std::string listen = absl::AsciiStrToLower(options_.listen_host);
  for (const std::string& name : options_.allowed_hosts) {
    if (name == "*") any_host_ = true;
    host_names_.push_back(absl::AsciiStrToLower(name));
  }
  // Bound to every address and told no names: the key (or the operator's
  // explicit --insecure_no_auth) is what guards it, not the name.
  if (IsWildcard(listen) && options_.allowed_hosts.empty()) any_host_ = true;
  if (!IsWildcard(listen)) host_names_.push_back(listen);
  if (IsLoopbackName(listen) || IsWildcard(listen)) {
    for (const char* name : {"localhost", "127.0.0.1", "::1"}) host_names_.push_back(name);
  }
}

std::optional<HttpError> HttpAccess::Check(const HttpRequest& head) const {
  if (auto error = CheckHost(head)) return error;
  if (auto error = CheckOrigin(head)) return error;
  return CheckKey(head);
}

std::optional<HttpError> HttpAccess::CheckHost(const HttpRequest& head) const {
  const absl::string_view header = head.Header("host");
  if (header.empty()) {
    if (head.version < 11) return std::nullopt;  // HTTP/1.0 need not send one
    return HttpError::Make(400, "invalid_request_error", "the request has no Host header", "", "missing_host");
  }
  const std::string name = HostName(header);
  if (any_host_ && !name.empty()) return std::nullopt;
  if (!name.empty() && std::find(host_names_.begin(), host_names_.end(), name) != host_names_.end()) {
    return std::nullopt;
  }
  return HttpError::Make(
      403, "permission_error",
      absl::StrCat("Host \"", header, "\" is not a name of this server (add it with --http_allowed_hosts)"), "",
      "host_not_allowed");
}

bool HttpAccess::CorsAllowed(absl::string_view origin) const {
  for (const std::string& allowed : options_.cors_origins) {
    if (allowed == "*" || absl::EqualsIgnoreCase(allowed, origin)) return true;
  }
  return false;
}

std::optional<HttpError> HttpAccess::CheckOrigin(const HttpRequest& head) const {
  const absl::string_view origin = head.Header("origin");
  if (origin.empty()) return std::nullopt;  // not a browser's cross-site request
  // The server's own page: same scheme-less authority as the Host it was
  // fetched from (already checked to be this server's).
  if (absl::EqualsIgnoreCase(origin, absl::StrCat("http://", head.Header("host")))) return std::nullopt;
  if (CorsAllowed(origin)) return std::nullopt;
  return HttpError::Make(
      403, "permission_error",
      absl::StrCat("requests from origin \"", origin, "\" are not allowed (add it with --cors_origins)"), "",
      "origin_not_allowed");
}

std::optional<HttpError> HttpAccess::CheckKey(const HttpRequest& head) const {
  if (options_.api_key.empty() || KeyExempt(head.path) || head.method == "OPTIONS") return std::nullopt;
  absl::string_view auth = absl::StripAsciiWhitespace(head.Header("authorization"));
  const bool bearer = auth.size() > 7 && absl::EqualsIgnoreCase(auth.substr(0, 7), "bearer ");
  if (bearer && ConstantTimeEquals(absl::StripAsciiWhitespace(auth.substr(7)), options_.api_key)) {
    return std::nullopt;
  }
  return HttpError::Make(401, "invalid_request_error",
                         bearer ? "Incorrect API key provided."
                                : "You didn't provide an API key: send it as \"Authorization: Bearer KEY\".",
                         "", "invalid_api_key");
}

std::vector<std::pair<std::string, std::string>> HttpAccess::CorsHeaders(const HttpRequest& head) const {
  const absl::string_view origin = head.Header("origin");
  if (origin.empty() || !CorsAllowed(origin)) return {};
  return {{"Access-Control-Allow-Origin", std::string(origin)}, {"Vary", "Origin"}};
}

HttpResponse HttpAccess::Preflight(const HttpRequest& head) const {
  HttpResponse r;
  const absl::string_view origin = head.Header("origin");
  if (origin.empty() || !CorsAllowed(origin)) {
    r.status = 403;
    r.body = HttpError::Make(403, "permission_error",
                             origin.empty() ? std::string("OPTIONS is answered for CORS preflights only")
                                            : absl::StrCat("requests from origin \"", origin,
                                                           "\" are not allowed (add it with --cors_origins)"),
                             "", "origin_not_allowed")
                 .ToJson();
    return r;
  }
  r.status = 204;
  r.content_type = "text/plain";
  r.headers = CorsHeaders(head);
  r.headers.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
  r.headers.push_back({"Access-Control-Allow-Headers", "Authorization, Content-Type"});
  r.headers.push_back({"Access-Control-Max-Age", "600"});
  return r;
}

}  // namespace tandem
