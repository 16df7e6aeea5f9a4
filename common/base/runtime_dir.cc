#include "common/base/runtime_dir.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/scoped_fd.h"

namespace tandem {
namespace {

std::string Mode(mode_t mode) { return absl::StrFormat("%04o", mode & 07777); }

// mkdir -p with mode 0700 for every folder it creates.
absl::Status MakeDirs(const std::string& dir, const std::string& what) {
  if (dir.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  for (size_t slash = dir.find('/', 1);; slash = dir.find('/', slash + 1)) {
    const std::string prefix = dir.substr(0, slash);
    if (!prefix.empty() && mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat(what, " ", dir, ": cannot create ", prefix, ": ", std::strerror(errno)));
    }
    if (slash == std::string::npos) return absl::OkStatus();
  }
}

// The folder's status, opened with O_NOFOLLOW so a symlink is never taken
// for the folder it points at. Sets *fd (caller closes) for fchmod.
absl::Status StatDir(const std::string& dir, const std::string& what, int* fd, struct stat* st) {
  *fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (*fd < 0) {
    const int err = errno;
    struct stat link {};
    if (lstat(dir.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
      return absl::PermissionDeniedError(absl::StrCat(what, " ", dir, " is a symlink (owned by uid ", link.st_uid,
                                                      "): refusing to follow it; remove it, or set "
                                                      "TANDEM_RUNTIME_DIR to a folder of your own"));
    }
    if (err == ENOTDIR)
      return absl::PermissionDeniedError(absl::StrCat(what, " ", dir, " exists and is not a directory"));
    return absl::PermissionDeniedError(absl::StrCat(what, " ", dir, ": cannot open: ", std::strerror(err)));
  }
  if (fstat(*fd, st) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", dir, ": cannot stat: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

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

absl::Status EnsurePrivateDir(const std::string& dir, const std::string& what) {
  if (absl::Status made = MakeDirs(dir, what); !made.ok()) return made;
  ScopedFd fd;
  struct stat st {};
  if (absl::Status s = StatDir(dir, what, fd.receive(), &st); !s.ok()) return s;
  const uid_t me = geteuid();
  if (st.st_uid != me) {
    return absl::PermissionDeniedError(absl::StrCat(
        what, " ", dir, " is owned by uid ", st.st_uid, " (mode ", Mode(st.st_mode), "), not by you (uid ", me,
        "): another user may have created it to take over tandem's sockets and files; remove it, or set "
        "TANDEM_RUNTIME_DIR to a folder of your own"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", dir, " has mode ", Mode(st.st_mode),
                                                    ": others may write to it; chmod 0700 it (or remove it) first"));
  }
  if ((st.st_mode & 077) != 0 && fchmod(fd.get(), 0700) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, " ", dir, ": cannot chmod 0700 (mode ", Mode(st.st_mode), "): ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status EnsureSocketDir(const std::string& dir, const std::string& what) {
  if (absl::Status made = MakeDirs(dir, what); !made.ok()) return made;
  ScopedFd fd;
  struct stat st {};
  if (absl::Status s = StatDir(dir, what, fd.receive(), &st); !s.ok()) return s;
  const uid_t me = geteuid();
  if (st.st_uid != me && st.st_uid != 0) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", dir, " is owned by uid ", st.st_uid, " (mode ",
                                                    Mode(st.st_mode), "), neither you (uid ", me,
                                                    ") nor root: its owner could replace the socket"));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
    return absl::PermissionDeniedError(absl::StrCat(what, " ", dir, " has mode ", Mode(st.st_mode),
                                                    ": others may write to it and it is not sticky, so they could "
                                                    "replace the socket; use a folder only you can write to"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
