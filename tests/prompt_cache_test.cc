// The prompt cache: KV blocks indexed by the token prefix they end
// (coordinator/engine/prefix_index.h, KvBlockPool), and the scheduler reusing
// the longest cached prefix of a new prompt. Outputs with the cache equal
// those without it (and the single-sequence generator's), the prefix found is
// the longest one (never past the prompt's last token), cached blocks are
// memory the pool reuses least recently used first, and a collision of
// hashes or a different parent is a miss.
#include <gtest/gtest.h>

#include <thread>

#include "coordinator/engine/kv_cache.h"
#include "coordinator/engine/prefix_index.h"
#include "coordinator/generation/scheduler.h"
#include "coordinator/runtime/local_runtime.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/status_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

constexpr int64_t kBlock = 16;  // the runtime's default KV block size
// f32-input kernels, as the scheduler's tests: the default plan's bf16 GEMM
// rounds its inputs, so KV computed in a decode step (GEMV) and the same
// positions recomputed in a prefill (GEMM) differ at bf16 precision, and a
// random-weight model's near-ties can flip on that.
const bool kExactKernels = test::UseExactKernels();

std::unique_ptr<KvBlockPool> Pool(int64_t max_blocks) {
  auto pool = KvBlockPool::Create({.num_layers = 1, .kv_dim = 4, .block_size = 4, .max_blocks = max_blocks});
  EXPECT_OK(pool);
  return std::move(*pool);
}

TEST(PrefixIndexTest, FindsOnlyTheSameTokensAfterTheSameParent) {
  PrefixIndex index;
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  const uint64_t ha = PrefixBlockHash(0, a);
  EXPECT_NE(ha, PrefixBlockHash(0, b));
  EXPECT_NE(ha, PrefixBlockHash(1, a)) << "the parent's hash is part of the name";
  ASSERT_TRUE(index.Insert(7, ha, -1, a));
  EXPECT_EQ(index.Find(ha, -1, a), 7);
  EXPECT_FALSE(index.Find(ha, -1, b).has_value()) << "same hash (a collision), other tokens: a miss";
  EXPECT_FALSE(index.Find(ha, 3, a).has_value()) << "same hash and tokens after another block: a miss";
  EXPECT_FALSE(index.Insert(8, ha, -1, a)) << "the first block holding a prefix stays";
  EXPECT_FALSE(index.Insert(7, PrefixBlockHash(0, b), -1, b)) << "a block is indexed once";
}

TEST(PrefixIndexTest, EvictsTheLeastRecentlyParkedFirst) {
  PrefixIndex index;
  for (int32_t block = 0; block < 3; ++block) {
    const std::vector<int32_t> tokens = {block};
    index.Insert(block, PrefixBlockHash(0, tokens), -1, tokens);
  }
  index.Park(2);
  index.Park(0);
  index.Park(1);
  index.Unpark(0);  // held again: not evictable
  EXPECT_EQ(index.parked(), 2);
  EXPECT_EQ(index.EvictOldest(), 2);
  EXPECT_EQ(index.EvictOldest(), 1);
  EXPECT_FALSE(index.EvictOldest().has_value());
  EXPECT_EQ(index.indexed(), 1);
  const std::vector<int32_t> two = {2};
  EXPECT_FALSE(index.Find(PrefixBlockHash(0, two), -1, two).has_value()) << "evicted blocks leave the index";
}

