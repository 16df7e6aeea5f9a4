// The continuous-batching scheduler in process, on the tiny model: results
// equal the single-sequence generator, beam search equals a naive reference
// beam search over the float64 reference model, concurrent requests equal
// their runs alone, and cancellation, limits and validation behave.
#include "coordinator/generation/scheduler.h"

#include <gtest/gtest.h>

#include <thread>

#include "coordinator/runtime/local_runtime.h"
#include "tests/beam_reference_testlib.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/reference_model_testlib.h"
#include "tests/status_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

const bool kExactKernels = test::UseExactKernels();

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

std::unique_ptr<Scheduler> MakeScheduler(LocalRuntime& rt, SchedulerOptions options = {}) {
  auto scheduler = Scheduler::Create(&rt.model(), &rt.engine(), &rt.kv_pool(), options);
  EXPECT_OK(scheduler);
  return std::move(*scheduler);
}

struct Outcome {
  absl::Status status;
  std::vector<GeneratedToken> tokens;
  StreamEvent done;
  int progress_events = 0;
};

Outcome Drain(RequestStream& stream) {
  Outcome out;
  while (true) {
    std::optional<StreamEvent> event = stream.Next(absl::Seconds(60));
    if (!event) {
      out.status = absl::DeadlineExceededError("no event within 60 s");
      return out;
    }
    for (GeneratedToken& t : event->tokens) out.tokens.push_back(std::move(t));
    if (event->has_progress) ++out.progress_events;
    if (event->done) {
      out.status = event->status;
      out.done = std::move(*event);
      return out;
    }
  }
}

std::vector<int32_t> IdsOf(const std::vector<GeneratedToken>& tokens) {
  std::vector<int32_t> ids;
  for (const GeneratedToken& t : tokens) ids.push_back(t.id);
  return ids;
}

GenerateParams Greedy(std::vector<int32_t> prompt, int max_tokens) {
  GenerateParams p;
  p.request.prompt_ids = std::move(prompt);
  p.request.max_tokens = max_tokens;
  p.request.ignore_eos = true;
  return p;
}

BeamSearchJob Beam(std::vector<int32_t> prompt, int width, int max_tokens) {
  BeamSearchJob job;
  job.prompt_ids = std::move(prompt);
  job.params.beam_width = width;
  job.params.max_tokens = max_tokens;
  job.params.num_return_sequences = width;
  return job;
}

