// The attention kernel (common/kernels/attention_block.h) against a float64
// reference, on every ISA path the host has and in both its shapes (queries
// in lanes, keys in lanes), which must give the same bits.
#include "common/kernels/attention_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// The cache of one sequence: `positions` rows of kv_heads * head_dim floats.
struct Cache {
  int64_t head_dim = 0, kv_heads = 0;
  std::vector<float> k, v;
  std::vector<const float*> key_rows, value_rows;
  Cache(int64_t positions, int64_t kv_heads_in, int64_t head_dim_in, uint32_t seed)
      : head_dim(head_dim_in), kv_heads(kv_heads_in) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> key(-2.0f, 2.0f), value(-1.0f, 1.0f);
    k.resize(static_cast<size_t>(positions * kv_heads * head_dim));
    v.resize(k.size());
    for (float& x : k) x = key(rng);
    for (float& x : v) x = value(rng);
    for (int64_t j = 0; j < positions; ++j) {
      key_rows.push_back(k.data() + j * kv_heads * head_dim);
      value_rows.push_back(v.data() + j * kv_heads * head_dim);
    }
  }
};

struct Case {
  int64_t rows, head_dim, start;  // the block's first row is at position `start`
  std::optional<int64_t> window;
};

std::string Name(const Case& c) {
  return absl::StrCat("rows ", c.rows, ", head_dim ", c.head_dim, ", start ", c.start,
                      c.window ? absl::StrCat(", window ", *c.window) : std::string(", no window"));
}

// Row r of the block attends kv head `kvh` over its causal (windowed) range, in float64.
std::vector<double> Reference(const Case& c, const std::vector<float>& q, int64_t q_stride, const Cache& cache,
                              int64_t kvh, const std::vector<int64_t>& first, const std::vector<int64_t>& count) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  std::vector<double> out(static_cast<size_t>(c.rows * c.head_dim));
  for (int64_t r = 0; r < c.rows; ++r) {
    std::vector<double> s(static_cast<size_t>(count[r]));
    double max = -INFINITY;
    for (int64_t j = 0; j < count[r]; ++j) {
      const float* key = cache.key_rows[first[r] + j] + kvh * c.head_dim;
      double dot = 0;
      for (int64_t d = 0; d < c.head_dim; ++d) dot += static_cast<double>(q[r * q_stride + d]) * key[d];
      s[j] = dot * scale;
      max = std::max(max, s[j]);
    }
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - max));
    for (int64_t j = 0; j < count[r]; ++j) {
      const float* value = cache.value_rows[first[r] + j] + kvh * c.head_dim;
      for (int64_t d = 0; d < c.head_dim; ++d) out[r * c.head_dim + d] += s[j] / sum * value[d];
    }
  }
  return out;
}

class AttentionBlockTest : public ::testing::TestWithParam<IsaLevel> {};

