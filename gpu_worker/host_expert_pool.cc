#include "gpu_worker/host_expert_pool.h"

#include <pthread.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"

namespace tandem {

void HostExpertPool::AlignedFree::operator()(uint8_t* p) const { std::free(p); }

absl::StatusOr<std::unique_ptr<HostExpertPool>> HostExpertPool::Create(
    const ModelConfig& config, const std::vector<std::vector<ExpertWeights>>& experts, ExpertKernel kernel,
    const ExpertPoolOptions& options) {
  TANDEM_RETURN_IF_ERROR(CheckExperts(config, experts).status());
  return Create(config, WholeExperts(experts), std::move(kernel), options);
}

absl::StatusOr<std::unique_ptr<HostExpertPool>> HostExpertPool::Create(const ModelConfig& config, ExpertSources experts,
                                                                       ExpertKernel kernel,
                                                                       const ExpertPoolOptions& options) {
  if (!kernel) return absl::InvalidArgumentError("kernel: the pool needs a kernel to compute the experts it holds");
  // Any types ExpertFfn computes, float or block-quantized: the kernel is
  // the CPU executor's own.
  TANDEM_ASSIGN_OR_RETURN(ExpertLayouts layouts, CheckExpertSources(config, experts));
  const int64_t buffer_bytes = MaxBufferBytes(layouts);
  TANDEM_ASSIGN_OR_RETURN(const int num_slots, options.SlotCount(buffer_bytes));
  auto pool = std::unique_ptr<HostExpertPool>(new HostExpertPool(
      config, std::move(experts), std::move(kernel), std::move(layouts), num_slots, options.num_staging_buffers));
  const int total = num_slots + options.num_staging_buffers;
  pool->data_.resize(static_cast<size_t>(total));
  for (int b = 0; b < total; ++b) {
    void* p = std::aligned_alloc(kExpertBufferAlignment, static_cast<size_t>(buffer_bytes));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("no host memory for expert buffer ", b, " of ", total, " (", buffer_bytes, " bytes each)"));
    }
    pool->data_[static_cast<size_t>(b)].reset(static_cast<uint8_t*>(p));
  }
  pool->copy_thread_ = std::thread([p = pool.get()] { p->CopyLoop(); });
  LOG_INFO(kHostPoolKind, ": ", num_slots, " slots + ", options.num_staging_buffers, " staging buffers of ",
           absl::StrFormat("%.2f MB", buffer_bytes / 1e6), " in host memory (experts ", pool->layout(0).DTypeNames(),
           pool->layout(0).quantized() ? ", as their blocks" : "",
           "); experts it holds run on the coordinator's CPU from the pool's copy");
  return pool;
}

HostExpertPool::HostExpertPool(const ModelConfig& config, ExpertSources experts, ExpertKernel kernel,
                               ExpertLayouts layouts, int num_slots, int num_staging)
    : SlotPool(kHostPoolKind, std::move(experts), static_cast<int>(config.num_local_experts), std::move(layouts),
               num_slots, num_staging),
      kernel_(std::move(kernel)) {}

HostExpertPool::~HostExpertPool() {
  StopCopies();
  if (copy_thread_.joinable()) copy_thread_.join();
}

void HostExpertPool::CopyExpert(ExpertKey key, uint8_t* dst) const {
  const ExpertSource& src = source(key);
  const ExpertLayout& l = layout(key.layer);
  GatherMatrixPieces(src.w1, l.w1_dtype, l.hidden_size, dst + l.w1_offset);
  GatherMatrixPieces(src.w3, l.w3_dtype, l.hidden_size, dst + l.w3_offset);
  GatherMatrixPieces(src.w2, l.w2_dtype, l.intermediate_size, dst + l.w2_offset);
}

ExpertWeights HostExpertPool::BufferWeights(const uint8_t* data, ExpertKey key) const {
  const ExpertLayout& l = layout(key.layer);
  const ExpertSource& src = source(key);  // the copy keeps its blocks' order
  const int64_t d = l.hidden_size, i = l.intermediate_size;
  ExpertWeights w;
  w.w1 = LinearWeight{data + l.w1_offset, l.w1_dtype, i, d, src.w1_order};
  w.w3 = LinearWeight{data + l.w3_offset, l.w3_dtype, i, d, src.w3_order};
  w.w2 = LinearWeight{data + l.w2_offset, l.w2_dtype, d, i, src.w2_order};
  return w;
}

absl::Status HostExpertPool::CopyNowLocked(int buffer, ExpertKey key) {
  CopyExpert(key, data_[static_cast<size_t>(buffer)].get());
  return absl::OkStatus();
}

absl::StatusOr<ExpertWeights> HostExpertPool::HeldWeights(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "held weights"));
  absl::MutexLock lock(&mutex());
  TANDEM_ASSIGN_OR_RETURN(const int b, WaitHeldLocked(key));
  return BufferWeights(data_[static_cast<size_t>(b)].get(), key);
}

absl::Status HostExpertPool::RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) {
  TANDEM_RETURN_IF_ERROR(CheckWork(layer, work).status());
  PoolRunTiming local;
  for (const ExpertWork& entry : work) {
    if (entry.num_rows == 0) continue;
    const ExpertKey key{layer, entry.expert};
    const auto wait_start = std::chrono::steady_clock::now();
    const uint8_t* data = nullptr;
    bool staging = false;
    {
      absl::MutexLock lock(&mutex());
      const int position = PositionLocked(key);
      const int b = BufferAtLocked(position);
      TANDEM_RETURN_IF_ERROR(WaitCopiedLocked(b, key));
      data = data_[static_cast<size_t>(b)].get();
      staging = IsStaging(position);
    }
    const auto compute_start = std::chrono::steady_clock::now();
    local.wait_us += MicrosBetween(wait_start, compute_start);
    // The buffer stays put: only this (the control) thread moves or frees it.
    TANDEM_RETURN_IF_ERROR(kernel_(BufferWeights(data, key), entry.input, entry.num_rows, entry.output));
    local.compute_us += MicrosSince(compute_start);
    ++(staging ? local.staging_runs : local.slot_runs);
  }
  RecordRun(local);
  if (timing != nullptr) *timing = local;
  return absl::OkStatus();
}

void HostExpertPool::CopyLoop() {
  pthread_setname_np(pthread_self(), "pool-copy");
  mutex().Lock();
  while (std::optional<CopyTask> task = NextCopyLocked()) {
    uint8_t* dst = data_[static_cast<size_t>(task->buffer)].get();
    mutex().Unlock();
    // The buffer is kCopying: nobody else reads or writes it until it is ready.
    const double start = NowUs();
    CopyExpert(task->expert, dst);
    const double end = NowUs();
    mutex().Lock();
    CopyDoneLocked(*task, start, end - start);
  }
  mutex().Unlock();
}

}  // namespace tandem
