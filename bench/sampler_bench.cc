// What choosing the next token costs per decode step, next to the model's
// own step: the sampler (greedy, temperature, top-k, top-p, min-p and
// llama.cpp's default mix) and the log probabilities a response reports, on
// one vocabulary row of random logits. --spread is the logits' standard
// deviation: small is a flat distribution (thousands of tokens inside top-p),
// large a peaked one.
//
// Prints one JSON line per (spread, case): median and p99 microseconds per
// call over --calls calls, each on a fresh row (the rows are drawn once).
//   tandem-sampler-bench --vocab 32000 --spread 1,3,8
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "coordinator/generation/sampler.h"

ABSL_FLAG(int, vocab, 32000, "tokens in the vocabulary (Mixtral 32000, Phi-3.5-MoE 32064, Qwen 151936)");
ABSL_FLAG(std::string, spread, "1,3,8", "standard deviations of the logits, comma-separated");
ABSL_FLAG(int, calls, 400, "timed calls per case");

namespace tandem {
namespace {

struct Case {
  const char* name;
  SamplingParams params;
  int logprobs = 0;  // > 0: time LogProbability and TopLogprobs(k) instead of Sample
};

int Main() {
  const int vocab = absl::GetFlag(FLAGS_vocab), calls = absl::GetFlag(FLAGS_calls);
  if (vocab < 2 || calls < 1) {
    std::fprintf(stderr, "tandem-sampler-bench: --vocab must be >= 2 and --calls >= 1\n");
    return 2;
  }
  const std::vector<Case> cases = {
      {"greedy", {.temperature = 0.0f}},
      {"temperature 1", {.temperature = 1.0f, .seed = 1}},
      {"top_k 40", {.temperature = 1.0f, .top_k = 40, .seed = 1}},
      {"top_p 0.9", {.temperature = 1.0f, .top_p = 0.9f, .seed = 1}},
      {"min_p 0.05", {.temperature = 1.0f, .min_p = 0.05f, .seed = 1}},
      {"top_k 40, top_p 0.95, min_p 0.05, T 0.8",
       {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .seed = 1}},
      {"logprob", {}, 1},
      {"logprob and top 20", {}, 20},
  };
  constexpr int kRows = 16;
  for (float spread : ParsePositiveList<int>(absl::GetFlag(FLAGS_spread))) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, spread);
    std::vector<std::vector<float>> rows(kRows, std::vector<float>(static_cast<size_t>(vocab)));
    for (auto& row : rows)
      for (float& l : row) l = normal(rng);
    for (const Case& c : cases) {
      Sampler sampler(c.params);
      std::vector<double> us;
      double sink = 0;
      for (int i = 0; i < calls; ++i) {
        const std::vector<float>& row = rows[static_cast<size_t>(i % kRows)];
        const auto start = std::chrono::steady_clock::now();
        if (c.logprobs == 0) {
          sink += sampler.Sample(row);
        } else {
          sink += LogProbability(row, i % vocab);
          if (c.logprobs > 1) sink += TopLogprobs(row, c.logprobs).front().second;
        }
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
      }
      const Summary s = Summarise(us);
      EmitJsonLine({{"bench", "sampler"},
                    {"case", c.name},
                    {"vocab", vocab},
                    {"spread", spread},
                    {"calls", calls},
                    {"median_us", s.median},
                    {"p99_us", s.p99},
                    {"checksum", sink}});
    }
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Main();
}
