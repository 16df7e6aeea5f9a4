#include "coordinator/inference_service_watchdog.h"

#include "common/base/log.h"

namespace tandem {
namespace {
// How often blocked writes are looked at: a fraction of any sensible limit.
constexpr auto kCheckEvery = std::chrono::milliseconds(250);
}  // namespace

WriteWatchdog::WriteWatchdog(absl::Duration limit) : limit_(limit), thread_([this] { Loop(); }) {}

WriteWatchdog::~WriteWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

WriteWatchdog::Guard WriteWatchdog::Watch(grpc::ServerContext* context) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  writes_.emplace(id, Write{context, std::chrono::steady_clock::now()});
  return Guard(this, id);
}

WriteWatchdog::Guard::~Guard() {
  // Under the lock, so the watchdog never touches a context whose call has returned.
  std::lock_guard<std::mutex> lock(watchdog_->mu_);
  watchdog_->writes_.erase(id_);
}

void WriteWatchdog::Loop() {
  const auto limit = absl::ToChronoNanoseconds(limit_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, kCheckEvery, [&] { return stopping_; });
    const auto now = std::chrono::steady_clock::now();
    for (auto it = writes_.begin(); it != writes_.end();) {
      if (now - it->second.since < limit) {
        ++it;
        continue;
      }
      LOG_INFO("gRPC call from ", it->second.context->peer(), ": the client took no response for ",
               absl::FormatDuration(limit_), "; call cancelled");
      it->second.context->TryCancel();
      it = writes_.erase(it);
    }
  }
}

}  // namespace tandem
