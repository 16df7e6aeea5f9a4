// The per-worker tensor arena: a shared-memory region through which the
// coordinator and one CPU worker exchange activations without copying them
// through gRPC, plus a doorbell control block that carries the request and
// response messages themselves (serialized tandem.v1.RunExpertsRequest /
// RunExpertsResponse) so a layer's round trip needs no socket at all.
//
// The worker creates (owns) the arena; the coordinator opens it read-write.
// Both processes run on one host, so integers are in host byte order.
//
// Arena layout (byte offsets from the region's start; every section starts on
// a 4096-byte page boundary; S = num_slots, B = slot_bytes, C = control
// message capacity):
//
//   [0, 4096)  header (ArenaHeader)
//       0  u64  magic "TNDMAREN"
//       8  u32  version (kArenaVersion)
//      12  u32  header_bytes (4096)
//      16  u32  num_slots S (1 .. kMaxArenaSlots)
//      20  u32  control_message_bytes C
//      24  u64  slot_bytes B (a multiple of 4096)
//      32  u64  control_offset      (= 4096)
//      40  u64  input_offset        (S input slots of B bytes)
//      48  u64  output_offset       (S output slots of B bytes)
//      56  u64  total_bytes
//      64  i32  owner_pid           (the worker, for messages)
//      72  u64  instance            random per Create: a restarted worker's arena differs
//     128  u64  input_sequence[64]  per input slot, atomic
//     640  u64  output_sequence[64] per output slot, atomic
//   [control_offset, input_offset)  doorbell control block (DoorbellControl)
//       +0   u32 request_seq      futex word, bumped by the coordinator per request
//       +4   u32 worker_sleeping  1 while the worker sleeps in futex_wait
//       +8   u32 request_bytes    length of the request message
//       +64  u32 response_seq     futex word, set by the worker to the answered request_seq
//       +68  u32 coordinator_sleeping
//       +72  u32 response_bytes
//       +76  i32 response_code    absl::StatusCode; non-zero: the message is the error text
//       +256     request message  [C bytes]
//       +256+C   response message [C bytes]
//   [input_offset + s·B, +B)    input slot s  — f32 rows, written by the coordinator
//   [output_offset + s·B, +B)   output slot s — f32 rows, written by the worker
//
// Slots and sequence numbers: before the coordinator writes a slot's contents
// it advances the slot's sequence number and puts the new value in each
// descriptor that points into the slot; the worker accepts a descriptor only
// if its sequence equals the slot's current one (so a stale or replayed
// request can never read or overwrite another request's tensors).
//
// Doorbell protocol (one request in flight per arena):
//   coordinator: write request message, request_bytes, then request_seq += 1
//                (release); futex_wake if worker_sleeping.
//   worker:      spin on request_seq, then futex_wait; copy the message out;
//                run; write response message/code/bytes, then
//                response_seq = request_seq (release); wake if coordinator_sleeping.
//   coordinator: spin on response_seq == its seq, then futex_wait in slices,
//                checking between slices that the worker still holds the
//                region (ShmRegion::OwnerAlive: a killed worker drops its lock
//                at once) → Unavailable; past the deadline → DeadlineExceeded.
//
// Validation (every field a peer writes is untrusted): a descriptor's slot
// index, offset + size within the slot (overflow-safe), shape == [rows, D],
// dtype f32, 4-byte aligned offset and sequence number are checked before any
// byte is touched: InvalidArgument for a malformed descriptor, DataLoss for a
// sequence mismatch (the slot holds other data) or a corrupt header or
// control block. A rejected request changes nothing.
//
// Legend: R rows, D hidden size.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/dtype.h"
#include "common/platform/shm_region.h"

