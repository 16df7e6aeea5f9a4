#include "cpu_worker/expert_call_stats.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"

namespace tandem {

absl::Status ExpertCallRecorder::RunAndRecord(int layer, std::span<const ExpertWork> work,
                                              const std::function<absl::Status(const ExpertWork&)>& run_one) {
  const auto start = std::chrono::steady_clock::now();
  ExpertCallStats call;
  call.calls = 1;
  for (const ExpertWork& entry : work) {
    if (entry.num_rows == 0) continue;  // an expert with no rows changes nothing
    absl::Status status = run_one(entry);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat("layer ", layer, " expert ", entry.expert, ": ", status.message()));
    }
    ++call.experts;
    call.rows += entry.num_rows;
  }
  call.time_us = NanosSince(start) / 1000;
  Record(call);
  return absl::OkStatus();
}

absl::Status ExpertCallRecorder::RunBatchAndRecord(
    int layer, std::span<const ExpertWork> work,
    const std::function<absl::Status(std::span<const ExpertWork>)>& run_all) {
  const auto start = std::chrono::steady_clock::now();
  ExpertCallStats call;
  call.calls = 1;
  for (const ExpertWork& entry : work) {
    if (entry.num_rows == 0) continue;
    ++call.experts;
    call.rows += entry.num_rows;
  }
  absl::Status status = run_all(work);
  if (!status.ok()) return absl::Status(status.code(), absl::StrCat("layer ", layer, " ", status.message()));
  call.time_us = NanosSince(start) / 1000;
  Record(call);
  return absl::OkStatus();
}

void ExpertCallRecorder::Record(const ExpertCallStats& call) {
  absl::MutexLock lock(&mutex_);
  last_call_ = call;
  totals_.calls += call.calls;
  totals_.experts += call.experts;
  totals_.rows += call.rows;
  totals_.time_us += call.time_us;
}

ExpertCallStats ExpertCallRecorder::totals() const {
  absl::MutexLock lock(&mutex_);
  return totals_;
}

ExpertCallStats ExpertCallRecorder::last_call() const {
  absl::MutexLock lock(&mutex_);
  return last_call_;
}

void ExpertCallRecorder::Reset() {
  absl::MutexLock lock(&mutex_);
  totals_ = {};
  last_call_ = {};
}

}  // namespace tandem
