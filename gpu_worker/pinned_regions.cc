#include "gpu_worker/pinned_regions.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/dtype.h"

namespace tandem {

std::vector<PinnedHostRegion> ExpertHostRegions(const ExpertSources& experts, size_t page_bytes) {
  // [begin, end) of whole pages, as integers so that rounding is exact.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  const uintptr_t mask = ~static_cast<uintptr_t>(page_bytes - 1);
  for (const std::vector<ExpertSource>& layer : experts) {
    for (const ExpertSource& expert : layer) {
      for (const auto& [pieces, dtype] :
           {std::pair{&expert.w1, expert.w1_dtype}, std::pair{&expert.w3, expert.w3_dtype},
            std::pair{&expert.w2, expert.w2_dtype}}) {
        for (const MatrixPiece& piece : *pieces) {
          if (piece.data == nullptr || piece.rows <= 0 || piece.cols <= 0) continue;
          const uintptr_t begin = reinterpret_cast<uintptr_t>(piece.data);
          const uintptr_t end = begin + piece.SpanBytes(dtype);
          ranges.emplace_back(begin & mask, (end + page_bytes - 1) & mask);
        }
      }
    }
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<PinnedHostRegion> regions;
  uintptr_t begin = 0, end = 0;
  for (const auto& [b, e] : ranges) {
    if (end != 0 && b <= end) {  // touches or overlaps the current region
      end = std::max(end, e);
      continue;
    }
    if (end != 0) regions.push_back({reinterpret_cast<const void*>(begin), static_cast<size_t>(end - begin)});
    begin = b;
    end = e;
  }
  if (end != 0) regions.push_back({reinterpret_cast<const void*>(begin), static_cast<size_t>(end - begin)});
  return regions;
}

const char* HostPinModeName(HostPinMode mode) {
  switch (mode) {
    case HostPinMode::kReadOnly: return "read-only registration";
    case HostPinMode::kReadWrite: return "plain registration";
    case HostPinMode::kPageable: return "pageable";
  }
  return "?";
}

HostPinMode ChooseHostPinMode(bool read_only_register_supported, bool mapping_writable_in_place) {
  if (read_only_register_supported) return HostPinMode::kReadOnly;
  if (mapping_writable_in_place) return HostPinMode::kReadWrite;
  return HostPinMode::kPageable;
}

absl::StatusOr<std::string> ReadSelfMemoryMap() {
  std::ifstream in("/proc/self/maps");
  if (!in.is_open()) return absl::InternalError("cannot open /proc/self/maps");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.fail() || text.str().empty()) return absl::InternalError("cannot read /proc/self/maps");
  return text.str();
}

namespace {

// One line of a maps file: "lo-hi perms offset dev inode [path]".
struct MapsLine {
  uintptr_t lo = 0, hi = 0;
  bool writable = false, shared = false, anonymous = false;
};

bool ParseHex(std::string_view s, uintptr_t* out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

absl::StatusOr<MapsLine> ParseMapsLine(std::string_view line) {
  auto bad = [&] {
    return absl::DataLossError(absl::StrCat("memory map line does not parse: \"", std::string(line), "\""));
  };
  // Fields separated by runs of spaces; the path (field 6) may contain spaces.
  std::vector<std::string_view> fields;
  size_t at = 0;
  while (fields.size() < 5 && at < line.size()) {
    const size_t start = line.find_first_not_of(' ', at);
    if (start == std::string_view::npos) break;
    const size_t stop = std::min(line.find(' ', start), line.size());
    fields.push_back(line.substr(start, stop - start));
    at = stop;
  }
  if (fields.size() < 5 || fields[1].size() < 4) return bad();
  const size_t dash = fields[0].find('-');
  MapsLine out;
  if (dash == std::string_view::npos || !ParseHex(fields[0].substr(0, dash), &out.lo) ||
      !ParseHex(fields[0].substr(dash + 1), &out.hi) || out.hi < out.lo) {
    return bad();
  }
  out.writable = fields[1][1] == 'w';
  out.shared = fields[1][3] == 's';
  out.anonymous = fields[4] == "0";  // no inode: anonymous memory (heap, mmap(MAP_ANONYMOUS), stack)
  return out;
}

}  // namespace

absl::StatusOr<bool> RangeWritableInPlace(std::string_view memory_map, const void* data, size_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data), end = begin + bytes;
  const std::string range = absl::StrFormat("host range [%p, +%d bytes)", data, bytes);
  if (bytes == 0 || end < begin) return absl::InvalidArgumentError(absl::StrCat(range, " is empty or wraps"));
  // The kernel lists mappings in address order: walk them, covering
  // [begin, end) from `covered` on.
  uintptr_t covered = begin;
  bool writable = true;
  size_t at = 0;
  while (at < memory_map.size() && covered < end) {
    size_t stop = memory_map.find('\n', at);
    if (stop == std::string_view::npos) stop = memory_map.size();
    const std::string_view line = memory_map.substr(at, stop - at);
    at = stop + 1;
    if (line.empty()) continue;
    absl::StatusOr<MapsLine> m = ParseMapsLine(line);
    if (!m.ok()) return m.status();
    if (m->hi <= covered) continue;
    if (m->lo > covered) break;  // a hole
    writable &= m->writable && (m->shared || m->anonymous);
    covered = m->hi;
  }
  if (covered < end) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s is not mapped in this process from %#x on", range, static_cast<uint64_t>(covered)));
  }
  return writable;
}

}  // namespace tandem
