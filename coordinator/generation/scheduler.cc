#include "coordinator/generation/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/sample_stats.h"
#include "coordinator/generation/sampler.h"
#include "coordinator/generation/stop_strings.h"
#include "coordinator/generation/utf8_stream.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool IsCancellation(const absl::Status& status) {
  return absl::IsCancelled(status) || absl::IsDeadlineExceeded(status);
}

}  // namespace

// ---- RequestStream -------------------------------------------------------

std::optional<StreamEvent> RequestStream::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (done_taken_) return std::nullopt;
  const absl::Time deadline = absl::Now() + timeout;
  while (events_.empty() && !cv_.WaitWithDeadline(&mu_, deadline)) {
  }
  if (events_.empty()) return std::nullopt;  // timed out
  StreamEvent event = std::move(events_.front());
  events_.pop_front();
  if (event.done) done_taken_ = true;
  return event;
}

void RequestStream::Cancel(absl::Status reason) {
  absl::MutexLock lock(&mu_);
  if (!cancel_) cancel_ = std::move(reason);
}

void RequestStream::Push(StreamEvent event) {
  {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  cv_.SignalAll();
}

size_t RequestStream::unread() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

std::optional<absl::Status> RequestStream::cancel_reason() const {
  absl::MutexLock lock(&mu_);
  return cancel_;
}

// ---- Scheduler -----------------------------------------------------------

absl::Status SchedulerOptions::Validate() const {
  // Upper bounds first, far above any useful setting, so a typo cannot size buffers.
  if (max_sequences > kMaxSchedulerSequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_sequences must be <= ", kMaxSchedulerSequences, ", got ", max_sequences));
  }
  if (max_batch_tokens > kMaxSchedulerBatchTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_tokens must be <= ", kMaxSchedulerBatchTokens, ", got ", max_batch_tokens));
  }
  if (max_waiting > kMaxSchedulerWaiting) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_waiting must be <= ", kMaxSchedulerWaiting, ", got ", max_waiting));
  }
  if (max_sequences < 1)
    return absl::InvalidArgumentError(absl::StrCat("max_sequences must be >= 1, got ", max_sequences));
  if (max_batch_tokens < max_sequences) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch_tokens (", max_batch_tokens, ") must be >= max_sequences (", max_sequences, ")"));
  }
  if (max_waiting < 0) return absl::InvalidArgumentError(absl::StrCat("max_waiting must be >= 0, got ", max_waiting));
  if (max_unread_events < 1 || max_unread_events > kMaxSchedulerWaiting) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_unread_events must be in [1, ", kMaxSchedulerWaiting, "], got ", max_unread_events));
  }
  if (max_stall <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("max_stall must be > 0, got ", absl::FormatDuration(max_stall)));
  }
  if (stats_window_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("stats_window_steps must be >= 1, got ", stats_window_steps));
  }
  return absl::OkStatus();
}

struct Scheduler::Request {
  enum class Kind { kGenerate, kBeamSearch };
  Kind kind = Kind::kGenerate;
  uint64_t id = 0;
  std::shared_ptr<RequestStream> stream = std::make_shared<RequestStream>();
  GenerateParams generate;
  BeamSearchJob beam;
  int64_t reserved_blocks = 0;
  int64_t sequences = 1;

  Clock::time_point submitted, admitted_at, first_token, last_token;
  bool admitted = false;
  bool finished = false;
  std::vector<double> gaps_ms;
  int64_t generated = 0;
  FinishReason finish_reason = FinishReason::kMaxTokens;

  // Scheduler thread only, once admitted.
  int64_t prefilled = 0;
  int64_t cached_prompt_tokens = 0;  // read from the prompt cache at admission
  // The prompt cache: the tokens whose KV the sequence holds (generate: the
  // prompt, then each token fed back), its blocks indexed so far, and the
  // chain hash and block of the last of them.
  std::vector<int32_t> sequence_tokens;
  int64_t published_blocks = 0;
  uint64_t chain_hash = 0;
  int32_t chain_block = -1;
  int64_t chunk = 0;                              // prompt tokens in this step's batch
  std::optional<Clock::time_point> paused_since;  // the client stopped reading (PauseSlowReaders)
  std::unique_ptr<SequenceKv> kv;  // generate: the sequence; beam search: the prompt until the first step
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StopStringMatcher> stops;
  Utf8Stream utf8;
  std::vector<int32_t> next_tokens;  // this step's decode input, one per sequence
  std::unique_ptr<BeamSearchState> search;
  std::vector<std::unique_ptr<SequenceKv>> beam_kvs;  // one per live beam

