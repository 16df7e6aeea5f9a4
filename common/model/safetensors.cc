#include "common/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/mapped_range_read.h"
#include "common/base/scoped_fd.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Real headers stay in the low MB even with thousands of tensors; a larger
// length means the file is not safetensors at all, and we must not try to
// parse gigabytes of weights as JSON.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr char kIndexFileName[] = "model.safetensors.index.json";

// The JSON of a header or an index, refusing a key given twice in one
// object: nlohmann keeps the last silently, so two readers (or a reader and
// the writer) could disagree about which entry a tensor has.
absl::StatusOr<json> ParseJsonUniqueKeys(const char* first, const char* last, const std::string& what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string duplicate;
  const json::parser_callback_t check = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
          duplicate = parsed.get<std::string>();
        }
        break;
      default: break;
    }
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(first, last, check);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not valid JSON: ", e.what()));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has the key \"", duplicate, "\" twice in one object: ambiguous, refused"));
  }
  return parsed;
}

// A shard named by the index must be a plain file name in the model folder:
// no folder part, no "." or "..", nothing absolute.
absl::Status CheckShardName(const fs::path& index_path, const std::string& shard) {
  if (shard.empty() || shard == "." || shard == ".." || shard.find('/') != std::string::npos ||
      shard.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": shard name \"", shard,
                                                   "\" is not a plain file name in the model folder (no \"/\", "
                                                   "no \"..\", nothing absolute)"));
  }
  return absl::OkStatus();
}

// `path`, a file directly in `model_dir`, as it may be opened: a symlink is
// followed only to a file inside the folder, or, in a Hugging Face hub cache
// (<repo>/snapshots/<revision>/<file> -> ../../blobs/<hash>), inside that
// repository's blobs/ folder. InvalidArgument naming both ends otherwise.
absl::Status CheckInsideModelDir(const fs::path& model_dir, const fs::path& path) {
  std::error_code ec;
  if (!fs::is_symlink(fs::symlink_status(path, ec))) return absl::OkStatus();
  const fs::path target = fs::weakly_canonical(path, ec);
  const fs::path dir = fs::weakly_canonical(model_dir, ec);
  auto inside = [&](const fs::path& folder) {
    const auto mismatch = std::mismatch(folder.begin(), folder.end(), target.begin(), target.end());
    return mismatch.first == folder.end();
  };
  const fs::path blobs = dir.parent_path().parent_path() / "blobs";
  const bool hub_cache = dir.parent_path().filename() == "snapshots" && inside(blobs);
  if (!ec && (inside(dir) || hub_cache)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(path.string(), " is a symlink to ", target.string(),
                                                 ", outside the model folder ", dir.string(), ": refused"));
}

// Error prefix naming a tensor of a file: `/m/x.safetensors: tensor "w"`.
std::string Where(const fs::path& path, const std::string& tensor) {
  return absl::StrCat(path.string(), ": tensor \"", tensor, "\"");
}

// Bytes of a `dtype` tensor of `shape`; fails on a negative dimension or a
// count that overflows 64 bits (a hostile header must not wrap to a match).
absl::StatusOr<uint64_t> ShapeBytes(const std::vector<int64_t>& shape, DType dtype) {
  if (IsQuantized(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(DTypeName(dtype)),
                                                   " is a GGUF block type: safetensors holds only ",
                                                   "F32, F16 and BF16 (write quantized models with tandem-quantize)"));
  }
  uint64_t bytes = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension in shape ", ShapeString(shape)));
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " overflows 64-bit byte count"));
    }
  }
  return bytes;
}

absl::Status ParseMetadata(const fs::path& path, const json& entry, std::map<std::string, std::string>* metadata) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": __metadata__ is not an object"));
  }
  for (const auto& [key, value] : entry.items()) {
    if (!value.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ": __metadata__ value of \"", key, "\" is not a string"));
    }
    (*metadata)[key] = value.get<std::string>();
  }
  return absl::OkStatus();
}

