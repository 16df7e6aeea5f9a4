// Where a local tandem deployment keeps its sockets and pid files, the same
// rule in the launch script (deploy/tandem-launch.sh), the server and the
// CLI: $TANDEM_RUNTIME_DIR, else ${XDG_RUNTIME_DIR:-/tmp}/tandem-<user>.
//
// Under /tmp that name is predictable, so another user may create it first
// and wait for our sockets, logs and pid files (issue 15, item 1). Whoever
// uses the dir checks it first (EnsurePrivateDir): a real directory, not a
// symlink, owned by this user, writable by nobody else; a dir that fails is
// refused with a message naming its owner and mode, never used.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace tandem {

std::string DefaultRuntimeDir();
// "unix:<runtime dir>/server.sock": where tandem-server listens and the
// `tandem` CLI and SDK examples connect unless told otherwise.
std::string DefaultServerAddress();

// Creates `dir` with mode 0700 (its missing parents too, also 0700), or
// checks the one there: opened without following a symlink, a directory,
// owned by this user, no group or other write permission. Group/other read
// or search bits on a dir of ours are removed (chmod 0700). PermissionDenied
// naming the dir, its owner and mode otherwise; `what` names it ("runtime
// dir", "--socket's folder").
absl::Status EnsurePrivateDir(const std::string& dir, const std::string& what = "runtime dir");

// For a folder that holds a socket but need not be private (e.g. /run or
// /tmp): created 0700 when missing, else it must be owned by this user or
// root and, when group or other may write to it, sticky (so no one else can
// replace what we put there). PermissionDenied naming it otherwise.
absl::Status EnsureSocketDir(const std::string& dir, const std::string& what);

}  // namespace tandem
