#include "tests/slow_client_testlib.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// HTTP/2 (RFC 9113) frame types and flags used here.
constexpr uint8_t kData = 0, kHeaders = 1, kRstStream = 3, kSettings = 4, kPing = 6, kGoAway = 7, kWindowUpdate = 8;
constexpr uint8_t kEndStream = 0x1, kAck = 0x1, kEndHeaders = 0x4;
constexpr uint32_t kStream = 1;
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

std::string Be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string Frame(uint8_t type, uint8_t flags, uint32_t stream, std::string_view payload) {
  const auto n = static_cast<uint32_t>(payload.size());
  std::string f = {static_cast<char>(n >> 16), static_cast<char>(n >> 8), static_cast<char>(n), static_cast<char>(type),
                   static_cast<char>(flags)};
  return f + Be32(stream) + std::string(payload);
}

// HPACK literal header field without indexing, new name, no Huffman coding
// (names and values here are shorter than 127 bytes).
std::string Literal(std::string_view name, std::string_view value) {
  return std::string(1, '\0') + static_cast<char>(name.size()) + std::string(name) + static_cast<char>(value.size()) +
         std::string(value);
}

absl::Status SendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Up to `n` bytes (at least one) by `deadline`; an empty string at EOF.
absl::StatusOr<std::string> RecvSome(int fd, size_t n, absl::Time deadline) {
  while (true) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0) return absl::DeadlineExceededError("nothing to read before the deadline");
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (ready < 0 && errno != EINTR) return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    if (ready <= 0) continue;
    std::string buffer(n, '\0');
    const ssize_t got = recv(fd, buffer.data(), n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::UnavailableError(absl::StrCat("recv: ", std::strerror(errno)));
    buffer.resize(static_cast<size_t>(got));
    return buffer;
  }
}

absl::StatusOr<std::string> RecvExactly(int fd, size_t n, absl::Time deadline) {
  std::string out;
  while (out.size() < n) {
    absl::StatusOr<std::string> got = RecvSome(fd, n - out.size(), deadline);
    if (!got.ok()) return got.status();
    if (got->empty()) return absl::UnavailableError("the server closed the connection");
    out += *got;
  }
  return out;
}

struct H2Frame {
  uint8_t type = 0, flags = 0;
  uint32_t stream = 0;
  std::string payload;
};

absl::StatusOr<H2Frame> ReadFrame(int fd, absl::Time deadline) {
  absl::StatusOr<std::string> header = RecvExactly(fd, 9, deadline);
  if (!header.ok()) return header.status();
  const auto* h = reinterpret_cast<const uint8_t*>(header->data());
  H2Frame frame{.type = h[3],
                .flags = h[4],
                .stream = (uint32_t{h[5]} & 0x7f) << 24 | uint32_t{h[6]} << 16 | uint32_t{h[7]} << 8 | h[8]};
  const size_t length = size_t{h[0]} << 16 | size_t{h[1]} << 8 | h[2];
  absl::StatusOr<std::string> payload = RecvExactly(fd, length, deadline);
  if (!payload.ok()) return payload.status();
  frame.payload = std::move(*payload);
  return frame;
}

