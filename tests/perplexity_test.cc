// tandem-perplexity's measure (runtime/perplexity.h) on the tiny synthetic
// model: perplexity equals exp(mean NLL) computed independently, one prefix
// forward pass per scored token; KL of a model against itself is 0 and
// against another model positive; bad options, streams and flags give errors
// naming the flag. The program itself runs end to end on a synthetic model.
//
// Legend: N tokens, C context, S stride, V vocab.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/model/gguf_quantize.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "coordinator/engine/kv_cache.h"
#include "coordinator/runtime/local_runtime.h"
#include "coordinator/runtime/perplexity.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/child_process_testlib.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

// f32 GEMM inputs throughout, so that batched and one-row forward passes
// agree to float rounding (the built-in plan rounds inputs to bf16 from 12
// rows on, and not below).
const bool kExactKernels = test::UseExactKernels();

std::unique_ptr<LocalRuntime> MakeRuntime(const std::string& preset, uint64_t seed) {
  auto model = LoadSyntheticModel(SyntheticModelSpec{.preset = preset, .seed = seed, .dtype = DType::kBF16});
  EXPECT_OK(model);
  if (!model.ok()) return nullptr;
  LocalRuntimeOptions options;
  options.num_threads = 2;
  auto runtime = LocalRuntime::Create(std::move(*model), options);
  EXPECT_OK(runtime);
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

// -log p(tokens[j] | tokens[b, j)) from the last logit row of one fresh
// forward pass over tokens[b, j), in long double.
long double PrefixNll(LocalRuntime& rt, const std::vector<int32_t>& tokens, int64_t b, int64_t j) {
  SequenceKv kv(&rt.kv_pool());
  const std::span<const int32_t> prefix(tokens.data() + b, static_cast<size_t>(j - b));
  const ForwardInput input{.kv = &kv, .tokens = prefix, .all_logits = false};
  std::vector<float> logits;
  EXPECT_OK(rt.engine().Forward({&input, 1}, &logits));
  long double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<long double>(x));
  return std::log(sum) - static_cast<long double>(logits[static_cast<size_t>(tokens[static_cast<size_t>(j)])]);
}

// The window that scores target j: the first start k·S with j in (k·S, k·S + C).
int64_t ScoringWindowStart(int64_t j, int64_t c, int64_t s) { return j < c ? 0 : ((j - c) / s + 1) * s; }

class PerplexityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rt_ = MakeRuntime("tiny", 7);
    ASSERT_NE(rt_, nullptr);
    tokens_ = RandomTokens(45, rt_->model().config.vocab_size, 11);
  }
  std::unique_ptr<LocalRuntime> rt_;
  std::vector<int32_t> tokens_;
};

TEST_F(PerplexityTest, EqualsExpOfMeanNllFromPrefixForwardPasses) {
  for (const int64_t stride : {4, 8, 16}) {
    SCOPED_TRACE(absl::StrCat("stride ", stride));
    const PerplexityOptions options{.context = 16, .stride = stride};
    ASSERT_OK_AND_ASSIGN(const PerplexityResult r, MeasurePerplexity(*rt_, nullptr, tokens_, options));
    long double nll = 0;
    int64_t scored = 0;
    for (int64_t j = 1; j < static_cast<int64_t>(tokens_.size()); ++j) {
      const int64_t b = ScoringWindowStart(j, options.context, stride);
      if (b == j) continue;  // first token of a disjoint window: nothing before it
      nll += PrefixNll(*rt_, tokens_, b, j);
      ++scored;
    }
    EXPECT_EQ(r.tokens, 45);
    EXPECT_EQ(r.scored, scored);
    EXPECT_EQ(r.windows, stride == 16 ? 3 : (45 - 16 + stride - 1) / stride + 1);
    const double mean = static_cast<double>(nll / scored);
    // Batched (all rows) and prefix forward passes sum in other orders.
    EXPECT_NEAR(r.mean_nll, mean, 1e-6 * mean);
    EXPECT_NEAR(r.perplexity, std::exp(mean), 1e-5 * std::exp(mean));
    EXPECT_FALSE(r.has_reference);
  }
}

