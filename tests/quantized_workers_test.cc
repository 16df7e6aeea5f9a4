// CPU worker processes holding a GGUF's experts in their quantized blocks
// (--gguf_experts quantized), end to end: the demo model (hidden 512, I
// 1024: every row whole 256-blocks), two layers, quantized by
// tandem-quantize's code to Q4_K_M (gate/up Q4_K, down Q4_K on layer 0 and
// Q6_K on layer 1: one region holds several types) and to Q8_0 (32-value
// blocks); two real tandem-cpu-worker processes on unix sockets.
//
//   - greedy tokens equal the in-process quantized run's; the logits are
//     bit-identical to the single-process engine computing the same
//     partials (LocalExpertExecutor split_ways = 2, cut on the same block
//     boundaries) for split, and to the plain in-process engine for shard;
//   - the workers' stores hold the quantized bytes (a third to a half of
//     the BF16 store's) and the content hashes the coordinator computes
//     over its own blocks agree with them (Connect checks);
//   - a worker whose experts are of other types (bf16 against a quantized
//     coordinator) is refused at connect, naming both;
//   - a split that would cut a block is refused, naming the tensor, its type
//     and the block size.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/kernels/linear.h"
#include "common/model/expert_content.h"
#include "common/model/expert_partition.h"
#include "common/model/gguf_quantize.h"
#include "common/model/gguf_tensor_source.h"
#include "common/model/model.h"
#include "common/model/synthetic_model.h"
#include "common/quant/block_order.h"
#include "coordinator/orchestration/worker_connect.h"
#include "coordinator/runtime/local_runtime.h"
#include "cpu_worker/expert_store.h"
#include "cpu_worker/local_expert_executor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"
#include "tests/worker_process_testlib.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

namespace fs = std::filesystem;

constexpr uint64_t kSeed = 5;
constexpr int kTokens = 8;
const char kWorkerBinary[] = TANDEM_BINARY_DIR "/bin/tandem-cpu-worker";

struct GenerationRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // every forward pass's, concatenated
};

// Greedy generation with `experts` (null: the runtime's own executor).
absl::StatusOr<GenerationRun> Generate(std::unique_ptr<Model> model, ExpertExecutor* experts,
                                       const std::vector<int32_t>& prompt) {
  GenerationRun run;
  LocalRuntimeOptions options;
  options.num_threads = 1;
  options.expert_executor = experts;
  options.engine.dump = [&](std::string_view name, int, const float* data, int64_t rows, int64_t cols) {
    if (name == "logits") run.logits.insert(run.logits.end(), data, data + rows * cols);
  };
  auto rt = LocalRuntime::Create(std::move(model), options);
  if (!rt.ok()) return rt.status();
  GenerationRequest request;
  request.prompt_ids = prompt;
  request.max_tokens = kTokens;
  request.ignore_eos = true;
  auto result = (*rt)->generator().Generate(request);
  if (!result.ok()) return result.status();
  for (const GeneratedToken& t : result->tokens) run.tokens.push_back(t.id);
  return run;
}

