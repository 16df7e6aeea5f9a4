// Loading whole model folders: what tandem-make-model writes loads back with
// the same bytes, sharded or not, and a broken folder gives an error naming
// the tensor or file at fault.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "common/model/model.h"
#include "common/model/model_tokenizer.h"
#include "common/model/safetensors.h"
#include "common/model/synthetic_model.h"
#include "common/model/tensor_names.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const SyntheticModelSpec kTiny{.preset = "tiny", .num_layers = 0, .seed = 3, .dtype = DType::kBF16};

void ExpectSameBytes(const ModelWeights& a, const ModelWeights& b) {
  ASSERT_EQ(a.layers.size(), b.layers.size());
  EXPECT_EQ(a.total_bytes, b.total_bytes);
  EXPECT_EQ(0, std::memcmp(a.embed_tokens.data, b.embed_tokens.data, a.embed_tokens.size_bytes));
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].input_norm.weight, b.layers[l].input_norm.weight);
    for (size_t e = 0; e < a.layers[l].experts.size(); ++e) {
      const LinearWeight& x = a.layers[l].experts[e].w2;
      const LinearWeight& y = b.layers[l].experts[e].w2;
      ASSERT_EQ(x.n, y.n);
      EXPECT_EQ(0, std::memcmp(x.data, y.data, static_cast<size_t>(x.n * x.k) * DTypeSize(x.dtype)));
    }
  }
}

class ModelLoadingTest : public ::testing::TestWithParam<int> {};

TEST_P(ModelLoadingTest, WrittenModelLoadsWithTheSameBytesAsInMemory) {
  ScopedTempDir dir;
  ASSERT_OK(WriteSyntheticModel(kTiny, dir.path(), {.num_shards = GetParam(), .with_tokenizer = false}));
  auto from_disk = LoadModel(dir.path());
  ASSERT_OK(from_disk);
  auto in_memory = LoadSyntheticModel(kTiny);
  ASSERT_OK(in_memory);
  ExpectSameBytes(*(*from_disk)->weights, *(*in_memory)->weights);
  EXPECT_EQ((*from_disk)->tokenizer, nullptr);
  EXPECT_EQ(std::filesystem::exists(dir.path() / "model.safetensors.index.json"), GetParam() > 1);
}

// --load_weights copy on a safetensors folder: the same bytes, none of them
// left in a file's mapping; experts a process does not compute stay mapped.
TEST_P(ModelLoadingTest, CopiedWeightsAreTheSameBytesOutsideTheFiles) {
  ScopedTempDir dir;
  ASSERT_OK(WriteSyntheticModel(kTiny, dir.path(), {.num_shards = GetParam(), .with_tokenizer = false}));
  auto copied = LoadModel(dir.path(), {.num_threads = 2, .copy_weights_to_memory = true});
  ASSERT_OK(copied);
  auto in_memory = LoadSyntheticModel(kTiny);
  ASSERT_OK(in_memory);
  ExpectSameBytes(*(*copied)->weights, *(*in_memory)->weights);
  const auto& checkpoint = dynamic_cast<const SafetensorsCheckpoint&>(*(*copied)->weights->source);
  EXPECT_EQ(checkpoint.copied_bytes(), (*copied)->weights->total_bytes);
  EXPECT_EQ(checkpoint.left_mapped_bytes(), 0);
  auto in_a_file = [&](const void* p) {
    for (const auto& file : checkpoint.files())
      if (file->Holds(p)) return true;
    return false;
  };
  const ModelWeights& w = *(*copied)->weights;
  EXPECT_FALSE(in_a_file(w.embed_tokens.data));
  EXPECT_FALSE(in_a_file(w.layers[0].q_proj.data));
  EXPECT_FALSE(in_a_file(w.layers[0].experts[1].w2.data));

  ModelLoadOptions no_experts{.copy_weights_to_memory = true};
  no_experts.experts.mode = SyntheticExperts::Mode::kNone;
  auto coordinator = LoadModel(dir.path(), no_experts);
  ASSERT_OK(coordinator);
  const auto& dense_only = dynamic_cast<const SafetensorsCheckpoint&>(*(*coordinator)->weights->source);
  EXPECT_GT(dense_only.copied_bytes(), 0);
  EXPECT_LT(dense_only.copied_bytes(), checkpoint.copied_bytes());
  const void* expert = (*coordinator)->weights->layers[0].experts[1].w2.data;
  EXPECT_TRUE(std::any_of(dense_only.files().begin(), dense_only.files().end(),
                          [&](const auto& file) { return file->Holds(expert); }));
}