TEST_F(PerplexityTest, OverlappingWindowsScoreEveryTokenButTheFirst) {
  ASSERT_OK_AND_ASSIGN(const PerplexityResult r,
                       MeasurePerplexity(*rt_, nullptr, tokens_, {.context = 16, .stride = 0}));
  EXPECT_EQ(r.scored, 44);  // stride 0: context / 2
}

TEST_F(PerplexityTest, KlAgainstItselfIsZeroAndAgainstAnotherModelPositive) {
  std::unique_ptr<LocalRuntime> same = MakeRuntime("tiny", 7);
  std::unique_ptr<LocalRuntime> other = MakeRuntime("tiny", 8);
  ASSERT_NE(same, nullptr);
  ASSERT_NE(other, nullptr);
  const PerplexityOptions options{.context = 16, .stride = 8};
  ASSERT_OK_AND_ASSIGN(const PerplexityResult alone, MeasurePerplexity(*rt_, nullptr, tokens_, options));
  ASSERT_OK_AND_ASSIGN(const PerplexityResult self, MeasurePerplexity(*rt_, same.get(), tokens_, options));
  EXPECT_TRUE(self.has_reference);
  EXPECT_EQ(self.mean_kl, 0.0);
  EXPECT_EQ(self.max_kl, 0.0);
  EXPECT_EQ(self.top1_agreement, 1.0);
  EXPECT_EQ(self.perplexity, alone.perplexity);

  ASSERT_OK_AND_ASSIGN(const PerplexityResult diff, MeasurePerplexity(*rt_, other.get(), tokens_, options));
  EXPECT_GT(diff.mean_kl, 1e-3);
  EXPECT_GE(diff.max_kl, diff.mean_kl);
  EXPECT_LT(diff.top1_agreement, 1.0);
  EXPECT_EQ(diff.perplexity, alone.perplexity);  // the reference does not change the model's own numbers
}

TEST_F(PerplexityTest, BadOptionsAndStreamsNameWhatIsWrong) {
  const auto error = [&](const PerplexityOptions& options, std::span<const int32_t> tokens, LocalRuntime* ref) {
    auto r = MeasurePerplexity(*rt_, ref, tokens, options);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(r.status().message());
  };
  EXPECT_THAT(error({.context = 1}, tokens_, nullptr), HasSubstr("--context 1"));
  EXPECT_THAT(error({.context = 257}, tokens_, nullptr), HasSubstr("max_position_embeddings"));
  EXPECT_THAT(error({.context = 16, .stride = 17}, tokens_, nullptr), HasSubstr("--stride 17"));
  EXPECT_THAT(error({.context = 16, .stride = -1}, tokens_, nullptr), HasSubstr("--stride -1"));
  const std::vector<int32_t> one = {1};
  EXPECT_THAT(error({.context = 16}, one, nullptr), HasSubstr("at least 2"));
  std::vector<int32_t> bad = tokens_;
  bad[5] = 512;
  EXPECT_THAT(error({.context = 16}, bad, nullptr), HasSubstr("token 5 of the text is id 512"));
  std::unique_ptr<LocalRuntime> phimoe = MakeRuntime("tiny-phimoe", 7);  // 520 entries, not 512
  ASSERT_NE(phimoe, nullptr);
  EXPECT_THAT(error({.context = 16}, tokens_, phimoe.get()), HasSubstr("same vocabulary"));
}