  // A token (generate) or a step (beam search) came out now.
  void RecordToken() {
    const auto now = Clock::now();
    if (generated == 0) {
      first_token = now;
    } else {
      gaps_ms.push_back(MillisBetween(last_token, now));
    }
    last_token = now;
    ++generated;
  }

  const std::vector<int32_t>& prompt() const {
    return kind == Kind::kGenerate ? generate.request.prompt_ids : beam.prompt_ids;
  }
  int32_t max_tokens() const { return kind == Kind::kGenerate ? generate.request.max_tokens : beam.params.max_tokens; }
  bool decoding() const { return prefilled == static_cast<int64_t>(prompt().size()); }
};

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const Model* model, Engine* engine, KvBlockPool* kv_pool,
                                                             const SchedulerOptions& options) {
  if (model == nullptr || engine == nullptr || kv_pool == nullptr) {
    return absl::InvalidArgumentError("scheduler needs a model, an engine and a KV block pool");
  }
  if (absl::Status status = options.Validate(); !status.ok()) return status;
  return std::unique_ptr<Scheduler>(new Scheduler(model, engine, kv_pool, options));
}

Scheduler::Scheduler(const Model* model, Engine* engine, KvBlockPool* kv_pool, const SchedulerOptions& options)
    : model_(model),
      eos_ids_(model->EosIds()),
      engine_(engine),
      kv_pool_(kv_pool),
      options_(options),
      started_(Clock::now()) {
  thread_ = std::thread([this] { Loop(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
}

absl::StatusOr<std::shared_ptr<RequestStream>> Scheduler::SubmitGenerate(GenerateParams params) {
  auto reject = [&](absl::Status status) {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.requests_rejected;
    return status;
  };
  if (absl::Status status = ValidateGenerationRequest(model_->config, params.request); !status.ok()) {
    return reject(status);
  }
  for (size_t i = 0; i < params.stop_strings.size(); ++i) {
    if (params.stop_strings[i].empty())
      return reject(absl::InvalidArgumentError(absl::StrCat("stop[", i, "] is empty")));
  }
  if (!params.stop_strings.empty() && model_->tokenizer == nullptr) {
    return reject(absl::InvalidArgumentError("stop strings need the model's tokenizer.model; use stop_ids"));
  }
  auto request = std::make_unique<Request>();
  request->kind = Request::Kind::kGenerate;
  const int64_t positions = static_cast<int64_t>(params.request.prompt_ids.size()) + params.request.max_tokens;
  request->reserved_blocks = CeilDiv(positions, kv_pool_->options().block_size);
  request->sequences = 1;
  request->generate = std::move(params);
  return Enqueue(std::move(request));
}

absl::StatusOr<std::shared_ptr<RequestStream>> Scheduler::SubmitBeamSearch(BeamSearchJob job) {
  auto reject = [&](absl::Status status) {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.requests_rejected;
    return status;
  };
  // The prompt and context checks are Generate's.
  GenerationRequest as_generate;
  as_generate.prompt_ids = job.prompt_ids;
  as_generate.max_tokens = job.params.max_tokens;
  as_generate.stop_ids = job.stop_ids;
  if (absl::Status status = ValidateGenerationRequest(model_->config, as_generate); !status.ok()) return reject(status);
  job.params.end_ids.clear();
  if (!job.ignore_eos) job.params.end_ids = eos_ids_;
  job.params.end_ids.insert(job.params.end_ids.end(), job.stop_ids.begin(), job.stop_ids.end());
  if (absl::Status status = job.params.Validate(model_->config.vocab_size); !status.ok()) return reject(status);
  const int64_t width = job.params.beam_width;
  if (width > options_.max_sequences) {
    // Never admissible, however long it waits: InvalidArgument, not the
    // ResourceExhausted a client would retry.
    return reject(absl::InvalidArgumentError(
        absl::StrCat("beam_width ", width, " exceeds the server's max_sequences (", options_.max_sequences, ")")));
  }
  auto request = std::make_unique<Request>();
  request->kind = Request::Kind::kBeamSearch;
  // Worst case: the shared prompt blocks, and per beam every block from the
  // prompt's partly filled last one (copied on write) to the end.
  const int64_t b = kv_pool_->options().block_size;
  const int64_t prompt = static_cast<int64_t>(job.prompt_ids.size());
  request->reserved_blocks = CeilDiv(prompt, b) + width * (CeilDiv(prompt + job.params.max_tokens, b) - prompt / b);
  request->sequences = width;
  request->beam = std::move(job);
  return Enqueue(std::move(request));
}

absl::StatusOr<std::shared_ptr<RequestStream>> Scheduler::Enqueue(std::unique_ptr<Request> request) {
  auto reject = [&](absl::Status status) {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.requests_rejected;
    return status;
  };
  if (request->reserved_blocks > kv_pool_->max_blocks()) {
    // More than the whole cache: never admissible (InvalidArgument, not a
    // retryable ResourceExhausted).
    return reject(absl::InvalidArgumentError(absl::StrCat(
        "request needs ", request->reserved_blocks, " KV cache blocks of ", kv_pool_->options().block_size,
        " positions (prompt ", request->prompt().size(), " + max_tokens ", request->max_tokens(),
        request->sequences > 1 ? absl::StrCat(", ", request->sequences, " beams") : "", "); the cache holds ",
        kv_pool_->max_blocks(), ": shorten the request or give the server more KV cache")));
  }
  request->submitted = Clock::now();
  std::shared_ptr<RequestStream> stream = request->stream;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return absl::UnavailableError("the server is shutting down");
    if (waiting_count_ >= options_.max_waiting + options_.max_sequences) {
      absl::MutexLock stats_lock(&stats_mu_);
      ++stats_.requests_rejected;
      return absl::ResourceExhaustedError(absl::StrCat(
          "server busy: ", waiting_count_, " requests are waiting (max_waiting ", options_.max_waiting, ")"));
    }
    request->id = next_id_++;
    ++waiting_count_;
    incoming_.push_back(std::move(request));
  }
  {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.requests_total;
  }
  cv_.SignalAll();
  return stream;
}

void Scheduler::Loop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && incoming_.empty() && active_.empty() && waiting_.empty()) cv_.Wait(&mu_);
      if (stopping_) break;
      while (!incoming_.empty()) {
        waiting_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    DropCancelled();
    PauseSlowReaders();
    Admit();
    PublishState();
    if (active_.empty()) {
      // Nothing admissible yet: wait for a new request or a cancellation
      // rather than spin (the head of the queue waits for KV memory held by
      // nobody only if it can never fit, which Enqueue refuses).
      WaitForRequest(absl::Milliseconds(10));
      continue;
    }
    const bool ran = RunStep();
    PublishState();
    if (!ran) {
      // Every running request waits for its client to read: wait for that
      // (or a new request) without spinning.
      WaitForRequest(absl::Milliseconds(5));
    }
  }
  // Shutting down: nobody is left waiting silently.
  {
    absl::MutexLock lock(&mu_);
    while (!incoming_.empty()) {
      waiting_.push_back(std::move(incoming_.front()));
      incoming_.pop_front();
    }
  }
  for (auto& r : active_) Finish(*r, absl::UnavailableError("the server is shutting down"));
  for (auto& r : waiting_) Finish(*r, absl::UnavailableError("the server is shutting down"));
  active_.clear();
  waiting_.clear();
  PublishState();
}

