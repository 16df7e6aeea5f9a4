// Status helpers: Debian's abseil (20220623) ships no RETURN_IF_ERROR or
// ASSIGN_OR_RETURN, so this one small header provides both.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_STATUS_CONCAT_INNER(a, b) a##b
#define TANDEM_STATUS_CONCAT(a, b) TANDEM_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define TANDEM_RETURN_IF_ERROR(expr)                       \
  do {                                                     \
    ::absl::Status tandem_status_tmp = (expr);             \
    if (!tandem_status_tmp.ok()) return tandem_status_tmp; \
  } while (0)

// `lhs` = value of the StatusOr `rexpr`, or returns its status.
#define TANDEM_ASSIGN_OR_RETURN(lhs, rexpr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL(TANDEM_STATUS_CONCAT(tandem_statusor_, __LINE__), lhs, rexpr)

#define TANDEM_ASSIGN_OR_RETURN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return statusor.status();            \
  lhs = std::move(statusor).value()
