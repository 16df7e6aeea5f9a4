#include "common/platform/shm_transport.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace tandem {

namespace {

// The first page of the arena; offsets are asserted against the layout in the header.
struct ArenaHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint32_t num_slots;
  uint32_t control_message_bytes;
  uint64_t slot_bytes;
  uint64_t control_offset;
  uint64_t input_offset;
  uint64_t output_offset;
  uint64_t total_bytes;
  int32_t owner_pid;
  uint32_t reserved0;
  uint64_t instance;
  uint8_t reserved1[128 - 80];
  uint64_t input_sequence[kMaxArenaSlots];
  uint64_t output_sequence[kMaxArenaSlots];
};
static_assert(offsetof(ArenaHeader, slot_bytes) == 24);
static_assert(offsetof(ArenaHeader, total_bytes) == 56);
static_assert(offsetof(ArenaHeader, owner_pid) == 64);
static_assert(offsetof(ArenaHeader, instance) == 72);
static_assert(offsetof(ArenaHeader, input_sequence) == 128);
static_assert(offsetof(ArenaHeader, output_sequence) == 640);
static_assert(sizeof(ArenaHeader) <= kArenaPageBytes);

// The doorbell control block; the two directions live on separate cache lines.
struct DoorbellControl {
  uint32_t request_seq;
  uint32_t worker_sleeping;
  uint32_t request_bytes;
  uint8_t pad0[64 - 12];
  uint32_t response_seq;
  uint32_t coordinator_sleeping;
  uint32_t response_bytes;
  int32_t response_code;
  uint8_t pad1[256 - 80];
};
static_assert(offsetof(DoorbellControl, response_seq) == 64);
static_assert(offsetof(DoorbellControl, response_code) == 76);
static_assert(sizeof(DoorbellControl) == 256);

ArenaHeader* HeaderOf(const ShmRegion& region) { return reinterpret_cast<ArenaHeader*>(region.bytes()); }
DoorbellControl* ControlOf(const ShmRegion& region) {
  return reinterpret_cast<DoorbellControl*>(region.bytes() + kArenaPageBytes);
}

using U32Ref = std::atomic_ref<uint32_t>;
using U64Ref = std::atomic_ref<uint64_t>;
static_assert(U32Ref::is_always_lock_free && U64Ref::is_always_lock_free);

uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

struct Layout {
  uint64_t control_offset, control_bytes, input_offset, output_offset, total_bytes;
};

Layout ComputeLayout(uint32_t num_slots, uint64_t slot_bytes, uint32_t control_message_bytes) {
  Layout l;
  l.control_offset = kArenaPageBytes;
  l.control_bytes = RoundUp(256 + 2ull * control_message_bytes, kArenaPageBytes);
  l.input_offset = l.control_offset + l.control_bytes;
  l.output_offset = l.input_offset + uint64_t{num_slots} * slot_bytes;
  l.total_bytes = l.output_offset + uint64_t{num_slots} * slot_bytes;
  return l;
}

// Shared (not FUTEX_PRIVATE) futex on a word of the mapping: works across processes.
void FutexWait(uint32_t* word, uint32_t expected, absl::Duration timeout) {
  timespec ts = absl::ToTimespec(std::max(timeout, absl::ZeroDuration()));
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, std::numeric_limits<int>::max(), nullptr, nullptr, 0);
}

// How long one futex sleep lasts before the waiter re-checks liveness, deadline or interrupt.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(10);

}  // namespace

void CopyFloats(float* dst, const float* src, size_t count) {
  size_t i = 0;
  for (; i + 32 <= count; i += 32) {
    const __m256 a = _mm256_loadu_ps(src + i), b = _mm256_loadu_ps(src + i + 8);
    const __m256 c = _mm256_loadu_ps(src + i + 16), d = _mm256_loadu_ps(src + i + 24);
    _mm256_storeu_ps(dst + i, a);
    _mm256_storeu_ps(dst + i + 8, b);
    _mm256_storeu_ps(dst + i + 16, c);
    _mm256_storeu_ps(dst + i + 24, d);
  }
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
  if (i < count) std::memcpy(dst + i, src + i, (count - i) * sizeof(float));  // < 32 bytes: no rep movsb
}

