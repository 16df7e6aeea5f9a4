#include "common/base/progress.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/base/log.h"

namespace tandem {
namespace {

std::atomic<int64_t> g_interval_ns{absl::ToInt64Nanoseconds(absl::Seconds(2))};

// The reporters alive now, oldest first (nested steps: a load that fills
// the expert store while generating).
struct ReporterRegistry {
  absl::Mutex mu;
  std::vector<const ProgressReporter*> reporters ABSL_GUARDED_BY(mu);
};

ReporterRegistry& Registry() {
  static ReporterRegistry* registry = new ReporterRegistry();
  return *registry;
}

int64_t NanosSinceStart(SteadyClock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now() - start).count();
}

}  // namespace

std::string ProgressSnapshot::ToString() const {
  constexpr double kGB = 1e9;
  std::string out = absl::StrFormat("%.2f of %.2f GB (%.0f%%), %.2f GB/s", done_bytes / kGB, total_bytes / kGB,
                                    100.0 * fraction(), bytes_per_s / kGB);
  if (eta_s >= 0) absl::StrAppendFormat(&out, ", ETA %.0f s", eta_s);
  return out;
}

void SetProgressLogInterval(absl::Duration interval) {
  g_interval_ns.store(std::max<int64_t>(0, absl::ToInt64Nanoseconds(interval)), std::memory_order_relaxed);
}

absl::Duration ProgressLogInterval() { return absl::Nanoseconds(g_interval_ns.load(std::memory_order_relaxed)); }

ProgressReporter::ProgressReporter(std::string what, int64_t total_bytes)
    : what_(std::move(what)),
      total_bytes_(std::max<int64_t>(0, total_bytes)),
      start_(SteadyClock::now()),
      next_log_ns_(g_interval_ns.load(std::memory_order_relaxed)) {
  ReporterRegistry& registry = Registry();
  absl::MutexLock lock(&registry.mu);
  registry.reporters.push_back(this);
}

ProgressReporter::~ProgressReporter() {
  {
    ReporterRegistry& registry = Registry();
    absl::MutexLock lock(&registry.mu);
    std::erase(registry.reporters, this);
  }
  const ProgressSnapshot s = Snapshot();
  LOG_INFO(what_, ": done, ",
           absl::StrFormat("%.2f GB in %.1f s (%.2f GB/s)", s.done_bytes / 1e9, s.elapsed_s, s.bytes_per_s / 1e9));
}

void ProgressReporter::Add(int64_t bytes) {
  done_.fetch_add(bytes, std::memory_order_relaxed);
  const int64_t now = NanosSinceStart(start_);
  int64_t due = next_log_ns_.load(std::memory_order_relaxed);
  if (now < due) return;
  // One thread wins the line; the others go back to work.
  if (!next_log_ns_.compare_exchange_strong(due, now + g_interval_ns.load(std::memory_order_relaxed))) return;
  absl::MutexLock lock(&log_mu_);
  LOG_INFO(what_, ": ", Snapshot().ToString());
}

ProgressSnapshot ProgressReporter::Snapshot() const {
  ProgressSnapshot s;
  s.active = true;
  s.what = what_;
  s.total_bytes = total_bytes_;
  s.done_bytes = std::min(done_.load(std::memory_order_relaxed), total_bytes_);
  s.elapsed_s = SecondsSince(start_);
  s.bytes_per_s = s.elapsed_s > 0 ? s.done_bytes / s.elapsed_s : 0;
  if (s.bytes_per_s > 0) s.eta_s = (total_bytes_ - s.done_bytes) / s.bytes_per_s;
  return s;
}

ProgressSnapshot CurrentProgress() {
  ReporterRegistry& registry = Registry();
  absl::MutexLock lock(&registry.mu);
  if (registry.reporters.empty()) return {};
  return registry.reporters.back()->Snapshot();
}

}  // namespace tandem