// One header entry -> a view into `data` (the data section, `data_bytes` long).
absl::StatusOr<TensorView> ParseTensor(const fs::path& path, const std::string& name, const json& entry,
                                       const uint8_t* data, uint64_t data_bytes) {
  auto malformed = [&](auto&&... detail) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path, name), ": ", detail...));
  };
  if (!entry.is_object()) return malformed("entry is not an object");

  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) return malformed("\"dtype\" missing or not a string");
  const absl::StatusOr<DType> dtype = ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) return malformed(dtype.status().message());

  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) return malformed("\"shape\" missing or not an array");
  TensorView view{.name = name, .dtype = *dtype};
  for (const json& d : *shape_it) {
    // nlohmann stores non-negative integers as unsigned: beyond int64 they would wrap.
    if (!d.is_number_integer() ||
        (d.is_number_unsigned() && d.get<uint64_t>() > uint64_t{std::numeric_limits<int64_t>::max()})) {
      return malformed("\"shape\" ", shape_it->dump(), " is not a list of 64-bit integers");
    }
    view.shape.push_back(d.get<int64_t>());
  }

  const auto offsets_it = entry.find("data_offsets");
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return malformed("\"data_offsets\" missing or not [begin, end] of non-negative integers");
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) return malformed("data_offsets [", begin, ", ", end, "] begin after end");
  if (end > data_bytes) {
    return absl::DataLossError(absl::StrCat(Where(path, name), ": data_offsets [", begin, ", ", end,
                                            "] end past the data section of ", data_bytes, " bytes (truncated file?)"));
  }

  const absl::StatusOr<uint64_t> bytes = ShapeBytes(view.shape, view.dtype);
  if (!bytes.ok()) return malformed(bytes.status().message());
  if (*bytes != end - begin) {
    return malformed(std::string(DTypeName(view.dtype)), " ", ShapeString(view.shape), " needs ", *bytes,
                     " bytes but data_offsets [", begin, ", ", end, "] span ", end - begin);
  }
  view.data = data + begin;
  view.size_bytes = end - begin;
  return view;
}

// Two tensors sharing bytes means a corrupt or hostile header: writing one
// (e.g. a prepacked copy) would silently change the other.
absl::Status CheckNoOverlap(const fs::path& path, const std::map<std::string, TensorView>& tensors) {
  std::vector<const TensorView*> by_start;
  for (const auto& [name, view] : tensors) {
    if (view.size_bytes > 0) by_start.push_back(&view);  // empty ranges share no bytes
  }
  std::sort(by_start.begin(), by_start.end(),
            [](const TensorView* a, const TensorView* b) { return std::less<const void*>()(a->data, b->data); });
  // Compare each start with the furthest end so far, not just the previous
  // tensor's: one large range may cover several later ones.
  const TensorView* furthest = nullptr;
  auto end_of = [](const TensorView* v) { return static_cast<const uint8_t*>(v->data) + v->size_bytes; };
  for (const TensorView* view : by_start) {
    if (furthest != nullptr && static_cast<const uint8_t*>(view->data) < end_of(furthest)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(path, view->name), ": bytes overlap those of tensor \"", furthest->name, "\""));
    }
    if (furthest == nullptr || end_of(view) > end_of(furthest)) furthest = view;
  }
  return absl::OkStatus();
}

// model_dir's index as shard file -> the tensors it should hold.
absl::StatusOr<std::map<std::string, std::vector<std::string>>> ReadIndex(const fs::path& index_path) {
  std::error_code ec;
  if (!fs::is_regular_file(index_path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": not a regular file"));
  }
  if (const uintmax_t bytes = fs::file_size(index_path, ec); !ec && bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path.string(), ": ", bytes, " bytes, more than an index can be (100 MB)"));
  }
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", index_path.string()));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TANDEM_ASSIGN_OR_RETURN(const json index,
                          ParseJsonUniqueKeys(text.data(), text.data() + text.size(), index_path.string()));
  const auto weight_map = index.find("weight_map");  // end() when index is not an object
  if (weight_map == index.end() || !weight_map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": no \"weight_map\" object"));
  }
  std::map<std::string, std::vector<std::string>> shards;
  for (const auto& [name, shard] : weight_map->items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path.string(), ": weight_map entry of tensor \"", name, "\" is not a file name"));
    }
    TANDEM_RETURN_IF_ERROR(CheckShardName(index_path, shard.get<std::string>()));
    shards[shard.get<std::string>()].push_back(name);
  }
  return shards;
}

