#include "tests/raw_http_testlib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace tandem {
namespace {

// Where the header ends (just past its blank line), or npos.
size_t HeaderEnd(absl::string_view response) {
  const size_t at = response.find("\r\n\r\n");
  return at == absl::string_view::npos ? at : at + 4;
}

// Whether `response` holds a whole response.
bool Complete(absl::string_view response) {
  const size_t head = HeaderEnd(response);
  if (head == absl::string_view::npos) return false;
  const int status = ResponseStatus(response);
  if ((status >= 100 && status < 200) || status == 204 || status == 304) return true;  // no body
  if (absl::EqualsIgnoreCase(ResponseHeader(response, "transfer-encoding"), "chunked")) {
    return absl::StrContains(response.substr(head), "0\r\n\r\n");
  }
  int64_t length = 0;
  const std::string value = ResponseHeader(response, "content-length");
  if (value.empty() || !absl::SimpleAtoi(value, &length)) return false;  // read to the close
  return static_cast<int64_t>(response.size() - head) >= length;
}

int64_t ProcStatusKb(int pid, absl::string_view field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, field)) {
      int64_t kb = 0;
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<ScopedFd> ConnectLoopback(int port) {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError("socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect to 127.0.0.1:", port, ": errno ", errno));
  }
  return fd;
}

absl::Status SendAll(int fd, absl::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(absl::StrCat("send: errno ", errno));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadResponse(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string response;
  char buffer[65536];
  while (!Complete(response)) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || ::poll(&p, 1, static_cast<int>(ms)) <= 0) {
      return absl::DeadlineExceededError(absl::StrCat("no whole response in time; got: ", response.substr(0, 300)));
    }
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // closed: the response is what came
    response.append(buffer, static_cast<size_t>(n));
  }
  return response;
}

int ResponseStatus(absl::string_view response) {
  int status = 0;
  if (!absl::StartsWith(response, "HTTP/1.") || response.size() < 12) return 0;
  return absl::SimpleAtoi(response.substr(9, 3), &status) ? status : 0;
}

std::string ResponseHeader(absl::string_view response, absl::string_view name) {
  const size_t head = HeaderEnd(response);
  for (absl::string_view line : absl::StrSplit(response.substr(0, head), "\r\n")) {
    const size_t colon = line.find(':');
    if (colon != absl::string_view::npos && absl::EqualsIgnoreCase(line.substr(0, colon), name)) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "";
}

std::string ResponseBody(absl::string_view response) {
  const size_t head = HeaderEnd(response);
  if (head == absl::string_view::npos) return "";
  absl::string_view rest = response.substr(head);
  if (!absl::EqualsIgnoreCase(ResponseHeader(response, "transfer-encoding"), "chunked")) return std::string(rest);
  std::string body;
  while (true) {
    const size_t eol = rest.find("\r\n");
    if (eol == absl::string_view::npos) break;
    uint64_t size = 0;
    if (!absl::SimpleHexAtoi(rest.substr(0, eol), &size) || size == 0) break;
    const absl::string_view piece = rest.substr(eol + 2, size);
    body.append(piece.data(), piece.size());
    if (rest.size() < eol + 2 + size + 2) break;
    rest.remove_prefix(eol + 2 + size + 2);
  }
  return body;
}

bool PeerClosed(int fd, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  char buffer[4096];
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || ::poll(&p, 1, static_cast<int>(ms)) <= 0) return false;
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
}

int64_t PeakRssKb(int pid) { return ProcStatusKb(pid, "VmHWM:"); }
int64_t RssKb(int pid) { return ProcStatusKb(pid, "VmRSS:"); }

std::string JsonPost(const std::string& path, const std::string& body, int port) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1:", port,
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
}

}  // namespace tandem