INSTANTIATE_TEST_SUITE_P(Shards, ModelLoadingTest, ::testing::Values(1, 3));

TEST(ModelLoadingErrorsTest, TextNeedsTokenizerButIdsDoNot) {
  auto model = LoadSyntheticModel(kTiny);
  ASSERT_OK(model);
  auto tokenizer = (*model)->RequireTokenizer();
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("token ids"));
}

// A folder with tokenizer.json and no tokenizer.model (every current MoE
// model) tokenizes text with the BPE tokenizer; tokenizer_config.json names
// its BOS.
TEST(ModelLoadingTest, TokenizerJsonWithoutTokenizerModelTokenizesText) {
  ScopedTempDir dir;
  ASSERT_OK(WriteSyntheticModel(kTiny, dir.path(), {.num_shards = 1, .with_tokenizer = false}));
  // Bytes a..z as tokens 0..25, "ab" 26, the added "<s>" 27 (HF numbers
  // added tokens on from the vocabulary's size); the byte-level pipeline.
  std::string vocab = "{";
  for (char c = 'a'; c <= 'z'; ++c) vocab += std::string("\"") + c + "\": " + std::to_string(c - 'a') + ", ";
  vocab += "\"ab\": 26}";
  std::ofstream(dir.path() / "tokenizer.json")
      << R"({"version": "1.0", "added_tokens": [{"id": 27, "content": "<s>", "special": true}],)"
      << R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false},)"
      << R"("decoder": {"type": "ByteLevel"},)"
      << R"("model": {"type": "BPE", "merges": ["a b"], "vocab": )" << vocab << "}}";
  std::ofstream(dir.path() / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  auto model = LoadModel(dir.path());
  ASSERT_OK(model);
  auto tokenizer = (*model)->RequireTokenizer();
  ASSERT_OK(tokenizer);
  auto ids = (*tokenizer)->Encode("<s>abc", /*add_bos=*/false);
  ASSERT_OK(ids);
  EXPECT_EQ(*ids, (std::vector<int32_t>{27, 26, 2}));
  EXPECT_EQ((*tokenizer)->bos_id(), 27);
  auto text = (*tokenizer)->Decode(*ids);
  ASSERT_OK(text);
  EXPECT_EQ(*text, "abc");

  // transformers' Llama tokenizers put BOS around a text unless the config
  // says add_bos_token false; other classes keep the file's post-processor.
  std::ofstream(dir.path() / "tokenizer_config.json")
      << R"({"bos_token": "<s>", "tokenizer_class": "LlamaTokenizerFast"})";
  auto llama = LoadTokenizerAt(dir.path());
  ASSERT_OK(llama);
  auto with_bos = (*llama)->Encode("abc", /*add_bos=*/true);
  ASSERT_OK(with_bos);
  EXPECT_EQ(*with_bos, (std::vector<int32_t>{27, 26, 2}));
  std::ofstream(dir.path() / "tokenizer_config.json")
      << R"({"bos_token": "<s>", "tokenizer_class": "LlamaTokenizerFast", "add_bos_token": false})";
  auto no_bos = LoadTokenizerAt(dir.path());
  ASSERT_OK(no_bos);
  auto without = (*no_bos)->Encode("abc", /*add_bos=*/true);
  ASSERT_OK(without);
  EXPECT_EQ(*without, (std::vector<int32_t>{26, 2}));

  // A malformed tokenizer.json fails the load, naming the file and field.
  std::ofstream(dir.path() / "tokenizer.json")
      << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a zz"]}})";
  auto broken = LoadModel(dir.path());
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(std::string(broken.status().message()),
              AllOf(HasSubstr("tokenizer.json: model.merges[0]"), HasSubstr("\"zz\" is not in the vocabulary")));
}

// Writes the tiny model's tensors with one edited or dropped.
void WriteEdited(const std::filesystem::path& dir, const std::string& victim, bool drop,
                 std::vector<int64_t> new_shape = {}) {
  auto config = SyntheticConfig(kTiny);
  ASSERT_OK(config);
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << ModelConfigToJson(*config);
  std::vector<TensorToWrite> tensors;
  for (const WeightSpec& w : ExpectedWeights(*config)) {
    if (w.name == victim && drop) continue;
    TensorToWrite t{w.name, DType::kBF16, w.shape, {}};
    if (w.name == victim) t.shape = new_shape;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    t.data.assign(static_cast<size_t>(n) * 2, 0);
    tensors.push_back(std::move(t));
  }
  std::vector<const TensorToWrite*> pointers;
  for (const auto& t : tensors) pointers.push_back(&t);
  ASSERT_OK(WriteSafetensorsCheckpoint(dir, pointers, 2));
}