std::string_view ArenaSideName(ArenaSide side) { return side == ArenaSide::kInput ? "input" : "output"; }

uint8_t* ShmArena::request_buffer() const { return region_.bytes() + kArenaPageBytes + sizeof(DoorbellControl); }
uint8_t* ShmArena::response_buffer() const { return request_buffer() + control_message_bytes_; }

absl::StatusOr<std::unique_ptr<ShmArena>> ShmArena::Create(const ArenaOptions& options) {
  if (options.num_slots < 1 || options.num_slots > kMaxArenaSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena ", options.name, ": num_slots ", options.num_slots, " not in [1, ", kMaxArenaSlots, "]"));
  }
  if (options.slot_bytes == 0)
    return absl::InvalidArgumentError(absl::StrCat("arena ", options.name, ": slot_bytes is 0"));
  if (options.control_message_bytes < 1024 || options.control_message_bytes > (64u << 20)) {
    return absl::InvalidArgumentError(absl::StrCat("arena ", options.name, ": control_message_bytes ",
                                                   options.control_message_bytes, " not in [1 KiB, 64 MiB]"));
  }
  const uint64_t slot_bytes = RoundUp(options.slot_bytes, kArenaPageBytes);
  const uint32_t message_bytes = static_cast<uint32_t>(RoundUp(options.control_message_bytes, 64));
  const Layout layout = ComputeLayout(options.num_slots, slot_bytes, message_bytes);
  auto arena = std::unique_ptr<ShmArena>(new ShmArena());
  TANDEM_ASSIGN_OR_RETURN(arena->region_, ShmRegion::Create(options.name, layout.total_bytes,
                                                            ShmCreateOptions{.unique_suffix = options.unique_suffix}));
  arena->num_slots_ = options.num_slots;
  arena->slot_bytes_ = slot_bytes;
  arena->control_message_bytes_ = message_bytes;
  arena->input_offset_ = layout.input_offset;
  arena->output_offset_ = layout.output_offset;

  ArenaHeader* h = HeaderOf(arena->region_);  // the region is zero-filled
  h->version = kArenaVersion;
  h->header_bytes = kArenaPageBytes;
  h->num_slots = options.num_slots;
  h->control_message_bytes = message_bytes;
  h->slot_bytes = slot_bytes;
  h->control_offset = layout.control_offset;
  h->input_offset = layout.input_offset;
  h->output_offset = layout.output_offset;
  h->total_bytes = layout.total_bytes;
  h->owner_pid = static_cast<int32_t>(getpid());
  h->instance = std::random_device{}() * 0x100000001ull ^ static_cast<uint64_t>(getpid()) << 20 ^
                static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
  U64Ref(h->magic).store(kArenaMagic, std::memory_order_release);  // last: the header is complete
  return arena;
}

