// OpenAI's error shape, {"error": {"message", "type", "param", "code"}},
// and the HTTP status an absl::Status maps to.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tandem {

struct HttpError {
  int status = 500;
  std::string type;  // invalid_request_error, not_found_error, rate_limit_error, unavailable_error, server_error
  std::string message;
  std::string param;  // the request field at fault; "" -> null
  std::string code;   // a machine-readable reason; "" -> null

  static HttpError Make(int status, std::string type, std::string message, std::string param = "",
                        std::string code = "");
  std::string ToJson() const;
};

// InvalidArgument / FailedPrecondition / OutOfRange -> 400, NotFound -> 404,
// ResourceExhausted -> 429, Cancelled -> 499, Unavailable -> 503,
// DeadlineExceeded -> 504, anything else -> 500. `param` is the one
// WithParam attached, else the field the message starts with
// ("temperature: ...", "top_p must ...") when it names one, else
// `default_param` for a 400.
HttpError HttpErrorFromStatus(const absl::Status& status, const std::string& default_param = "");

// `status` naming `param` as the field at fault: for fields whose names the
// message cannot lead with (an unknown field's name may hold any character).
absl::Status WithParam(absl::Status status, absl::string_view param);

}  // namespace tandem