void Scheduler::WaitForRequest(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout;
  while (!stopping_ && incoming_.empty() && !cv_.WaitWithDeadline(&mu_, deadline)) {
  }
}

void Scheduler::PublishState() {
  absl::MutexLock lock(&stats_mu_);
  stats_.requests_active = static_cast<int64_t>(active_.size());
  stats_.requests_waiting = static_cast<int64_t>(waiting_.size());
  stats_.active_sequences = reserved_sequences_;
  stats_.kv_blocks_in_use = kv_pool_->blocks_in_use();
  stats_.kv_copies_on_write = kv_pool_->copies_on_write();
  stats_.kv_blocks_cached = kv_pool_->blocks_cached();
  stats_.prompt_cache_evictions = kv_pool_->prefix_evictions();
}

void Scheduler::DropCancelled() {
  for (auto& r : active_) {
    if (std::optional<absl::Status> reason = r->stream->cancel_reason()) Finish(*r, *reason);
  }
  std::erase_if(active_, [](const std::unique_ptr<Request>& r) { return r->finished; });
  for (auto& r : waiting_) {
    if (std::optional<absl::Status> reason = r->stream->cancel_reason()) Finish(*r, *reason);
  }
  std::erase_if(waiting_, [](const std::unique_ptr<Request>& r) { return r->finished; });
}

