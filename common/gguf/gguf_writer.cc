#include "common/gguf/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<GgufWriter>> GgufWriter::Create(const std::filesystem::path& path,
                                                               const GgufMetadata& metadata,
                                                               absl::Span<const GgufTensorSpec> tensors) {
  auto in_file = [&path](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path.string(), ": ", s.message()));
  };
  absl::StatusOr<uint64_t> alignment = GgufAlignment(metadata);
  if (!alignment.ok()) return in_file(alignment.status());
  absl::StatusOr<std::vector<GgufTensorInfo>> infos = LayOutGgufTensors(tensors, *alignment);
  if (!infos.ok()) return in_file(infos.status());
  absl::StatusOr<std::string> header = SerializeGgufHeader(metadata, *infos);
  if (!header.ok()) return in_file(header.status());

  std::filesystem::path partial = path;
  partial += ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", partial.string()));
  const uint64_t total = header->size() + GgufDataSectionBytes(*infos, *alignment);
  std::unique_ptr<GgufWriter> writer(
      new GgufWriter(path, std::move(partial), fd, *std::move(infos), *alignment, total));
  TANDEM_RETURN_IF_ERROR(writer->WriteAll(header->data(), header->size()));
  writer->data_offset_ = header->size();
  TANDEM_RETURN_IF_ERROR(writer->AdvancePastComplete());
  return writer;
}

GgufWriter::GgufWriter(std::filesystem::path path, std::filesystem::path partial_path, int fd,
                       std::vector<GgufTensorInfo> tensors, uint64_t alignment, uint64_t total_bytes)
    : path_(std::move(path)),
      partial_path_(std::move(partial_path)),
      fd_(fd),
      tensors_(std::move(tensors)),
      alignment_(alignment),
      total_bytes_(total_bytes) {}

GgufWriter::~GgufWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) {
    std::error_code ignored;
    std::filesystem::remove(partial_path_, ignored);
  }
}

const GgufTensorInfo* GgufWriter::next_tensor() const {
  return current_ < tensors_.size() ? &tensors_[current_] : nullptr;
}

absl::Status GgufWriter::WriteAll(const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      failed_ = absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", partial_path_.string()));
      return failed_;
    }
    p += n;
    size -= static_cast<size_t>(n);
    bytes_written_ += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::PadTo(uint64_t file_offset) {
  static constexpr char kZeros[256] = {};
  while (bytes_written_ < file_offset) {
    const uint64_t n = std::min<uint64_t>(sizeof(kZeros), file_offset - bytes_written_);
    TANDEM_RETURN_IF_ERROR(WriteAll(kZeros, n));
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Write(absl::string_view name, absl::Span<const uint8_t> bytes) {
  TANDEM_RETURN_IF_ERROR(failed_);
  if (finished_ || current_ >= tensors_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_.string(), ": tensor \"", name, "\" written after every tensor was complete"));
  }
  const GgufTensorInfo& t = tensors_[current_];
  if (name != t.name) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_.string(), ": tensor \"", name, "\" written out of order: \"", t.name, "\" is due"));
  }
  if (bytes.size() > t.size_bytes - current_done_) {
    return absl::FailedPreconditionError(absl::StrCat(path_.string(), ": tensor \"", name, "\": ", bytes.size(),
                                                      " more bytes after ", current_done_, " exceed its ",
                                                      t.size_bytes));
  }
  TANDEM_RETURN_IF_ERROR(WriteAll(bytes.data(), bytes.size()));
  current_done_ += bytes.size();
  return AdvancePastComplete();
}

absl::Status GgufWriter::AdvancePastComplete() {
  // Complete tensors (zero-byte ones at once) are padded up to the next offset.
  while (current_ < tensors_.size() && current_done_ == tensors_[current_].size_bytes) {
    const GgufTensorInfo& done = tensors_[current_];
    const uint64_t end = data_offset_ + (done.offset + done.size_bytes + alignment_ - 1) / alignment_ * alignment_;
    TANDEM_RETURN_IF_ERROR(PadTo(end));
    ++current_;
    current_done_ = 0;
  }
  return absl::OkStatus();
}

absl::Status GgufWriter::Finish() {
  TANDEM_RETURN_IF_ERROR(failed_);
  if (finished_) return absl::OkStatus();
  if (current_ < tensors_.size()) {
    const GgufTensorInfo& t = tensors_[current_];
    return absl::FailedPreconditionError(absl::StrCat(path_.string(), ": tensor \"", t.name, "\" has ", current_done_,
                                                      " of its ", t.size_bytes,
                                                      " bytes; every tensor must be written before Finish"));
  }
  TANDEM_RETURN_IF_ERROR(PadTo(total_bytes_));
  if (::fdatasync(fd_) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot sync ", partial_path_.string()));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot close ", partial_path_.string()));
  std::error_code ec;
  std::filesystem::rename(partial_path_, path_, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot rename ", partial_path_.string(), " to ", path_.string(), ": ", ec.message()));
  }
  finished_ = true;
  return absl::OkStatus();
}

}  // namespace tandem