class QuantizedWorkersTest : public ::testing::TestWithParam<std::string> {
 protected:
  // The demo model (2 layers) as a BF16 folder and as GGUF files, once.
  static void SetUpTestSuite() {
    dir_ = new ScopedTempDir();
    const fs::path folder = dir_->path() / "demo";
    ASSERT_OK(WriteSyntheticModel({.preset = "demo", .num_layers = 2, .seed = kSeed, .dtype = DType::kBF16}, folder,
                                  {.num_threads = 2}));
    for (const char* type : {"q4_k_m", "q8_0"}) {
      absl::StatusOr<GgufFileType> file_type = ParseGgufFileType(type);
      ASSERT_OK(file_type);
      ASSERT_OK(QuantizeModel({.model_dir = folder, .file_type = *file_type, .out = File(type), .num_threads = 2}));
    }
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static fs::path File(const std::string& type) { return dir_->path() / absl::StrCat("demo-", type, ".gguf"); }

  static std::unique_ptr<Model> LoadQuantized(const std::string& type) {
    auto model = LoadModel(File(type), {.num_threads = 2, .quantized = QuantizedWeights::kKeepExperts});
    EXPECT_OK(model);
    return model.ok() ? std::move(*model) : nullptr;
  }

  // Starts `n` workers on the GGUF of `type`.
  void StartWorkers(int n, const std::string& type, const std::string& division, const std::string& gguf_experts) {
    const std::string prefix = UniqueRegionPrefix();
    for (int i = 0; i < n; ++i) {
      WorkerProcessOptions o;
      o.binary = kWorkerBinary;
      o.socket = work_.path() / absl::StrCat("w", i, ".sock");
      o.region_prefix = prefix;
      o.worker_index = i;
      o.num_workers = n;
      o.extra_args = {"--model",        File(type).string(),
                      "--gguf_experts", gguf_experts,
                      "--division",     division,
                      "--transport",    "shm",
                      "--threads",      "1"};
      o.log = work_.path() / absl::StrCat("w", i, ".log");
      workers_.push_back(std::make_unique<WorkerProcess>(o));
      ASSERT_OK(workers_.back()->Start());
    }
  }
  // ConnectExpertWorkers: the coordinator's own checks (types, split blocks,
  // content hashes over its blocks).
  absl::StatusOr<std::unique_ptr<RemoteExpertExecutor>> Connect(const Model& model, const std::string& gguf_path = "") {
    WorkerConnectSettings settings;
    settings.gguf_path = gguf_path;
    for (const auto& w : workers_)
      settings.addresses += absl::StrCat(settings.addresses.empty() ? "" : ",", w->address());
    settings.transport = "shm";
    settings.num_threads = 2;
    return ConnectExpertWorkers(model, settings);
  }
  std::string Logs() const {
    std::string text;
    for (const auto& w : workers_) text += w->LogTail(1500);
    return text;
  }

  static ScopedTempDir* dir_;
  ScopedTempDir work_;
  std::vector<std::unique_ptr<WorkerProcess>> workers_;  // stopped and reaped with the fixture
};

ScopedTempDir* QuantizedWorkersTest::dir_ = nullptr;

// The single-process reference computing the split's partials in worker order.
GenerationRun SplitReference(std::unique_ptr<Model> model, const std::vector<int32_t>& prompt) {
  std::vector<std::vector<ExpertFfnWeights>> experts;
  for (const LayerWeights& layer : model->weights->layers) experts.push_back(layer.experts);
  ThreadPool pool(ThreadPoolOptions{.num_threads = 1, .name = "ref"});
  LocalExpertExecutor local(std::move(experts), &pool, LinearOptions{}, /*split_ways=*/2);
  auto run = Generate(std::move(model), &local, prompt);
  EXPECT_OK(run);
  return run.ok() ? *run : GenerationRun{};
}

TEST_P(QuantizedWorkersTest, SplitAndShardGiveTheInProcessQuantizedTokens) {
  const std::string type = GetParam();
  std::unique_ptr<Model> probe = LoadQuantized(type);
  ASSERT_NE(probe, nullptr);
  const std::vector<int32_t> prompt = RandomTokens(16, probe->config.vocab_size, 77);
  auto in_process = Generate(std::move(probe), nullptr, prompt);
  ASSERT_OK(in_process);
  ASSERT_EQ(in_process->tokens.size(), static_cast<size_t>(kTokens));

  for (const std::string division : {"split", "shard"}) {
    SCOPED_TRACE(division);
    workers_.clear();
    ASSERT_NO_FATAL_FAILURE(StartWorkers(2, type, division, "quantized"));
    std::unique_ptr<Model> model = LoadQuantized(type);
    ASSERT_NE(model, nullptr);
    auto remote = Connect(*model);
    ASSERT_OK(remote) << Logs();
    auto got = Generate(std::move(model), remote->get(), prompt);
    ASSERT_OK(got) << Logs();
    EXPECT_EQ(got->tokens, in_process->tokens);
    const GenerationRun want = division == "split" ? SplitReference(LoadQuantized(type), prompt) : *in_process;
    ASSERT_EQ(got->logits.size(), want.logits.size());
    EXPECT_EQ(std::memcmp(got->logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0)
        << "logits differ from the single-process engine's";
    for (const RemoteWorkerStats& s : (*remote)->stats()) {
      EXPECT_GT(s.calls, 0) << s.address;
      EXPECT_EQ(s.failures, 0) << s.address;
    }
    // The stores hold blocks, and say which: the log names the types.
    const std::string logs = Logs();
    EXPECT_TRUE(absl::StrContains(logs, type == "q8_0" ? "slices of Q8_0" : "slices of Q4_K+Q6_K")) << logs;
    // --block_order auto: K-quant stores in group-major order where this
    // CPU's GEMV reads it (the tokens and logits above then also check that
    // it computes the same bits from them).
    const bool group_major = type == "q4_k_m" && PreferredBlockOrder() == BlockOrder::kGroupMajor;
    EXPECT_EQ(absl::StrContains(logs, "blocks in group-major order"), group_major) << logs;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, QuantizedWorkersTest, ::testing::Values("q4_k_m", "q8_0"));

using QuantizedWorkersRefusalTest = QuantizedWorkersTest;

// --gguf_experts bf16 on both sides: the workers dequantize their slices at
// load, the coordinator loads no experts (as runtime_flags does with
// --workers) and checks the workers' hashes by dequantizing the same rows
// from the file's blocks.
TEST_F(QuantizedWorkersRefusalTest, Bf16WorkersOnAGgufAreCheckedFromTheFileBlocks) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(2, "q4_k_m", "split", "bf16"));
  ModelLoadOptions no_experts{.num_threads = 2};
  no_experts.experts.mode = SyntheticExperts::Mode::kNone;
  auto model = LoadModel(File("q4_k_m"), no_experts);
  ASSERT_OK(model);
  EXPECT_FALSE(Connect(**model).ok()) << "no expert bytes and no file: nothing to check the workers against";
  auto remote = Connect(**model, File("q4_k_m").string());
  ASSERT_OK(remote) << Logs();
  auto full = LoadModel(File("q4_k_m"), {.num_threads = 2});  // every expert dequantized to BF16
  ASSERT_OK(full);
  const std::vector<int32_t> prompt = RandomTokens(16, (*model)->config.vocab_size, 78);
  auto got = Generate(std::move(*model), remote->get(), prompt);
  ASSERT_OK(got) << Logs();
  const GenerationRun want = SplitReference(std::move(*full), prompt);
  EXPECT_EQ(got->tokens, want.tokens);
  ASSERT_EQ(got->logits.size(), want.logits.size());
  EXPECT_EQ(std::memcmp(got->logits.data(), want.logits.data(), want.logits.size() * sizeof(float)), 0);
  EXPECT_TRUE(absl::StrContains(Logs(), "slices of BF16")) << Logs();
}

TEST_F(QuantizedWorkersRefusalTest, WorkerWithOtherExpertTypesIsRefusedNamingBoth) {
  ASSERT_NO_FATAL_FAILURE(StartWorkers(1, "q4_k_m", "split", "bf16"));
  std::unique_ptr<Model> model = LoadQuantized("q4_k_m");
  ASSERT_NE(model, nullptr);
  auto remote = Connect(*model);
  ASSERT_FALSE(remote.ok());
  EXPECT_EQ(remote.status().code(), absl::StatusCode::kFailedPrecondition) << remote.status();
  EXPECT_TRUE(absl::StrContains(remote.status().message(), "stores its experts as BF16")) << remote.status();
  EXPECT_TRUE(absl::StrContains(remote.status().message(), "has them as Q4_K+Q6_K")) << remote.status();
  EXPECT_TRUE(absl::StrContains(remote.status().message(), "--gguf_experts")) << remote.status();
}

// I = 1024 is four 256-value blocks (Q4_K_M) or 32 of 32 (Q8_0): five
// workers cannot each get a whole Q4_K block; Q8_0 splits on 32-boundaries.
TEST_F(QuantizedWorkersRefusalTest, SplitThatWouldCutABlockIsRefusedNamingTensorTypeAndBlock) {
  std::unique_ptr<Model> model = LoadQuantized("q4_k_m");
  ASSERT_NE(model, nullptr);
  const ExpertSplitBlock block = ExpertSplitBlockOf(*model->weights);
  EXPECT_EQ(block.values, 256);
  ASSERT_OK(PartitionExperts(model->config, ExpertDivision::kSplit, 3, 4, block));
  auto refused = PartitionExperts(model->config, ExpertDivision::kSplit, 0, 5, block);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& part : {std::string("w2.weight"), std::string("256-value blocks"), std::string("Q4_K")}) {
    EXPECT_TRUE(absl::StrContains(refused.status().message(), part)) << part << ": " << refused.status();
  }
  // The store refuses the same split, before creating anything.
  const std::string prefix = UniqueRegionPrefix();
  auto store = ExpertStore::Create(
      *model->weights, ExpertStoreOptions{.region_name = prefix + "-cut", .worker_index = 0, .num_workers = 5});
  ASSERT_FALSE(store.ok());
  EXPECT_TRUE(absl::StrContains(store.status().message(), "256-value blocks")) << store.status();
  // Shard never cuts an expert.
  EXPECT_OK(PartitionExperts(model->config, ExpertDivision::kShard, 0, 5, block));