// HPACK (RFC 7541) integer with a `bits`-bit prefix.
bool DecodeInt(std::string_view& in, int bits, uint64_t* out) {
  if (in.empty()) return false;
  const uint64_t max = (1u << bits) - 1;
  *out = static_cast<uint8_t>(in[0]) & max;
  in.remove_prefix(1);
  if (*out < max) return true;
  for (int shift = 0; !in.empty() && shift < 56; shift += 7) {
    const auto b = static_cast<uint8_t>(in[0]);
    in.remove_prefix(1);
    *out += uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

// A literal string; Huffman-coded ones come back as "<huffman>".
bool DecodeString(std::string_view& in, std::string* out) {
  if (in.empty()) return false;
  const bool huffman = (static_cast<uint8_t>(in[0]) & 0x80) != 0;
  uint64_t n = 0;
  if (!DecodeInt(in, 7, &n) || n > in.size()) return false;
  *out = huffman ? "<huffman>" : std::string(in.substr(0, n));
  in.remove_prefix(n);
  return true;
}

// grpc-status and grpc-message from a trailer block. Only the
// representations gRPC uses for them on a fresh connection are understood
// (literal names); anything else is skipped.
absl::Status ParseTrailers(std::string_view in, RawGrpcCall::Result* result) {
  while (!in.empty()) {
    const auto first = static_cast<uint8_t>(in[0]);
    uint64_t index = 0;
    if (first & 0x80) {  // indexed field: a name and value seen before
      if (!DecodeInt(in, 7, &index)) break;
      continue;
    }
    if ((first & 0xe0) == 0x20) {  // dynamic table size update
      if (!DecodeInt(in, 5, &index)) break;
      continue;
    }
    if (!DecodeInt(in, (first & 0x40) ? 6 : 4, &index)) break;
    std::string name, value;
    if (index == 0 && !DecodeString(in, &name)) break;
    if (!DecodeString(in, &value)) break;
    if (name == "grpc-status") result->grpc_status = value;
    if (name == "grpc-message") result->grpc_message = value;
  }
  if (result->grpc_status.empty()) return absl::DataLossError("no grpc-status in the trailers");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RawGrpcCall>> RawGrpcCall::Start(const std::filesystem::path& socket,
                                                                const std::string& method,
                                                                const google::protobuf::Message& request) {
  ScopedFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket.string().size() >= sizeof(address.sun_path)) return absl::InvalidArgumentError("socket path too long");
  std::strncpy(address.sun_path, socket.c_str(), sizeof(address.sun_path) - 1);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect ", socket.string(), ": ", std::strerror(errno)));
  }
  // Preface and empty settings (so the initial window stays 65,535); then
  // acknowledge the server's settings, which it sends first.
  absl::Status sent = SendAll(fd.get(), absl::StrCat(kPreface, Frame(kSettings, 0, 0, "")));
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (sent.ok()) {
    absl::StatusOr<H2Frame> frame = ReadFrame(fd.get(), deadline);
    if (!frame.ok()) return frame.status();
    if (frame->type == kSettings && (frame->flags & kAck) == 0) break;
  }
  if (sent.ok()) sent = SendAll(fd.get(), Frame(kSettings, kAck, 0, ""));
  const std::string headers = absl::StrCat(Literal(":method", "POST"), Literal(":scheme", "http"),
                                           Literal(":path", method), Literal(":authority", "localhost"),
                                           Literal("content-type", "application/grpc"), Literal("te", "trailers"));
  const std::string body = request.SerializeAsString();
  if (sent.ok()) sent = SendAll(fd.get(), Frame(kHeaders, kEndHeaders, kStream, headers));
  if (sent.ok()) {
    sent = SendAll(fd.get(), Frame(kData, kEndStream, kStream,
                                   absl::StrCat(std::string(1, '\0'), Be32(static_cast<uint32_t>(body.size())), body)));
  }
  if (!sent.ok()) return sent;
  return std::unique_ptr<RawGrpcCall>(new RawGrpcCall(std::move(fd)));
}

absl::StatusOr<RawGrpcCall::Result> RawGrpcCall::Drain(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // Far more window than any test response needs, for the connection and the stream.
  const std::string grant = Be32(1u << 30);
  TANDEM_RETURN_IF_ERROR(SendAll(fd_.get(), Frame(kWindowUpdate, 0, 0, grant)));
  TANDEM_RETURN_IF_ERROR(SendAll(fd_.get(), Frame(kWindowUpdate, 0, kStream, grant)));
  Result result;
  while (true) {
    absl::StatusOr<H2Frame> frame = ReadFrame(fd_.get(), deadline);
    if (!frame.ok()) return frame.status();
    if (frame->type == kPing && (frame->flags & kAck) == 0) {
      TANDEM_RETURN_IF_ERROR(SendAll(fd_.get(), Frame(kPing, kAck, 0, frame->payload)));
    } else if (frame->type == kGoAway || (frame->type == kRstStream && frame->stream == kStream)) {
      return absl::UnavailableError(absl::StrCat("the server reset the stream (frame type ", frame->type, ")"));
    } else if (frame->type == kData && frame->stream == kStream) {
      result.data += frame->payload;
    } else if (frame->type == kHeaders && frame->stream == kStream && (frame->flags & kEndStream)) {
      if ((frame->flags & kEndHeaders) == 0) return absl::UnimplementedError("trailers split over CONTINUATION");
      for (size_t at = 0; at + 5 <= result.data.size(); ++result.messages) {
        const auto* p = reinterpret_cast<const uint8_t*>(result.data.data() + at + 1);
        at += 5 + (size_t{p[0]} << 24 | size_t{p[1]} << 16 | size_t{p[2]} << 8 | p[3]);
      }
      TANDEM_RETURN_IF_ERROR(ParseTrailers(frame->payload, &result));
      return result;
    }
  }
}

absl::StatusOr<std::unique_ptr<RawHttpRequest>> RawHttpRequest::Start(int port, const std::string& path,
                                                                      const std::string& json_body) {
  ScopedFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  // Before connect, so the window announced to the server is small too.
  const int smallest = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &smallest, sizeof(smallest));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    return absl::UnavailableError(absl::StrCat("connect 127.0.0.1:", port, ": ", std::strerror(errno)));
  }
  TANDEM_RETURN_IF_ERROR(SendAll(
      fd.get(), absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n",
                             "Content-Length: ", json_body.size(), "\r\n\r\n", json_body)));
  return std::unique_ptr<RawHttpRequest>(new RawHttpRequest(std::move(fd)));
}

absl::StatusOr<std::string> RawHttpRequest::Drain(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string out;
  while (true) {
    absl::StatusOr<std::string> got = RecvSome(fd_.get(), 1 << 16, deadline);
    if (!got.ok()) {
      return absl::DeadlineExceededError(absl::StrCat("the server did not close the connection within ",
                                                      absl::FormatDuration(timeout), " (", out.size(),
                                                      " bytes came): ", got.status().message()));
    }
    if (got->empty()) return out;
    out += *got;
  }
}

int64_t VmRssKb(int pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

}  // namespace tandem
