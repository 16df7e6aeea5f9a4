#include "coordinator/serving/health_monitor.h"

#include <optional>

#include "common/base/log.h"

namespace tandem {

HealthMonitor::HealthMonitor(std::function<bool(std::string* reason)> check, std::function<void(bool serving)> publish,
                             absl::Duration interval)
    : check_(std::move(check)), publish_(std::move(publish)), interval_(interval), thread_([this] { Loop(); }) {}

void HealthMonitor::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

void HealthMonitor::Loop() {
  std::optional<bool> published;
  mu_.Lock();
  while (!stop_) {
    mu_.Unlock();
    std::string reason;
    const bool serving = check_(&reason);
    mu_.Lock();
    if (stop_) break;  // never publish after Stop: the server may be shutting down
    if (published != serving) {
      if (published.has_value()) {
        if (serving) {
          LOG_INFO("health: SERVING again");
        } else {
          LOG_WARNING("health: NOT_SERVING: ", reason);
        }
      }
      publish_(serving);
      published = serving;
    }
    const absl::Time deadline = absl::Now() + interval_;
    while (!stop_ && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
  }
  mu_.Unlock();
}

}  // namespace tandem