// Blocks are returned at the step after a request ends; stats publish them.
void ExpectAllBlocksFree(const Scheduler& scheduler) {
  for (int i = 0; i < 200 && scheduler.Stats().kv_blocks_in_use != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(scheduler.Stats().kv_blocks_in_use, 0);
}

TEST(SchedulerTest, OptionsAreValidated) {
  SchedulerOptions options;
  options.max_batch_tokens = 4;
  options.max_sequences = 8;
  EXPECT_NE(options.Validate().message().find("max_batch_tokens"), std::string::npos);
}

TEST(SchedulerTest, GreedyEqualsTheGenerator) {
  auto alone = TinyRuntime();
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  for (int len : {1, 7, 33}) {
    const auto prompt = RandomTokens(len, 512, 100 + len);
    GenerationRequest request = Greedy(prompt, 10).request;
    request.logprobs = 3;
    auto expected = alone->generator().Generate(request);
    ASSERT_OK(expected);
    GenerateParams params = Greedy(prompt, 10);
    params.request.logprobs = 3;
    auto stream = scheduler->SubmitGenerate(params);
    ASSERT_OK(stream);
    Outcome out = Drain(**stream);
    ASSERT_OK(out.status);
    EXPECT_EQ(IdsOf(out.tokens), Ids(*expected)) << "prompt length " << len;
    ASSERT_EQ(out.tokens.size(), expected->tokens.size());
    for (size_t i = 0; i < out.tokens.size(); ++i) {
      EXPECT_NEAR(out.tokens[i].logprob, expected->tokens[i].logprob, 1e-4);
      ASSERT_EQ(out.tokens[i].top_logprobs.size(), 3u);
    }
    EXPECT_EQ(out.done.finish_reason, FinishReason::kMaxTokens);
    EXPECT_EQ(out.done.usage.prompt_tokens, len);
    EXPECT_EQ(out.done.usage.generated_tokens, 10);
    EXPECT_GT(out.done.usage.time_to_first_token_ms, 0);
  }
  ExpectAllBlocksFree(*scheduler);
}

TEST(SchedulerTest, ChunkedPrefillEqualsOnePass) {
  auto alone = TinyRuntime();
  auto rt = TinyRuntime();
  SchedulerOptions options;
  options.max_sequences = 4;
  options.max_batch_tokens = 8;  // a 50-token prompt takes 7 steps
  auto scheduler = MakeScheduler(*rt, options);
  const auto prompt = RandomTokens(50, 512, 5);
  auto expected = alone->generator().Generate(Greedy(prompt, 6).request);
  ASSERT_OK(expected);
  auto stream = scheduler->SubmitGenerate(Greedy(prompt, 6));
  ASSERT_OK(stream);
  Outcome out = Drain(**stream);
  ASSERT_OK(out.status);
  EXPECT_EQ(IdsOf(out.tokens), Ids(*expected));
  EXPECT_GE(scheduler->Stats().steps, 7 + 5);
}

TEST(SchedulerTest, SampledGenerationFollowsTheSeed) {
  auto alone = TinyRuntime();
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  GenerateParams params = Greedy(RandomTokens(5, 512, 9), 12);
  params.request.sampling = {.temperature = 0.9f, .top_k = 40, .top_p = 0.9f, .seed = 1234};
  auto expected = alone->generator().Generate(params.request);
  ASSERT_OK(expected);
  auto stream = scheduler->SubmitGenerate(params);
  ASSERT_OK(stream);
  Outcome out = Drain(**stream);
  ASSERT_OK(out.status);
  EXPECT_EQ(IdsOf(out.tokens), Ids(*expected));
}

TEST(SchedulerTest, StopIdsAndEosEndGeneration) {
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  const auto prompt = RandomTokens(6, 512, 3);
  auto first = scheduler->SubmitGenerate(Greedy(prompt, 8));
  ASSERT_OK(first);
  Outcome all = Drain(**first);
  ASSERT_OK(all.status);
  // Stop at the third token's id: generation ends there (or earlier if it came before).
  GenerateParams params = Greedy(prompt, 8);
  params.request.stop_ids = {all.tokens[2].id};
  auto second = scheduler->SubmitGenerate(params);
  ASSERT_OK(second);
  Outcome stopped = Drain(**second);
  ASSERT_OK(stopped.status);
  EXPECT_EQ(stopped.done.finish_reason, FinishReason::kStopId);
  EXPECT_LE(stopped.tokens.size(), 3u);
  EXPECT_EQ(stopped.tokens.back().id, all.tokens[2].id);
}

TEST(SchedulerTest, BeamWidthOneEqualsGreedy) {
  auto alone = TinyRuntime();
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  const auto prompt = RandomTokens(9, 512, 21);
  auto expected = alone->generator().Generate(Greedy(prompt, 12).request);
  ASSERT_OK(expected);
  BeamSearchJob job = Beam(prompt, 1, 12);
  job.ignore_eos = true;
  auto stream = scheduler->SubmitBeamSearch(job);
  ASSERT_OK(stream);
  Outcome out = Drain(**stream);
  ASSERT_OK(out.status);
  ASSERT_EQ(out.done.beams.size(), 1u);
  EXPECT_EQ(out.done.beams[0].ids, Ids(*expected));
  double sum = 0;
  for (const GeneratedToken& t : expected->tokens) sum += t.logprob;
  EXPECT_NEAR(out.done.beams[0].sum_logprob, sum, 1e-3);
}

class BeamVsReferenceTest : public ::testing::TestWithParam<int> {};

TEST_P(BeamVsReferenceTest, EqualsNaiveBeamSearchOverTheReferenceModel) {
  const int width = GetParam();
  auto rt = TinyRuntime();
  auto reference = ReferenceModel::Create(*rt->model().weights);
  ASSERT_OK(reference);
  auto scheduler = MakeScheduler(*rt);
  for (uint32_t seed : {1u, 2u}) {
    const auto prompt = RandomTokens(5 + seed, 512, 300 + seed);
    BeamSearchJob job = Beam(prompt, width, 6);
    job.params.length_penalty = seed == 1 ? 1.0f : 0.5f;
    job.stream_progress = true;
    NaiveBeamParams naive{.beam_width = width,
                          .max_tokens = 6,
                          .length_penalty = job.params.length_penalty,
                          .early_stopping = false,
                          .num_return_sequences = width,
                          .end_ids = {2}};
    auto expected = NaiveBeamSearch(**reference, prompt, naive);
    ASSERT_OK(expected);
    auto stream = scheduler->SubmitBeamSearch(job);
    ASSERT_OK(stream);
    Outcome out = Drain(**stream);
    ASSERT_OK(out.status);
    ASSERT_EQ(out.done.beams.size(), expected->size()) << "width " << width;
    for (size_t i = 0; i < expected->size(); ++i) {
      EXPECT_EQ(out.done.beams[i].ids, (*expected)[i].ids) << "width " << width << " seed " << seed << " rank " << i;
      EXPECT_NEAR(out.done.beams[i].score, (*expected)[i].score, 1e-3);
      EXPECT_NEAR(out.done.beams[i].sum_logprob, (*expected)[i].sum_logprob, 1e-3);
    }
    EXPECT_GT(out.progress_events, 0);
  }
  const SchedulerStats stats = scheduler->Stats();
  if (width > 1) {
    EXPECT_GT(stats.kv_copies_on_write, 0) << "beams fork their caches";
  }
  ExpectAllBlocksFree(*scheduler);
}

INSTANTIATE_TEST_SUITE_P(Widths, BeamVsReferenceTest, ::testing::Values(2, 4, 8));

TEST(SchedulerTest, BeamsRunAsOneBatch) {
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  auto stream = scheduler->SubmitBeamSearch(Beam(RandomTokens(4, 512, 8), 8, 10));
  ASSERT_OK(stream);
  Outcome out = Drain(**stream);
  ASSERT_OK(out.status);
  const SchedulerStats stats = scheduler->Stats();
  // One prefill step plus one step per generated position, each with every live beam.
  EXPECT_LE(stats.steps, 1 + 10);
  EXPECT_GT(stats.mean_batch_rows, 4.0);
}

TEST(SchedulerTest, SixteenConcurrentRequestsEqualTheirRunsAlone) {
  auto rt = TinyRuntime();
  SchedulerOptions options;
  options.max_sequences = 24;
  auto scheduler = MakeScheduler(*rt, options);
  struct Job {
    bool beam;
    GenerateParams generate;
    BeamSearchJob beam_job;
  };
  std::vector<Job> jobs;
  for (int i = 0; i < 16; ++i) {
    const auto prompt = RandomTokens(3 + (i * 7) % 40, 512, 1000 + i);
    if (i % 4 == 3) {
      jobs.push_back({true, {}, Beam(prompt, 2 + i % 3, 4 + i % 5)});
    } else {
      jobs.push_back({false, Greedy(prompt, 4 + (i * 5) % 17), {}});
    }
  }
  // Alone: one at a time through the same scheduler.
  std::vector<Outcome> alone;
  for (const Job& job : jobs) {
    auto stream = job.beam ? scheduler->SubmitBeamSearch(job.beam_job) : scheduler->SubmitGenerate(job.generate);
    ASSERT_OK(stream);
    alone.push_back(Drain(**stream));
    ASSERT_OK(alone.back().status);
  }
  // Together: all submitted at once from 16 threads.
  std::vector<Outcome> together(jobs.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < jobs.size(); ++i) {
    clients.emplace_back([&, i] {
      auto stream =
          jobs[i].beam ? scheduler->SubmitBeamSearch(jobs[i].beam_job) : scheduler->SubmitGenerate(jobs[i].generate);
      if (!stream.ok()) {
        together[i].status = stream.status();
        return;
      }
      together[i] = Drain(**stream);
    });
  }
  for (std::thread& t : clients) t.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    ASSERT_OK(together[i].status) << "request " << i << ": " << together[i].status;
    if (jobs[i].beam) {
      ASSERT_EQ(together[i].done.beams.size(), alone[i].done.beams.size());
      for (size_t b = 0; b < alone[i].done.beams.size(); ++b) {
        EXPECT_EQ(together[i].done.beams[b].ids, alone[i].done.beams[b].ids) << "request " << i << " beam " << b;
      }
    } else {
      EXPECT_EQ(IdsOf(together[i].tokens), IdsOf(alone[i].tokens)) << "request " << i;
    }
  }
  const SchedulerStats stats = scheduler->Stats();
  EXPECT_EQ(stats.requests_succeeded, 32);
  EXPECT_GT(stats.mean_batch_rows, 1.0);
  ExpectAllBlocksFree(*scheduler);
}

