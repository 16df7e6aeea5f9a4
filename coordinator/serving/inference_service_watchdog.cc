#include "coordinator/serving/inference_service_watchdog.h"

#include "common/base/log.h"

namespace tandem {
namespace {
// How often blocked writes are looked at: a fraction of any sensible limit.
constexpr absl::Duration kCheckEvery = absl::Milliseconds(250);
}  // namespace

WriteWatchdog::WriteWatchdog(absl::Duration limit) : limit_(limit), thread_([this] { Loop(); }) {}

WriteWatchdog::~WriteWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

WriteWatchdog::Guard WriteWatchdog::Watch(grpc::ServerContext* context) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  writes_.emplace(id, Write{context, std::chrono::steady_clock::now()});
  return Guard(this, id);
}

WriteWatchdog::Guard::~Guard() {
  // Under the lock, so the watchdog never touches a context whose call has returned.
  absl::MutexLock lock(&watchdog_->mu_);
  watchdog_->writes_.erase(id_);
}

void WriteWatchdog::Loop() {
  const auto limit = absl::ToChronoNanoseconds(limit_);
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    const absl::Time deadline = absl::Now() + kCheckEvery;
    while (!stopping_ && !cv_.WaitWithDeadline(&mu_, deadline)) {
    }
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
