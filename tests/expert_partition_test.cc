// How experts are divided between CPU workers: split ranges cover each
// expert's intermediate dimension exactly once, balanced and 16-aligned;
// shards cover every (layer, expert) exactly once.
#include "common/model/expert_partition.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "common/model/synthetic_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

ModelConfig Config(int64_t layers, int64_t experts, int64_t intermediate) {
  ModelConfig config;
  config.num_hidden_layers = layers;
  config.num_local_experts = experts;
  config.intermediate_size = intermediate;
  config.hidden_size = 64;
  return config;
}

TEST(ExpertPartitionTest, DivisionNamesRoundTrip) {
  for (ExpertDivision division : {ExpertDivision::kSplit, ExpertDivision::kShard}) {
    absl::StatusOr<ExpertDivision> parsed = ParseExpertDivision(ExpertDivisionName(division));
    ASSERT_OK(parsed);
    EXPECT_EQ(*parsed, division);
  }
  absl::StatusOr<ExpertDivision> bad = ParseExpertDivision("halves");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "halves")) << bad.status();
}

TEST(ExpertPartitionTest, MixtralSplitsInHalvesOf7168) {
  absl::StatusOr<std::vector<IntermediateRange>> ranges = SplitIntermediate(14336, 2);
  ASSERT_OK(ranges);
  ASSERT_EQ(ranges->size(), 2u);
  EXPECT_EQ((*ranges)[0].begin, 0);
  EXPECT_EQ((*ranges)[0].end, 7168);
  EXPECT_EQ((*ranges)[1].begin, 7168);
  EXPECT_EQ((*ranges)[1].end, 14336);
}

TEST(ExpertPartitionTest, TinySplits) {
  absl::StatusOr<std::vector<IntermediateRange>> two = SplitIntermediate(96, 2);
  ASSERT_OK(two);
  EXPECT_EQ((*two)[0].end, 48);
  EXPECT_EQ((*two)[1].size(), 48);
  absl::StatusOr<std::vector<IntermediateRange>> three = SplitIntermediate(96, 3);
  ASSERT_OK(three);
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ((*three)[static_cast<size_t>(w)].begin, 32 * w);
    EXPECT_EQ((*three)[static_cast<size_t>(w)].size(), 32);
  }
}

// Every I and worker count: contiguous, covering [0, I) once, balanced,
// boundaries on multiples of 16 whenever each worker can get 16 rows.
TEST(ExpertPartitionTest, SplitCoversOnceBalancedAndAligned) {
  for (int64_t intermediate : {1, 7, 16, 17, 80, 96, 100, 250, 1000, 6400, 14336, 14337}) {
    for (int workers = 1; workers <= 9; ++workers) {
      if (intermediate < workers) continue;
      absl::StatusOr<std::vector<IntermediateRange>> ranges = SplitIntermediate(intermediate, workers);
      ASSERT_OK(ranges);
      ASSERT_EQ(ranges->size(), static_cast<size_t>(workers));
      int64_t next = 0, smallest = intermediate, largest = 0;
      for (const IntermediateRange& r : *ranges) {
        EXPECT_EQ(r.begin, next) << "I=" << intermediate << " workers=" << workers;
        EXPECT_GT(r.size(), 0) << "I=" << intermediate << " workers=" << workers;
        next = r.end;
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
      }
      EXPECT_EQ(next, intermediate);
      const bool aligned = intermediate >= 16 * workers;
      EXPECT_LE(largest - smallest, aligned ? 16 : 1) << "I=" << intermediate << " workers=" << workers;
      if (aligned) {
        for (const IntermediateRange& r : *ranges) EXPECT_EQ(r.begin % 16, 0) << "I=" << intermediate;
        if (intermediate % 16 == 0) {
          for (const IntermediateRange& r : *ranges) EXPECT_EQ(r.size() % 16, 0) << "I=" << intermediate;
        }
      }
    }
  }
}

