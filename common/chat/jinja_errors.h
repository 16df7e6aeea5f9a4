// How template errors carry their position: the innermost construct that
// failed appends " at line L col C" once; outer ones leave it alone.
// raise_exception's errors carry the template's message unchanged.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/chat/jinja_lexer.h"

namespace tandem::jinja {

// `status` with " at line L col C" appended, unless it already has a
// position (or is OK).
absl::Status AtPosition(absl::Status status, SourcePos pos);

// The error raise_exception(message) produces: InvalidArgument with exactly
// `message`, marked so that AtPosition leaves it alone.
absl::Status RaisedByTemplate(absl::string_view message);
bool IsRaisedByTemplate(const absl::Status& status);

}  // namespace tandem::jinja