TEST(ModelLoadingErrorsTest, MissingTensorIsNamed) {
  ScopedTempDir dir;
  const std::string victim = "model.layers.1.block_sparse_moe.experts.2.w3.weight";
  WriteEdited(dir.path(), victim, /*drop=*/true);
  auto model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr(victim));
}

TEST(ModelLoadingErrorsTest, WrongShapeIsNamedWithBothShapes) {
  ScopedTempDir dir;
  const std::string victim = "model.layers.0.self_attn.k_proj.weight";
  WriteEdited(dir.path(), victim, /*drop=*/false, {16, 64});
  auto model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(model.status().message());
  EXPECT_THAT(message, HasSubstr(victim));
  EXPECT_THAT(message, HasSubstr("[16, 64]"));
  EXPECT_THAT(message, HasSubstr("[32, 64]"));
}

TEST(ModelLoadingErrorsTest, MissingShardIsNamed) {
  ScopedTempDir dir;
  ASSERT_OK(WriteSyntheticModel(kTiny, dir.path(), {.num_shards = 2, .with_tokenizer = false}));
  std::filesystem::remove(dir.path() / "model-00002-of-00002.safetensors");
  auto model = LoadModel(dir.path());
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST(ModelLoadingErrorsTest, MissingDirectoryAndConfig) {
  auto missing = LoadModel("/nonexistent/model");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/model"));
  ScopedTempDir dir;
  auto no_config = LoadModel(dir.path());
  ASSERT_FALSE(no_config.ok());
  EXPECT_THAT(std::string(no_config.status().message()), HasSubstr("config.json"));
}

// A file given as --model used to say "model directory not found".
TEST(ModelLoadingErrorsTest, AFileIsNotAModelDirectory) {
  ScopedTempDir dir;
  const std::filesystem::path file = dir.path() / "model.safetensors";
  std::ofstream(file) << "not a folder";
  auto model = LoadModel(file);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument) << model.status();
  EXPECT_THAT(std::string(model.status().message()),
              AllOf(HasSubstr(file.string()), HasSubstr("is a file, not a model directory")));
  auto missing = LoadModel(dir.path() / "nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no such model directory"));
}

TEST(SyntheticModelTest, SameSeedSameBytesOtherSeedOtherBytes) {
  auto a = LoadSyntheticModel(kTiny);
  auto b = LoadSyntheticModel(kTiny);
  SyntheticModelSpec other = kTiny;
  other.seed = 4;
  auto c = LoadSyntheticModel(other);
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  ExpectSameBytes(*(*a)->weights, *(*b)->weights);
  EXPECT_NE(0, std::memcmp((*a)->weights->embed_tokens.data, (*c)->weights->embed_tokens.data,
                           (*a)->weights->embed_tokens.size_bytes));
}

// --vocab_size: a Qwen shape with the synthetic tokenizer's vocabulary, so
// another engine can decode every id the model picks.
TEST(SyntheticModelTest, VocabSizeOverridesThePresetsAndBoundsTheTokenizer) {
  auto c = SyntheticConfig({.preset = "qwen1.5-moe-a2.7b", .num_layers = 1, .vocab_size = 32000});
  ASSERT_OK(c);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(SyntheticTokenizerVocab({.preset = "qwen1.5-moe-a2.7b", .vocab_size = 32000}), 32000);
  EXPECT_EQ(SyntheticTokenizerVocab({.preset = "tiny", .vocab_size = 300}), 300);  // never past the model's
  EXPECT_EQ(SyntheticTokenizerVocab({.preset = "tiny"}), 512);
  EXPECT_FALSE(SyntheticConfig({.preset = "tiny", .vocab_size = -1}).ok());
  EXPECT_FALSE(SyntheticConfig({.preset = "tiny", .vocab_size = 1}).ok());  // bos/eos outside it
}

TEST(SyntheticModelTest, UnknownPresetListsTheKnownOnes) {
  auto c = SyntheticConfig({.preset = "gpt-5"});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("mixtral-8x7b"));
}

}  // namespace
}  // namespace tandem