absl::StatusOr<std::unique_ptr<ShmArena>> ShmArena::Open(const std::string& name) {
  auto arena = std::unique_ptr<ShmArena>(new ShmArena());
  TANDEM_ASSIGN_OR_RETURN(arena->region_, ShmRegion::Open(name, ShmAccess::kReadWrite));
  const size_t size = arena->region_.size();
  auto corrupt = [&](std::string_view field, auto value) {
    return absl::DataLossError(absl::StrCat("arena ", name, ": header field ", std::string(field), " = ", value,
                                            " is not valid for a version ", kArenaVersion, " arena of ", size,
                                            " bytes"));
  };
  if (size < kArenaPageBytes) return corrupt("size", size);
  const ArenaHeader* h = HeaderOf(arena->region_);
  if (U64Ref(const_cast<ArenaHeader*>(h)->magic).load(std::memory_order_acquire) != kArenaMagic) {
    return corrupt("magic", h->magic);
  }
  if (h->version != kArenaVersion) return corrupt("version", h->version);
  if (h->header_bytes != kArenaPageBytes) return corrupt("header_bytes", h->header_bytes);
  if (h->num_slots < 1 || h->num_slots > kMaxArenaSlots) return corrupt("num_slots", h->num_slots);
  if (h->slot_bytes == 0 || h->slot_bytes % kArenaPageBytes != 0 || h->slot_bytes > (uint64_t{1} << 40)) {
    return corrupt("slot_bytes", h->slot_bytes);
  }
  if (h->control_message_bytes < 1024 || h->control_message_bytes > (64u << 20)) {
    return corrupt("control_message_bytes", h->control_message_bytes);
  }
  const Layout layout = ComputeLayout(h->num_slots, h->slot_bytes, h->control_message_bytes);
  if (h->control_offset != layout.control_offset) return corrupt("control_offset", h->control_offset);
  if (h->input_offset != layout.input_offset) return corrupt("input_offset", h->input_offset);
  if (h->output_offset != layout.output_offset) return corrupt("output_offset", h->output_offset);
  if (h->total_bytes != layout.total_bytes || h->total_bytes != size) return corrupt("total_bytes", h->total_bytes);
  arena->num_slots_ = h->num_slots;
  arena->slot_bytes_ = h->slot_bytes;
  arena->control_message_bytes_ = h->control_message_bytes;
  arena->input_offset_ = layout.input_offset;
  arena->output_offset_ = layout.output_offset;
  arena->last_request_seq_ = U32Ref(ControlOf(arena->region_)->request_seq).load(std::memory_order_acquire);
  return arena;
}

pid_t ShmArena::owner_pid() const { return static_cast<pid_t>(HeaderOf(region_)->owner_pid); }
uint64_t ShmArena::instance() const { return HeaderOf(region_)->instance; }

uint8_t* ShmArena::slot_data(ArenaSide side, uint32_t slot) const {
  const uint64_t base = side == ArenaSide::kInput ? input_offset_ : output_offset_;
  return region_.bytes() + base + uint64_t{slot} * slot_bytes_;
}

uint64_t ShmArena::sequence(ArenaSide side, uint32_t slot) const {
  uint64_t* seqs = side == ArenaSide::kInput ? HeaderOf(region_)->input_sequence : HeaderOf(region_)->output_sequence;
  return U64Ref(seqs[slot]).load(std::memory_order_acquire);
}

uint64_t ShmArena::AdvanceSequence(ArenaSide side, uint32_t slot) {
  uint64_t* seqs = side == ArenaSide::kInput ? HeaderOf(region_)->input_sequence : HeaderOf(region_)->output_sequence;
  return U64Ref(seqs[slot]).fetch_add(1, std::memory_order_acq_rel) + 1;
}

absl::StatusOr<float*> ShmArena::Resolve(const ArenaTensorRef& ref, int64_t rows, int64_t hidden,
                                         absl::FunctionRef<std::string()> what) const {
  const auto prefix = [&] {
    return absl::StrCat(what(), " (", std::string(ArenaSideName(ref.side)), " slot ", ref.slot, ", offset ", ref.offset,
                        ")");
  };
  if (ref.slot >= num_slots_) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix(), ": slot ", ref.slot, " out of range; arena ", name(), " has ", num_slots_, " slots"));
  }
  if (ref.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix(), ": dtype ", ref.dtype ? std::string(DTypeName(*ref.dtype)) : std::string("unspecified"),
                     ", activations must be F32"));
  }
  if (ref.shape.size() != 2 || ref.shape[0] != rows || ref.shape[1] != hidden) {
    return absl::InvalidArgumentError(absl::StrCat(prefix(), ": shape [", absl::StrJoin(ref.shape, ", "),
                                                   "] does not match [rows, hidden] = [", rows, ", ", hidden, "]"));
  }
  if (rows < 0 || hidden <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix(), ": rows ", rows, ", hidden ", hidden));
  }
  if (ref.offset % alignof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix(), ": offset is not ", alignof(float), "-byte aligned"));
  }
  // Overflow-safe: rows * hidden * 4 <= slot_bytes and offset <= slot_bytes - that.
  const uint64_t max_elements = slot_bytes_ / sizeof(float);
  if (static_cast<uint64_t>(rows) > max_elements / static_cast<uint64_t>(hidden) ||
      ref.offset > slot_bytes_ - static_cast<uint64_t>(rows) * static_cast<uint64_t>(hidden) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix(), ": [", rows, ", ", hidden, "] f32 at this offset ends outside the slot of ", slot_bytes_, " bytes"));
  }
  const uint64_t current = sequence(ref.side, ref.slot);
  if (ref.sequence != current) {
    return absl::DataLossError(absl::StrCat(prefix(), ": sequence ", ref.sequence,
                                            " but the slot's current sequence is ", current,
                                            " (stale or replayed descriptor)"));
  }
  return reinterpret_cast<float*>(slot_data(ref.side, ref.slot) + ref.offset);
}