namespace tandem {

inline constexpr uint64_t kArenaMagic = 0x4e4552414d444e54ULL;  // "TNDMAREN" little-endian
inline constexpr uint32_t kArenaVersion = 1;
inline constexpr uint32_t kMaxArenaSlots = 64;
inline constexpr size_t kArenaPageBytes = 4096;

struct ArenaOptions {
  std::string name;                           // POSIX shm name, e.g. "/tandem-run-w0-arena"
  uint32_t num_slots = 2;                     // input slots = output slots = this
  uint64_t slot_bytes = 16ull << 20;          // rounded up to a page
  uint32_t control_message_bytes = 64 << 10;  // capacity of each doorbell message
  // The region's name is `name` plus a random suffix (ShmCreateOptions::
  // unique_suffix): ShmArena::name() reports it.
  bool unique_suffix = false;
};

enum class ArenaSide { kInput, kOutput };
std::string_view ArenaSideName(ArenaSide side);  // "input" | "output"

// Copies `count` floats between the arena and process memory (either way).
// Not memcpy: glibc 2.36's memmove uses `rep movsb` for these sizes, which on
// AMD Zen runs about 16x slower (2.6 vs 45 GB/s measured here) when the
// distance between source and destination is a few bytes modulo 4 KiB — the
// usual case for a page-aligned slot and a malloc'ed buffer at +16. An AVX2
// loop has no such cliff. Ranges must not overlap.
void CopyFloats(float* dst, const float* src, size_t count);

// A tensor in the arena as a descriptor names it (mirrors tandem.v1.TensorDescriptor).
struct ArenaTensorRef {
  ArenaSide side = ArenaSide::kInput;
  uint32_t slot = 0;
  uint64_t offset = 0;         // bytes from the slot's start
  std::vector<int64_t> shape;  // [R, D]
  std::optional<DType> dtype;  // nullopt: unspecified / unknown (rejected)
  uint64_t sequence = 0;
};

// A request taken off the doorbell by the worker.
struct DoorbellRequest {
  uint32_t seq = 0;
  std::string message;   // the serialized request (empty when framing failed)
  absl::Status framing;  // DataLoss when the control block's length is corrupt
};

// One side's handle on an arena. Thread-compatible: the coordinator uses one
// arena per worker from one thread at a time; the worker's doorbell loop is
// the only reader of requests.
class ShmArena {
 public:
  // Worker side: a new arena (see ShmRegion::Create for stale names).
  static absl::StatusOr<std::unique_ptr<ShmArena>> Create(const ArenaOptions& options);
  // Coordinator side: maps an existing arena read-write and checks its header
  // (DataLoss naming the field when it is not a valid arena of this version).
  static absl::StatusOr<std::unique_ptr<ShmArena>> Open(const std::string& name);

  const std::string& name() const { return region_.name(); }
  size_t total_bytes() const { return region_.size(); }
  uint32_t num_slots() const { return num_slots_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t control_message_bytes() const { return control_message_bytes_; }
  pid_t owner_pid() const;
  bool OwnerAlive() const { return region_.OwnerAlive(); }
  const ShmRegion& region() const { return region_; }  // the whole mapping (e.g. to bind it to a node)
  // A per-arena identity: differs between two arenas created under one name
  // (a restarted worker), so the coordinator can tell it must re-open.
  uint64_t instance() const;

  uint8_t* slot_data(ArenaSide side, uint32_t slot) const;  // slot < num_slots()
  uint64_t sequence(ArenaSide side, uint32_t slot) const;
  // The coordinator claims a slot for new contents: ++sequence, returns it.
  uint64_t AdvanceSequence(ArenaSide side, uint32_t slot);

  // The f32 [rows, hidden] tensor `ref` names, after every check listed in
  // the file comment; `what` prefixes messages (e.g. "layer 3 expert 5
  // input"), built only on error (this is on every request's path).
  absl::StatusOr<float*> Resolve(const ArenaTensorRef& ref, int64_t rows, int64_t hidden,
                                 absl::FunctionRef<std::string()> what) const;
  absl::StatusOr<float*> Resolve(const ArenaTensorRef& ref, int64_t rows, int64_t hidden, std::string_view what) const {
    return Resolve(ref, rows, hidden, [what] { return std::string(what); });
  }

  // ---- doorbell, coordinator side ----
  // Writes `message` into the control block and rings; returns its sequence.
  // InvalidArgument when it exceeds control_message_bytes; FailedPrecondition
  // while a previous request is unanswered (see ResponsePending).
  absl::StatusOr<uint32_t> PostRequest(std::string_view message);
  // Waits for the answer to `seq`. OK: *response views the response message
  // (valid until the next PostRequest) — or the worker's own error status.
  // Unavailable when the worker dies, DeadlineExceeded past `deadline`.
  absl::Status AwaitResponse(uint32_t seq, absl::Time deadline, absl::Duration spin, std::string_view* response);
  bool ResponsePending() const;
  uint32_t last_posted() const { return last_request_seq_; }  // the latest PostRequest's sequence
  // Test hook: ring with raw control-block contents (e.g. garbage, a lying length).
  uint32_t PostRawRequest(std::string_view bytes, uint32_t claimed_length);

  // ---- doorbell, worker side ----
  // Waits (spin, then futex) for a request newer than the last answered one;
  // nullopt when `timeout` passes first or Interrupt() is called.
  std::optional<DoorbellRequest> AwaitRequest(absl::Duration spin, absl::Duration timeout);
  // Answers `seq`: OK with `message` (the serialized response), or `status`'s
  // code and text. A message too large for the block becomes ResourceExhausted.
  void PostResponse(uint32_t seq, const absl::Status& status, std::string_view message);
  // Wakes a worker blocked in AwaitRequest (for shutdown).
  void Interrupt();

 private:
  ShmArena() = default;
  uint8_t* request_buffer() const;
  uint8_t* response_buffer() const;

  ShmRegion region_;
  uint32_t num_slots_ = 0;
  uint64_t slot_bytes_ = 0;
  uint32_t control_message_bytes_ = 0;
  uint64_t input_offset_ = 0, output_offset_ = 0;
  uint32_t last_request_seq_ = 0;  // coordinator: the last posted; worker: the last answered
  std::atomic<bool> interrupted_{false};
};

}  // namespace tandem
