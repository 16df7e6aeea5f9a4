#include "coordinator/serving/http/http_error.h"

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"

namespace tandem {
namespace {

// The leading field name of a validation message: "messages[2].role: ...",
// "temperature must be ...", "prompt_ids[3] = 9 is ...".
std::string LeadingField(std::string_view message) {
  size_t end = 0;
  while (end < message.size() && (absl::ascii_isalnum(message[end]) || message[end] == '_' || message[end] == '.' ||
                                  message[end] == '[' || message[end] == ']')) {
    ++end;
  }
  if (end == 0 || end == message.size() || !absl::ascii_islower(message[0])) return "";
  const std::string_view rest = message.substr(end);
  if (rest[0] == ':' || rest.starts_with(" must") || rest.starts_with(" =") || rest.starts_with(" is")) {
    std::string field(message.substr(0, end));
    // Common words that begin sentences are not fields.
    if (field == "the" || field == "this" || field == "a" || field == "give") return "";
    return field;
  }
  return "";
}

constexpr char kParamPayload[] = "type.tandem.dev/http.param";

}  // namespace

HttpError HttpError::Make(int status, std::string type, std::string message, std::string param, std::string code) {
  return HttpError{status, std::move(type), std::move(message), std::move(param), std::move(code)};
}

std::string HttpError::ToJson() const {
  nlohmann::ordered_json error = {
      {"message", message},
      {"type", type},
      {"param", param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param)},
      {"code", code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code)}};
  return nlohmann::ordered_json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

HttpError HttpErrorFromStatus(const absl::Status& status, const std::string& default_param) {
  const std::string message(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange: {
      const auto attached = status.GetPayload(kParamPayload);  // absl::optional
      std::string param = attached ? std::string(*attached) : LeadingField(message);
      if (param.empty()) param = default_param;
      return HttpError::Make(400, "invalid_request_error", message, param);
    }
    case absl::StatusCode::kNotFound: return HttpError::Make(404, "not_found_error", message);
    case absl::StatusCode::kResourceExhausted:
      return HttpError::Make(429, "rate_limit_error", message, "", "server_busy");
    case absl::StatusCode::kCancelled: return HttpError::Make(499, "cancelled", message);
    case absl::StatusCode::kUnavailable: return HttpError::Make(503, "unavailable_error", message);
    case absl::StatusCode::kDeadlineExceeded: return HttpError::Make(504, "timeout_error", message);
    default: return HttpError::Make(500, "server_error", message);
  }
}

absl::Status WithParam(absl::Status status, absl::string_view param) {
  status.SetPayload(kParamPayload, absl::Cord(param));
  return status;
}

}  // namespace tandem