TEST(KvPromptCacheTest, ReleasedBlocksStayCachedUntilThePoolNeedsThem) {
  auto pool = Pool(/*max_blocks=*/3);
  const std::vector<int32_t> first = {1, 2, 3, 4}, second = {5, 6, 7, 8};
  const uint64_t h1 = PrefixBlockHash(0, first), h2 = PrefixBlockHash(h1, second);
  int32_t b1 = -1, b2 = -1;
  {
    SequenceKv kv(pool.get());
    ASSERT_OK(kv.Reserve(8));
    b1 = kv.blocks()[0], b2 = kv.blocks()[1];
    EXPECT_EQ(pool->PublishPrefixBlock(b1, h1, -1, first), b1);
    EXPECT_EQ(pool->PublishPrefixBlock(b2, h2, b1, second), b2);
  }
  EXPECT_EQ(pool->blocks_in_use(), 0);
  EXPECT_EQ(pool->blocks_cached(), 2);

  // A new sequence takes the cached prefix back.
  {
    std::optional<int32_t> got1 = pool->AcquirePrefixBlock(h1, -1, first);
    ASSERT_TRUE(got1.has_value());
    std::optional<int32_t> got2 = pool->AcquirePrefixBlock(h2, *got1, second);
    ASSERT_TRUE(got2.has_value());
    EXPECT_EQ(*got1, b1);
    EXPECT_EQ(*got2, b2);
    SequenceKv kv(pool.get());
    kv.AdoptPrefix({*got1, *got2});
    EXPECT_EQ(kv.length(), 8);
    EXPECT_FALSE(kv.started()) << "a new sequence, past position 0";
    EXPECT_EQ(pool->blocks_in_use(), 2);
    EXPECT_EQ(pool->blocks_cached(), 0);
  }
  // Released last block first: the second block is the older in the cache,
  // so room for two new blocks evicts it before the block it follows.
  SequenceKv other(pool.get());
  ASSERT_OK(other.Reserve(8));  // the never-used third block, then an eviction
  EXPECT_EQ(pool->prefix_evictions(), 1);
  EXPECT_TRUE(pool->AcquirePrefixBlock(h1, -1, first).has_value()) << "the first block is still cached";
  EXPECT_FALSE(pool->AcquirePrefixBlock(h2, b1, second).has_value()) << "the second was evicted";
  pool->Release(b1);
  // Every block held: no cached block to evict, the pool is full.
  ASSERT_OK(other.Reserve(12));
  SequenceKv third(pool.get());
  EXPECT_EQ(third.Reserve(1).code(), absl::StatusCode::kResourceExhausted);
}

std::unique_ptr<LocalRuntime> TinyRuntime(int64_t kv_cache_tokens = 4096) {
  auto model = LoadSyntheticModel({.preset = "tiny", .seed = 7});
  EXPECT_OK(model);
  LocalRuntimeOptions options;
  options.num_threads = 2;
  options.kv_cache_tokens = kv_cache_tokens;
  auto runtime = LocalRuntime::Create(std::move(*model), options);
  EXPECT_OK(runtime);
  return std::move(*runtime);
}

struct Outcome {
  std::vector<int32_t> ids;
  RequestUsage usage;
};

