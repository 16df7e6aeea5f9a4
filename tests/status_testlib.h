// ASSERT_OK / EXPECT_OK / ASSERT_OK_AND_ASSIGN: Debian's abseil (20220623)
// ships no status matchers, so tests/ has these. Each takes an absl::Status,
// an absl::StatusOr<T> or a grpc::Status, prints the status on failure, and
// accepts more context with <<, as gtest's own assertions do.
#pragma once

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/status_macros.h"
#include "gtest/gtest.h"

namespace tandem::test {

inline std::string StatusText(const absl::Status& status) { return status.ToString(); }
template <typename T>
std::string StatusText(const absl::StatusOr<T>& value) {
  return value.status().ToString();
}
// grpc::Status and anything else with ok(), error_code() and error_message().
template <typename S>
requires requires(const S& s) {
  s.error_message();
  s.error_code();
}
std::string StatusText(const S& status) {
  return "code " + std::to_string(static_cast<int>(status.error_code())) + ": " + status.error_message();
}

template <typename T>
::testing::AssertionResult IsOk(const char* expression, const T& value) {
  if (value.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expression << " is not OK: " << StatusText(value);
}

}  // namespace tandem::test

#define ASSERT_OK(expr) ASSERT_PRED_FORMAT1(::tandem::test::IsOk, expr)
#define EXPECT_OK(expr) EXPECT_PRED_FORMAT1(::tandem::test::IsOk, expr)

// `lhs` = the value of the StatusOr `rexpr`, or a fatal failure naming it.
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr) \
  TANDEM_ASSERT_OK_AND_ASSIGN_IMPL(TANDEM_STATUS_CONCAT(tandem_test_statusor_, __LINE__), lhs, rexpr)
#define TANDEM_ASSERT_OK_AND_ASSIGN_IMPL(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                     \
  ASSERT_OK(statusor);                                         \
  lhs = std::move(statusor).value()
