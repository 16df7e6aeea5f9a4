#include "gpu_worker/host_expert_pool.h"

#include <pthread.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace tandem {
namespace {

// A copy that has not finished in this long is a bug, not a slow copy: fail
// the step rather than hang it.
constexpr auto kReadyTimeout = std::chrono::seconds(60);

std::string KeyName(ExpertKey key) { return absl::StrCat("layer ", key.layer, " expert ", key.expert); }

absl::Status CheckMatrix(const LinearWeight& w, DType dtype, int64_t n, int64_t k, const std::string& name) {
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " has no data"));
  if (w.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is ", std::string(DTypeName(w.dtype)),
                                                   ", the pool's experts are ", std::string(DTypeName(dtype))));
  }
  if (w.n != n || w.k != k) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is [", w.n, ", ", w.k, "], expected [", n, ", ", k, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

void HostExpertPool::AlignedFree::operator()(uint8_t* p) const { std::free(p); }

absl::StatusOr<std::unique_ptr<HostExpertPool>> HostExpertPool::Create(const ModelConfig& config,
                                                                       std::vector<std::vector<ExpertWeights>> experts,
                                                                       ExpertKernel kernel,
                                                                       const ExpertPoolOptions& options) {
  if (experts.empty() || experts[0].empty()) return absl::InvalidArgumentError("experts: the model has no experts");
  if (static_cast<int64_t>(experts.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("experts has ", experts.size(), " layers, the config ",
                                                   config.num_hidden_layers));
  }
  if (!kernel) return absl::InvalidArgumentError("kernel: the pool needs a kernel to compute the experts it holds");
  const DType dtype = experts[0][0].w1.dtype;
  TANDEM_ASSIGN_OR_RETURN(ExpertLayout layout, ExpertLayout::ForModel(config, dtype));
  const int64_t d = layout.hidden_size, i = layout.intermediate_size;
  for (size_t l = 0; l < experts.size(); ++l) {
    if (static_cast<int64_t>(experts[l].size()) != config.num_local_experts) {
      return absl::InvalidArgumentError(absl::StrCat("experts[", l, "] has ", experts[l].size(), " experts, the config ",
                                                     config.num_local_experts));
    }
    for (size_t e = 0; e < experts[l].size(); ++e) {
      const std::string name = absl::StrCat("experts[", l, "][", e, "]");
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w1, dtype, i, d, name + ".w1"));
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w3, dtype, i, d, name + ".w3"));
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w2, dtype, d, i, name + ".w2"));
    }
  }
  TANDEM_ASSIGN_OR_RETURN(const int num_slots, options.SlotCount(layout));
  auto pool = std::unique_ptr<HostExpertPool>(
      new HostExpertPool(config, std::move(experts), std::move(kernel), layout, num_slots, options.num_staging_buffers));
  const int total = num_slots + options.num_staging_buffers;
  pool->buffers_.resize(static_cast<size_t>(total));
  for (int b = 0; b < total; ++b) {
    void* p = std::aligned_alloc(kExpertBufferAlignment, static_cast<size_t>(layout.buffer_bytes));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("no host memory for expert buffer ", b, " of ", total, " (",
                                                       layout.buffer_bytes, " bytes each)"));
    }
    pool->buffers_[static_cast<size_t>(b)].data.reset(static_cast<uint8_t*>(p));
    pool->position_buffer_.push_back(b);
  }
  pool->copy_thread_ = std::thread([p = pool.get()] { p->CopyLoop(); });
  LOG_INFO(kHostPoolKind, ": ", num_slots, " slots + ", options.num_staging_buffers, " staging buffers of ",
           absl::StrFormat("%.2f MB", layout.buffer_bytes / 1e6),
           " in host memory; experts it holds run on the coordinator's CPU from the pool's copy");
  return pool;
}

HostExpertPool::HostExpertPool(const ModelConfig& config, std::vector<std::vector<ExpertWeights>> experts,
                               ExpertKernel kernel, const ExpertLayout& layout, int num_slots, int num_staging)
    : experts_(std::move(experts)),
      num_experts_(static_cast<int>(config.num_local_experts)),
      kernel_(std::move(kernel)),
      layout_(layout),
      num_slots_(num_slots),
      num_staging_(num_staging),
      epoch_(std::chrono::steady_clock::now()),
      where_(experts_.size() * static_cast<size_t>(num_experts_), -1) {
  stats_.kind = kHostPoolKind;
}