void Scheduler::PauseSlowReaders() {
  const auto now = Clock::now();
  for (auto& r : active_) {
    const size_t unread = r->stream->unread();
    if (unread < static_cast<size_t>(options_.max_unread_events)) {
      r->paused_since.reset();
      continue;
    }
    if (!r->paused_since) {
      r->paused_since = now;
      LOG_INFO("request ", r->id, ": paused, its client has ", unread, " events unread");
      continue;
    }
    if (now - *r->paused_since >= absl::ToChronoNanoseconds(options_.max_stall)) {
      Finish(*r, absl::ResourceExhaustedError(
                     absl::StrCat("the client did not read its stream for ", absl::FormatDuration(options_.max_stall),
                                  " (", unread, " events unread): the request was stopped and its KV cache freed")));
    }
  }
  std::erase_if(active_, [](const std::unique_ptr<Request>& r) { return r->finished; });
}

void Scheduler::Admit() {
  // First come, first served: a large request at the head is not overtaken
  // (it would starve otherwise); it waits for blocks to be freed.
  while (!waiting_.empty()) {
    Request& r = *waiting_.front();
    if (reserved_blocks_ + r.reserved_blocks > kv_pool_->max_blocks() ||
        reserved_sequences_ + r.sequences > options_.max_sequences) {
      break;
    }
    reserved_blocks_ += r.reserved_blocks;
    reserved_sequences_ += r.sequences;
    r.admitted = true;
    r.admitted_at = Clock::now();
    r.kv = std::make_unique<SequenceKv>(kv_pool_);
    ReuseCachedPrefix(r);
    if (r.kind == Request::Kind::kGenerate) {
      r.sampler = std::make_unique<Sampler>(r.generate.request.sampling, r.generate.request.prompt_ids);
      r.stops = std::make_unique<StopStringMatcher>(r.generate.stop_strings);
    } else {
      r.search = std::make_unique<BeamSearchState>(r.beam.params);
    }
    active_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    absl::MutexLock lock(&mu_);
    --waiting_count_;
  }
}

void Scheduler::ReuseCachedPrefix(Request& r) {
  if (!options_.prompt_cache) return;
  const int64_t block = kv_pool_->options().block_size;
  const std::vector<int32_t>& prompt = r.prompt();
  if (r.kind == Request::Kind::kGenerate) r.sequence_tokens = prompt;
  // The last prompt token always runs: its logits choose the first token.
  const int64_t reusable = (static_cast<int64_t>(prompt.size()) - 1) / block;
  std::vector<int32_t> blocks;
  for (int64_t i = 0; i < reusable; ++i) {
    const std::span<const int32_t> tokens(prompt.data() + i * block, static_cast<size_t>(block));
    const uint64_t hash = PrefixBlockHash(r.chain_hash, tokens);
    std::optional<int32_t> cached = kv_pool_->AcquirePrefixBlock(hash, r.chain_block, tokens);
    if (!cached) break;
    blocks.push_back(*cached);
    r.chain_hash = hash;
    r.chain_block = *cached;
  }
  r.published_blocks = static_cast<int64_t>(blocks.size());
  r.cached_prompt_tokens = r.published_blocks * block;
  r.prefilled = r.cached_prompt_tokens;
  r.kv->AdoptPrefix(std::move(blocks));
  if (r.cached_prompt_tokens > 0) {
    absl::MutexLock lock(&stats_mu_);
    stats_.prompt_cache_hit_tokens += r.cached_prompt_tokens;
  }
}