// A GGUF against the folder it was quantized from: the same tokens, a small
// positive KL that grows as the bits shrink.
TEST(PerplexityGgufTest, QuantizedFileAgainstItsFolder) {
  ScopedTempDir dir;
  const std::filesystem::path folder = dir.path() / "tiny";
  ASSERT_OK(WriteSyntheticModel({.preset = "tiny", .seed = 5, .dtype = DType::kBF16}, folder, {}));
  LocalRuntimeOptions options;
  options.num_threads = 2;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalRuntime> reference, LocalRuntime::Open(folder, options));
  const std::vector<int32_t> tokens = RandomTokens(40, reference->model().config.vocab_size, 3);
  double last_kl = 0;
  for (const char* type : {"q8_0", "q4_0"}) {
    SCOPED_TRACE(type);
    const std::filesystem::path gguf = dir.path() / absl::StrCat(type, ".gguf");
    ASSERT_OK_AND_ASSIGN(const GgufFileType file_type, ParseGgufFileType(type));
    ASSERT_OK(QuantizeModel({.model_dir = folder, .file_type = file_type, .out = gguf, .num_threads = 2}).status());
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<LocalRuntime> model, LocalRuntime::Open(gguf, options));
    ASSERT_OK_AND_ASSIGN(const PerplexityResult r,
                         MeasurePerplexity(*model, reference.get(), tokens, {.context = 16, .stride = 8}));
    EXPECT_GT(r.mean_kl, last_kl);
    // Random weights are more sensitive than trained ones (docs/BENCHMARKS.md,
    // "Quantized types and accuracy", the trained tiny MoE); 8 bits still stay close.
    if (std::string(type) == "q8_0") {
      EXPECT_LT(r.mean_kl, 0.05);
    }
    last_kl = r.mean_kl;
    RecordProperty(absl::StrCat(type, "_mean_kl"), absl::StrCat(r.mean_kl));
  }
}

// The program: one JSON line on success; exit code 1 and the flag named on stderr otherwise.
class PerplexityProgramTest : public ::testing::Test {
 protected:
  struct Run {
    int exit_code = -1;
    std::string out, err;
  };
  Run RunProgram(std::vector<std::string> args) {
    args.insert(args.begin(), std::string(TANDEM_BINARY_DIR) + "/bin/tandem-perplexity");
    ChildProcess child;
    const std::filesystem::path out = dir_.path() / "out.txt", err = dir_.path() / "err.txt";
    EXPECT_OK(child.Spawn(args, out, err, {}));
    Run run;
    auto status = child.Wait(absl::Seconds(120));
    EXPECT_OK(status);
    if (status.ok() && WIFEXITED(*status)) run.exit_code = WEXITSTATUS(*status);
    run.out = Slurp(out);
    run.err = Slurp(err);
    return run;
  }
  static std::string Slurp(const std::filesystem::path& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  std::filesystem::path WriteText() {
    const std::filesystem::path path = dir_.path() / "text.txt";
    std::ofstream(path) << "Permission is hereby granted, free of charge, to any person obtaining a copy of this "
                           "software and associated documentation files, to deal in the Software without restriction.";
    return path;
  }
  ScopedTempDir dir_;
};

TEST_F(PerplexityProgramTest, PrintsOneJsonLineWithPerplexityAndKl) {
  const std::string text = WriteText().string();
  const Run run =
      RunProgram({"--synthetic", "tiny", "--synthetic_seed", "3", "--text", text, "--context", "16", "--threads", "2"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json j = nlohmann::json::parse(run.out);
  EXPECT_GT(j["tokens"].get<int64_t>(), 16);
  EXPECT_EQ(j["scored"].get<int64_t>(), j["tokens"].get<int64_t>() - 1);
  EXPECT_NEAR(j["perplexity"].get<double>(), std::exp(j["mean_nll"].get<double>()), 1e-9);
  EXPECT_FALSE(j.contains("mean_kl"));
  EXPECT_THAT(run.err, HasSubstr("perplexity"));
}

TEST_F(PerplexityProgramTest, BadFlagsAreNamed) {
  const std::string text = WriteText().string();
  const std::vector<std::string> tiny = {"--synthetic", "tiny", "--threads", "2"};
  const auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = tiny;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  Run run = RunProgram(with({}));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("--text"));
  run = RunProgram(with({"--text", (dir_.path() / "missing.txt").string()}));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("missing.txt"));
  run = RunProgram(with({"--text", text, "--context", "1"}));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("--context 1"));
  run = RunProgram(with({"--text", text, "--context", "16", "--stride", "32"}));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("--stride 32"));
  run = RunProgram(with({"--text", text, "--context", "16", "--reference_model", (dir_.path() / "nowhere").string()}));
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("--reference_model"));
  run = RunProgram({"--text", text});
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("--model"));
}

}  // namespace
}  // namespace tandem