HostExpertPool::~HostExpertPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  if (copy_thread_.joinable()) copy_thread_.join();
}

double HostExpertPool::NowUs() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - epoch_).count();
}

absl::Status HostExpertPool::CheckKey(ExpertKey key, const char* what) const {
  if (key.layer < 0 || key.layer >= num_layers() || key.expert < 0 || key.expert >= num_experts_) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", KeyName(key), " is outside the model (", num_layers(),
                                                   " layers x ", num_experts_, " experts)"));
  }
  return absl::OkStatus();
}

void HostExpertPool::CopyExpert(ExpertKey key, uint8_t* dst) const {
  const ExpertWeights& src = experts_[static_cast<size_t>(key.layer)][static_cast<size_t>(key.expert)];
  const size_t bytes = static_cast<size_t>(layout_.matrix_bytes);
  std::memcpy(dst + layout_.w1_offset, src.w1.data, bytes);
  std::memcpy(dst + layout_.w3_offset, src.w3.data, bytes);
  std::memcpy(dst + layout_.w2_offset, src.w2.data, bytes);
}

ExpertWeights HostExpertPool::BufferWeights(const uint8_t* data) const {
  const int64_t d = layout_.hidden_size, i = layout_.intermediate_size;
  ExpertWeights w;
  w.w1 = LinearWeight{data + layout_.w1_offset, layout_.dtype, i, d};
  w.w3 = LinearWeight{data + layout_.w3_offset, layout_.dtype, i, d};
  w.w2 = LinearWeight{data + layout_.w2_offset, layout_.dtype, d, i};
  return w;
}

absl::Status HostExpertPool::WaitBufferLocked(std::unique_lock<std::mutex>& lock, int buffer, ExpertKey key) {
  const bool done = ready_cv_.wait_for(lock, kReadyTimeout, [&] {
    return buffers_[static_cast<size_t>(buffer)].state != BufferState::kCopying;
  });
  if (!done) {
    return absl::DeadlineExceededError(absl::StrCat(kHostPoolKind, ": the copy of ", KeyName(key), " did not finish in ",
                                                    std::chrono::seconds(kReadyTimeout).count(), " s"));
  }
  return absl::OkStatus();
}

void HostExpertPool::EvictPositionLocked(int position) {
  Buffer& buffer = buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(position)])];
  if (buffer.expert) where_[Index(*buffer.expert)] = -1;
  buffer.expert.reset();
  buffer.state = BufferState::kFree;
}

absl::StatusOr<int> HostExpertPool::TakeSlotLocked(std::unique_lock<std::mutex>& lock, std::optional<ExpertKey> evict) {
  if (evict) {
    TANDEM_RETURN_IF_ERROR(CheckKey(*evict, "evict"));
    const int position = where_[Index(*evict)];
    if (position < 0 || IsStaging(position)) {
      return absl::FailedPreconditionError(absl::StrCat("evict: ", KeyName(*evict), " holds no slot"));
    }
    TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, position_buffer_[static_cast<size_t>(position)], *evict));
    EvictPositionLocked(position);
    ++stats_.evictions;
    return position;
  }
  for (int s = 0; s < num_slots_; ++s) {
    if (!buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(s)])].expert) return s;
  }
  return absl::ResourceExhaustedError(absl::StrCat(kHostPoolKind, ": all ", num_slots_, " slots are taken"));
}

void HostExpertPool::Enqueue(std::unique_lock<std::mutex>& lock, int position, ExpertKey key) {
  const int b = position_buffer_[static_cast<size_t>(position)];
  Buffer& buffer = buffers_[static_cast<size_t>(b)];
  buffer.expert = key;
  buffer.state = BufferState::kCopying;
  where_[Index(key)] = position;
  queue_.push_back({b, key, IsStaging(position), NowUs()});
  ++stats_.migrations_started;
  if (IsStaging(position)) ++stats_.staging_copies;
  lock.unlock();
  work_cv_.notify_one();
}

