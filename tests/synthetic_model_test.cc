// Synthetic models generated in memory (--synthetic PRESET[:layers] --synthetic_seed N)
// are the models tandem-make-model writes: same tensors, fingerprint,
// tokenizer and greedy tokens; a process that holds only some experts
// generates only those; and the flags are checked alike everywhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "common/model/expert_partition.h"
#include "common/model/model.h"
#include "common/model/model_fingerprint.h"
#include "common/model/sentencepiece_tokenizer.h"
#include "common/model/synthetic_model.h"
#include "common/model/tensor_names.h"
#include "coordinator/runtime/local_runtime.h"
#include "cpu_worker/expert_store.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

const SyntheticModelSpec kTiny{.preset = "tiny", .num_layers = 0, .seed = 7, .dtype = DType::kBF16};

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<int32_t> Greedy(std::unique_ptr<Model> model, const std::vector<int32_t>& prompt, int n) {
  auto ids = GreedyInProcess(std::move(model), prompt, n);
  EXPECT_OK(ids);
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(SyntheticInMemoryTest, SameAsTheWrittenModel) {
  ScopedTempDir dir;
  ASSERT_OK(WriteSyntheticModel(kTiny, dir.path(), {.num_shards = 2, .with_tokenizer = true, .num_threads = 2}));
  auto written = LoadModel(dir.path());
  ASSERT_OK(written);
  // Three threads and small chunks of work: the split must not change a bit.
  auto generated = LoadSyntheticModel(kTiny, ModelLoadOptions{.num_threads = 3, .tokenizer = true});
  ASSERT_OK(generated);
  const Model& a = **written;
  const Model& b = **generated;

  auto fa = FingerprintModel(a.config, *a.weights->source);
  auto fb = FingerprintModel(b.config, *b.weights->source);
  ASSERT_OK(fa);
  ASSERT_OK(fb);
  EXPECT_EQ(*fa, *fb) << FingerprintString(*fa) << " vs " << FingerprintString(*fb);
  for (const WeightSpec& w : ExpectedWeights(a.config)) {
    auto x = a.weights->source->Get(w.name);
    auto y = b.weights->source->Get(w.name);
    ASSERT_OK(x) << w.name;
    ASSERT_OK(y) << w.name;
    ASSERT_EQ(x->size_bytes, y->size_bytes) << w.name;
    EXPECT_EQ(0, std::memcmp(x->data, y->data, x->size_bytes)) << w.name;
  }
  EXPECT_EQ(a.weights->total_bytes, b.weights->total_bytes);
  EXPECT_EQ(a.weights->expert_bytes, b.weights->expert_bytes);
  EXPECT_EQ(b.origin, "synthetic:tiny:2 seed 7");

  // The tokenizer: the written file's bytes, and the same ids for text.
  auto proto = SyntheticTokenizerModel(kTiny);
  ASSERT_OK(proto);
  EXPECT_EQ(*proto, ReadFile(dir.path() / "tokenizer.model"));
  ASSERT_NE(a.tokenizer, nullptr);
  ASSERT_NE(b.tokenizer, nullptr);
  const std::string text = "Permission is hereby granted, free of charge, to any person: ünïcödé 123";
  auto ia = a.tokenizer->Encode(text, true);
  auto ib = b.tokenizer->Encode(text, true);
  ASSERT_OK(ia);
  ASSERT_OK(ib);
  EXPECT_EQ(*ia, *ib);
  EXPECT_EQ(a.tokenizer->vocab_size(), b.tokenizer->vocab_size());

  // And the same greedy tokens through the whole runtime.
  const std::vector<int32_t> prompt = RandomTokens(6, 512, 3);
  const std::vector<int32_t> from_disk = Greedy(std::move(*written), prompt, 12);
  EXPECT_EQ(from_disk.size(), 12u);
  EXPECT_EQ(from_disk, Greedy(std::move(*generated), prompt, 12));
}

TEST(SyntheticInMemoryTest, InMemoryTokenizerIsTheTrainedFileAndWritesNothing) {
  ScopedTempDir dir;
  TokenizerTrainOptions options;
  options.input_files = DefaultTokenizerCorpus();
  options.vocab_size = 512;
  options.model_prefix = dir.path() / "tok";
  const absl::Status trained = TrainTokenizer(options);
  ASSERT_OK(trained);
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::create_directories(dir.path() / "cwd");
  std::filesystem::current_path(dir.path() / "cwd");
  options.model_prefix.clear();
  auto proto = TrainTokenizerInMemory(options);
  const bool wrote = !std::filesystem::is_empty(dir.path() / "cwd");
  std::filesystem::current_path(cwd);
  ASSERT_OK(proto);
  EXPECT_FALSE(wrote) << "in-memory training left files in the working directory";
  // The same tokenizer (the bytes differ only in the recorded model_prefix).
  auto from_file = SentencePieceTokenizer::Load(dir.path() / "tok.model");
  auto in_memory = SentencePieceTokenizer::FromModelProto(*proto, "in memory");
  ASSERT_OK(from_file);
  ASSERT_OK(in_memory);
  ASSERT_EQ((*from_file)->vocab_size(), (*in_memory)->vocab_size());
  for (int32_t id = 0; id < (*from_file)->vocab_size(); ++id) {
    ASSERT_EQ((*from_file)->PieceText(id), (*in_memory)->PieceText(id)) << id;
  }
  const std::string text = "THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY; 1998 ünïcödé\n";
  EXPECT_EQ(*(*from_file)->Encode(text, true), *(*in_memory)->Encode(text, true));

  auto bad = SentencePieceTokenizer::FromModelProto("not a model", "synthetic:x tokenizer");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("synthetic:x tokenizer"));
}

