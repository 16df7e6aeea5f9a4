// Minimal leveled logging to stderr. Debian's abseil predates absl/log, and
// printf logging is scattered; this is the one channel. Thread-safe: each
// message is formatted first and written with one call.
#pragma once

#include <string_view>

#include "absl/strings/str_cat.h"

namespace tandem {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Messages below this level are dropped. Default kInfo; TANDEM_LOG_LEVEL
// (debug|info|warning|error) read once at first use overrides it.
LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);
void LogMessage(LogLevel level, std::string_view file, int line, std::string_view message);

}  // namespace tandem

#define TANDEM_LOG(level, ...)                                                                        \
  do {                                                                                                \
    if (::tandem::LogLevel::level >= ::tandem::MinLogLevel())                                         \
      ::tandem::LogMessage(::tandem::LogLevel::level, __FILE__, __LINE__, absl::StrCat(__VA_ARGS__)); \
  } while (0)
#define LOG_INFO(...) TANDEM_LOG(kInfo, __VA_ARGS__)
#define LOG_WARNING(...) TANDEM_LOG(kWarning, __VA_ARGS__)
#define LOG_ERROR(...) TANDEM_LOG(kError, __VA_ARGS__)
#define LOG_DEBUG(...) TANDEM_LOG(kDebug, __VA_ARGS__)