// ---- doorbell, coordinator side ----

bool ShmArena::ResponsePending() const {
  return U32Ref(ControlOf(region_)->response_seq).load(std::memory_order_acquire) != last_request_seq_;
}

absl::StatusOr<uint32_t> ShmArena::PostRequest(std::string_view message) {
  if (message.size() > control_message_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat("arena ", name(), ": request of ", message.size(),
                                                   " bytes exceeds the control block's ", control_message_bytes_));
  }
  if (ResponsePending()) {
    return absl::FailedPreconditionError(
        absl::StrCat("arena ", name(), ": request ", last_request_seq_, " is still unanswered"));
  }
  return PostRawRequest(message, static_cast<uint32_t>(message.size()));
}

uint32_t ShmArena::PostRawRequest(std::string_view bytes, uint32_t claimed_length) {
  DoorbellControl* c = ControlOf(region_);
  std::memcpy(request_buffer(), bytes.data(), std::min<size_t>(bytes.size(), control_message_bytes_));
  U32Ref(c->request_bytes).store(claimed_length, std::memory_order_relaxed);
  const uint32_t seq = last_request_seq_ + 1;
  last_request_seq_ = seq;
  U32Ref(c->request_seq).store(seq, std::memory_order_seq_cst);
  if (U32Ref(c->worker_sleeping).load(std::memory_order_seq_cst) != 0) FutexWakeAll(&c->request_seq);
  return seq;
}

absl::Status ShmArena::AwaitResponse(uint32_t seq, absl::Time deadline, absl::Duration spin,
                                     std::string_view* response) {
  DoorbellControl* c = ControlOf(region_);
  U32Ref response_seq(c->response_seq);
  const absl::Time spin_until = std::min(absl::Now() + spin, deadline);
  bool done = response_seq.load(std::memory_order_acquire) == seq;
  while (!done && absl::Now() < spin_until) {
    for (int i = 0; i < 64 && !done; ++i) {
      _mm_pause();
      done = response_seq.load(std::memory_order_acquire) == seq;
    }
  }
  while (!done) {
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("arena ", name(), ": no response to doorbell request ", seq,
                                                      " (worker pid ", owner_pid(), ") before the deadline"));
    }
    if (!OwnerAlive()) {
      return absl::UnavailableError(absl::StrCat("arena ", name(), ": worker pid ", owner_pid(),
                                                 " exited before answering doorbell request ", seq));
    }
    U32Ref sleeping(c->coordinator_sleeping);
    sleeping.store(1, std::memory_order_seq_cst);
    const uint32_t current = response_seq.load(std::memory_order_seq_cst);
    if (current != seq) FutexWait(&c->response_seq, current, std::min(kWaitSlice, deadline - now));
    sleeping.store(0, std::memory_order_relaxed);
    done = response_seq.load(std::memory_order_acquire) == seq;
  }
  const uint32_t bytes = U32Ref(c->response_bytes).load(std::memory_order_relaxed);
  const int32_t code = std::atomic_ref<int32_t>(c->response_code).load(std::memory_order_relaxed);
  if (bytes > control_message_bytes_) {
    return absl::DataLossError(absl::StrCat("arena ", name(), ": response length ", bytes,
                                            " exceeds the control block's ", control_message_bytes_));
  }
  const std::string_view text(reinterpret_cast<const char*>(response_buffer()), bytes);
  if (code != 0) {
    if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
      return absl::DataLossError(absl::StrCat("arena ", name(), ": response code ", code, " is not a status code"));
    }
    return absl::Status(static_cast<absl::StatusCode>(code), std::string(text));
  }
  *response = text;
  return absl::OkStatus();
}