// The tiny model makes 240 tokens in ~20 ms, so a test thread the host
// deschedules that long after the first token can cancel too late (seen
// under a load of ~4): such a try says nothing about cancelling and is
// made again.
TEST(SchedulerTest, CancellationStopsTheWorkAndFreesItsBlocks) {
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  Outcome out;
  int outran = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    const int64_t cancelled_before = scheduler->Stats().requests_cancelled;
    auto stream = scheduler->SubmitGenerate(Greedy(RandomTokens(8, 512, 4), 240));
    ASSERT_OK(stream);
    std::optional<StreamEvent> first = (*stream)->Next(absl::Seconds(30));
    ASSERT_TRUE(first.has_value());
    (*stream)->Cancel(absl::CancelledError("test cancels"));
    out = Drain(**stream);
    ExpectAllBlocksFree(*scheduler);
    if (out.status.ok() || out.tokens.size() >= 200) {
      ++outran;
      continue;
    }
    EXPECT_EQ(scheduler->Stats().requests_cancelled, cancelled_before + 1);
    break;
  }
  EXPECT_EQ(out.status.code(), absl::StatusCode::kCancelled) << outran << " tries finished before the cancel";
  EXPECT_LT(out.tokens.size(), 200u) << "stopped long before max_tokens (" << outran << " tries outran the cancel)";
  // And the scheduler serves the next request.
  auto next = scheduler->SubmitGenerate(Greedy(RandomTokens(3, 512, 5), 3));
  ASSERT_OK(next);
  EXPECT_OK(Drain(**next).status);
}

