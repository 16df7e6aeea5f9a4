// Keeps a published health status true to the server's state: a thread
// calls `check` every `interval` and hands each result to `publish` (in
// tandem-server, the grpc.health.v1 service's SetServingStatus), logging
// every change. The check may block (it probes the CPU workers with a short
// deadline); the published status is at most one interval plus one check old.
#pragma once

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

// Owns its thread; Stop (or the destructor) joins it, after which `publish`
// is never called again. Stop may be called from any thread.
class HealthMonitor {
 public:
  // `check` returns whether the server can serve, and why not in `*reason`.
  HealthMonitor(std::function<bool(std::string* reason)> check, std::function<void(bool serving)> publish,
                absl::Duration interval);
  ~HealthMonitor() { Stop(); }
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  std::function<bool(std::string*)> check_;
  std::function<void(bool)> publish_;
  absl::Duration interval_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // stop_
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the rest exists
};

}  // namespace tandem