absl::Status HostExpertPool::Place(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "place"));
  std::unique_lock<std::mutex> lock(mutex_);
  if (where_[Index(key)] >= 0) return absl::FailedPreconditionError(absl::StrCat("place: ", KeyName(key), " is already held"));
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(lock, std::nullopt));
  Buffer& buffer = buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(position)])];
  // Synchronous: the buffer is free and nobody else writes it.
  CopyExpert(key, buffer.data.get());
  buffer.expert = key;
  buffer.state = BufferState::kReady;
  where_[Index(key)] = position;
  ++stats_.placements;
  return absl::OkStatus();
}

absl::Status HostExpertPool::Migrate(ExpertKey key, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "migrate"));
  std::unique_lock<std::mutex> lock(mutex_);
  if (where_[Index(key)] >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("migrate: ", KeyName(key), " is already held"));
  }
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(lock, evict));
  Enqueue(lock, position, key);
  return absl::OkStatus();
}

absl::Status HostExpertPool::Stage(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "stage"));
  std::unique_lock<std::mutex> lock(mutex_);
  if (where_[Index(key)] >= 0) return absl::FailedPreconditionError(absl::StrCat("stage: ", KeyName(key), " is already held"));
  for (int j = 0; j < num_staging_; ++j) {
    const int position = num_slots_ + j;
    if (!buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(position)])].expert) {
      Enqueue(lock, position, key);
      return absl::OkStatus();
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(kHostPoolKind, ": all ", num_staging_, " staging buffers are taken (stage ", KeyName(key), ")"));
}

absl::Status HostExpertPool::Admit(ExpertKey key, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "admit"));
  std::unique_lock<std::mutex> lock(mutex_);
  const int staged = where_[Index(key)];
  if (staged < 0 || !IsStaging(staged)) {
    return absl::FailedPreconditionError(absl::StrCat("admit: ", KeyName(key), " is not in a staging buffer"));
  }
  TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, position_buffer_[static_cast<size_t>(staged)], key));
  TANDEM_ASSIGN_OR_RETURN(const int slot, TakeSlotLocked(lock, evict));
  // No copy: the slot takes the staging buffer, the staging position the
  // slot's (now free) buffer.
  std::swap(position_buffer_[static_cast<size_t>(slot)], position_buffer_[static_cast<size_t>(staged)]);
  where_[Index(key)] = slot;
  ++stats_.admissions;
  return absl::OkStatus();
}

absl::Status HostExpertPool::Evict(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "evict"));
  std::unique_lock<std::mutex> lock(mutex_);
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(lock, key));
  (void)position;
  return absl::OkStatus();
}

absl::Status HostExpertPool::ReleaseStaging() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (int j = 0; j < num_staging_; ++j) {
    const int position = num_slots_ + j;
    const int b = position_buffer_[static_cast<size_t>(position)];
    if (!buffers_[static_cast<size_t>(b)].expert) continue;
    TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, b, *buffers_[static_cast<size_t>(b)].expert));
    EvictPositionLocked(position);
  }
  return absl::OkStatus();
}

PoolLocation HostExpertPool::Find(ExpertKey key) const {
  PoolLocation location;
  if (!CheckKey(key, "find").ok()) return location;
  std::lock_guard<std::mutex> lock(mutex_);
  const int position = where_[Index(key)];
  if (position < 0) return location;
  location.held = true;
  location.staging = IsStaging(position);
  location.index = location.staging ? position - num_slots_ : position;
  location.state = buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(position)])].state;
  return location;
}

bool HostExpertPool::IsReady(ExpertKey key) const {
  const PoolLocation location = Find(key);
  return location.held && location.state == BufferState::kReady;
}

absl::Status HostExpertPool::WaitReady(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "wait"));
  std::unique_lock<std::mutex> lock(mutex_);
  const int position = where_[Index(key)];
  if (position < 0) return absl::FailedPreconditionError(absl::StrCat("wait: the pool does not hold ", KeyName(key)));
  return WaitBufferLocked(lock, position_buffer_[static_cast<size_t>(position)], key);
}

std::vector<PoolSlot> HostExpertPool::SlotTable() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<PoolSlot> table;
  for (int p = 0; p < num_slots_ + num_staging_; ++p) {
    const Buffer& buffer = buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(p)])];
    table.push_back({IsStaging(p) ? p - num_slots_ : p, IsStaging(p), buffer.expert, buffer.state});
  }
  return table;
}

