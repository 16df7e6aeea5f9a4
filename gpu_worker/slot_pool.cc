#include "gpu_worker/slot_pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// A copy that has not finished (or started) in this long is a bug, not a
// slow copy: fail the step rather than hang it.
constexpr auto kReadyTimeout = std::chrono::seconds(60);

absl::Status CheckMatrix(const LinearWeight& w, DType dtype, int64_t n, int64_t k, const std::string& name) {
  if (w.data == nullptr) return absl::InvalidArgumentError(absl::StrCat(name, " has no data"));
  if (w.dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is ", std::string(DTypeName(w.dtype)),
                                                   ", its layer's experts are ", std::string(DTypeName(dtype))));
  }
  if (w.n != n || w.k != k) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is [", w.n, ", ", w.k, "], expected [", n, ", ", k, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpertLayouts> SlotPool::CheckExperts(const ModelConfig& config,
                                                     const std::vector<std::vector<ExpertWeights>>& experts) {
  if (experts.empty()) return absl::InvalidArgumentError("experts: the model has no experts");
  // Each matrix's dtype and shape first, for messages that name them; then
  // the counts and coverage, as for any source.
  const int64_t d = config.hidden_size, i = config.intermediate_size;
  for (size_t l = 0; l < experts.size(); ++l) {
    if (experts[l].empty()) continue;  // the count is CheckExpertSources' to report
    const ExpertWeights& first = experts[l][0];
    for (size_t e = 0; e < experts[l].size(); ++e) {
      const std::string name = absl::StrCat("experts[", l, "][", e, "]");
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w1, first.w1.dtype, i, d, name + ".w1"));
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w3, first.w3.dtype, i, d, name + ".w3"));
      TANDEM_RETURN_IF_ERROR(CheckMatrix(experts[l][e].w2, first.w2.dtype, d, i, name + ".w2"));
    }
  }
  return CheckExpertSources(config, WholeExperts(experts));
}

absl::StatusOr<ExpertLayouts> SlotPool::CheckExpertSources(const ModelConfig& config, const ExpertSources& experts) {
  if (static_cast<int64_t>(experts.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("experts has ", experts.size(), " layers, the config ", config.num_hidden_layers));
  }
  ExpertLayouts layouts;
  for (size_t l = 0; l < experts.size(); ++l) {
    if (experts[l].empty() && config.dense_layer(static_cast<int64_t>(l))) {
      layouts.push_back(ExpertLayout{.dense_layer = true});  // filled in below
      continue;
    }
    if (static_cast<int64_t>(experts[l].size()) != config.num_local_experts) {
      return absl::InvalidArgumentError(
          absl::StrCat("experts[", l, "] has ", experts[l].size(), " experts, the config ", config.num_local_experts));
    }
    // A layer's experts share their matrices' types (a GGUF stores each
    // projection of a layer as one stacked tensor), so one layout per layer.
    const ExpertSource& first = experts[l][0];
    absl::StatusOr<ExpertLayout> layout =
        ExpertLayout::ForMatrices(config, first.w1_dtype, first.w3_dtype, first.w2_dtype);
    if (!layout.ok()) {
      return absl::Status(layout.status().code(), absl::StrCat("layer ", l, ": ", layout.status().message()));
    }
    const int64_t d = layout->hidden_size, i = layout->intermediate_size;
    for (size_t e = 0; e < experts[l].size(); ++e) {
      const ExpertSource& source = experts[l][e];
      const std::string name = absl::StrCat("experts[", l, "][", e, "]");
      if (source.w1_dtype != first.w1_dtype || source.w3_dtype != first.w3_dtype || source.w2_dtype != first.w2_dtype) {
        ExpertLayout mine = *layout;
        mine.w1_dtype = source.w1_dtype;
        mine.w3_dtype = source.w3_dtype;
        mine.w2_dtype = source.w2_dtype;
        return absl::InvalidArgumentError(
            absl::StrCat(name, " is ", mine.DTypeNames(), ", the layer's experts are ", layout->DTypeNames()));
      }
      TANDEM_RETURN_IF_ERROR(CheckMatrixPieces(source.w1, source.w1_dtype, i, d, name + ".w1"));
      TANDEM_RETURN_IF_ERROR(CheckMatrixPieces(source.w3, source.w3_dtype, i, d, name + ".w3"));
      TANDEM_RETURN_IF_ERROR(CheckMatrixPieces(source.w2, source.w2_dtype, d, i, name + ".w2"));
    }
    layouts.push_back(*layout);
  }
  // A dense layer's stand-in: the first MoE layer's layout, so that every
  // layer has one; no key of that layer is ever accepted (CheckKey).
  const auto moe = std::find_if(layouts.begin(), layouts.end(), [](const ExpertLayout& l) { return !l.dense_layer; });
  if (moe == layouts.end()) return absl::InvalidArgumentError("experts: the model has no experts");
  const ExpertLayout first_moe = *moe;
  for (ExpertLayout& l : layouts) {
    if (!l.dense_layer) continue;
    l = first_moe;
    l.dense_layer = true;
  }
  return layouts;
}