Outcome Generate(Scheduler& scheduler, const std::vector<int32_t>& prompt, int max_tokens) {
  GenerateParams params;
  params.request.prompt_ids = prompt;
  params.request.max_tokens = max_tokens;
  params.request.ignore_eos = true;
  Outcome run;
  auto stream = scheduler.SubmitGenerate(params);
  EXPECT_OK(stream);
  if (!stream.ok()) return run;
  while (true) {
    std::optional<StreamEvent> event = (*stream)->Next(absl::Seconds(60));
    if (!event) {
      ADD_FAILURE() << "no event within 60 s";
      return run;
    }
    for (const GeneratedToken& t : event->tokens) run.ids.push_back(t.id);
    if (event->done) {
      EXPECT_OK(event->status);
      run.usage = event->usage;
      return run;
    }
  }
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class SchedulerPromptCacheTest : public ::testing::Test {
 protected:
  std::unique_ptr<Scheduler> MakeScheduler(LocalRuntime& rt, bool prompt_cache) {
    SchedulerOptions options;
    options.prompt_cache = prompt_cache;
    auto scheduler = Scheduler::Create(&rt.model(), &rt.engine(), &rt.kv_pool(), options);
    EXPECT_OK(scheduler);
    return std::move(*scheduler);
  }
};

TEST_F(SchedulerPromptCacheTest, ASharedPrefixIsReadFromTheCacheAndOutputsAreUnchanged) {
  auto cached_rt = TinyRuntime(), plain_rt = TinyRuntime();
  auto cached = MakeScheduler(*cached_rt, true), plain = MakeScheduler(*plain_rt, false);
  const std::vector<int32_t> system = RandomTokens(100, 512, 11);  // 6 full blocks and 4 tokens
  for (int turn = 0; turn < 3; ++turn) {
    const std::vector<int32_t> prompt = Concat(system, RandomTokens(5 + turn, 512, 20 + turn));
    const Outcome with = Generate(*cached, prompt, 12), without = Generate(*plain, prompt, 12);
    EXPECT_EQ(with.ids, without.ids) << "turn " << turn;
    EXPECT_EQ(without.usage.cached_prompt_tokens, 0);
    EXPECT_EQ(with.usage.cached_prompt_tokens, turn == 0 ? 0 : 6 * kBlock) << "turn " << turn;
  }
  // The same prompt again: every full block but the one holding its last token.
  const std::vector<int32_t> exact = RandomTokens(4 * kBlock, 512, 31);
  const Outcome once = Generate(*cached, exact, 4), again = Generate(*cached, exact, 4);
  EXPECT_EQ(once.ids, again.ids);
  EXPECT_EQ(again.usage.cached_prompt_tokens, 3 * kBlock) << "the last prompt token always runs";
  const SchedulerStats stats = cached->Stats();
  EXPECT_EQ(stats.prompt_cache_hit_tokens, 2 * 6 * kBlock + 3 * kBlock);
  EXPECT_GT(stats.kv_blocks_cached, 0);
  EXPECT_EQ(plain->Stats().prompt_cache_hit_tokens, 0);
}

TEST_F(SchedulerPromptCacheTest, AConversationReusesTheGeneratedTokensToo) {
  auto rt = TinyRuntime(), plain_rt = TinyRuntime();
  auto cached = MakeScheduler(*rt, true), plain = MakeScheduler(*plain_rt, false);
  const std::vector<int32_t> first = RandomTokens(20, 512, 41);
  const Outcome answer = Generate(*cached, first, 40);
  // The next turn sends the conversation so far: prompt, answer, question.
  const std::vector<int32_t> next = Concat(Concat(first, answer.ids), RandomTokens(6, 512, 42));
  const Outcome with = Generate(*cached, next, 8), without = Generate(*plain, next, 8);
  EXPECT_EQ(with.ids, without.ids);
  // 20 + 40 = 60 tokens had their KV written (the last answer token's was
  // never fed back): 3 full blocks.
  EXPECT_EQ(with.usage.cached_prompt_tokens, 3 * kBlock);
}

TEST_F(SchedulerPromptCacheTest, ASmallCacheEvictsOldPrefixesAndStaysCorrect) {
  auto rt = TinyRuntime(/*kv_cache_tokens=*/8 * kBlock), plain_rt = TinyRuntime();
  auto cached = MakeScheduler(*rt, true), plain = MakeScheduler(*plain_rt, false);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(RandomTokens(3 * kBlock + 2, 512, 50 + i));
  for (int round = 0; round < 2; ++round) {
    for (const auto& prompt : prompts) {
      EXPECT_EQ(Generate(*cached, prompt, 6).ids, Generate(*plain, prompt, 6).ids);
    }
  }
  // The stats publish the last request's freed blocks a step after its end.
  for (int i = 0; i < 200 && cached->Stats().kv_blocks_in_use != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const SchedulerStats stats = cached->Stats();
  EXPECT_GT(stats.prompt_cache_evictions, 0) << "6 prompts of 4 blocks in a cache of 8";
  EXPECT_LE(stats.kv_blocks_cached, 8);
  EXPECT_EQ(stats.kv_blocks_in_use, 0);
}

TEST_F(SchedulerPromptCacheTest, BeamSearchOverACachedPrefixEqualsOneWithout) {
  auto rt = TinyRuntime(), plain_rt = TinyRuntime();
  auto cached = MakeScheduler(*rt, true), plain = MakeScheduler(*plain_rt, false);
  const std::vector<int32_t> prompt = RandomTokens(2 * kBlock + 5, 512, 61);
  Generate(*cached, prompt, 2);  // caches the prompt's two full blocks
  auto beams = [&](Scheduler& scheduler) {
    BeamSearchJob job;
    job.prompt_ids = prompt;
    job.params.beam_width = 3;
    job.params.max_tokens = 6;
    job.params.num_return_sequences = 3;
    job.ignore_eos = true;
    auto stream = scheduler.SubmitBeamSearch(job);
    EXPECT_OK(stream);
    std::vector<std::vector<int32_t>> out;
    while (stream.ok()) {
      std::optional<StreamEvent> event = (*stream)->Next(absl::Seconds(60));
      if (!event) break;
      if (event->done) {
        EXPECT_OK(event->status);
        EXPECT_EQ(event->usage.cached_prompt_tokens, &scheduler == cached.get() ? 2 * kBlock : 0);
        for (const BeamHypothesis& h : event->beams) out.push_back(h.ids);
        break;
      }
    }
    return out;
  };
  EXPECT_EQ(beams(*cached), beams(*plain));
}

}  // namespace
}  // namespace tandem
