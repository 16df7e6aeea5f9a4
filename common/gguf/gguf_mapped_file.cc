#include "common/gguf/gguf_mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/base/scoped_fd.h"
#include "common/gguf/gguf_parser.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<GgufMappedFile>> GgufMappedFile::Open(const std::filesystem::path& path) {
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open GGUF file ", path.string()));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path.string()));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not a regular file"));

  std::unique_ptr<GgufMappedFile> file(new GgufMappedFile());
  file->path_ = path;
  if (st.st_size > 0) {  // mmap refuses length 0; an empty file then fails to parse
    void* mapping = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (mapping == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat("cannot mmap ", path.string()));
    file->mapping_ = mapping;  // from here on the destructor unmaps, on errors too
    file->mapping_bytes_ = static_cast<size_t>(st.st_size);
  }
  absl::StatusOr<GgufFile> gguf = ParseGguf(file->bytes(), path.string());
  if (!gguf.ok()) return gguf.status();
  file->gguf_.emplace(*std::move(gguf));
  file->fd_ = std::move(fd);
  return file;
}

GgufMappedFile::~GgufMappedFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

absl::Span<const uint8_t> GgufMappedFile::TensorData(const GgufTensorInfo& tensor) const {
  return bytes().subspan(gguf_->data_offset() + tensor.offset, tensor.size_bytes);
}

absl::Status GgufMappedFile::ReadInto(absl::Span<const uint8_t> range, uint8_t* out) const {
  const uint8_t* base = static_cast<const uint8_t*>(mapping_);
  if (range.empty()) return absl::OkStatus();
  if (base == nullptr || range.data() < base || range.data() + range.size() > base + mapping_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(path_.string(), ": a read of ", range.size(),
                                                   " bytes outside the file's ", mapping_bytes_, " bytes"));
  }
  const off_t offset = static_cast<off_t>(range.data() - base);
  size_t done = 0;
  while (done < range.size()) {
    const ssize_t n = ::pread(fd_.get(), out + done, range.size() - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::ErrnoToStatus(
          errno, absl::StrCat("cannot read ", path_.string(), " at byte ", offset + static_cast<off_t>(done)));
    }
    if (n == 0) {
      return absl::DataLossError(absl::StrCat(path_.string(), " ends at byte ", offset + static_cast<off_t>(done),
                                              ", before the ", range.size(), " bytes read from byte ", offset,
                                              " (did it shrink since it was opened?)"));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace tandem