void Scheduler::PublishFullBlocks(Request& r) {
  // A beam search's blocks past the prompt belong to its beams (r.kv is the
  // prompt's until the first step).
  if (!options_.prompt_cache || r.kv == nullptr) return;
  const std::vector<int32_t>& tokens = r.kind == Request::Kind::kGenerate ? r.sequence_tokens : r.beam.prompt_ids;
  const int64_t block = kv_pool_->options().block_size;
  const int64_t full = std::min(r.kv->length(), static_cast<int64_t>(tokens.size())) / block;
  for (; r.published_blocks < full; ++r.published_blocks) {
    const std::span<const int32_t> content(tokens.data() + r.published_blocks * block, static_cast<size_t>(block));
    const uint64_t hash = PrefixBlockHash(r.chain_hash, content);
    r.chain_block = kv_pool_->PublishPrefixBlock(r.kv->blocks()[r.published_blocks], hash, r.chain_block, content);
    r.chain_hash = hash;
  }
}

bool Scheduler::RunStep() {
  const auto start = Clock::now();
  // Decode rows first (every running sequence moves one token), then prompt
  // chunks in admission order within what is left of max_batch_tokens.
  struct Slot {
    Request* r;
    size_t first_input;
    size_t num_inputs;
  };
  std::vector<ForwardInput> inputs;
  std::vector<Slot> slots;
  int64_t rows = 0;
  for (auto& r : active_) {
    if (!r->decoding() || r->paused_since) continue;
    if (r->kind == Request::Kind::kGenerate) {
      slots.push_back({r.get(), inputs.size(), 1});
      inputs.push_back({r->kv.get(), {r->next_tokens.data(), 1}, false});
    } else {
      slots.push_back({r.get(), inputs.size(), r->beam_kvs.size()});
      for (size_t i = 0; i < r->beam_kvs.size(); ++i) {
        inputs.push_back({r->beam_kvs[i].get(), {r->next_tokens.data() + i, 1}, false});
      }
    }
    rows += static_cast<int64_t>(slots.back().num_inputs);
  }
  for (auto& r : active_) {
    r->chunk = 0;
    if (r->decoding()) continue;
    const int64_t budget = options_.max_batch_tokens - rows;
    if (budget <= 0) break;
    const int64_t remaining = static_cast<int64_t>(r->prompt().size()) - r->prefilled;
    r->chunk = std::min(remaining, budget);
    slots.push_back({r.get(), inputs.size(), 1});
    inputs.push_back({r->kv.get(), {r->prompt().data() + r->prefilled, static_cast<size_t>(r->chunk)}, false});
    rows += r->chunk;
  }
  if (inputs.empty()) return false;

  const absl::Status status = engine_->Forward(inputs, &logits_);
  if (!status.ok()) {
    LOG_WARNING("step of ", rows, " rows failed, failing its ", slots.size(), " request(s): ", status.ToString());
    for (const Slot& slot : slots) Finish(*slot.r, status);
    std::erase_if(active_, [](const std::unique_ptr<Request>& r) { return r->finished; });
    return true;
  }
  // Account the step before streaming its tokens, so a client that sees
  // its request done also sees the step in the stats.
  int64_t tokens = 0;
  for (const Slot& slot : slots) {
    Request& r = *slot.r;
    if (r.decoding() || r.prefilled + r.chunk == static_cast<int64_t>(r.prompt().size())) {
      tokens += static_cast<int64_t>(slot.num_inputs);
    }
  }
  const auto end = Clock::now();
  {
    absl::MutexLock lock(&stats_mu_);
    ++stats_.steps;
    stats_.generated_tokens += tokens;
    window_.push_back({end, MillisBetween(start, end), rows, tokens, engine_->last_timing()});
    while (static_cast<int32_t>(window_.size()) > options_.stats_window_steps) window_.pop_front();
  }

  const int64_t vocab = model_->config.vocab_size;
  for (const Slot& slot : slots) {
    Request& r = *slot.r;
    PublishFullBlocks(r);
    std::span<const float> logits(logits_.data() + slot.first_input * vocab, slot.num_inputs * vocab);
    if (!r.decoding()) {
      r.prefilled += r.chunk;
      if (!r.decoding()) continue;  // more prompt to go: this chunk's logits are not needed
    }
    // Only this request fails: another in the batch may be fine.
    if (absl::Status finite = CheckFiniteLogits(logits); !finite.ok()) {
      LOG_WARNING("request ", r.id, ": ", finite.message());
      Finish(r, finite);
      continue;
    }
    if (r.kind == Request::Kind::kGenerate) {
      AfterGenerateLogits(r, logits);
    } else {
      AfterBeamLogits(r, logits, static_cast<int64_t>(slot.num_inputs));
    }
  }
  std::erase_if(active_, [](const std::unique_ptr<Request>& r) { return r->finished; });
  return true;
}

