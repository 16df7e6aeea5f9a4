// The quick start's model, deploy/demo/tiny-licence-moe.gguf (deploy/demo/README.md:
// tools/train_tiny_moe.py on the licence texts, then tandem-quantize), is there, loads
// with its tokenizer, and is a trained model, not noise:
//
//   perplexity   on paragraphs of a licence the model never saw (LGPL-2.1, held
//                out of training), far below that of random weights
//                of the same shapes (the synthetic models' generator), computed here
//                too, and below the vocabulary size (a uniform guess);
//   greedy text  from "The licensee may" is words, many of them different (random
//                weights, and an undertrained model, loop on a word or two).
//
// No timing assertions; a few seconds on one core (a 4.5 M-parameter model).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model/model.h"
#include "common/model/model_weights.h"
#include "common/model/safetensors.h"
#include "common/model/synthetic_model.h"
#include "common/model/tensor_names.h"
#include "coordinator/runtime/local_runtime.h"
#include "coordinator/runtime/perplexity.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

const fs::path kModel = fs::path(TANDEM_SOURCE_DIR) / "deploy/demo/tiny-licence-moe.gguf";

// The start of the preamble of /usr/share/common-licenses/LGPL-2.1, held out of
// training (train_tiny_moe.py's HELD_OUT): text in the style of the licences it read,
// the case a model this small (59k training tokens) can generalise to.
constexpr char kHeldOut[] =
    "  The licenses for most software are designed to take away your\n"
    "freedom to share and change it.  By contrast, the GNU General Public\n"
    "Licenses are intended to guarantee your freedom to share and change\n"
    "free software--to make sure the software is free for all its users.\n"
    "\n"
    "  This license, the Lesser General Public License, applies to some\n"
    "specially designated software packages--typically libraries--of the\n"
    "Free Software Foundation and other authors who decide to use it.  You\n"
    "can use it too, but we suggest you first think carefully about whether\n"
    "this license or the ordinary General Public License is the better\n"
    "strategy to use in any particular case, based on the explanations below.\n"
    "\n"
    "  When we speak of free software, we are referring to freedom of use,\n";

// Random weights for `config`, bf16, as the synthetic models draw them
// (FillSyntheticTensor): the quick start's model before it was a trained one.
class RandomWeights : public TensorSource {
 public:
  RandomWeights(const ModelConfig& config, uint64_t seed) {
    for (const WeightSpec& spec : ExpectedWeights(config)) {
      std::vector<uint16_t>& data = data_[spec.name];
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      data.resize(static_cast<size_t>(n));
      FillSyntheticTensor(config, spec, seed, DType::kBF16, data.data());
      views_[spec.name] = TensorView{.name = spec.name,
                                     .dtype = DType::kBF16,
                                     .shape = spec.shape,
                                     .data = data.data(),
                                     .size_bytes = data.size() * sizeof(uint16_t)};
    }
  }
  absl::StatusOr<TensorView> Get(const std::string& name) const override {
    auto it = views_.find(name);
    if (it == views_.end()) return absl::NotFoundError(absl::StrCat("no tensor ", name, " in ", Describe()));
    return it->second;
  }
  std::vector<std::string> Names() const override {
    std::vector<std::string> names;
    for (const auto& [name, view] : views_) names.push_back(name);
    return names;
  }
  std::string Describe() const override { return "random weights"; }

 private:
  std::map<std::string, std::vector<uint16_t>> data_;
  std::map<std::string, TensorView> views_;
};

std::unique_ptr<LocalRuntime> Runtime(std::unique_ptr<Model> model) {
  absl::StatusOr<std::unique_ptr<LocalRuntime>> runtime = LocalRuntime::Create(std::move(model), {.num_threads = 1});
  EXPECT_OK(runtime);
  return runtime.ok() ? std::move(*runtime) : nullptr;
}

// The words (runs of letters) of `text`, lower-cased.
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!word.empty()) {
      words.push_back(word), word.clear();
    }
  }
  return words;
}

class DemoModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::is_regular_file(kModel))
        << kModel << " is missing: the quick start's model (deploy/demo/README.md says how it is made)";
    absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(kModel);
    ASSERT_OK(model);
    ASSERT_NE((*model)->tokenizer, nullptr) << kModel << " carries no tokenizer";
    runtime_ = Runtime(std::move(*model));
    ASSERT_NE(runtime_, nullptr);
  }

  const Model& model() const { return runtime_->model(); }

  std::unique_ptr<LocalRuntime> runtime_;
};

TEST_F(DemoModelTest, IsTheTwoLayerEightExpertMixtralTheReadmeDescribes) {
  const ModelConfig& c = model().config;
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_local_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.vocab_size, model().tokenizer->vocab_size());
  EXPECT_LE(fs::file_size(kModel), 8u << 20) << "the shipped file is meant to stay small";
}

TEST_F(DemoModelTest, HeldOutPerplexityIsFarBelowRandomWeights) {
  ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> tokens, model().tokenizer->Encode(kHeldOut, /*add_bos=*/true));
  ASSERT_GE(tokens.size(), 64u);
  // The windows the model was trained on (128 tokens), half overlapping, as
  // tools/accuracy_tiny_moe.sh measures.
  const PerplexityOptions options{.context = 128, .stride = 64};
  ASSERT_OK_AND_ASSIGN(const PerplexityResult trained, MeasurePerplexity(*runtime_, nullptr, tokens, options));

  auto random = std::make_unique<Model>();
  random->config = model().config;
  random->origin = "random weights";
  ASSERT_OK_AND_ASSIGN(random->weights,
                       LoadModelWeights(random->config, std::make_shared<RandomWeights>(random->config, 1)));
  std::unique_ptr<LocalRuntime> random_runtime = Runtime(std::move(random));
  ASSERT_NE(random_runtime, nullptr);
  ASSERT_OK_AND_ASSIGN(const PerplexityResult untrained,
                       MeasurePerplexity(*random_runtime, nullptr, tokens, options));

  RecordProperty("trained_perplexity", absl::StrCat(trained.perplexity));
  RecordProperty("random_perplexity", absl::StrCat(untrained.perplexity));
  std::cout << "held-out paragraphs, " << trained.scored << " tokens scored: perplexity " << trained.perplexity
            << " (random weights " << untrained.perplexity << ", vocabulary " << model().config.vocab_size << ")\n";
  EXPECT_LT(trained.perplexity, 60.0);
  EXPECT_LT(trained.perplexity * 20, untrained.perplexity);
  EXPECT_LT(trained.perplexity * 20, static_cast<double>(model().config.vocab_size));
}

TEST_F(DemoModelTest, GreedyTextFromTheQuickStartPromptIsManyDifferentWords) {
  GenerationRequest request;
  ASSERT_OK_AND_ASSIGN(request.prompt_ids, model().tokenizer->Encode("The licensee may", /*add_bos=*/true));
  request.max_tokens = 48;
  request.ignore_eos = true;
  ASSERT_OK_AND_ASSIGN(const GenerationResult result, runtime_->generator().Generate(request));
  std::vector<int32_t> ids;
  for (const GeneratedToken& t : result.tokens) ids.push_back(t.id);
  ASSERT_OK_AND_ASSIGN(const std::string text, model().tokenizer->Decode(ids, {}));
  std::cout << "greedy, after \"The licensee may\": " << text << "\n";

  const std::vector<std::string> words = Words(text);
  const std::set<std::string> distinct(words.begin(), words.end());
  std::map<std::string, int> count;
  for (const std::string& w : words) ++count[w];
  int most = 0;
  for (const auto& [w, n] : count) most = std::max(most, n);
  EXPECT_GE(words.size(), 20u) << text;
  EXPECT_GE(distinct.size(), 15u) << text;
  EXPECT_LE(most * 4, static_cast<int>(words.size())) << "one word is a quarter of the text: " << text;
}

}  // namespace
}  // namespace tandem