  // Q8_0: boundaries on 32-value blocks, and 1024 / 32 = 32 blocks split 20 ways.
  std::unique_ptr<Model> q8 = LoadQuantized("q8_0");
  ASSERT_NE(q8, nullptr);
  const ExpertSplitBlock q8_block = ExpertSplitBlockOf(*q8->weights);
  EXPECT_EQ(q8_block.values, 32);
  for (int w = 0; w < 20; ++w) {
    auto slices = PartitionExperts(q8->config, ExpertDivision::kSplit, w, 20, q8_block);
    ASSERT_OK(slices);
    EXPECT_EQ(slices->front().intermediate_begin % 32, 0);
    EXPECT_EQ(slices->front().size() % 32, 0);
  }
}

// The quantized store holds the blocks: its bytes are the quantized sizes
// (Q8_0: 34 bytes per 32 values; BF16: 64), every slice's matrices have the
// model's types, and its content hash equals the one the coordinator
// computes over its own blocks.
TEST_F(QuantizedWorkersRefusalTest, StoreHoldsTheQuantizedBytes) {
  std::unique_ptr<Model> model = LoadQuantized("q8_0");
  ASSERT_NE(model, nullptr);
  const std::string prefix = UniqueRegionPrefix();
  auto store = ExpertStore::Create(
      *model->weights, ExpertStoreOptions{.region_name = prefix + "-q8", .worker_index = 1, .num_workers = 2});
  ASSERT_OK(store);
  const ModelConfig& c = model->config;
  const int64_t values = 3 * c.hidden_size * (c.intermediate_size / 2) * c.num_hidden_layers * c.num_local_experts;
  EXPECT_EQ((*store)->expert_bytes(), values / 32 * 34);
  EXPECT_EQ((*store)->dtypes(), "Q8_0");
  for (const ExpertSlice& s : (*store)->slices()) {
    const ExpertWeights* w = (*store)->Find(s.layer, s.expert);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->w2.dtype, DType::kQ8_0);
    EXPECT_EQ(w->w2.k, s.size());
    // Stored w2 row 3: the source row's blocks from intermediate_begin on.
    const LinearWeight& full =
        model->weights->layers[static_cast<size_t>(s.layer)].experts[static_cast<size_t>(s.expert)].w2;
    EXPECT_EQ(std::memcmp(static_cast<const char*>(w->w2.data) + 3 * w->w2.row_bytes(),
                          static_cast<const char*>(full.data) + 3 * full.row_bytes() +
                              DTypeRowBytes(full.dtype, s.intermediate_begin),
                          static_cast<size_t>(w->w2.row_bytes())),
              0);
  }
  auto hashes = HashExpertSlices(*model->weights, (*store)->slices(), nullptr);
  ASSERT_OK(hashes);
  EXPECT_EQ(*hashes, (*store)->slice_hashes());
}