TEST(SchedulerTest, RefusesWhatCanNeverFitAndQueuesWhatFitsLater) {
  auto rt = TinyRuntime(/*kv_cache_tokens=*/64);  // 4 blocks of 16
  SchedulerOptions options;
  options.max_sequences = 4;
  auto scheduler = MakeScheduler(*rt, options);
  auto too_big = scheduler->SubmitGenerate(Greedy(RandomTokens(10, 512, 1), 100));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("KV cache"), std::string::npos) << too_big.status();
  auto too_wide = scheduler->SubmitBeamSearch(Beam(RandomTokens(3, 512, 1), 8, 2));
  EXPECT_EQ(too_wide.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_wide.status().message().find("max_sequences"), std::string::npos) << too_wide.status();

  // Each needs 3 of the 4 blocks: the second waits for the first.
  auto a = scheduler->SubmitGenerate(Greedy(RandomTokens(20, 512, 2), 25));
  auto b = scheduler->SubmitGenerate(Greedy(RandomTokens(20, 512, 3), 25));
  ASSERT_OK(a);
  ASSERT_OK(b);
  Outcome oa = Drain(**a), ob = Drain(**b);
  ASSERT_OK(oa.status);
  ASSERT_OK(ob.status);
  // One after the other: a prefill and 24 decode steps each, never batched.
  EXPECT_GE(scheduler->Stats().steps, 2 * 25) << "b waited for a";
  EXPECT_GT(ob.done.usage.queue_ms, 0);
  EXPECT_EQ(scheduler->Stats().requests_rejected, 2);
  ExpectAllBlocksFree(*scheduler);
}

TEST(SchedulerTest, InvalidRequestsNameTheirField) {
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  struct Case {
    std::string field;
    std::function<void(GenerateParams&)> mutate;
  };
  const std::vector<Case> cases = {
      {"prompt", [](GenerateParams& p) { p.request.prompt_ids.clear(); }},
      {"prompt_ids[1]", [](GenerateParams& p) { p.request.prompt_ids[1] = 512; }},
      {"prompt_ids[0]", [](GenerateParams& p) { p.request.prompt_ids[0] = -1; }},
      {"max_tokens", [](GenerateParams& p) { p.request.max_tokens = 0; }},
      {"context", [](GenerateParams& p) { p.request.max_tokens = 300; }},
      {"temperature", [](GenerateParams& p) { p.request.sampling.temperature = -1; }},
      {"top_k", [](GenerateParams& p) { p.request.sampling.top_k = -2; }},
      {"top_p", [](GenerateParams& p) { p.request.sampling.top_p = 1.5f; }},
      {"logprobs", [](GenerateParams& p) { p.request.logprobs = -1; }},
      {"stop_ids[0]", [](GenerateParams& p) { p.request.stop_ids = {9999}; }},
      {"tokenizer", [](GenerateParams& p) { p.stop_strings = {"\n"}; }},  // the tiny model has none
  };
  for (const Case& c : cases) {
    GenerateParams params = Greedy({5, 6, 7}, 4);
    c.mutate(params);
    auto stream = scheduler->SubmitGenerate(params);
    ASSERT_FALSE(stream.ok()) << c.field;
    EXPECT_EQ(stream.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(stream.status().message().find(c.field), std::string::npos) << stream.status();
  }
  BeamSearchJob beam = Beam({5, 6}, 2, 4);
  beam.params.num_return_sequences = 3;
  auto stream = scheduler->SubmitBeamSearch(beam);
  EXPECT_NE(stream.status().message().find("num_return_sequences"), std::string::npos) << stream.status();
  EXPECT_EQ(scheduler->Stats().requests_rejected, static_cast<int64_t>(cases.size()) + 1);
}

TEST(SchedulerTest, ShutdownFailsQueuedRequestsWithUnavailable) {
  auto rt = TinyRuntime();
  auto scheduler = MakeScheduler(*rt);
  auto stream = scheduler->SubmitGenerate(Greedy(RandomTokens(8, 512, 4), 240));
  ASSERT_OK(stream);
  scheduler.reset();
  Outcome out = Drain(**stream);
  EXPECT_TRUE(out.status.ok() || out.status.code() == absl::StatusCode::kUnavailable) << out.status;
}

}  // namespace
}  // namespace tandem