// Writes `chunks` to <path>.tmp, then renames it over `path`: a reader (or a
// crash) never sees a half-written file under the final name.
absl::Status WriteFileAtomically(const fs::path& path, const std::vector<std::string_view>& chunks) {
  fs::path tmp = path;
  tmp += ".tmp";
  std::error_code ignored;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp.string()));
    for (std::string_view chunk : chunks) out.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    out.close();
    if (!out) {
      const int error = errno;
      fs::remove(tmp, ignored);
      return absl::ErrnoToStatus(error, absl::StrCat("cannot write ", tmp.string()));
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ignored);
    return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot rename ", tmp.string(), " to ", path.string()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const fs::path& path) {
  // O_NONBLOCK: a fifo planted under a shard's name must not hang the open
  // (it is refused below as not a regular file).
  ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path.string()));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot stat ", path.string()));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": not a regular file"));
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < 8) {
    return absl::DataLossError(
        absl::StrCat(path.string(), ": ", file_bytes, " bytes, shorter than the 8-byte header length (truncated?)"));
  }

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  if (mapping == MAP_FAILED) return absl::ErrnoToStatus(errno, absl::StrCat("cannot mmap ", path.string()));
  file->mapping_ = mapping;  // from here on the destructor unmaps, on errors too
  file->mapping_bytes_ = file_bytes;
  const auto* bytes = static_cast<const uint8_t*>(mapping);

  uint64_t header_bytes = 0;  // little-endian whatever the host
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | bytes[i];
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": header length ", header_bytes,
                                                   " exceeds the 100 MB limit (not a safetensors file?)"));
  }
  if (header_bytes > file_bytes - 8) {
    return absl::DataLossError(absl::StrCat(path.string(), ": header length ", header_bytes, " but only ",
                                            file_bytes - 8, " bytes follow it (truncated?)"));
  }

  const auto* header_text = reinterpret_cast<const char*>(bytes + 8);
  TANDEM_ASSIGN_OR_RETURN(const json header, ParseJsonUniqueKeys(header_text, header_text + header_bytes,
                                                                 absl::StrCat(path.string(), ": header")));
  if (!header.is_object()) return absl::InvalidArgumentError(absl::StrCat(path.string(), ": header is not an object"));

  const uint8_t* data = bytes + 8 + header_bytes;
  const uint64_t data_bytes = file_bytes - 8 - header_bytes;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      TANDEM_RETURN_IF_ERROR(ParseMetadata(path, entry, &file->metadata_));
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(TensorView view, ParseTensor(path, name, entry, data, data_bytes));
    file->tensors_.emplace(name, std::move(view));
  }
  TANDEM_RETURN_IF_ERROR(CheckNoOverlap(path, file->tensors_));
  file->fd_ = std::move(fd);
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

absl::StatusOr<TensorView> SafetensorsFile::Get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat(Where(path_, name), ": not found"));
  return it->second;
}

bool SafetensorsFile::Holds(const void* p) const {
  const auto* base = static_cast<const uint8_t*>(mapping_);
  const auto* at = static_cast<const uint8_t*>(p);
  return base != nullptr && at >= base && at < base + mapping_bytes_;
}