TEST(SyntheticExpertsTest, NoneLeavesEveryExpertOutButKeepsTheFingerprint) {
  auto full = LoadSyntheticModel(kTiny);
  auto dense = LoadSyntheticModel(
      kTiny,
      ModelLoadOptions{.num_threads = 2, .experts = {.mode = SyntheticExperts::Mode::kNone}, .tokenizer = false});
  ASSERT_OK(full);
  ASSERT_OK(dense);
  const ModelWeights& f = *(*full)->weights;
  const ModelWeights& d = *(*dense)->weights;
  EXPECT_EQ(d.expert_bytes, 0);
  EXPECT_GT(f.expert_bytes, 0);
  EXPECT_EQ(d.total_bytes, f.total_bytes - f.expert_bytes);
  for (const LayerWeights& layer : d.layers) {
    for (const ExpertWeights& e : layer.experts) {
      EXPECT_EQ(e.w1.data, nullptr);
      EXPECT_EQ(e.w2.data, nullptr);
      EXPECT_EQ(e.w3.data, nullptr);
    }
  }
  // The dense part is all there, with the same bytes.
  EXPECT_EQ(0, std::memcmp(f.embed_tokens.data, d.embed_tokens.data, f.embed_tokens.size_bytes));
  EXPECT_EQ(0, std::memcmp(f.layers[1].router.data, d.layers[1].router.data,
                           static_cast<size_t>(f.layers[1].router.n * f.layers[1].router.k) * 2));
  auto ff = FingerprintModel(f.config, *f.source);
  auto fd = FingerprintModel(d.config, *d.source);
  ASSERT_OK(ff);
  ASSERT_OK(fd);
  EXPECT_EQ(*ff, *fd);
}