std::string SlotPool::KeyName(ExpertKey key) { return absl::StrCat("layer ", key.layer, " expert ", key.expert); }

SlotPool::SlotPool(std::string kind, ExpertSources experts, int num_experts, ExpertLayouts layouts, int num_slots,
                   int num_staging)
    : experts_(std::move(experts)),
      num_experts_(num_experts),
      layouts_(std::move(layouts)),
      buffer_bytes_(MaxBufferBytes(layouts_)),
      expert_bytes_(MeanCopyBytes(layouts_)),
      num_slots_(num_slots),
      num_staging_(num_staging),
      epoch_(std::chrono::steady_clock::now()),
      kind_(std::move(kind)),
      entries_(static_cast<size_t>(num_slots + num_staging)),
      where_(experts_.size() * static_cast<size_t>(num_experts_), -1) {
  for (int b = 0; b < num_slots_ + num_staging_; ++b) position_buffer_.push_back(b);
  stats_.kind = kind_;
}

void SlotPool::SetKind(std::string kind) {
  absl::MutexLock lock(&mutex_);
  kind_ = std::move(kind);
  stats_.kind = kind_;
}

double SlotPool::NowUs() const { return MicrosSince(epoch_); }

absl::Status SlotPool::CheckKey(ExpertKey key, const char* what) const {
  if (key.layer < 0 || key.layer >= num_layers() || key.expert < 0 || key.expert >= num_experts_) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", KeyName(key), " is outside the model (", num_layers(),
                                                   " layers x ", num_experts_, " experts)"));
  }
  if (layouts_[static_cast<size_t>(key.layer)].dense_layer) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", KeyName(key), " is in a dense layer (no experts)"));
  }
  return absl::OkStatus();
}

absl::Status SlotPool::WaitLocked(ExpertKey key, const char* verb, const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::FromChrono(kReadyTimeout);
  while (!done() && copy_error_.ok() && !ready_cv_.WaitWithDeadline(&mutex_, deadline)) {
  }
  if (!copy_error_.ok()) return copy_error_;
  if (!done()) {
    return absl::DeadlineExceededError(absl::StrCat(kind_, ": the copy of ", KeyName(key), " did not ", verb, " in ",
                                                    std::chrono::seconds(kReadyTimeout).count(), " s"));
  }
  return absl::OkStatus();
}

absl::Status SlotPool::WaitCopiedLocked(int buffer, ExpertKey key) {
  return WaitLocked(key, "finish", [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return StateLocked(buffer) != BufferState::kCopying;
  });
}

absl::StatusOr<int> SlotPool::WaitHeldLocked(ExpertKey key, const char* prefix) {
  const int position = PositionLocked(key);
  if (position < 0) return absl::FailedPreconditionError(absl::StrCat(prefix, "the pool does not hold ", KeyName(key)));
  const int b = BufferAtLocked(position);
  TANDEM_RETURN_IF_ERROR(WaitCopiedLocked(b, key));
  return b;
}

absl::Status SlotPool::EvictPositionLocked(int position) {
  Entry& entry = EntryAt(position);
  if (entry.expert) where_[Index(*entry.expert)] = -1;
  entry.expert.reset();
  entry.state = BufferState::kFree;
  return OnFreedLocked(BufferAtLocked(position));
}

absl::StatusOr<int> SlotPool::TakeSlotLocked(std::optional<ExpertKey> evict) {
  if (evict) {
    TANDEM_RETURN_IF_ERROR(CheckKey(*evict, "evict"));
    const int position = where_[Index(*evict)];
    if (position < 0 || IsStaging(position)) {
      return absl::FailedPreconditionError(absl::StrCat("evict: ", KeyName(*evict), " holds no slot"));
    }
    TANDEM_RETURN_IF_ERROR(WaitCopiedLocked(BufferAtLocked(position), *evict));
    TANDEM_RETURN_IF_ERROR(EvictPositionLocked(position));
    ++stats_.evictions;
    return position;
  }
  for (int s = 0; s < num_slots_; ++s) {
    if (!EntryAt(s).expert) return s;
  }
  return absl::ResourceExhaustedError(absl::StrCat(kind_, ": all ", num_slots_, " slots are taken"));
}

