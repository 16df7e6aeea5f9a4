#include "common/gguf/gguf_mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/base/mapped_range_read.h"
#include "common/base/scoped_fd.h"
#include "common/gguf/gguf_parser.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<GgufMappedFile>> GgufMappedFile::Open(const std::filesystem::path& path) {
  // O_NONBLOCK: a FIFO given as the model opens at once (and is refused
  // below as not a regular file) instead of waiting for a writer forever.
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
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

absl::Status GgufMappedFile::ReadInto(absl::Span<const uint8_t> range, uint8_t* out, ThreadPool* pool) const {
  return ReadMappedRange(fd_.get(), path_.string(), bytes(), range, out, pool);
}

}  // namespace tandem