absl::Status SafetensorsFile::ReadInto(absl::Span<const uint8_t> range, uint8_t* out, ThreadPool* pool) const {
  return ReadMappedRange(fd_.get(), path_.string(), {static_cast<const uint8_t*>(mapping_), mapping_bytes_}, range, out,
                         pool);
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(const fs::path& model_dir) {
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    return absl::NotFoundError(absl::StrCat(model_dir.string(), ": not a directory (model checkpoint expected)"));
  }
  std::unique_ptr<SafetensorsCheckpoint> checkpoint(new SafetensorsCheckpoint());
  checkpoint->dir_ = model_dir;
  auto add_file = [&](const fs::path& path) -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
    for (const auto& tensor : file->tensors()) {
      const std::string& name = tensor.first;  // a named reference: clang 14 cannot capture a structured binding
      if (!checkpoint->tensors_.emplace(name, tensor.second).second) {
        const auto holder = std::find_if(checkpoint->files_.begin(), checkpoint->files_.end(),
                                         [&](const auto& f) { return f->tensors().contains(name); });
        return absl::InvalidArgumentError(absl::StrCat(Where(path, name), ": also in ", (*holder)->path().string()));
      }
    }
    checkpoint->files_.push_back(std::move(file));
    return absl::OkStatus();
  };

  const fs::path index_path = model_dir / kIndexFileName;
  if (fs::exists(index_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(const auto shards, ReadIndex(index_path));
    for (const auto& [shard, names] : shards) {
      const fs::path shard_path = model_dir / shard;
      TANDEM_RETURN_IF_ERROR(CheckInsideModelDir(model_dir, shard_path));
      if (!fs::exists(shard_path, ec)) {
        return absl::NotFoundError(absl::StrCat(index_path.string(), ": shard \"", shard, "\" (holding tensor \"",
                                                names.front(), "\" and ", names.size() - 1, " more) is missing: no ",
                                                shard_path.string()));
      }
      TANDEM_RETURN_IF_ERROR(add_file(shard_path));
      const SafetensorsFile& file = *checkpoint->files_.back();
      for (const std::string& name : names) {
        if (!file.tensors().contains(name)) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(shard_path, name), ": listed in ", index_path.string(), " but absent from the shard"));
        }
      }
    }
    return checkpoint;
  }

  std::vector<fs::path> paths;
  fs::directory_iterator it(model_dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    // Whatever is not a readable regular file (a broken Hugging Face cache
    // link, say) fails in SafetensorsFile::Open with its own name.
    if (it->path().extension() == ".safetensors") paths.push_back(it->path());
  }
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot list ", model_dir.string()));
  if (paths.empty()) {
    return absl::NotFoundError(absl::StrCat(model_dir.string(), ": no *.safetensors files and no ", kIndexFileName));
  }
  std::sort(paths.begin(), paths.end());
  for (const fs::path& path : paths) {
    TANDEM_RETURN_IF_ERROR(CheckInsideModelDir(model_dir, path));
    TANDEM_RETURN_IF_ERROR(add_file(path));
  }
  return checkpoint;
}

absl::StatusOr<TensorView> SafetensorsCheckpoint::Get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor \"", name, "\" not found in checkpoint ", dir_.string()));
  }
  return it->second;
}

absl::Status SafetensorsCheckpoint::CopyToMemory(const std::vector<std::string>& names, int64_t budget_bytes,
                                                 ThreadPool* pool) {
  for (const std::string& name : names) {
    auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second.size_bytes == 0) continue;
    TensorView& view = it->second;
    const auto file = std::find_if(files_.begin(), files_.end(), [&](const auto& f) { return f->Holds(view.data); });
    if (file == files_.end()) continue;  // copied already
    const int64_t bytes = static_cast<int64_t>(view.size_bytes);
    uint8_t* out = copied_bytes_ + bytes <= budget_bytes ? arena_.Allocate(view.size_bytes) : nullptr;
    if (out == nullptr) {  // over the budget, or no memory to map
      left_mapped_bytes_ += bytes;
      continue;
    }
    if (absl::Status read = (*file)->ReadInto({static_cast<const uint8_t*>(view.data), view.size_bytes}, out, pool);
        !read.ok()) {
      return absl::Status(read.code(), absl::StrCat("tensor ", name, ": ", read.message()));
    }
    view.data = out;
    copied_bytes_ += bytes;
  }
  return absl::OkStatus();
}

std::vector<std::string> SafetensorsCheckpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