void Scheduler::AfterGenerateLogits(Request& r, std::span<const float> logits) {
  const GenerationRequest& request = r.generate.request;
  GeneratedToken token;
  token.id = r.sampler->Sample(logits);
  token.logprob = LogProbability(r.sampler->biased(), token.id);
  if (request.logprobs > 0) token.top_logprobs = TopLogprobs(r.sampler->biased(), request.logprobs);
  const std::string piece = model_->tokenizer ? model_->tokenizer->PieceText(token.id) : std::string();

  r.RecordToken();

  std::optional<FinishReason> finish;
  if (!request.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token.id) != eos_ids_.end()) {
    finish = FinishReason::kEos;
  } else if (std::find(request.stop_ids.begin(), request.stop_ids.end(), token.id) != request.stop_ids.end()) {
    finish = FinishReason::kStopId;
  } else if (r.generated >= request.max_tokens) {
    finish = FinishReason::kMaxTokens;
  }
  // Bytes → whole characters → the stop-string check, which may hold some back.
  std::string chars = r.utf8.Push(piece);
  if (finish) chars += r.utf8.Flush();
  StopStringMatcher::Result text = r.stops->Push(chars);
  token.text = std::move(text.emit);
  if (text.stopped) {
    finish = FinishReason::kStopString;
  } else if (finish) {
    token.text += r.stops->Flush();
  }

  if (!finish) {
    r.next_tokens.assign(1, token.id);
    if (options_.prompt_cache) r.sequence_tokens.push_back(token.id);  // its KV is written next step
    StreamEvent event;
    event.tokens.push_back(std::move(token));
    r.stream->Push(std::move(event));
    return;
  }
  r.finish_reason = *finish;
  StreamEvent event;
  event.tokens.push_back(std::move(token));
  r.stream->Push(std::move(event));
  Finish(r, absl::OkStatus());
}

void Scheduler::AfterBeamLogits(Request& r, std::span<const float> logits, int64_t rows) {
  const std::vector<BeamChoice> choices = r.search->Step(logits, model_->config.vocab_size);
  r.RecordToken();

  // Fork the chosen parents' caches (block tables only), then drop the old
  // beams: a parent chosen k times shares its blocks k ways, and the next
  // Forward copies just the last, partly filled block of k - 1 of them.
  std::vector<std::unique_ptr<SequenceKv>> next;
  next.reserve(choices.size());
  r.next_tokens.clear();
  for (const BeamChoice& choice : choices) {
    const SequenceKv& parent = r.beam_kvs.empty() ? *r.kv : *r.beam_kvs[choice.parent];
    next.push_back(std::make_unique<SequenceKv>(kv_pool_));
    next.back()->ForkFrom(parent);
    r.next_tokens.push_back(choice.token);
  }
  r.beam_kvs = std::move(next);
  r.kv.reset();

  if (r.beam.stream_progress && !r.search->done()) {
    StreamEvent event;
    BeamProgressEvent progress;
    progress.step = r.search->step();
    progress.live_beams = static_cast<int32_t>(r.search->live().size());
    progress.finished = r.search->num_finished();
    if (!r.search->live().empty()) progress.best = r.search->live().front();
    event.progress = std::move(progress);
    event.has_progress = true;
    r.stream->Push(std::move(event));
  }
  if (r.search->done()) Finish(r, absl::OkStatus());
}

RequestUsage Scheduler::Usage(const Request& r) const {
  RequestUsage usage;
  const auto now = Clock::now();
  usage.prompt_tokens = static_cast<int64_t>(r.prompt().size());
  usage.cached_prompt_tokens = r.cached_prompt_tokens;
  usage.generated_tokens = r.generated;
  usage.total_ms = MillisBetween(r.submitted, now);
  usage.queue_ms = r.admitted ? MillisBetween(r.submitted, r.admitted_at) : usage.total_ms;
  if (r.generated > 0) usage.time_to_first_token_ms = MillisBetween(r.submitted, r.first_token);
  if (!r.gaps_ms.empty()) {
    double sum = 0;
    for (double g : r.gaps_ms) sum += g;
    usage.mean_inter_token_ms = sum / static_cast<double>(r.gaps_ms.size());
    usage.p50_inter_token_ms = Percentile(r.gaps_ms, 0.50);
    usage.p99_inter_token_ms = Percentile(r.gaps_ms, 0.99);
    const double decode_ms = MillisBetween(r.first_token, r.last_token);
    if (decode_ms > 0) usage.tokens_per_s = 1000.0 * static_cast<double>(r.gaps_ms.size()) / decode_ms;
  }
  return usage;
}

