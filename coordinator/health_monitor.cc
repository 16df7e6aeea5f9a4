#include "coordinator/health_monitor.h"

#include <optional>

#include "common/base/log.h"

namespace tandem {

HealthMonitor::HealthMonitor(std::function<bool(std::string* reason)> check, std::function<void(bool serving)> publish,
                             absl::Duration interval)
    : check_(std::move(check)), publish_(std::move(publish)), interval_(interval), thread_([this] { Loop(); }) {}

void HealthMonitor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HealthMonitor::Loop() {
  std::optional<bool> published;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    std::string reason;
    const bool serving = check_(&reason);
    lock.lock();
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
    cv_.wait_for(lock, absl::ToChronoNanoseconds(interval_), [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stop_; });
  }
}

}  // namespace tandem