TEST(ExpertPartitionTest, SplitGivesEveryWorkerEveryExpertInOrder) {
  absl::StatusOr<ModelConfig> config = SyntheticConfig(SyntheticModelSpec{.preset = "tiny"});
  ASSERT_OK(config);
  for (int workers : {1, 2, 3}) {
    absl::StatusOr<std::vector<IntermediateRange>> ranges = SplitIntermediate(config->intermediate_size, workers);
    ASSERT_OK(ranges);
    for (int w = 0; w < workers; ++w) {
      absl::StatusOr<std::vector<ExpertSlice>> slices = PartitionExperts(*config, ExpertDivision::kSplit, w, workers);
      ASSERT_OK(slices);
      ASSERT_EQ(slices->size(), static_cast<size_t>(config->num_hidden_layers * config->num_local_experts));
      size_t i = 0;
      for (int layer = 0; layer < config->num_hidden_layers; ++layer) {
        for (int expert = 0; expert < config->num_local_experts; ++expert, ++i) {
          const ExpertSlice& s = (*slices)[i];
          EXPECT_EQ(s.layer, layer);
          EXPECT_EQ(s.expert, expert);
          EXPECT_EQ(s.intermediate_begin, (*ranges)[static_cast<size_t>(w)].begin);
          EXPECT_EQ(s.intermediate_end, (*ranges)[static_cast<size_t>(w)].end);
        }
      }
    }
  }
}

TEST(ExpertPartitionTest, ShardCoversEveryExpertOnceWhole) {
  for (int workers : {1, 2, 3, 5}) {
    const ModelConfig config = Config(3, 8, 96);
    std::map<std::pair<int, int>, int> owner;
    for (int w = 0; w < workers; ++w) {
      absl::StatusOr<std::vector<ExpertSlice>> slices = PartitionExperts(config, ExpertDivision::kShard, w, workers);
      ASSERT_OK(slices);
      for (size_t i = 0; i < slices->size(); ++i) {
        const ExpertSlice& s = (*slices)[i];
        EXPECT_EQ(s.intermediate_begin, 0);
        EXPECT_EQ(s.intermediate_end, 96);
        EXPECT_EQ(ShardWorker(s.layer, s.expert, workers), w);
        EXPECT_TRUE(owner.emplace(std::make_pair(s.layer, s.expert), w).second)
            << "layer " << s.layer << " expert " << s.expert << " held twice";
        if (i > 0) {  // (layer, expert) order
          EXPECT_LT(std::make_pair((*slices)[i - 1].layer, (*slices)[i - 1].expert), std::make_pair(s.layer, s.expert));
        }
      }
    }
    EXPECT_EQ(owner.size(), 24u) << workers << " workers";
  }
  // Two workers, four experts: each holds two per layer, rotating by layer.
  const ModelConfig tiny = Config(2, 4, 96);
  absl::StatusOr<std::vector<ExpertSlice>> w0 = PartitionExperts(tiny, ExpertDivision::kShard, 0, 2);
  ASSERT_OK(w0);
  ASSERT_EQ(w0->size(), 4u);
  EXPECT_EQ((*w0)[0].expert, 0);
  EXPECT_EQ((*w0)[1].expert, 2);
  EXPECT_EQ((*w0)[2].expert, 1);  // layer 1 rotates
  EXPECT_EQ((*w0)[3].expert, 3);
}

