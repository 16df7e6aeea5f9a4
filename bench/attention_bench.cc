// Prefill attention of one block of query rows against one head's cached
// keys and values, on one thread: the per-key dot products of
// AttendRowsOneHead (coordinator/cpu_ops.h, what decode runs) against the
// GEMM-shaped kernel (common/kernels/attention_block.h) on each ISA path the
// host has, alternating, at Mixtral's layout (head_dim 128, a key row every
// 8 kv heads x 128 floats = 4 KB). One JSON line per (rows, keys, kernel):
// microseconds per block (best of --reps) and GFLOP/s (4 * rows * keys *
// head_dim flops: q.k and p.v, the causal half not subtracted: every row
// here attends every key).
//
//   tandem-attention-bench --rows 1,4,8,16,32 --keys 512,4096 --reps 20
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/json_lines.h"
#include "common/kernels/attention_block.h"
#include "coordinator/cpu_ops.h"

ABSL_FLAG(std::string, rows, "1,4,8,16,32", "query rows per block (at most 32)");
ABSL_FLAG(std::string, keys, "512,4096", "keys every row attends");
ABSL_FLAG(int, reps, 20, "repetitions per kernel and shape; the best is reported");

namespace tandem {
namespace {

constexpr int64_t kHeadDim = 128, kKvHeads = 8;

template <typename Fn>
double BestMicros(int reps, Fn fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

void Run(int64_t rows, int64_t keys, int reps) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(keys * kKvHeads * kHeadDim)), v(k.size()), q(rows * kHeadDim);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  for (float& x : q) x = dist(rng);
  std::vector<const float*> key_rows, value_rows;
  for (int64_t j = 0; j < keys; ++j) {
    key_rows.push_back(k.data() + j * kKvHeads * kHeadDim);
    value_rows.push_back(v.data() + j * kKvHeads * kHeadDim);
  }
  std::vector<int64_t> first(static_cast<size_t>(rows), 0), count(static_cast<size_t>(rows), keys);
  std::vector<float> out(q.size()), scores(static_cast<size_t>(rows * keys));
  std::vector<float> scratch(static_cast<size_t>(AttentionBlockScratchFloats(keys, kHeadDim)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const AttentionBlockArgs args{.q = q.data(), .q_stride = kHeadDim, .rows = rows, .head_dim = kHeadDim,
                                .first_key = first.data(), .num_keys = count.data(), .keys = key_rows.data(),
                                .values = value_rows.data(), .kv_offset = 0, .scale = scale, .out = out.data(),
                                .out_stride = kHeadDim};
  struct Kernel {
    std::string name;
    std::function<void()> run;
  };
  std::vector<Kernel> kernels = {{"per_key_dot", [&] {
                                    AttendRowsOneHead(
                                        q.data(), kHeadDim, rows, kHeadDim, first.data(), count.data(),
                                        [&](int64_t j) { return key_rows[j]; }, [&](int64_t j) { return value_rows[j]; },
                                        scores.data(), out.data(), kHeadDim);
                                  }}};
  for (IsaLevel isa : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (!IsaUnavailableReason(isa).empty()) continue;
    kernels.push_back({absl::StrCat("block_", IsaLevelName(isa)),
                       [&, isa] { (void)AttendBlockWithIsa(isa, args, scratch.data()); }});
  }
  std::vector<double> best(kernels.size(), 1e30);
  for (int round = 0; round < reps; ++round)  // alternating: the host is shared and noisy
    for (size_t i = 0; i < kernels.size(); ++i) best[i] = std::min(best[i], BestMicros(1, kernels[i].run));
  const double flops = 4.0 * static_cast<double>(rows * keys * kHeadDim);
  for (size_t i = 0; i < kernels.size(); ++i) {
    EmitJsonLine({{"bench", "attention_block"}, {"kernel", kernels[i].name}, {"rows", rows}, {"keys", keys},
                  {"head_dim", kHeadDim}, {"us", best[i]}, {"gflops", flops / best[i] / 1e3}});
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  for (int64_t keys : tandem::ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_keys)))
    for (int64_t rows : tandem::ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_rows)))
      tandem::Run(std::min<int64_t>(rows, tandem::kAttentionBlockMaxRows), keys, absl::GetFlag(FLAGS_reps));
  return 0;
}