TEST_P(AttentionBlockTest, MatchesFloat64Reference) {
  const IsaLevel isa = GetParam();
  if (const std::string why = IsaUnavailableReason(isa); !why.empty()) GTEST_SKIP() << why;
  // Rows below, at and past a vector; head_dim with and without a partial
  // vector (6, 72) and Mixtral's 128; windows narrower than the block.
  const Case cases[] = {{1, 128, 0, std::nullopt},  {5, 16, 3, std::nullopt},  {8, 64, 40, std::nullopt},
                        {17, 72, 9, std::nullopt},  {32, 128, 0, std::nullopt}, {32, 128, 200, std::nullopt},
                        {32, 6, 11, std::nullopt},  {24, 128, 100, 48},         {32, 64, 60, 7},
                        {3, 128, 500, 600},         {31, 130, 33, std::nullopt}, {4, 64, 2047, std::nullopt},
                        {2, 72, 30, 20},            {7, 8, 13, std::nullopt},    {12, 24, 5, 9}};
  const int64_t kv_heads = 2, kvh = 1;
  for (const Case& c : cases) {
    const int64_t positions = c.start + c.rows;
    const Cache cache(positions, kv_heads, c.head_dim, 7);
    const int64_t q_stride = 3 * c.head_dim;  // rows of a wider q: the stride is honoured
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> q(static_cast<size_t>(c.rows * q_stride));
    for (float& x : q) x = dist(rng);
    std::vector<int64_t> first(static_cast<size_t>(c.rows)), count(first.size());
    for (int64_t r = 0; r < c.rows; ++r) {
      const int64_t position = c.start + r;
      first[r] = c.window ? std::max<int64_t>(0, position - *c.window + 1) : 0;
      count[r] = position - first[r] + 1;
    }
    const int64_t out_stride = c.head_dim + 5;
    std::vector<float> out(static_cast<size_t>(c.rows * out_stride), -7.0f);
    std::vector<float> scratch(static_cast<size_t>(AttentionBlockScratchFloats(positions, c.head_dim)));
    const AttentionBlockArgs args{.q = q.data(), .q_stride = q_stride, .rows = c.rows, .head_dim = c.head_dim,
                                  .first_key = first.data(), .num_keys = count.data(),
                                  .keys = cache.key_rows.data(), .values = cache.value_rows.data(),
                                  .kv_offset = kvh * c.head_dim,
                                  .scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)), .out = out.data(),
                                  .out_stride = out_stride};
    ASSERT_TRUE(AttendBlockWithIsa(isa, args, scratch.data()).ok()) << Name(c);
    // Each shape forced gives kAuto's bits, whichever kAuto picked.
    for (const AttentionBlockShape shape : {AttentionBlockShape::kQueriesInLanes, AttentionBlockShape::kKeysInLanes}) {
      std::vector<float> forced(out.size(), -7.0f);
      AttentionBlockArgs with_shape = args;
      with_shape.out = forced.data();
      ASSERT_TRUE(AttendBlockWithIsa(isa, with_shape, scratch.data(), shape).ok()) << Name(c);
      EXPECT_EQ(std::memcmp(forced.data(), out.data(), out.size() * sizeof(float)), 0)
          << Name(c) << ", shape " << static_cast<int>(shape);
    }
    const std::vector<double> ref = Reference(c, q, q_stride, cache, kvh, first, count);
    double err = 0, norm = 0;
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t d = 0; d < c.head_dim; ++d) {
        const double e = ref[r * c.head_dim + d];
        err += (out[r * out_stride + d] - e) * (out[r * out_stride + d] - e);
        norm += e * e;
      }
      // Columns between rows are not written.
      for (int64_t d = c.head_dim; d < out_stride; ++d) EXPECT_EQ(out[r * out_stride + d], -7.0f) << Name(c);
    }
    EXPECT_LT(err / norm, 1e-11) << Name(c);

    // A row's result does not depend on the rows beside it: each row alone
    // gives the same bits.
    for (int64_t r = 0; r < c.rows; r += 7) {
      std::vector<float> alone(static_cast<size_t>(c.head_dim));
      AttentionBlockArgs one = args;
      one.q = q.data() + r * q_stride, one.rows = 1, one.first_key = &first[r], one.num_keys = &count[r];
      one.out = alone.data(), one.out_stride = c.head_dim;
      ASSERT_TRUE(AttendBlockWithIsa(isa, one, scratch.data()).ok());
      EXPECT_EQ(std::memcmp(alone.data(), out.data() + r * out_stride, alone.size() * sizeof(float)), 0)
          << Name(c) << ", row " << r;
    }
  }
}

