// Attention of one block of query rows (a prefill block, or a decode row's
// query heads that share a kv head) against one head's cached keys and
// values, on one thread: the attention kernel (common/kernels/attention_block.h)
// in each shape (queries in lanes, keys in lanes) on each ISA path the host
// has, alternating. (Results before 2026-11-29 also show "per_key_dot", the
// per-(row, key) dot products decode ran before keys in lanes replaced
// them.) Layout: a key row every kv_heads
// x head_dim floats (Mixtral's 8 x 128 = 4 KB by default; small-mixtral 4 x
// 64). One JSON line per (rows, keys, kernel): microseconds per block (best
// of --reps) and GFLOP/s (4 * rows * keys * head_dim flops: q.k and p.v,
// the causal half not subtracted: every row here attends every key).
//
//   tandem-attention-bench --rows 1,4,8,16,32 --keys 512,4096 --reps 20
//   tandem-attention-bench --head_dim 64 --kv_heads 4 --rows 1,2,4,8,12,16
#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/json_lines.h"
#include "common/kernels/attention_block.h"

ABSL_FLAG(std::string, rows, "1,4,8,16,32", "query rows per block (at most 32)");
ABSL_FLAG(std::string, keys, "512,4096", "keys every row attends");
ABSL_FLAG(int, reps, 20, "repetitions per kernel and shape; the best is reported");
ABSL_FLAG(int64_t, head_dim, 128, "floats per head");
ABSL_FLAG(int64_t, kv_heads, 8, "kv heads per cached position (the key row stride)");

namespace tandem {
namespace {

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

void Run(int64_t rows, int64_t keys, int reps, int64_t head_dim, int64_t kv_heads) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(keys * kv_heads * head_dim)), v(k.size()), q(rows * head_dim);
  for (float& x : k) x = dist(rng);
  for (float& x : v) x = dist(rng);
  for (float& x : q) x = dist(rng);
  std::vector<const float*> key_rows, value_rows;
  for (int64_t j = 0; j < keys; ++j) {
    key_rows.push_back(k.data() + j * kv_heads * head_dim);
    value_rows.push_back(v.data() + j * kv_heads * head_dim);
  }
  std::vector<int64_t> first(static_cast<size_t>(rows), 0), count(static_cast<size_t>(rows), keys);
  std::vector<float> out(q.size());
  std::vector<float> scratch(static_cast<size_t>(AttentionBlockScratchFloats(keys, head_dim)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const AttentionBlockArgs args{.q = q.data(), .q_stride = head_dim, .rows = rows, .head_dim = head_dim,
                                .first_key = first.data(), .num_keys = count.data(), .keys = key_rows.data(),
                                .values = value_rows.data(), .kv_offset = 0, .scale = scale, .out = out.data(),
                                .out_stride = head_dim};
  struct Kernel {
    std::string name;
    std::function<void()> run;
  };
  std::vector<Kernel> kernels;
  for (IsaLevel isa : {IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    if (!IsaUnavailableReason(isa).empty()) continue;
    for (const auto& [shape_in_lanes, name] : {std::pair{AttentionBlockShape::kQueriesInLanes, "queries_in_lanes_"},
                                               std::pair{AttentionBlockShape::kKeysInLanes, "keys_in_lanes_"}}) {
      const AttentionBlockShape shape = shape_in_lanes;  // a lambda cannot capture a structured binding (C++17 clang)
      kernels.push_back({absl::StrCat(name, IsaLevelName(isa)),
                         [&, isa, shape] { (void)AttendBlockWithIsa(isa, args, scratch.data(), shape); }});
    }
  }
  std::vector<double> best(kernels.size(), 1e30);
  for (int round = 0; round < reps; ++round)  // alternating: the host is shared and noisy
    for (size_t i = 0; i < kernels.size(); ++i) best[i] = std::min(best[i], BestMicros(1, kernels[i].run));
  const double flops = 4.0 * static_cast<double>(rows * keys * head_dim);
  for (size_t i = 0; i < kernels.size(); ++i) {
    EmitJsonLine({{"bench", "attention_block"}, {"kernel", kernels[i].name}, {"rows", rows}, {"keys", keys},
                  {"head_dim", head_dim}, {"kv_heads", kv_heads}, {"us", best[i]},
                  {"gflops", flops / best[i] / 1e3}});
  }
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int64_t head_dim = absl::GetFlag(FLAGS_head_dim), kv_heads = absl::GetFlag(FLAGS_kv_heads);
  if (head_dim < 1 || head_dim > 1024 || kv_heads < 1 || kv_heads > 256) {
    std::fprintf(stderr, "--head_dim must be 1..1024 and --kv_heads 1..256 (got %lld, %lld)\n",
                 static_cast<long long>(head_dim), static_cast<long long>(kv_heads));
    return 2;
  }
  for (int64_t keys : tandem::ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_keys)))
    for (int64_t rows : tandem::ParsePositiveList<int64_t>(absl::GetFlag(FLAGS_rows)))
      tandem::Run(std::min<int64_t>(rows, tandem::kAttentionBlockMaxRows), keys, absl::GetFlag(FLAGS_reps),
                  head_dim, kv_heads);
  return 0;
}