// ---- doorbell, worker side ----

std::optional<DoorbellRequest> ShmArena::AwaitRequest(absl::Duration spin, absl::Duration timeout) {
  DoorbellControl* c = ControlOf(region_);
  U32Ref request_seq(c->request_seq);
  const uint32_t last = last_request_seq_;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  const absl::Time spin_until = std::min(start + spin, deadline);
  uint32_t seq = request_seq.load(std::memory_order_acquire);
  while (seq == last && absl::Now() < spin_until && !interrupted_.load(std::memory_order_relaxed)) {
    for (int i = 0; i < 64 && seq == last; ++i) {
      _mm_pause();
      seq = request_seq.load(std::memory_order_acquire);
    }
  }
  while (seq == last) {
    const absl::Time now = absl::Now();
    if (now >= deadline || interrupted_.load(std::memory_order_relaxed)) return std::nullopt;
    U32Ref sleeping(c->worker_sleeping);
    sleeping.store(1, std::memory_order_seq_cst);
    seq = request_seq.load(std::memory_order_seq_cst);
    if (seq == last) FutexWait(&c->request_seq, last, std::min(kWaitSlice, deadline - now));
    sleeping.store(0, std::memory_order_relaxed);
    seq = request_seq.load(std::memory_order_acquire);
  }
  DoorbellRequest request;
  request.seq = seq;
  const uint32_t bytes = U32Ref(c->request_bytes).load(std::memory_order_relaxed);
  if (bytes > control_message_bytes_) {
    request.framing =
        absl::DataLossError(absl::StrCat("arena ", name(), ": doorbell request ", seq, " claims ", bytes,
                                         " bytes; the control block holds at most ", control_message_bytes_));
    return request;
  }
  request.message.assign(reinterpret_cast<const char*>(request_buffer()), bytes);
  return request;
}

void ShmArena::PostResponse(uint32_t seq, const absl::Status& status, std::string_view message) {
  DoorbellControl* c = ControlOf(region_);
  absl::Status effective = status;
  if (status.ok() && message.size() > control_message_bytes_) {
    effective =
        absl::ResourceExhaustedError(absl::StrCat("arena ", name(), ": response of ", message.size(),
                                                  " bytes exceeds the control block's ", control_message_bytes_));
  }
  std::string_view body =
      effective.ok() ? message : std::string_view(effective.message().data(), effective.message().size());
  body = body.substr(0, control_message_bytes_);
  std::memcpy(response_buffer(), body.data(), body.size());
  U32Ref(c->response_bytes).store(static_cast<uint32_t>(body.size()), std::memory_order_relaxed);
  std::atomic_ref<int32_t>(c->response_code).store(static_cast<int32_t>(effective.code()), std::memory_order_relaxed);
  last_request_seq_ = seq;
  U32Ref(c->response_seq).store(seq, std::memory_order_seq_cst);
  if (U32Ref(c->coordinator_sleeping).load(std::memory_order_seq_cst) != 0) FutexWakeAll(&c->response_seq);
}

void ShmArena::Interrupt() {
  interrupted_.store(true, std::memory_order_relaxed);
  FutexWakeAll(&ControlOf(region_)->request_seq);
}

}  // namespace tandem
