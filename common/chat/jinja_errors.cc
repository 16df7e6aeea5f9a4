#include "common/chat/jinja_errors.h"

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tandem::jinja {
namespace {

constexpr char kPositioned[] = "tandem.chat/positioned";
constexpr char kRaised[] = "tandem.chat/raise_exception";

}  // namespace

absl::Status AtPosition(absl::Status status, SourcePos pos) {
  if (status.ok() || status.GetPayload(kPositioned).has_value()) return status;
  absl::Status positioned(status.code(), absl::StrCat(status.message(), " at ", Where(pos)));
  positioned.SetPayload(kPositioned, absl::Cord("1"));
  return positioned;
}

absl::Status RaisedByTemplate(absl::string_view message) {
  absl::Status status = absl::InvalidArgumentError(message);
  status.SetPayload(kPositioned, absl::Cord("1"));
  status.SetPayload(kRaised, absl::Cord("1"));
  return status;
}

bool IsRaisedByTemplate(const absl::Status& status) { return status.GetPayload(kRaised).has_value(); }

}  // namespace tandem::jinja