// Worker `w` of 2 under `division`: its slices have the full model's bytes;
// experts it holds no part of are not generated.
void CheckSlices(ExpertDivision division, int w) {
  auto full = LoadSyntheticModel(kTiny);
  ASSERT_OK(full);
  const ModelConfig& config = (*full)->config;
  auto slices = PartitionExperts(config, division, w, 2);
  ASSERT_OK(slices);
  ModelLoadOptions load{.num_threads = 2, .tokenizer = false};
  load.experts = {.mode = SyntheticExperts::Mode::kSlices, .slices = *slices};
  auto part = LoadSyntheticModel(kTiny, load);
  ASSERT_OK(part);
  const int64_t d = config.hidden_size, n = config.intermediate_size;
  int held = 0;
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    for (int e = 0; e < config.num_local_experts; ++e) {
      const ExpertWeights& x = (*full)->weights->layers[l].experts[e];
      const ExpertWeights& y = (*part)->weights->layers[l].experts[e];
      const ExpertSlice* slice = nullptr;
      for (const ExpertSlice& s : *slices) {
        if (s.layer == l && s.expert == e) slice = &s;
      }
      if (slice == nullptr) {
        EXPECT_EQ(y.w1.data, nullptr) << l << "/" << e;
        EXPECT_EQ(y.w2.data, nullptr) << l << "/" << e;
        continue;
      }
      ++held;
      const auto* x1 = static_cast<const uint16_t*>(x.w1.data);
      const auto* y1 = static_cast<const uint16_t*>(y.w1.data);
      const auto* x3 = static_cast<const uint16_t*>(x.w3.data);
      const auto* y3 = static_cast<const uint16_t*>(y.w3.data);
      const auto* x2 = static_cast<const uint16_t*>(x.w2.data);
      const auto* y2 = static_cast<const uint16_t*>(y.w2.data);
      const size_t rows = static_cast<size_t>(slice->size());
      EXPECT_EQ(0, std::memcmp(x1 + slice->intermediate_begin * d, y1 + slice->intermediate_begin * d, rows * d * 2));
      EXPECT_EQ(0, std::memcmp(x3 + slice->intermediate_begin * d, y3 + slice->intermediate_begin * d, rows * d * 2));
      for (int64_t r = 0; r < d; ++r) {
        ASSERT_EQ(0,
                  std::memcmp(x2 + r * n + slice->intermediate_begin, y2 + r * n + slice->intermediate_begin, rows * 2))
            << "w2 row " << r << " of " << l << "/" << e;
      }
    }
  }
  EXPECT_EQ(held, static_cast<int>(slices->size()));
}

TEST(SyntheticExpertsTest, SplitWorkerGeneratesItsRowsOfEveryExpert) {
  CheckSlices(ExpertDivision::kSplit, 0);
  CheckSlices(ExpertDivision::kSplit, 1);
}

TEST(SyntheticExpertsTest, ShardWorkerGeneratesOnlyItsExperts) { CheckSlices(ExpertDivision::kShard, 1); }

TEST(SyntheticExpertsTest, SliceOutsideTheModelIsAnError) {
  ModelLoadOptions load{.tokenizer = false};
  load.experts = {.mode = SyntheticExperts::Mode::kSlices,
                  .slices = {ExpertSlice{.layer = 5, .expert = 0, .intermediate_begin = 0, .intermediate_end = 8}}};
  auto model = LoadSyntheticModel(kTiny, load);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("layer 5"));
}

