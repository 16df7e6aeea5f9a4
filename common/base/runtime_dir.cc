#include "common/base/runtime_dir.h"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>

namespace tandem {

std::string DefaultRuntimeDir() {
  if (const char* dir = std::getenv("TANDEM_RUNTIME_DIR"); dir != nullptr && *dir != '\0') return dir;
  const char* base = std::getenv("XDG_RUNTIME_DIR");
  std::string user;
  if (const passwd* pw = getpwuid(getuid()); pw != nullptr && pw->pw_name != nullptr) {
    user = pw->pw_name;
  } else {
    user = std::to_string(getuid());
  }
  return std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/tandem-" + user;
}

std::string DefaultServerAddress() { return "unix:" + DefaultRuntimeDir() + "/server.sock"; }

}  // namespace tandem