absl::Status WriteSafetensors(const fs::path& path, const std::vector<const TensorToWrite*>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // Header keys come out sorted (readers go by data_offsets); the data keeps
  // the given order.
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite* t : tensors) {
    if (t->name == "__metadata__" || header.contains(t->name)) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, t->name), ": name reserved or repeated"));
    }
    const absl::StatusOr<uint64_t> bytes = ShapeBytes(t->shape, t->dtype);
    if (!bytes.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, t->name), ": ", bytes.status().message()));
    }
    if (*bytes != t->data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, t->name), ": ", std::string(DTypeName(t->dtype)), " ",
                                                     ShapeString(t->shape), " needs ", *bytes, " bytes but data holds ",
                                                     t->data.size()));
    }
    header[t->name] = {
        {"dtype", std::string(DTypeName(t->dtype))}, {"shape", t->shape}, {"data_offsets", {offset, offset + *bytes}}};
    offset += *bytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {  // names and metadata must be valid UTF-8
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": cannot encode header: ", e.what()));
  }
  // Padding to 8 bytes keeps the data section aligned for every dtype, as the
  // reference implementation does; JSON ignores the trailing spaces.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string length(8, '\0');
  for (size_t i = 0; i < 8; ++i) length[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);

  std::vector<std::string_view> chunks = {length, text};
  for (const TensorToWrite* t : tensors) {
    chunks.emplace_back(reinterpret_cast<const char*>(t->data.data()), t->data.size());
  }
  return WriteFileAtomically(path, chunks);
}

absl::Status WriteSafetensorsCheckpoint(const fs::path& model_dir, const std::vector<const TensorToWrite*>& tensors,
                                        int num_shards) {
  const int64_t num_tensors = static_cast<int64_t>(tensors.size());
  if (num_shards < 1 || (num_shards > 1 && num_shards > num_tensors)) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir.string(), ": cannot split ", num_tensors, " tensors into ", num_shards, " shards"));
  }
  std::error_code ec;
  fs::create_directories(model_dir, ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create ", model_dir.string()));
  if (num_shards == 1) {
    // A leftover index would make readers ignore the new single file.
    const fs::path stale_index = model_dir / kIndexFileName;
    fs::remove(stale_index, ec);
    if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot remove stale ", stale_index.string()));
    return WriteSafetensors(model_dir / "model.safetensors", tensors);
  }

  uint64_t total_bytes = 0;
  for (const TensorToWrite* t : tensors) total_bytes += t->data.size();
  // A tensor goes to the shard whose equal slice of the total holds its first
  // byte, clamped so that no shard is skipped and enough tensors remain to
  // give every later shard one.
  std::vector<std::vector<const TensorToWrite*>> shards(num_shards);
  auto shard_name = [&](int64_t s) { return absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, num_shards); };
  json weight_map = json::object();
  int64_t shard = 0;
  uint64_t start = 0;
  for (int64_t i = 0; i < num_tensors; ++i) {
    const auto by_bytes =
        total_bytes == 0 ? int64_t{0} : static_cast<int64_t>(static_cast<double>(start) / total_bytes * num_shards);
    shard = std::clamp(by_bytes, std::max(shard, num_shards - (num_tensors - i)),
                       std::min(shard + 1, int64_t{num_shards} - 1));
    const TensorToWrite* t = tensors[i];
    if (weight_map.contains(t->name)) {
      return absl::InvalidArgumentError(absl::StrCat(model_dir.string(), ": tensor \"", t->name, "\" given twice"));
    }
    weight_map[t->name] = shard_name(shard);
    shards[shard].push_back(t);
    start += t->data.size();
  }
  for (int s = 0; s < num_shards; ++s) {
    TANDEM_RETURN_IF_ERROR(WriteSafetensors(model_dir / shard_name(s), shards[s]));
  }
  // Written last: an index never names a shard that is not there yet. The
  // names already went through a JSON dump in WriteSafetensors, so this dump
  // cannot throw.
  const json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  const std::string text = index.dump(2) + "\n";
  return WriteFileAtomically(model_dir / kIndexFileName, {text});
}

}  // namespace tandem
