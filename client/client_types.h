// The C++ SDK's value types: plain structs mirroring tandem/v1/inference.proto,
// so a program using tandem::sdk::Client never touches protobuf. A proto
// `optional` field is a std::optional here: unset means "the server's
// default" (documented beside each field, as in the proto).
//
// The SDK lives in tandem::sdk because the engine's own tandem::FinishReason
// (coordinator/generator.h) would clash with it in programs, such as our
// tests, that link both.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

namespace tandem::sdk {

enum class FinishReason { kUnspecified, kEos, kStopId, kStopString, kMaxTokens };
// "eos", "stop_id", "stop_string", "max_tokens", "unspecified".
std::string_view FinishReasonName(FinishReason reason);

// Per-call settings; every call has a deadline.
struct CallOptions {
  // Zero: the client's default for the kind of call (ClientOptions).
  absl::Duration timeout = absl::ZeroDuration();
};

struct GenerateOptions {
  // Exactly one of prompt (text; the model needs a tokenizer) and prompt_ids.
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::optional<bool> add_bos;        // prepend BOS to a text prompt; unset: true
  std::optional<int32_t> max_tokens;  // unset: 16
  std::optional<float> temperature;   // unset: 1.0; 0 = greedy
  std::optional<int32_t> top_k;       // unset or 0: all tokens
  std::optional<float> top_p;         // in (0, 1]; unset: 1.0
  std::optional<uint64_t> seed;       // unset: drawn by the server (see GenerateResult::seed)
  std::vector<std::string> stop;      // stop strings (not returned themselves)
  std::vector<int32_t> stop_ids;      // stop after emitting one of these
  bool ignore_eos = false;
  int32_t logprobs = 0;  // top-K log probabilities per position; 0 = none
  // Token id -> a bias in [-100, 100] added to its logit (OpenAI's
  // logit_bias); logprobs are then of the biased distribution.
  std::map<int32_t, float> logit_bias;
};

struct TopLogprob {
  int32_t id = 0;
  std::string text;
  double logprob = 0;
};

struct StreamedToken {
  int32_t id = 0;
  // The text this token adds to the stream; may be empty while text that
  // could begin a stop string is held back (a later token then carries it).
  std::string text;
  double logprob = 0;
  std::vector<TopLogprob> top_logprobs;  // highest first; empty unless logprobs > 0
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double queue_ms = 0;                // submitted -> admitted
  double time_to_first_token_ms = 0;  // submitted -> first token
  double mean_inter_token_ms = 0;
  double p50_inter_token_ms = 0;
  double p99_inter_token_ms = 0;
  double tokens_per_s = 0;  // decode speed: generated / (first -> last token)
  double total_ms = 0;
};

struct GenerateResult {
  std::vector<StreamedToken> tokens;
  std::string text;  // the tokens' texts, concatenated
  FinishReason finish_reason = FinishReason::kUnspecified;
  Usage usage;
  uint64_t seed = 0;  // the seed used (the request's, or the server's draw)

  std::vector<int32_t> ids() const;
};

struct BeamSearchOptions {
  // Exactly one of prompt and prompt_ids, as for GenerateOptions.
  std::string prompt;
  std::vector<int32_t> prompt_ids;
  std::optional<bool> add_bos;          // unset: true
  int32_t beam_width = 4;               // 1..64
  std::optional<int32_t> max_tokens;    // unset: 16
  std::optional<float> length_penalty;  // score = sum logprob / length^penalty; unset: 1.0
  // true: stop once beam_width sequences have finished; false: stop when no
  // live beam can still beat the finished ones.
  bool early_stopping = false;
  std::optional<int32_t> num_return_sequences;  // 1..beam_width; unset: 1
  std::vector<int32_t> stop_ids;                // end a beam like EOS
  bool ignore_eos = false;
  std::map<int32_t, float> logit_bias;  // as GenerateOptions', added to every beam's logits
};

struct BeamSequence {
  std::vector<int32_t> ids;  // generated ids, without the prompt; EOS included when it ended the beam
  std::string text;
  double score = 0;  // length-penalised
  double sum_logprob = 0;
  FinishReason finish_reason = FinishReason::kUnspecified;
};

struct BeamProgress {
  int32_t step = 0;
  int32_t live_beams = 0;
  int32_t finished = 0;
  BeamSequence best;  // the best live beam so far
};

struct BeamSearchResult {
  std::vector<BeamSequence> sequences;  // best first
  Usage usage;
};

struct TokenizeResult {
  std::vector<int32_t> ids;
  std::vector<std::string> pieces;
};

struct ModelInfo {
  std::string model_dir;     // the server's model folder, or "synthetic:PRESET:LAYERS seed N"
  std::string architecture;  // MixtralForCausalLM | PhiMoEForCausalLM
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int32_t num_layers = 0;
  int32_t num_experts = 0;
  int32_t experts_per_token = 0;
  int64_t max_context = 0;
  int64_t parameters = 0;
  int64_t expert_bytes = 0;  // one expert's weights
  std::string fingerprint;
  bool has_tokenizer = false;
  int32_t bos_id = 0;
  std::vector<int32_t> eos_ids;
  std::string placement_summary;  // where experts run
  int32_t max_sequences = 0;
  int64_t kv_cache_tokens = 0;
};

struct LayerTiming {
  int32_t layer = 0;
  double attention_ms = 0;
  double router_ms = 0;
  double experts_ms = 0;
};

struct WorkerHealth {
  std::string address;
  bool healthy = false;
  std::string detail;
};

struct ServerStats {
  double uptime_s = 0;
  int64_t requests_total = 0;
  int64_t requests_active = 0;
  int64_t requests_waiting = 0;
  int64_t requests_succeeded = 0;
  int64_t requests_failed = 0;
  int64_t requests_cancelled = 0;
  int64_t requests_rejected = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  double tokens_per_s = 0;  // over the last window
  double window_s = 0;
  double mean_step_ms = 0;
  double mean_batch_rows = 0;
  int64_t kv_blocks_in_use = 0;
  int64_t kv_blocks_total = 0;
  int64_t kv_block_size = 0;
  int32_t active_sequences = 0;
  std::vector<LayerTiming> layers;  // mean per step over the window
  std::vector<WorkerHealth> workers;
  std::string orchestrator_json;  // empty without an orchestrator
  // The server's CPU and the CPU kernels it chose at start-up.
  std::string cpu, cpu_flags, isa, kernel_plan, kernels;
};

}  // namespace tandem::sdk