// Every path computes the same bits (same operations in the same order per
// lane), so what a machine computes does not depend on its vector width:
// 29 rows (queries in lanes on both), 4 (a decode row's GQA group: keys in
// lanes on both), 6 (keys in lanes on AVX-512, queries in lanes on AVX2).
TEST(AttentionBlockPathsTest, Avx512AndAvx2GiveTheSameBits) {
  if (const std::string why = IsaUnavailableReason(IsaLevel::kAvx512); !why.empty()) GTEST_SKIP() << why;
  for (const int64_t rows : {29, 4, 6}) {
    const int64_t head_dim = 128, start = 70, positions = start + rows;
    const Cache cache(positions, 1, head_dim, 3);
    std::vector<float> q(static_cast<size_t>(rows * head_dim));
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    for (float& x : q) x = dist(rng);
    std::vector<int64_t> first(static_cast<size_t>(rows), 0), count(first.size());
    for (int64_t r = 0; r < rows; ++r) count[r] = start + r + 1;
    std::vector<float> scratch(static_cast<size_t>(AttentionBlockScratchFloats(positions, head_dim)));
    std::vector<float> wide(q.size()), narrow(q.size());
    AttentionBlockArgs args{.q = q.data(), .q_stride = head_dim, .rows = rows, .head_dim = head_dim,
                            .first_key = first.data(), .num_keys = count.data(), .keys = cache.key_rows.data(),
                            .values = cache.value_rows.data(), .kv_offset = 0, .scale = 0.088f,
                            .out = wide.data(), .out_stride = head_dim};
    ASSERT_TRUE(AttendBlockWithIsa(IsaLevel::kAvx512, args, scratch.data()).ok());
    args.out = narrow.data();
    ASSERT_TRUE(AttendBlockWithIsa(IsaLevel::kAvx2, args, scratch.data()).ok());
    EXPECT_EQ(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)), 0) << rows << " rows";
  }
}

// A NaN query (a poisoned weight upstream) must come out NaN in every
// shape and path, so the logits fail the request instead of a finite,
// wrong row being sampled: the exp's clamp once turned NaN into e^-87.
TEST_P(AttentionBlockTest, ANaNQueryGivesANaNRow) {
  const IsaLevel isa = GetParam();
  if (const std::string why = IsaUnavailableReason(isa); !why.empty()) GTEST_SKIP() << why;
  for (const int64_t rows : {1, 4, 32}) {
    const int64_t head_dim = 64, positions = 40;
    const Cache cache(positions, 1, head_dim, 9);
    std::vector<float> q(static_cast<size_t>(rows * head_dim), 0.5f);
    q[3] = std::numeric_limits<float>::quiet_NaN();  // row 0 only
    std::vector<int64_t> first(static_cast<size_t>(rows), 0), count(first.size(), positions);
    std::vector<float> scratch(static_cast<size_t>(AttentionBlockScratchFloats(positions, head_dim)));
    for (const AttentionBlockShape shape : {AttentionBlockShape::kQueriesInLanes, AttentionBlockShape::kKeysInLanes}) {
      std::vector<float> out(q.size());
      const AttentionBlockArgs args{.q = q.data(), .q_stride = head_dim, .rows = rows, .head_dim = head_dim,
                                    .first_key = first.data(), .num_keys = count.data(),
                                    .keys = cache.key_rows.data(), .values = cache.value_rows.data(),
                                    .kv_offset = 0, .scale = 0.125f, .out = out.data(), .out_stride = head_dim};
      ASSERT_TRUE(AttendBlockWithIsa(isa, args, scratch.data(), shape).ok());
      for (int64_t d = 0; d < head_dim; ++d)
        ASSERT_TRUE(std::isnan(out[d])) << rows << " rows, shape " << static_cast<int>(shape) << ", column " << d;
      for (int64_t i = head_dim; i < rows * head_dim; ++i)
        ASSERT_TRUE(std::isfinite(out[i])) << rows << " rows, shape " << static_cast<int>(shape) << ", at " << i;
    }
  }
}

TEST(AttentionBlockArgsTest, RowsOutsideTheBlockSizeAreRefused) {
  AttentionBlockArgs args;
  args.rows = kAttentionBlockMaxRows + 1;
  const absl::Status status = AttendBlockWithIsa(IsaLevel::kAvx2, args, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rows"), std::string::npos) << status;
}

INSTANTIATE_TEST_SUITE_P(Paths, AttentionBlockTest, ::testing::Values(IsaLevel::kAvx2, IsaLevel::kAvx512),
                         [](const ::testing::TestParamInfo<IsaLevel>& info) {
                           return std::string(IsaLevelName(info.param));
                         });

}  // namespace
}  // namespace tandem
