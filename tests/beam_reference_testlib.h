// The oracle for beam search: the plainest possible implementation, over the
// float64 reference model, beams run one at a time, every step recomputing
// each beam's whole sequence (no KV cache, no batching, no forking). It
// shares no code with coordinator/beam_search.cc; it implements the same
// documented rule (Hugging Face's BeamSearchScorer, see beam_search.h) from
// the description, enumerating every (beam, token) pair instead of taking
// per-beam top lists.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/reference_model_testlib.h"

namespace tandem {

struct NaiveBeamParams {
  int beam_width = 1;
  int max_tokens = 8;
  double length_penalty = 1.0;
  bool early_stopping = false;
  int num_return_sequences = 1;
  std::vector<int32_t> end_ids;
};

struct NaiveBeam {
  std::vector<int32_t> ids;
  double sum_logprob = 0;
  double score = 0;
  bool ended_by_token = false;
};

// The num_return_sequences best sequences, best first.
absl::StatusOr<std::vector<NaiveBeam>> NaiveBeamSearch(const ReferenceModel& model, const std::vector<int32_t>& prompt,
                                                       const NaiveBeamParams& params);

}  // namespace tandem
