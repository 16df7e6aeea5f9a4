// What every front end of the scheduler shares (the gRPC InferenceService and
// the HTTP server of coordinator/http/): the server's facts and hooks, the
// prompt of a request as ids, and fresh seeds. One place, so a prompt is
// checked the same way whichever protocol brought it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/expert_division.h"
#include "common/model/model.h"

namespace tandem {

struct WorkerHealthInfo {
  std::string address;
  bool healthy = false;
  std::string detail;
};

struct ServingOptions {
  std::string model_dir;
  std::string placement_summary;  // where experts run, in words
  int64_t kv_cache_tokens = 0;
  // Where the CPU experts run: 0 workers = in this process; else the
  // worker processes and how the experts are divided between them.
  int num_cpu_workers = 0;
  ExpertDivision division = ExpertDivision::kSplit;
  // Optional, called from request threads: CPU workers' health, and the
  // orchestrator's figures as JSON.
  std::function<std::vector<WorkerHealthInfo>()> worker_health;
  std::function<std::string()> orchestrator_json;
};

// The prompt of a request: exactly one of `text` (tokenized with the model's
// tokenizer, BOS first when `add_bos`) and `ids`. InvalidArgument naming
// `field` when both or neither are given, the model has no tokenizer for a
// text, the text encodes to nothing, or (with max_token_bytes > 0) the text
// is too long for the context to hold (CheckPromptTextFits).
absl::StatusOr<std::vector<int32_t>> PromptIds(const Model& model, const std::string& text,
                                               std::span<const int32_t> ids, bool add_bos,
                                               const std::string& field = "prompt", int64_t max_token_bytes = 0);

// The most text one token stands for, in bytes (its longest piece); 1
// without a tokenizer. Reads the whole vocabulary: compute once per model.
int64_t MaxTokenTextBytes(const Model& model);

// A prompt text is tokenized on the request's thread before its length is
// known, so a text that cannot fit the context is refused by its size first:
// B bytes are at least B / (max_token_bytes * kPromptTextSlack) tokens
// (the slack covers normalization, which can shrink text, e.g. NFKC's
// ligatures and compositions). InvalidArgument naming `field` when that
// bound already exceeds `context` tokens.
inline constexpr int64_t kPromptTextSlack = 4;
absl::Status CheckPromptTextFits(size_t text_bytes, int64_t max_token_bytes, int64_t context, const std::string& field);

// A seed from the system's entropy, for requests that give none.
uint64_t FreshSeed();

}  // namespace tandem
