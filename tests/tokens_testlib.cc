#include "tests/tokens_testlib.h"

#include <random>

namespace tandem {

std::vector<int32_t> RandomTokens(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> Ids(const GenerationResult& result) {
  std::vector<int32_t> ids;
  for (const GeneratedToken& t : result.tokens) ids.push_back(t.id);
  return ids;
}

}  // namespace tandem
