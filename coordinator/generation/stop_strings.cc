#include "coordinator/generation/stop_strings.h"

#include <algorithm>

namespace tandem {

StopStringMatcher::Result StopStringMatcher::Push(std::string_view piece) {
  Result result;
  held_.append(piece);
  if (stops_.empty()) {
    result.emit.swap(held_);
    return result;
  }
  // The earliest stop string wins; everything streamed before held_ was
  // already checked not to contain or begin one.
  size_t first = std::string::npos;
  for (const std::string& stop : stops_) {
    if (stop.empty()) continue;
    first = std::min(first, held_.find(stop));
  }
  if (first != std::string::npos) {
    result.emit = held_.substr(0, first);
    result.stopped = true;
    held_.clear();
    return result;
  }
  // Keep the longest tail of held_ that some stop string starts with.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    const size_t longest = std::min(stop.size() - (stop.empty() ? 0 : 1), held_.size());
    for (size_t n = longest; n > keep; --n) {
      if (std::string_view(held_).substr(held_.size() - n) == std::string_view(stop).substr(0, n)) {
        keep = n;
        break;
      }
    }
  }
  result.emit = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return result;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace tandem