void SlotPool::EnqueueLocked(int position, ExpertKey key) {
  const int b = BufferAtLocked(position);
  Entry& entry = entries_[static_cast<size_t>(b)];
  entry.expert = key;
  entry.state = BufferState::kCopying;
  OnQueuedLocked(b);
  where_[Index(key)] = position;
  queue_.push_back({b, key, IsStaging(position), NowUs()});
  ++stats_.migrations_started;
  if (IsStaging(position)) ++stats_.staging_copies;
  // Under the lock: absl moves the woken copy thread onto the mutex's queue
  // rather than waking it to block on the mutex the caller still holds.
  work_cv_.Signal();
}

absl::Status SlotPool::Place(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "place"));
  TANDEM_RETURN_IF_ERROR(EnterDevice());
  absl::MutexLock lock(&mutex_);
  if (where_[Index(key)] >= 0)
    return absl::FailedPreconditionError(absl::StrCat("place: ", KeyName(key), " is already held"));
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(std::nullopt));
  // Synchronous: the buffer is free and nobody else writes it.
  TANDEM_RETURN_IF_ERROR(CopyNowLocked(BufferAtLocked(position), key));
  Entry& entry = EntryAt(position);
  entry.expert = key;
  entry.state = BufferState::kReady;
  where_[Index(key)] = position;
  ++stats_.placements;
  return absl::OkStatus();
}

absl::Status SlotPool::Migrate(ExpertKey key, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "migrate"));
  TANDEM_RETURN_IF_ERROR(EnterDevice());
  absl::MutexLock lock(&mutex_);
  if (where_[Index(key)] >= 0) {
    return absl::FailedPreconditionError(absl::StrCat("migrate: ", KeyName(key), " is already held"));
  }
  TANDEM_ASSIGN_OR_RETURN(const int position, TakeSlotLocked(evict));
  EnqueueLocked(position, key);
  return absl::OkStatus();
}

absl::Status SlotPool::Stage(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "stage"));
  absl::MutexLock lock(&mutex_);
  if (where_[Index(key)] >= 0)
    return absl::FailedPreconditionError(absl::StrCat("stage: ", KeyName(key), " is already held"));
  for (int j = 0; j < num_staging_; ++j) {
    const int position = num_slots_ + j;
    if (!EntryAt(position).expert) {
      EnqueueLocked(position, key);
      return absl::OkStatus();
    }
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(kind_, ": all ", num_staging_, " staging buffers are taken (stage ", KeyName(key), ")"));
}

absl::Status SlotPool::Admit(ExpertKey key, std::optional<ExpertKey> evict) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "admit"));
  TANDEM_RETURN_IF_ERROR(EnterDevice());
  absl::MutexLock lock(&mutex_);
  const int staged = where_[Index(key)];
  if (staged < 0 || !IsStaging(staged)) {
    return absl::FailedPreconditionError(absl::StrCat("admit: ", KeyName(key), " is not in a staging buffer"));
  }
  TANDEM_RETURN_IF_ERROR(WaitCopiedLocked(BufferAtLocked(staged), key));
  TANDEM_ASSIGN_OR_RETURN(const int slot, TakeSlotLocked(evict));
  // No copy: the slot takes the staging buffer (bytes and all), the staging
  // position the slot's (now free) buffer.
  std::swap(position_buffer_[static_cast<size_t>(slot)], position_buffer_[static_cast<size_t>(staged)]);
  where_[Index(key)] = slot;
  ++stats_.admissions;
  return absl::OkStatus();
}

absl::Status SlotPool::Evict(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "evict"));
  TANDEM_RETURN_IF_ERROR(EnterDevice());
  absl::MutexLock lock(&mutex_);
  return TakeSlotLocked(key).status();
}

absl::Status SlotPool::ReleaseStaging() {
  TANDEM_RETURN_IF_ERROR(EnterDevice());
  absl::MutexLock lock(&mutex_);
  for (int j = 0; j < num_staging_; ++j) {
    const int position = num_slots_ + j;
    const int b = BufferAtLocked(position);
    if (!entries_[static_cast<size_t>(b)].expert) continue;
    TANDEM_RETURN_IF_ERROR(WaitCopiedLocked(b, *entries_[static_cast<size_t>(b)].expert));
    TANDEM_RETURN_IF_ERROR(EvictPositionLocked(position));
  }
  return absl::OkStatus();
}

PoolLocation SlotPool::Find(ExpertKey key) const {
  PoolLocation location;
  if (!CheckKey(key, "find").ok()) return location;
  absl::MutexLock lock(&mutex_);
  const int position = where_[Index(key)];
  if (position < 0) return location;
  location.held = true;
  location.staging = IsStaging(position);
  location.index = location.staging ? position - num_slots_ : position;
  location.state = EntryAt(position).state;
  return location;
}