void Scheduler::Finish(Request& r, absl::Status status) {
  if (r.finished) return;
  r.finished = true;
  StreamEvent event;
  event.done = true;
  event.finish_reason = r.finish_reason;
  event.usage = Usage(r);
  if (status.ok() && r.search) event.beams = r.search->Results();
  event.status = status;
  // Free the request's KV cache now, not when its stream is dropped.
  r.beam_kvs.clear();
  r.kv.reset();
  if (r.admitted) {
    reserved_blocks_ -= r.reserved_blocks;
    reserved_sequences_ -= r.sequences;
  } else {
    absl::MutexLock lock(&mu_);
    --waiting_count_;
  }
  {
    absl::MutexLock lock(&stats_mu_);
    if (status.ok()) {
      ++stats_.requests_succeeded;
      stats_.prompt_tokens += static_cast<int64_t>(r.prompt().size());
    } else if (IsCancellation(status)) {
      ++stats_.requests_cancelled;
    } else {
      ++stats_.requests_failed;
    }
  }
  r.stream->Push(std::move(event));
}

SchedulerStats Scheduler::Stats() const {
  absl::MutexLock lock(&stats_mu_);
  SchedulerStats s = stats_;
  const auto now = Clock::now();
  s.uptime_s = SecondsBetween(started_, now);
  if (!window_.empty()) {
    const auto begin = window_.front().end - std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double, std::milli>(window_.front().ms));
    s.window_s = SecondsBetween(begin, window_.back().end);
    double ms = 0, rows = 0, tokens = 0;
    ForwardTiming& f = s.mean_forward;
    for (const StepRecord& step : window_) {
      ms += step.ms;
      rows += static_cast<double>(step.rows);
      tokens += static_cast<double>(step.tokens);
      f.embed_us += step.timing.embed_us;
      f.attention_us += step.timing.attention_us;
      f.router_us += step.timing.router_us;
      f.experts_us += step.timing.experts_us;
      f.combine_us += step.timing.combine_us;
      f.shared_expert_us += step.timing.shared_expert_us;
      f.dense_mlp_us += step.timing.dense_mlp_us;
      f.logits_us += step.timing.logits_us;
      f.total_us += step.timing.total_us;
      s.mean_layers.resize(std::max(s.mean_layers.size(), step.timing.layers.size()));
      for (size_t l = 0; l < step.timing.layers.size(); ++l) {
        s.mean_layers[l].attention_us += step.timing.layers[l].attention_us;
        s.mean_layers[l].router_us += step.timing.layers[l].router_us;
        s.mean_layers[l].experts_us += step.timing.layers[l].experts_us;
        s.mean_layers[l].combine_us += step.timing.layers[l].combine_us;
        s.mean_layers[l].shared_expert_us += step.timing.layers[l].shared_expert_us;
        s.mean_layers[l].dense_mlp_us += step.timing.layers[l].dense_mlp_us;
      }
    }
    for (LayerTimingUs& l : s.mean_layers) {
      for (double* x :
           {&l.attention_us, &l.router_us, &l.experts_us, &l.combine_us, &l.shared_expert_us, &l.dense_mlp_us})
        *x /= static_cast<double>(window_.size());
    }
    const double n = static_cast<double>(window_.size());
    s.mean_step_ms = ms / n;
    s.mean_batch_rows = rows / n;
    if (s.window_s > 0) s.tokens_per_s = tokens / s.window_s;
    f.rows = static_cast<int64_t>(rows / n);
    for (double* x : {&f.embed_us, &f.attention_us, &f.router_us, &f.experts_us, &f.combine_us, &f.shared_expert_us,
                      &f.dense_mlp_us, &f.logits_us, &f.total_us}) {
      *x /= n;
    }
  }
  s.kv_blocks_total = kv_pool_->max_blocks();
  s.kv_block_size = kv_pool_->options().block_size;
  return s;
}

}  // namespace tandem