absl::StatusOr<ExpertWeights> HostExpertPool::HeldWeights(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "held weights"));
  std::unique_lock<std::mutex> lock(mutex_);
  const int position = where_[Index(key)];
  if (position < 0) return absl::FailedPreconditionError(absl::StrCat("the pool does not hold ", KeyName(key)));
  const int b = position_buffer_[static_cast<size_t>(position)];
  TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, b, key));
  return BufferWeights(buffers_[static_cast<size_t>(b)].data.get());
}

absl::Status HostExpertPool::RunExperts(int layer, std::span<const ExpertWork> work, PoolRunTiming* timing) {
  if (layer < 0 || layer >= num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(kHostPoolKind, ": layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  for (const ExpertWork& entry : work) {
    const ExpertKey key{layer, entry.expert};
    TANDEM_RETURN_IF_ERROR(CheckKey(key, "run"));
    if (entry.num_rows < 0 || (entry.num_rows > 0 && (entry.input == nullptr || entry.output == nullptr))) {
      return absl::InvalidArgumentError(absl::StrCat(kHostPoolKind, ": ", KeyName(key), " has ", entry.num_rows,
                                                     " rows and a null input or output"));
    }
    if (Find(key).held == false) {
      return absl::FailedPreconditionError(absl::StrCat(kHostPoolKind, ": asked to run ", KeyName(key),
                                                        ", which it does not hold"));
    }
  }
  PoolRunTiming local;
  for (const ExpertWork& entry : work) {
    if (entry.num_rows == 0) continue;
    const ExpertKey key{layer, entry.expert};
    const auto wait_start = std::chrono::steady_clock::now();
    const uint8_t* data = nullptr;
    bool staging = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      const int position = where_[Index(key)];
      const int b = position_buffer_[static_cast<size_t>(position)];
      TANDEM_RETURN_IF_ERROR(WaitBufferLocked(lock, b, key));
      data = buffers_[static_cast<size_t>(b)].data.get();
      staging = IsStaging(position);
    }
    const auto compute_start = std::chrono::steady_clock::now();
    local.wait_us += std::chrono::duration<double, std::micro>(compute_start - wait_start).count();
    // The buffer stays put: only this (the control) thread moves or frees it.
    TANDEM_RETURN_IF_ERROR(kernel_(BufferWeights(data), entry.input, entry.num_rows, entry.output));
    local.compute_us +=
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - compute_start).count();
    ++(staging ? local.staging_runs : local.slot_runs);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.wait_us += local.wait_us;
    stats_.compute_us += local.compute_us;
    stats_.slot_runs += local.slot_runs;
    stats_.staging_runs += local.staging_runs;
  }
  if (timing != nullptr) *timing = local;
  return absl::OkStatus();
}

std::vector<MigrationRecord> HostExpertPool::TakeCompletedMigrations() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MigrationRecord> out;
  out.swap(completed_);
  return out;
}

ExpertPoolStats HostExpertPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ExpertPoolStats s = stats_;
  s.num_slots = num_slots_;
  s.num_staging_buffers = num_staging_;
  s.expert_bytes = layout_.copy_bytes;
  s.used_slots = 0;
  for (int p = 0; p < num_slots_; ++p) {
    s.used_slots += buffers_[static_cast<size_t>(position_buffer_[static_cast<size_t>(p)])].expert.has_value();
  }
  return s;
}

void HostExpertPool::ResetStats() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_ = ExpertPoolStats{};
  stats_.kind = kHostPoolKind;
}

void HostExpertPool::CopyLoop() {
  pthread_setname_np(pthread_self(), "pool-copy");
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, and every queued copy done
    const CopyTask task = queue_.front();
    queue_.pop_front();
    uint8_t* dst = buffers_[static_cast<size_t>(task.buffer)].data.get();
    lock.unlock();
    // The buffer is kCopying: nobody else reads or writes it until it is ready.
    const double start = NowUs();
    CopyExpert(task.expert, dst);
    const double end = NowUs();
    lock.lock();
    buffers_[static_cast<size_t>(task.buffer)].state = BufferState::kReady;
    ++stats_.migrations_completed;
    stats_.bytes_copied += layout_.copy_bytes;
    stats_.copy_us += end - start;
    completed_.push_back({task.expert, task.staging, layout_.copy_bytes, start - task.queued_at_us, end - start});
    ready_cv_.notify_all();
  }
}

}  // namespace tandem