bool SlotPool::IsReady(ExpertKey key) const {
  const PoolLocation location = Find(key);
  return location.held && location.state == BufferState::kReady;
}

absl::Status SlotPool::WaitReady(ExpertKey key) {
  TANDEM_RETURN_IF_ERROR(CheckKey(key, "wait"));
  absl::MutexLock lock(&mutex_);
  return WaitHeldLocked(key, "wait: ").status();
}

std::vector<PoolSlot> SlotPool::SlotTable() const {
  absl::MutexLock lock(&mutex_);
  std::vector<PoolSlot> table;
  for (int p = 0; p < num_slots_ + num_staging_; ++p) {
    const Entry& entry = EntryAt(p);
    table.push_back({IsStaging(p) ? p - num_slots_ : p, IsStaging(p), entry.expert, entry.state});
  }
  return table;
}

absl::StatusOr<int64_t> SlotPool::CheckWork(int layer, std::span<const ExpertWork> work) const {
  if (layer < 0 || layer >= num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(kind_, ": layer ", layer, " out of range [0, ", num_layers(), ")"));
  }
  int64_t total_rows = 0;
  for (const ExpertWork& entry : work) {
    const ExpertKey key{layer, entry.expert};
    TANDEM_RETURN_IF_ERROR(CheckKey(key, "run"));
    if (entry.num_rows < 0 || (entry.num_rows > 0 && (entry.input == nullptr || entry.output == nullptr))) {
      return absl::InvalidArgumentError(
          absl::StrCat(kind_, ": ", KeyName(key), " has ", entry.num_rows, " rows and a null input or output"));
    }
    if (!Find(key).held) {
      return absl::FailedPreconditionError(
          absl::StrCat(kind_, ": asked to run ", KeyName(key), ", which it does not hold"));
    }
    total_rows += entry.num_rows;
  }
  return total_rows;
}

void SlotPool::RecordRun(const PoolRunTiming& run) {
  absl::MutexLock lock(&mutex_);
  stats_.wait_us += run.wait_us;
  stats_.compute_us += run.compute_us;
  stats_.slot_runs += run.slot_runs;
  stats_.staging_runs += run.staging_runs;
}

std::vector<MigrationRecord> SlotPool::TakeCompletedMigrations() {
  absl::MutexLock lock(&mutex_);
  std::vector<MigrationRecord> out;
  out.swap(completed_);
  return out;
}

ExpertPoolStats SlotPool::stats() const {
  absl::MutexLock lock(&mutex_);
  ExpertPoolStats s = stats_;
  s.num_slots = num_slots_;
  s.num_staging_buffers = num_staging_;
  s.expert_bytes = expert_bytes_;
  s.used_slots = 0;
  for (int p = 0; p < num_slots_; ++p) s.used_slots += EntryAt(p).expert.has_value();
  return s;
}

void SlotPool::ResetStats() {
  absl::MutexLock lock(&mutex_);
  stats_ = ExpertPoolStats{};
  stats_.kind = kind_;
}

std::optional<SlotPool::CopyTask> SlotPool::NextCopyLocked() {
  while (!stop_ && queue_.empty()) work_cv_.Wait(&mutex_);
  if (queue_.empty()) return std::nullopt;  // stop_, and every queued copy taken
  const CopyTask task = queue_.front();
  queue_.pop_front();
  return task;
}

void SlotPool::CopyDoneLocked(const CopyTask& task, double start_us, double copy_us) {
  entries_[static_cast<size_t>(task.buffer)].state = BufferState::kReady;
  ++stats_.migrations_completed;
  const int64_t bytes = layout(task.expert.layer).copy_bytes;
  stats_.bytes_copied += bytes;
  stats_.copy_us += copy_us;
  completed_.push_back({task.expert, task.staging, bytes, start_us - task.queued_at_us, copy_us});
  ready_cv_.SignalAll();
}

void SlotPool::CopyFailedLocked(ExpertKey key, const absl::Status& status) {
  if (copy_error_.ok()) {
    copy_error_ =
        absl::Status(status.code(), absl::StrCat(kind_, ": copy of ", KeyName(key), " failed: ", status.message()));
    LOG_ERROR(copy_error_.ToString());
  }
  ready_cv_.SignalAll();
}

void SlotPool::StopCopies() {
  {
    absl::MutexLock lock(&mutex_);
    stop_ = true;
  }
  work_cv_.SignalAll();
}

}  // namespace tandem
