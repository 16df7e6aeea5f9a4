// Serves many requests at once on one engine (continuous batching). The
// scheduler's thread owns the engine: every step it
//   1. takes new requests, and drops cancelled ones (freeing their KV blocks),
//   2. admits waiting requests, first come first served, while their
//      worst-case KV blocks and sequences fit the configured limits,
//   3. runs one Forward over the decode rows of every running request (a
//      beam search contributes all its live beams) plus prefill chunks of
//      newly admitted prompts, up to max_batch_tokens rows, so a long prompt
//      or a long generation never blocks a short one for more than a step,
//   4. samples (or advances the beam search), streams the new tokens and
//      finishes the requests that are done.
// A request that can never fit (more KV blocks or sequences than the limits)
// is refused at once with RESOURCE_EXHAUSTED, as is one arriving to a full
// wait queue. A failed Forward (a CPU worker down) fails the requests in
// that batch with its status; the scheduler keeps serving the next ones.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/model.h"
#include "coordinator/engine/engine.h"
#include "coordinator/engine/kv_cache.h"
#include "coordinator/generation/beam_search.h"
#include "coordinator/generation/generator.h"

namespace tandem {

inline constexpr int32_t kMaxSchedulerSequences = 4096;
inline constexpr int64_t kMaxSchedulerBatchTokens = int64_t{1} << 20;
inline constexpr int32_t kMaxSchedulerWaiting = 1 << 20;

struct SchedulerOptions {
  int32_t max_sequences = 16;      // sequences decoding at once; a beam search counts beam_width
  int64_t max_batch_tokens = 256;  // rows per Forward (decodes + prefill chunks); >= max_sequences
  int32_t max_waiting = 256;       // admitted-later requests beyond this are refused
  int32_t stats_window_steps = 256;
  // A client that does not read its stream: once this many events wait
  // unread, its sequences are paused (not decoded, so nothing more is
  // buffered for it); paused longer than max_stall, the request fails with
  // RESOURCE_EXHAUSTED and its KV cache is freed.
  int32_t max_unread_events = 256;
  absl::Duration max_stall = absl::Seconds(30);
  // Reuse the KV blocks of a prompt prefix already computed (kv_cache.h's
  // prompt cache): a request whose prompt starts with a cached prefix
  // prefills only the rest.
  bool prompt_cache = true;

  absl::Status Validate() const;  // InvalidArgument naming the field
};

struct GenerateParams {
  GenerationRequest request;              // prompt_ids, max_tokens, sampling, stop_ids, logprobs
  std::vector<std::string> stop_strings;  // need the model's tokenizer
};

struct BeamSearchJob {
  std::vector<int32_t> prompt_ids;
  BeamSearchParams params;        // end_ids are set from the two below
  std::vector<int32_t> stop_ids;  // end a beam like EOS
  bool ignore_eos = false;
  bool stream_progress = false;
};

struct RequestUsage {
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;  // of prompt_tokens, read from the prompt cache
  int64_t generated_tokens = 0;
  double queue_ms = 0;
  double time_to_first_token_ms = 0;
  double mean_inter_token_ms = 0, p50_inter_token_ms = 0, p99_inter_token_ms = 0;
  double tokens_per_s = 0;  // (generated - 1) / (last token - first token)
  double total_ms = 0;
};

struct BeamProgressEvent {
  int32_t step = 0;
  int32_t live_beams = 0;
  int32_t finished = 0;
  LiveBeam best;
};

// What a request streams. The last event has done = true.
struct StreamEvent {
  std::vector<GeneratedToken> tokens;  // generate: tokens since the last event
  bool has_progress = false;           // beam search: `progress` is set
  BeamProgressEvent progress;
  bool done = false;
  absl::Status status;  // done: OK, or why the request failed
  FinishReason finish_reason = FinishReason::kMaxTokens;
  RequestUsage usage;
  std::vector<BeamHypothesis> beams;  // beam search: best first
};

// The consumer's end of one request: a queue of events and a cancel switch.
// Thread-safe; shared by the scheduler thread and the caller.
class RequestStream {
 public:
  // Waits up to `timeout` for the next event; nullopt on timeout or after
  // the done event was taken.
  std::optional<StreamEvent> Next(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the request at the next step; its done event carries `reason`
  // (CANCELLED or DEADLINE_EXCEEDED). No effect once it is done.
  void Cancel(absl::Status reason) ABSL_LOCKS_EXCLUDED(mu_);

  // Scheduler side.
  void Push(StreamEvent event) ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<absl::Status> cancel_reason() const ABSL_LOCKS_EXCLUDED(mu_);
  size_t unread() const ABSL_LOCKS_EXCLUDED(mu_);  // events pushed and not yet taken by Next

 private:
  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // an event was pushed
  std::deque<StreamEvent> events_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> cancel_ ABSL_GUARDED_BY(mu_);
  bool done_taken_ ABSL_GUARDED_BY(mu_) = false;
};

struct SchedulerStats {
  double uptime_s = 0;
  int64_t requests_total = 0, requests_succeeded = 0, requests_failed = 0, requests_cancelled = 0,
          requests_rejected = 0;
  int64_t requests_active = 0, requests_waiting = 0, active_sequences = 0;
  int64_t prompt_tokens = 0, generated_tokens = 0, steps = 0;
  // Over the last stats_window_steps steps:
  double window_s = 0, tokens_per_s = 0, mean_step_ms = 0, mean_batch_rows = 0;
  ForwardTiming mean_forward;              // per step, µs
  std::vector<LayerTimingUs> mean_layers;  // per step, µs
  int64_t kv_blocks_in_use = 0, kv_blocks_total = 0, kv_block_size = 0, kv_copies_on_write = 0;
  // The prompt cache: prompt tokens read from it, blocks cached that no
  // sequence holds, and cached blocks reused for new sequences' memory.
  int64_t prompt_cache_hit_tokens = 0, kv_blocks_cached = 0, prompt_cache_evictions = 0;
};

// Borrows the model, engine and KV pool; owns the thread that drives them
// (nothing else may call the engine while the scheduler lives). Submit*
// and Stats may be called from any thread.
class Scheduler {
 public:
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const Model* model, Engine* engine, KvBlockPool* kv_pool,
                                                           const SchedulerOptions& options);
  // Fails every request still queued or running with UNAVAILABLE.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // At once: InvalidArgument naming the field, or for a request that can
  // never be admitted (more KV cache than the pool, a beam wider than
  // max_sequences); ResourceExhausted while the queue is full (retry).
  // Otherwise the request is queued and its events arrive on the stream.
  absl::StatusOr<std::shared_ptr<RequestStream>> SubmitGenerate(GenerateParams params)
      ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  absl::StatusOr<std::shared_ptr<RequestStream>> SubmitBeamSearch(BeamSearchJob job)
      ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);