TEST(ExpertPartitionTest, ErrorsNameTheProblem) {
  const ModelConfig config = Config(2, 4, 96);
  struct Case {
    ModelConfig config;
    ExpertDivision division;
    int worker, workers;
    std::string mentions;
  };
  const Case cases[] = {
      {config, ExpertDivision::kSplit, 0, 0, "num_workers"},
      {config, ExpertDivision::kShard, 0, -1, "num_workers"},
      {config, ExpertDivision::kSplit, 2, 2, "worker_index 2"},
      {config, ExpertDivision::kShard, -1, 2, "worker_index -1"},
      {Config(2, 4, 2), ExpertDivision::kSplit, 0, 3, "no rows"},
      {Config(0, 4, 96), ExpertDivision::kSplit, 0, 1, "num_hidden_layers"},
      {Config(2, 0, 96), ExpertDivision::kShard, 0, 1, "num_local_experts"},
      {Config(2, 4, 0), ExpertDivision::kShard, 0, 1, "intermediate_size"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::vector<ExpertSlice>> slices = PartitionExperts(c.config, c.division, c.worker, c.workers);
    ASSERT_FALSE(slices.ok()) << c.mentions;
    EXPECT_EQ(slices.status().code(), absl::StatusCode::kInvalidArgument) << slices.status();
    EXPECT_TRUE(absl::StrContains(slices.status().message(), c.mentions)) << slices.status();
  }
  EXPECT_FALSE(SplitIntermediate(0, 1).ok());
  EXPECT_FALSE(SplitIntermediate(96, 0).ok());
  EXPECT_FALSE(SplitIntermediate(3, 4).ok());
}

// A quantized down_proj is split on whole blocks: every boundary a multiple
// of the block (of lcm(16, block) when I allows), covering [0, I); fewer
// blocks than workers, or I not whole blocks, is refused saying so, and
// PartitionExperts names the tensor, its type and the block size.
TEST(SplitIntermediateTest, BlocksAreNeverCut) {
  for (const int64_t block : {32, 256}) {
    for (const int64_t intermediate : {block * 4, block * 7, int64_t{14336}, block * 56 + block}) {
      for (int workers = 1; workers <= 6; ++workers) {
        absl::StatusOr<std::vector<IntermediateRange>> ranges = SplitIntermediate(intermediate, workers, block);
        if (intermediate / block < workers) {
          EXPECT_FALSE(ranges.ok()) << intermediate << " / " << workers;
          continue;
        }
        ASSERT_TRUE(ranges.ok()) << ranges.status();
        int64_t begin = 0;
        for (const IntermediateRange& r : *ranges) {
          EXPECT_EQ(r.begin, begin);
          EXPECT_EQ(r.begin % block, 0) << intermediate << " / " << workers;
          EXPECT_GT(r.size(), 0);
          EXPECT_EQ(r.size() % block, 0) << intermediate << " / " << workers;
          begin = r.end;
        }
        EXPECT_EQ(begin, intermediate);
      }
    }
  }
  // The block-free split is unchanged: 16-row units.
  EXPECT_EQ((*SplitIntermediate(96, 2, 1))[0].end, 48);
  absl::StatusOr<std::vector<IntermediateRange>> few = SplitIntermediate(512, 3, 256);
  ASSERT_FALSE(few.ok());
  EXPECT_TRUE(absl::StrContains(few.status().message(), "without a whole block")) << few.status();
  EXPECT_FALSE(SplitIntermediate(500, 2, 32).ok());  // not whole blocks

  const ExpertSplitBlock q6{.values = 256, .dtype = DType::kQ6_K, .tensor = "model.layers.1.x.w2.weight"};
  absl::StatusOr<std::vector<ExpertSlice>> refused =
      PartitionExperts(Config(2, 4, 512), ExpertDivision::kSplit, 0, 3, q6);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* part : {"model.layers.1.x.w2.weight", "Q6_K", "256-value blocks", "3 workers"}) {
    EXPECT_TRUE(absl::StrContains(refused.status().message(), part)) << part << ": " << refused.status();
  }
  EXPECT_OK(PartitionExperts(Config(2, 4, 512), ExpertDivision::kShard, 0, 3, q6));
  EXPECT_OK(PartitionExperts(Config(2, 4, 512), ExpertDivision::kSplit, 1, 2, q6));
}

}  // namespace
}  // namespace tandem
