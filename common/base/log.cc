#include "common/base/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "absl/strings/str_format.h"

namespace tandem {
namespace {

LogLevel LevelFromEnv() {
  const char* env = std::getenv("TANDEM_LOG_LEVEL");
  if (env == nullptr) return LogLevel::kInfo;
  if (std::strcmp(env, "debug") == 0) return LogLevel::kDebug;
  if (std::strcmp(env, "warning") == 0) return LogLevel::kWarning;
  if (std::strcmp(env, "error") == 0) return LogLevel::kError;
  return LogLevel::kInfo;
}

std::atomic<int>& Level() {
  static std::atomic<int> level{static_cast<int>(LevelFromEnv())};
  return level;
}

}  // namespace

LogLevel MinLogLevel() { return static_cast<LogLevel>(Level().load(std::memory_order_relaxed)); }
void SetMinLogLevel(LogLevel level) { Level().store(static_cast<int>(level)); }

void LogMessage(LogLevel level, std::string_view file, int line, std::string_view message) {
  static constexpr char kLetters[] = {'D', 'I', 'W', 'E'};
  const size_t slash = file.rfind('/');
  if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm local;
  localtime_r(&ts.tv_sec, &local);
  std::string out =
      absl::StrFormat("%c%02d:%02d:%02d.%03d %s:%d] %s\n", kLetters[static_cast<int>(level)], local.tm_hour,
                      local.tm_min, local.tm_sec, static_cast<int>(ts.tv_nsec / 1000000), file, line, message);
  // One write per message so lines from several threads never interleave.
  ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}

}  // namespace tandem