// A worker's store filled by generating in place (what tandem-cpu-worker
// --synthetic does) holds the bytes a copy from the full model gives.
TEST(SyntheticExpertsTest, StoreGeneratedInPlaceEqualsStoreCopiedFromTheModel) {
  auto full = LoadSyntheticModel(kTiny);
  auto bare = LoadSyntheticModel(
      kTiny, ModelLoadOptions{
                 .experts = {.mode = SyntheticExperts::Mode::kNone}, .dense_matrices = false, .tokenizer = false});
  ASSERT_OK(full);
  ASSERT_OK(bare);
  EXPECT_EQ((*bare)->weights->embed_tokens.data, nullptr);
  ThreadPool pool({.num_threads = 2, .name = "test"});
  for (ExpertDivision division : {ExpertDivision::kSplit, ExpertDivision::kShard}) {
    const std::string prefix = UniqueRegionPrefix();
    ExpertStoreOptions options{
        .region_name = prefix + "-copied", .division = division, .worker_index = 1, .num_workers = 2, .pool = &pool};
    auto copied = ExpertStore::Create(*(*full)->weights, options);
    ASSERT_OK(copied);
    options.region_name = prefix + "-generated";
    const ModelConfig config = (*full)->config;
    options.fill = [config](int layer, int expert, WeightRole role, int64_t begin, int64_t end, void* out) {
      const WeightSpec w{WeightName(config, role, layer, expert), role, layer, expert, WeightShape(config, role)};
      FillSyntheticRange(config, w, kTiny.seed, kTiny.dtype, out, begin, end, begin);
    };
    auto generated = ExpertStore::Create(*(*bare)->weights, options);
    ASSERT_OK(generated);
    ASSERT_EQ((*copied)->region_bytes(), (*generated)->region_bytes());
    ASSERT_EQ((*copied)->slices().size(), (*generated)->slices().size());
    for (const ExpertSlice& s : (*copied)->slices()) {
      const ExpertWeights* a = (*copied)->Find(s.layer, s.expert);
      const ExpertWeights* b = (*generated)->Find(s.layer, s.expert);
      ASSERT_TRUE(a != nullptr && b != nullptr);
      const size_t bytes = static_cast<size_t>(s.size() * config.hidden_size) * 2;
      EXPECT_EQ(0, std::memcmp(a->w1.data, b->w1.data, bytes));
      EXPECT_EQ(0, std::memcmp(a->w3.data, b->w3.data, bytes));
      EXPECT_EQ(0, std::memcmp(a->w2.data, b->w2.data, bytes));
    }
  }
}

TEST(ModelSourceTest, ParsesAndNamesTheModel) {
  auto dir = ParseModelSource("/models/demo", "", 3);
  ASSERT_OK(dir);
  EXPECT_EQ(dir->model_dir, "/models/demo");
  EXPECT_FALSE(dir->synthetic.has_value());
  EXPECT_EQ(dir->Describe(), "/models/demo");

  auto tiny = ParseModelSource("", "tiny", 7);
  ASSERT_OK(tiny);
  ASSERT_TRUE(tiny->synthetic.has_value());
  EXPECT_EQ(tiny->synthetic->preset, "tiny");
  EXPECT_EQ(tiny->synthetic->num_layers, 0);
  EXPECT_EQ(tiny->synthetic->seed, 7u);
  EXPECT_EQ(tiny->Describe(), "synthetic:tiny:2 seed 7");

  auto mixtral = ParseModelSource("", "mixtral-8x7b:3", 1);
  ASSERT_OK(mixtral);
  EXPECT_EQ(mixtral->synthetic->num_layers, 3);
  EXPECT_EQ(mixtral->Describe(), "synthetic:mixtral-8x7b:3 seed 1");
}

TEST(ModelSourceTest, BadFlagsAreNamed) {
  struct Case {
    std::string model, synthetic, expected;
  };
  for (const Case& c : std::vector<Case>{
           {"", "", "exactly one of --model DIR or --synthetic"},
           {"/models/demo", "tiny", "exactly one of --model DIR or --synthetic"},
           {"", "gpt-5", "--synthetic \"gpt-5\": unknown synthetic model preset \"gpt-5\" (known: tiny, "},
           {"", "tiny:0", "--synthetic \"tiny:0\": expected PRESET or PRESET:layers with layers >= 1"},
           {"", "tiny:two", "--synthetic \"tiny:two\": expected PRESET or PRESET:layers"},
           {"", "tiny:2:3", "--synthetic \"tiny:2:3\": expected PRESET"},
           {"", ":2", "--synthetic \":2\": unknown synthetic model preset"},
       }) {
    auto source = ParseModelSource(c.model, c.synthetic, 0);
    ASSERT_FALSE(source.ok()) << c.model << " / " << c.synthetic;
    EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(source.status().message()), HasSubstr(c.expected));
  }
}

}  // namespace
}  // namespace tandem