// A store asked for group-major blocks holds each Q4_K/Q6_K row of the file
// reordered (block_order.h), says so in its header and views, and hashes
// the rows as the file has them: its content hash is the ggml store's.
TEST_F(QuantizedWorkersRefusalTest, GroupMajorStoreHashesTheFileOrder) {
  std::unique_ptr<Model> model = LoadQuantized("q4_k_m");
  ASSERT_NE(model, nullptr);
  const std::string prefix = UniqueRegionPrefix();
  auto ggml =
      ExpertStore::Create(*model->weights, ExpertStoreOptions{.region_name = prefix + "-ggml", .num_workers = 2});
  auto reordered = ExpertStore::Create(
      *model->weights,
      ExpertStoreOptions{.region_name = prefix + "-gm", .num_workers = 2, .block_order = BlockOrder::kGroupMajor});
  ASSERT_OK(ggml);
  ASSERT_OK(reordered);
  EXPECT_EQ((*reordered)->info().block_order, BlockOrder::kGroupMajor);
  EXPECT_EQ((*ggml)->info().block_order, BlockOrder::kGgml);
  EXPECT_EQ((*reordered)->slice_hashes(), (*ggml)->slice_hashes());
  EXPECT_EQ((*reordered)->content_hash(), (*ggml)->content_hash());
  int reordered_matrices = 0;
  for (const ExpertSlice& s : (*reordered)->slices()) {
    const ExpertWeights* a = (*ggml)->Find(s.layer, s.expert);
    const ExpertWeights* b = (*reordered)->Find(s.layer, s.expert);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    for (const auto& [x, y] : {std::pair{&a->w1, &b->w1}, std::pair{&a->w3, &b->w3}, std::pair{&a->w2, &b->w2}}) {
      ASSERT_EQ(y->order, HasGroupMajorOrder(y->dtype) ? BlockOrder::kGroupMajor : BlockOrder::kGgml);
      std::vector<uint8_t> want(static_cast<const uint8_t*>(x->data),
                                static_cast<const uint8_t*>(x->data) + x->bytes());
      if (y->order == BlockOrder::kGroupMajor) {
        ++reordered_matrices;
        ASSERT_OK(ToGroupMajorOrder(GgmlFromDType(y->dtype), absl::MakeSpan(want)));
      }
      ASSERT_EQ(std::memcmp(y->data, want.data(), want.size()), 0) << "layer " << s.layer << " expert " << s.expert;
    }
  }
  EXPECT_GT(reordered_matrices, 0);
  // What a reader maps sees the same order.
  auto view = ExpertStore::OpenReadOnly((*reordered)->region_name());
  ASSERT_OK(view);
  EXPECT_EQ(view->info().block_order, BlockOrder::kGroupMajor);
  // A model whose views are already reordered is refused: rows are hashed
  // as they are copied, in the file's order.
  ModelWeights copy_of_views = *model->weights;
  copy_of_views.layers[0].experts[0].w1.order = BlockOrder::kGroupMajor;
  auto refused = ExpertStore::Create(copy_of_views, ExpertStoreOptions{.region_name = prefix + "-bad"});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("group_major block order"));
}

}  // namespace
}  // namespace tandem
