// Where a local tandem deployment keeps its sockets and pid files, the same
// rule in the launch script (deploy/tandem-launch.sh), the server and the
// CLI: $TANDEM_RUNTIME_DIR, else ${XDG_RUNTIME_DIR:-/tmp}/tandem-<user>.
#pragma once

#include <string>

namespace tandem {

std::string DefaultRuntimeDir();
// "unix:<runtime dir>/server.sock": where tandem-server listens and the
// `tandem` CLI and SDK examples connect unless told otherwise.
std::string DefaultServerAddress();

}  // namespace tandem
