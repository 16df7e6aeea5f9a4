// Ends gRPC calls whose response Write has been blocked too long. gRPC's
// flow control blocks ServerWriter::Write while the client's window is
// full, and only the client (reading, cancelling, disconnecting, its
// deadline) releases it: a client that never reads and set no deadline
// would hold an RPC thread forever. The scheduler stops such a request
// after --max_stall_s (RESOURCE_EXHAUSTED, KV cache freed; a client that
// reads soon after still gets that status); this lets go of the thread.
// Owns one thread; Watch may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <thread>

#include <grpcpp/server_context.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tandem {

class WriteWatchdog {
 public:
  explicit WriteWatchdog(absl::Duration limit);
  ~WriteWatchdog();
  WriteWatchdog(const WriteWatchdog&) = delete;
  WriteWatchdog& operator=(const WriteWatchdog&) = delete;

  // While a Guard lives (around one Write), its call is cancelled
  // (TryCancel: the Write returns false) once the guard is `limit` old.
  class Guard {
   public:
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    friend class WriteWatchdog;
    Guard(WriteWatchdog* watchdog, uint64_t id) : watchdog_(watchdog), id_(id) {}
    WriteWatchdog* watchdog_;
    uint64_t id_;
  };
  [[nodiscard]] Guard Watch(grpc::ServerContext* context) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Duration limit() const { return limit_; }

 private:
  struct Write {
    grpc::ServerContext* context;
    std::chrono::steady_clock::time_point since;
  };
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration limit_;
  absl::Mutex mu_;
  absl::CondVar cv_;  // stopping_
  std::map<uint64_t, Write> writes_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace tandem