  SchedulerStats Stats() const ABSL_LOCKS_EXCLUDED(stats_mu_);
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Request;
  Scheduler(const Model* model, Engine* engine, KvBlockPool* kv_pool, const SchedulerOptions& options);
  absl::StatusOr<std::shared_ptr<RequestStream>> Enqueue(std::unique_ptr<Request> request)
      ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  // The scheduler thread's; the steps below are called from it alone, none
  // with a lock held (they take mu_ and stats_mu_ as they need them).
  void Loop() ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  // Returns after `timeout`, or sooner once a request arrives or stopping_.
  void WaitForRequest(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);
  void DropCancelled() ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  // Pauses the requests whose client has max_unread_events unread, and fails
  // those paused longer than max_stall (RESOURCE_EXHAUSTED).
  void PauseSlowReaders() ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  void Admit() ABSL_LOCKS_EXCLUDED(mu_);
  // The longest cached prefix of r's prompt becomes its first KV blocks.
  void ReuseCachedPrefix(Request& r) ABSL_LOCKS_EXCLUDED(stats_mu_);
  // Indexes the blocks r's sequence has filled since the last call.
  void PublishFullBlocks(Request& r);
  bool RunStep() ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);  // false: nothing could run (every request paused)
  void AfterGenerateLogits(Request& r, std::span<const float> logits) ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  void AfterBeamLogits(Request& r, std::span<const float> logits, int64_t rows) ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  void Finish(Request& r, absl::Status status) ABSL_LOCKS_EXCLUDED(mu_, stats_mu_);
  void PublishState() ABSL_LOCKS_EXCLUDED(stats_mu_);  // scheduler-thread state into stats_
  RequestUsage Usage(const Request& r) const;

  const Model* model_;
  const std::vector<int32_t> eos_ids_;  // model_->EosIds(), once
  Engine* engine_;
  KvBlockPool* kv_pool_;
  SchedulerOptions options_;
  const std::chrono::steady_clock::time_point started_;

  absl::Mutex mu_;
  absl::CondVar cv_;  // a request arrived, or stopping
  std::deque<std::unique_ptr<Request>> incoming_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t waiting_count_ ABSL_GUARDED_BY(mu_) = 0;  // incoming + waiting, for max_waiting
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;

  // Scheduler thread only.
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> active_;
  int64_t reserved_blocks_ = 0;
  int64_t reserved_sequences_ = 0;
  std::vector<float> logits_;

  struct StepRecord {
    std::chrono::steady_clock::time_point end;
    double ms = 0;
    int64_t rows = 0, tokens = 0;
    ForwardTiming timing;
  };
  // Taken alone, or inside mu_ (Enqueue), never the other way round.
  mutable absl::Mutex stats_mu_ ABSL_ACQUIRED_AFTER(mu_);
  SchedulerStats stats_ ABSL_GUARDED_BY(stats_mu_);  // counters
  std::deque<StepRecord> window_ ABSL_GUARDED_BY(stats_mu_);

  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace tandem
