// Token helpers shared by the tests: deterministic random prompts, and the
// ids of a generation result.
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/generation/generator.h"

namespace tandem {

// n ids drawn uniformly from [3, vocab) (above the special ids) by a seeded generator.
std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed);

// The generated token ids, in order.
std::vector<int32_t> Ids(const GenerationResult& result);

}  // namespace tandem
