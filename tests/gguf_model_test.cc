// GGUF models end to end: a Hugging Face folder -> tandem-quantize (every
// file type) -> LoadModel(.gguf) -> the engine, against the folder itself.
//
//   f32 / bf16   the GGUF loads to the same config and the same weight values
//                (q/k rows back in Hugging Face order), so the logits equal
//                the folder's.
//   quantized    each loaded matrix equals, value for value, an independent
//                oracle: the folder's rows quantized and dequantized with the
//                type the file stores (rows are quantized independently, so
//                the converter's q/k permutation does not change them); the
//                engine on those weights equals the float64 reference; and
//                the logits stay within a per-type NMSE of the folder's.
//   tokenizer    the vocabulary in the GGUF tokenizes a corpus exactly as
//                the tokenizer.model it came from.
//   bad files    missing keys and tensors, shapes the hyperparameters do not
//                imply, types tandem does not run, other tokenizers: errors
//                naming the file and the key or tensor.
//
// The test models are small (hidden 256) but K-quant friendly: every row is
// whole 256-blocks, so q4_K/q5_K/q6_K are really used, and two layers put
// use_more_bits' Q6_K on layer 1 only.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/gguf/gguf_writer.h"
#include "common/kernels/linear.h"
#include "common/model/gguf_model_config.h"
#include "common/model/gguf_names.h"
#include "common/model/gguf_quantize.h"
#include "common/model/gguf_tensor_source.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "common/model/synthetic_model.h"
#include "common/quant/block_order.h"
#include "common/quant/quantize.h"
#include "coordinator/engine/cpu_backend.h"
#include "coordinator/runtime/local_runtime.h"
#include "tests/exact_kernels_testlib.h"
#include "tests/reference_model_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokens_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// The round trips compare a bf16 folder with f32/f16 GGUF files at 1e-12:
// both must run f32-input kernels (exact_kernels_testlib.h).
const bool kExactKernels = test::UseExactKernels();
using ::testing::HasSubstr;
using ::testing::Not;

constexpr uint64_t kSeed = 11;
constexpr char kChatTemplate[] = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}";

// Mixtral-, PhiMoE-, Qwen3-MoE-, Qwen2-MoE-, OLMoE- or GLM-4.5-shaped, hidden 256:
// every matrix row is whole K-blocks.
ModelConfig KConfig(const std::string& arch) {
  auto base = SyntheticConfig({.preset = arch == "mixtral" ? "tiny" : absl::StrCat("tiny-", arch)});
  EXPECT_TRUE(base.ok());
  ModelConfig c = *base;
  c.hidden_size = 256, c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 64;
  c.intermediate_size = arch == "mixtral" ? 512 : 256;
  if (c.shared_expert()) c.shared_expert_intermediate_size = 512;
  if (c.mla()) {  // whole Q4_K blocks along every matrix's rows
    c.num_key_value_heads = c.num_attention_heads;
    c.qk_nope_head_dim = 64, c.qk_rope_head_dim = 32, c.v_head_dim = 64, c.head_dim = 96;
    c.kv_lora_rank = 256;
    if (c.q_lora_rank > 0) c.q_lora_rank = 256;
  }
  if (!c.dense_layers.empty()) c.dense_intermediate_size = 768;
  if (c.rope_scaling.type == "longrope") {
    c.rope_scaling.short_factor.clear(), c.rope_scaling.long_factor.clear();
    for (int64_t i = 0; i < c.head_dim / 2; ++i) {
      const double t = static_cast<double>(i) / static_cast<double>(c.head_dim / 2);
      c.rope_scaling.short_factor.push_back(1.0 + 0.1 * t * t);
      c.rope_scaling.long_factor.push_back(1.0 + 30.0 * t * t);
    }
  }
  return c;
}

// Writes an HF folder for `config`: synthetic weights (FillSyntheticTensor),
// the tiny preset's tokenizer and a tokenizer_config.json with a template.
void WriteHfFolder(const fs::path& dir, const ModelConfig& config) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << ModelConfigToJson(config);
  std::vector<TensorToWrite> tensors;
  for (const WeightSpec& w : ExpectedWeights(config)) {
    TensorToWrite t{w.name, DType::kBF16, w.shape, {}};
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    t.data.resize(static_cast<size_t>(n) * 2);
    FillSyntheticTensor(config, w, kSeed, DType::kBF16, t.data.data());
    tensors.push_back(std::move(t));
  }
  std::vector<const TensorToWrite*> pointers;
  for (const TensorToWrite& t : tensors) pointers.push_back(&t);
  ASSERT_OK(WriteSafetensorsCheckpoint(dir, pointers, 2));
  auto tokenizer = SyntheticTokenizerModel({.preset = "tiny"});
  ASSERT_OK(tokenizer);
  std::ofstream(dir / "tokenizer.model", std::ios::binary) << *tokenizer;
  nlohmann::json tc = {{"add_bos_token", true}, {"add_eos_token", false}, {"chat_template", kChatTemplate}};
  std::ofstream(dir / "tokenizer_config.json") << tc.dump();
}

std::vector<float> Logits(std::unique_ptr<Model> model, const std::vector<int32_t>& tokens) {
  LocalRuntimeOptions options;
  options.num_threads = 2;
  auto runtime = LocalRuntime::Create(std::move(model), options);
  EXPECT_TRUE(runtime.ok()) << runtime.status();
  if (!runtime.ok()) return {};
  SequenceKv kv(&(*runtime)->kv_pool());
  const ForwardInput input{&kv, tokens, /*all_logits=*/true};
  std::vector<float> logits;
  absl::Status s = (*runtime)->engine().Forward({&input, 1}, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

double LogitsNmse(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> reference(b.begin(), b.end());
  return Nmse(std::span<const float>(a), std::span<const double>(reference));
}

// The folders and files every test shares: written once per process.
class GgufModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new ScopedTempDir(); }
  static void TearDownTestSuite() { delete dir_; }

  static fs::path Folder(const std::string& arch) {
    const fs::path dir = dir_->path() / arch;
    if (!fs::exists(dir / "config.json")) WriteHfFolder(dir, KConfig(arch));
    return dir;
  }
  static fs::path Gguf(const std::string& arch, const std::string& type) {
    const fs::path out = dir_->path() / absl::StrCat(arch, "-", type, ".gguf");
    if (!fs::exists(out)) {
      auto file_type = ParseGgufFileType(type);
      EXPECT_TRUE(file_type.ok());
      auto result = QuantizeModel({.model_dir = Folder(arch), .file_type = *file_type, .out = out, .num_threads = 2});
      EXPECT_TRUE(result.ok()) << result.status();
    }
    return out;
  }
  static std::vector<int32_t> Prompt(const ModelConfig& c) { return RandomTokens(24, c.vocab_size, 5); }

  static ScopedTempDir* dir_;
};
ScopedTempDir* GgufModelTest::dir_ = nullptr;

// ---------------------------------------------------------------- vocabulary

TEST(GgufVocabularyTest, DTypeBlocksAreGgmls) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0,
                  DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    SCOPED_TRACE(DTypeName(d));
    const GgmlType g = GgmlFromDType(d);
    EXPECT_EQ(DTypeBlockSize(d), GgmlBlockSize(g));
    EXPECT_EQ(DTypeBlockBytes(d), GgmlBlockBytes(g));
    EXPECT_EQ(IsQuantized(d), GgmlBlockSize(g) > 1);
    auto back = DTypeFromGgml(g);
    ASSERT_OK(back);
    EXPECT_EQ(*back, d);
  }
  auto iq = DTypeFromGgml(GgmlType::kIQ2_XXS);
  ASSERT_FALSE(iq.ok());
  EXPECT_THAT(std::string(iq.status().message()), HasSubstr("iq2_xxs"));
}

// The converter's permute(): reshape rows as (heads, 2, hd/2), swap the
// middle axes, flatten. Built here from that definition, not from gguf_names.
TEST(GgufVocabularyTest, RowPermutationIsTheConvertersAndItsInverse) {
  const int64_t heads = 3, hd = 8, rows = heads * hd;
  std::vector<int64_t> converted(static_cast<size_t>(rows));  // converted[gguf row] = hf row
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t j = 0; j < hd / 2; ++j) converted[static_cast<size_t>(h * hd + j * 2 + s)] = h * hd + s * hd / 2 + j;
  for (int64_t g = 0; g < rows; ++g) {
    EXPECT_EQ(HfRowOfGgufRow(g, hd), converted[static_cast<size_t>(g)]);
    EXPECT_EQ(GgufRowOfHfRow(converted[static_cast<size_t>(g)], hd), g);
  }
}

// llama.cpp's documented mix on the real Mixtral-8x7B shape (32 layers, 8
// experts): use_more_bits picks layers 0-3, 6, 9, ..., 27 and 28-31.
TEST(GgufVocabularyTest, QuantizationMixIsLlamaCpps) {
  auto config = SyntheticConfig({.preset = "mixtral-8x7b"});
  ASSERT_OK(config);
  auto plan = PlanGgufTensors(*config, GgufFileType::kQ4_K_M);
  ASSERT_OK(plan);
  std::map<std::string, GgmlType> type;
  for (const GgufTensorPlan& p : *plan) type[p.spec.name] = p.spec.type;
  EXPECT_EQ(plan->front().spec.name, "output.weight");  // model-level tensors first, by name
  EXPECT_EQ(type["output.weight"], GgmlType::kQ6_K);
  EXPECT_EQ(type["token_embd.weight"], GgmlType::kQ4_K);
  EXPECT_EQ(type["output_norm.weight"], GgmlType::kF32);
  EXPECT_EQ(type["blk.5.ffn_gate_inp.weight"], GgmlType::kF32);
  EXPECT_EQ(type["blk.5.attn_norm.weight"], GgmlType::kF32);
  EXPECT_EQ(type["blk.5.attn_v.weight"], GgmlType::kQ8_0);  // 8 experts
  EXPECT_EQ(type["blk.5.attn_k.weight"], GgmlType::kQ8_0);
  EXPECT_EQ(type["blk.5.attn_q.weight"], GgmlType::kQ4_K);
  EXPECT_EQ(type["blk.5.attn_output.weight"], GgmlType::kQ5_K);
  EXPECT_EQ(type["blk.5.ffn_gate_exps.weight"], GgmlType::kQ4_K);
  EXPECT_EQ(type["blk.5.ffn_up_exps.weight"], GgmlType::kQ4_K);
  for (int layer : {0, 3, 6, 9, 27, 28, 31}) {
    EXPECT_EQ(type[absl::StrCat("blk.", layer, ".ffn_down_exps.weight")], GgmlType::kQ6_K) << layer;
  }
  for (int layer : {4, 5, 7, 8, 26}) {
    EXPECT_EQ(type[absl::StrCat("blk.", layer, ".ffn_down_exps.weight")], GgmlType::kQ4_K) << layer;
  }
  auto q5 = PlanGgufTensors(*config, GgufFileType::kQ5_K_M);
  ASSERT_OK(q5);
  for (const GgufTensorPlan& p : *q5) {
    if (p.spec.name == "blk.5.attn_output.weight") {
      EXPECT_EQ(p.spec.type, GgmlType::kQ5_K);
    }
    if (p.spec.name == "blk.6.ffn_down_exps.weight") {
      EXPECT_EQ(p.spec.type, GgmlType::kQ6_K);
    }
  }
  auto q4_0 = PlanGgufTensors(*config, GgufFileType::kQ4_0);
  ASSERT_OK(q4_0);
  for (const GgufTensorPlan& p : *q4_0) {
    if (p.spec.name == "output.weight") {
      EXPECT_EQ(p.spec.type, GgmlType::kQ6_K);
    }
    if (p.spec.name == "blk.5.ffn_down_exps.weight") {
      EXPECT_EQ(p.spec.type, GgmlType::kQ4_0);
    }
  }
  auto q8 = PlanGgufTensors(*config, GgufFileType::kQ8_0);
  ASSERT_OK(q8);
  for (const GgufTensorPlan& p : *q8) {
    if (p.spec.name == "output.weight") {
      EXPECT_EQ(p.spec.type, GgmlType::kQ8_0);
    }
  }
}

// ------------------------------------------------------------ float round trip

class GgufFloatRoundTripTest : public GgufModelTest,
                               public ::testing::WithParamInterface<std::tuple<std::string, std::string>> {};

TEST_P(GgufFloatRoundTripTest, SameConfigWeightsAndLogitsAsTheFolder) {
  const auto& [arch, type] = GetParam();
  auto folder = LoadModel(Folder(arch));
  ASSERT_OK(folder);
  auto gguf = LoadModel(Gguf(arch, type));
  ASSERT_OK(gguf);
  EXPECT_EQ(ModelConfigToJson((*gguf)->config), ModelConfigToJson((*folder)->config));
  EXPECT_EQ((*gguf)->chat_template, kChatTemplate);
  EXPECT_EQ((*folder)->chat_template, kChatTemplate);
  // Every tensor has the folder's values, q/k rows included.
  const TensorSource& a = *(*folder)->weights->source;
  const TensorSource& b = *(*gguf)->weights->source;
  // f16 holds every bf16 value but the smallest (f16 subnormals): compared by logits only.
  for (const WeightSpec& w : type == "f16" ? std::vector<WeightSpec>{} : ExpectedWeights((*folder)->config)) {
    auto x = a.Get(w.name), y = b.Get(w.name);
    ASSERT_OK(x);
    ASSERT_OK(y);
    ASSERT_EQ(x->shape, y->shape) << w.name;
    for (int64_t i = 0; i < x->num_elements(); ++i) {
      ASSERT_EQ(LoadAsF32(x->data, x->dtype, i), LoadAsF32(y->data, y->dtype, i)) << w.name << " element " << i;
    }
  }
  const std::vector<int32_t> tokens = Prompt((*folder)->config);
  const std::vector<float> want = Logits(std::move(*folder), tokens);
  const std::vector<float> got = Logits(std::move(*gguf), tokens);
  ASSERT_EQ(got.size(), want.size());
  // bf16 matrices run the very kernels the folder's do; the router (f32 in
  // GGUF, as the converter writes it) and f32 files take the f32 path, whose
  // summation order may differ in the last bit.
  const double nmse = LogitsNmse(got, want);
  std::cout << "[ nmse     ] " << arch << " " << type << " vs folder: " << nmse << "\n";
  EXPECT_LT(nmse, type == "f16" ? 1e-8 : 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Types, GgufFloatRoundTripTest,
                         ::testing::Combine(::testing::Values("mixtral", "phimoe", "qwen3moe", "qwen2moe", "olmoe",
                                                              "qwen3moe-dense", "glm4moe", "deepseek-v2",
                                                              "deepseek-v3"),
                                            ::testing::Values("f32", "bf16", "f16")),
                         [](const auto& info) {
                           std::string name = absl::StrCat(std::get<0>(info.param), "_", std::get<1>(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// ------------------------------------------------------------ quantized files

// max_nmse: logits vs the unquantized folder's, about 3x what was measured.
// On these random tiny models the error is dominated by routing flips (a
// token whose top-k changes moves its whole output), worst for PhiMoE's
// discontinuous sparsemixer, so the bounds are loose and not monotone in
// bits; the exact checks are the weights (against the oracle) and the
// engine (against the float64 reference on those weights).
struct QuantCase {
  std::string arch;
  std::string type;
  double max_nmse;
};

class GgufQuantizedTest : public GgufModelTest, public ::testing::WithParamInterface<QuantCase> {};

// The oracle for one HF tensor stored as `type`: its rows quantized and
// dequantized, row by row.
std::vector<float> QuantizedValues(const TensorView& view, GgmlType type) {
  const int64_t row = view.shape.back(), rows = view.num_elements() / row;
  std::vector<float> in(static_cast<size_t>(row)), out(static_cast<size_t>(view.num_elements()));
  std::vector<uint8_t> blocks(static_cast<size_t>(*GgmlRowBytes(type, row)));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < row; ++i) in[static_cast<size_t>(i)] = LoadAsF32(view.data, view.dtype, r * row + i);
    EXPECT_TRUE(QuantizeRow(type, in, absl::MakeSpan(blocks)).ok());
    EXPECT_TRUE(DequantizeRow(type, blocks, absl::MakeSpan(out).subspan(static_cast<size_t>(r * row), row)).ok());
  }
  return out;
}

TEST_P(GgufQuantizedTest, WeightsAreTheDequantizedBlocksAndLogitsStayClose) {
  const QuantCase& c = GetParam();
  const fs::path file = Gguf(c.arch, c.type);
  auto folder = LoadModel(Folder(c.arch));
  ASSERT_OK(folder);
  auto gguf = LoadModel(file, {.quantized = QuantizedWeights::kDequantizeToF32});
  ASSERT_OK(gguf);
  EXPECT_THAT((*gguf)->summary, HasSubstr("dequantized at load"));
  EXPECT_EQ(ModelConfigToJson((*gguf)->config), ModelConfigToJson((*folder)->config));

  const auto& source = dynamic_cast<const GgufTensorSource&>(*(*gguf)->weights->source);
  const TensorSource& hf = *(*folder)->weights->source;
  for (const WeightSpec& w : ExpectedWeights((*folder)->config)) {
    auto x = hf.Get(w.name), y = source.Get(w.name);
    ASSERT_OK(x);
    ASSERT_OK(y);
    const std::string gguf_name = source.GgufNameOf(w.name);
    auto stored = source.checkpoint().Get(gguf_name);
    ASSERT_OK(stored);
    const GgmlType type = stored->info->type;
    const std::vector<float> want = QuantizedValues(*x, type);
    for (int64_t i = 0; i < x->num_elements(); ++i) {
      ASSERT_EQ(LoadAsF32(y->data, y->dtype, i), want[static_cast<size_t>(i)])
          << w.name << " (" << gguf_name << ", " << GgmlTypeName(type) << ") element " << i;
    }
  }
  // The mix: layer 1 is a use_more_bits layer of two, layer 0 is not.
  auto type_of = [&](const std::string& name) {
    auto tensor = source.checkpoint().Get(name);
    EXPECT_OK(tensor);
    return tensor.ok() ? tensor->info->type : GgmlType::kF32;
  };
  const int64_t moe = (*folder)->config.first_moe_layer();
  EXPECT_EQ(type_of(absl::StrCat("blk.", moe, ".ffn_gate_inp.weight")), GgmlType::kF32);
  EXPECT_EQ(type_of("blk.0.attn_norm.weight"), GgmlType::kF32);
  if (c.arch == "qwen3moe-dense" && c.type == "q4_k_m") {
    // A dense layer's down_proj takes the ffn_down rule: layer 2 of 4 gets more bits, 0 does not.
    EXPECT_EQ(type_of("blk.0.ffn_down.weight"), GgmlType::kQ4_K);
    EXPECT_EQ(type_of("blk.2.ffn_down.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(type_of("blk.1.ffn_down_exps.weight"), GgmlType::kQ4_K);
    EXPECT_EQ(type_of("blk.3.ffn_down_exps.weight"), GgmlType::kQ6_K);
  } else if ((c.type == "q4_k_m" || c.type == "q5_k_m") && (*folder)->config.dense_layers.empty()) {
    EXPECT_EQ(type_of("blk.1.attn_v.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(type_of("blk.1.ffn_down_exps.weight"), GgmlType::kQ6_K);
    EXPECT_EQ(type_of("blk.0.ffn_down_exps.weight"), c.type == "q4_k_m" ? GgmlType::kQ4_K : GgmlType::kQ5_K);
    EXPECT_EQ(type_of("blk.0.ffn_up_exps.weight"), c.type == "q4_k_m" ? GgmlType::kQ4_K : GgmlType::kQ5_K);
  }

  const std::vector<int32_t> tokens = Prompt((*folder)->config);
  auto reference = ReferenceModel::Create(*(*gguf)->weights);
  ASSERT_OK(reference);
  auto ref = (*reference)->Forward(tokens);
  ASSERT_OK(ref);
  const std::vector<float> want = Logits(std::move(*folder), tokens);
  const std::vector<float> got = Logits(std::move(*gguf), tokens);
  const double vs_reference = Nmse(std::span<const float>(got), std::span<const double>(ref->logits.data));
  const double vs_folder = LogitsNmse(got, want);
  std::cout << "[ nmse     ] " << c.arch << " " << c.type << ": vs float64 reference on the dequantized weights "
            << vs_reference << ", vs the unquantized folder " << vs_folder << " (bound " << c.max_nmse << ")\n";
  EXPECT_LT(vs_reference, 1e-10);
  EXPECT_LT(vs_folder, c.max_nmse);
  EXPECT_GT(vs_folder, 0.0);
}

// The default load: the logged BF16 fallback, the same model to bf16 rounding.
TEST_P(GgufQuantizedTest, DefaultLoadIsTheLoggedBf16Fallback) {
  const QuantCase& c = GetParam();
  auto exact = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kDequantizeToF32});
  ASSERT_OK(exact);
  auto fallback = LoadModel(Gguf(c.arch, c.type));
  ASSERT_OK(fallback);
  EXPECT_THAT((*fallback)->summary, HasSubstr("dequantized to BF16 at load"));
  const size_t moe = static_cast<size_t>((*fallback)->config.first_moe_layer());
  EXPECT_EQ((*fallback)->weights->layers[moe].experts[0].w1.dtype, DType::kBF16);
  const std::vector<int32_t> tokens = Prompt((*exact)->config);
  const double nmse = LogitsNmse(Logits(std::move(*fallback), tokens), Logits(std::move(*exact), tokens));
  std::cout << "[ nmse     ] " << c.arch << " " << c.type << ": bf16 fallback vs exact dequantization " << nmse << "\n";
  EXPECT_LT(nmse, 3e-2);  // measured 3e-5 .. 8e-3 (routing flips, as above)
}

// Kept quantized, the blocks are views into the file and the quantized
// kernels run them.
TEST_P(GgufQuantizedTest, KeptBlocksAreViewsTheKernelsRun) {
  const QuantCase& c = GetParam();
  auto model = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kKeep});
  ASSERT_OK(model);
  const int64_t moe = (*model)->config.first_moe_layer();  // layer 0 may be a dense one
  const LinearWeight& w1 = (*model)->weights->layers[static_cast<size_t>(moe)].experts[1].w1;
  ASSERT_TRUE(IsQuantized(w1.dtype));
  const auto& source = dynamic_cast<const GgufTensorSource&>(*(*model)->weights->source);
  auto stacked = source.checkpoint().Get(absl::StrCat("blk.", moe, ".ffn_gate_exps.weight"));
  ASSERT_OK(stacked);
  EXPECT_EQ(w1.data, stacked->data.data() + stacked->data.size() / (*model)->config.num_local_experts);  // a view
  EXPECT_EQ(w1.bytes(), static_cast<int64_t>(stacked->data.size()) / (*model)->config.num_local_experts);
  std::vector<float> x(static_cast<size_t>(w1.k), 1.0f), y(static_cast<size_t>(w1.n));
  EXPECT_OK(Linear(x.data(), 1, w1, nullptr, y.data(), nullptr));
}

// --load_weights copy: every matrix the process uses comes out of the file's
// mapping into the arena's anonymous memory, the same bytes, so the logits
// are those of the views; a budget too small for them leaves them views.
TEST_P(GgufQuantizedTest, CopiedWeightsAreTheMappedBytesOutsideTheMapping) {
  const QuantCase& c = GetParam();
  auto mapped = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kKeep});
  auto copied = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kKeep, .copy_weights_to_memory = true});
  ASSERT_OK(mapped);
  ASSERT_OK(copied);
  const auto& source = dynamic_cast<const GgufTensorSource&>(*(*copied)->weights->source);
  const absl::Span<const uint8_t> file = source.checkpoint().files().front()->bytes();
  EXPECT_GT(source.copied_bytes(), 0);
  EXPECT_EQ(source.left_mapped_bytes(), 0);
  EXPECT_GE(source.arena().mapped_bytes(), static_cast<size_t>(source.copied_bytes()));
  const size_t moe = static_cast<size_t>((*mapped)->config.first_moe_layer());
  const LayerWeights& a = (*mapped)->weights->layers[moe];
  const LayerWeights& b = (*copied)->weights->layers[moe];
  using Pair = std::pair<const LinearWeight*, const LinearWeight*>;
  for (const auto& [m, n] : {Pair{&a.experts[1].w1, &b.experts[1].w1}, Pair{&a.o_proj, &b.o_proj},
                             Pair{&(*mapped)->weights->lm_head, &(*copied)->weights->lm_head}}) {
    const auto* data = static_cast<const uint8_t*>(n->data);
    EXPECT_TRUE(data < file.data() || data >= file.data() + file.size()) << "still a view of the file";
    ASSERT_EQ(m->bytes(), n->bytes());
    EXPECT_EQ(std::memcmp(m->data, n->data, static_cast<size_t>(m->bytes())), 0);
  }
  const std::vector<int32_t> tokens = Prompt((*mapped)->config);
  EXPECT_EQ(LogitsNmse(Logits(std::move(*mapped), tokens), Logits(std::move(*copied), tokens)), 0.0);

  // No budget: nothing copied, every matrix left a view and counted.
  auto checkpoint = GgufCheckpoint::Open(Gguf(c.arch, c.type));
  ASSERT_OK(checkpoint);
  auto config = ModelConfigFromGguf(**checkpoint);
  ASSERT_OK(config);
  auto unbudgeted =
      GgufTensorSource::Create(*std::move(checkpoint), *config,
                               {.quantized = QuantizedWeights::kKeep, .copy_to_memory = true, .copy_budget_bytes = 0});
  ASSERT_OK(unbudgeted);
  EXPECT_EQ((*unbudgeted)->copied_bytes(), 0);
  EXPECT_GT((*unbudgeted)->left_mapped_bytes(), 0);
}

// --block_order group_major: the Q4_K/Q6_K matrices the copy holds (not the
// token embedding) are the file's blocks in the VNNI GEMV's order, their
// views say so, and the logits are the file's (this binary's exact plan
// decodes them back block by block: the same values in the same sums).
TEST_P(GgufQuantizedTest, GroupMajorCopiesAreTheFileBlocksReordered) {
  const QuantCase& c = GetParam();
  auto mapped = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kKeep});
  auto reordered = LoadModel(
      Gguf(c.arch, c.type),
      {.quantized = QuantizedWeights::kKeep, .copy_weights_to_memory = true, .block_order = BlockOrder::kGroupMajor});
  ASSERT_OK(mapped);
  ASSERT_OK(reordered);
  const auto& source = dynamic_cast<const GgufTensorSource&>(*(*reordered)->weights->source);
  const ModelWeights& a = *(*mapped)->weights;
  const ModelWeights& b = *(*reordered)->weights;
  int64_t group_major = 0;
  std::vector<std::pair<const LinearWeight*, const LinearWeight*>> pairs = {{&a.lm_head, &b.lm_head}};
  for (size_t l = 0; l < a.layers.size(); ++l) {
    const LayerWeights &x = a.layers[l], &y = b.layers[l];
    for (const auto& [m, n] : {std::pair{&x.q_proj, &y.q_proj}, std::pair{&x.k_proj, &y.k_proj},
                               std::pair{&x.v_proj, &y.v_proj}, std::pair{&x.o_proj, &y.o_proj}})
      pairs.emplace_back(m, n);
    for (size_t e = 0; e < x.experts.size(); ++e) {
      pairs.emplace_back(&x.experts[e].w1, &y.experts[e].w1);
      pairs.emplace_back(&x.experts[e].w2, &y.experts[e].w2);
      pairs.emplace_back(&x.experts[e].w3, &y.experts[e].w3);
    }
    if (x.dense_mlp.w1.data != nullptr) {
      pairs.emplace_back(&x.dense_mlp.w1, &y.dense_mlp.w1);
      pairs.emplace_back(&x.dense_mlp.w2, &y.dense_mlp.w2);
      pairs.emplace_back(&x.dense_mlp.w3, &y.dense_mlp.w3);
    }
  }
  for (const auto& [m, n] : pairs) {
    ASSERT_EQ(m->dtype, n->dtype);
    ASSERT_EQ(m->order, BlockOrder::kGgml);
    ASSERT_EQ(n->order, HasGroupMajorOrder(n->dtype) ? BlockOrder::kGroupMajor : BlockOrder::kGgml)
        << DTypeName(n->dtype);
    std::vector<uint8_t> back(static_cast<const uint8_t*>(n->data), static_cast<const uint8_t*>(n->data) + n->bytes());
    if (n->order == BlockOrder::kGroupMajor) {
      ++group_major;
      ASSERT_NE(std::memcmp(m->data, back.data(), back.size()), 0);
      ASSERT_OK(ToGgmlOrder(GgmlFromDType(n->dtype), absl::MakeSpan(back)));
    }
    ASSERT_EQ(std::memcmp(m->data, back.data(), back.size()), 0) << DTypeName(n->dtype);
  }
  auto embed = source.Get(WeightName((*reordered)->config, WeightRole::kEmbedTokens));
  ASSERT_OK(embed);
  EXPECT_EQ(embed->order, BlockOrder::kGgml);  // read a row at a time by the embedding lookup
  if (c.type == "q4_k_m" || c.type == "q6_k") {
    EXPECT_GT(group_major, 0);
  }
  EXPECT_EQ(source.reordered_tensors() > 0, group_major > 0);
  const std::vector<int32_t> tokens = Prompt((*mapped)->config);
  EXPECT_EQ(LogitsNmse(Logits(std::move(*mapped), tokens), Logits(std::move(*reordered), tokens)), 0.0);
}

// Every matrix kept in its blocks (as --gguf_experts/--gguf_dense auto on
// the CPU): the quantized embedding table gives the dequantized rows, the
// attention projections and lm_head run the quantized kernels, and the
// logits are those of the file fully dequantized to F32.
TEST_P(GgufQuantizedTest, AllBlocksKeptGiveTheDequantizedEmbeddingRowsAndLogits) {
  const QuantCase& c = GetParam();
  auto kept = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kKeep});
  auto exact = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kDequantizeToF32});
  ASSERT_OK(kept);
  ASSERT_OK(exact);
  const LayerWeights& layer0 = (*kept)->weights->layers[0];
  EXPECT_TRUE(IsQuantized((*kept)->config.mla() ? layer0.mla.kv_b_proj.dtype : layer0.q_proj.dtype));
  EXPECT_TRUE(IsQuantized((*kept)->weights->lm_head.dtype));
  EXPECT_TRUE(IsQuantized((*kept)->weights->embed_tokens.dtype));
  EXPECT_THAT((*kept)->summary, Not(HasSubstr("dequantized at load")));
  const ModelConfig& config = (*exact)->config;
  {
    const std::vector<int32_t> ids = {0, 1, static_cast<int32_t>(config.vocab_size / 2),
                                      static_cast<int32_t>(config.vocab_size - 1)};
    std::vector<float> a(ids.size() * static_cast<size_t>(config.hidden_size)), b(a.size());
    ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
    CpuBackend kept_backend((*kept)->weights.get(), &pool), exact_backend((*exact)->weights.get(), &pool);
    ASSERT_OK(kept_backend.Embed(ids, a.data()));
    ASSERT_OK(exact_backend.Embed(ids, b.data()));
    EXPECT_EQ(a, b);
    const std::vector<int32_t> outside = {static_cast<int32_t>(config.vocab_size)};
    EXPECT_THAT(std::string(kept_backend.Embed(outside, a.data()).message()), HasSubstr("outside the vocabulary"));
  }
  const std::vector<int32_t> tokens = Prompt(config);
  const bool mla = config.mla();
  const double nmse = LogitsNmse(Logits(std::move(*kept), tokens), Logits(std::move(*exact), tokens));
  std::cout << "[ nmse     ] " << c.arch << " " << c.type << ": every matrix quantized vs exact dequantization " << nmse
            << "\n";
  // This binary runs the exact plan (f32 inputs, exact_kernels_testlib.h):
  // the same values summed in another order; measured ~2e-13. Latent
  // attention derives k_b from kv_b as BF16 unless kv_b is F32 (measured
  // ~2e-6).
  EXPECT_LT(nmse, mla ? 2e-5 : 1e-9);
}

// The experts kept quantized (the rest dequantized to F32 here) give the
// logits of the same file fully dequantized to F32: the quantized kernels
// compute with the dequantized values, in f32.
TEST_P(GgufQuantizedTest, QuantizedExpertsGiveTheDequantizedLogits) {
  const QuantCase& c = GetParam();
  auto kept = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kKeepExperts});
  auto exact = LoadModel(Gguf(c.arch, c.type), {.quantized = QuantizedWeights::kDequantizeToF32});
  ASSERT_OK(kept);
  ASSERT_OK(exact);
  const size_t moe = static_cast<size_t>((*kept)->config.first_moe_layer());
  EXPECT_TRUE(IsQuantized((*kept)->weights->layers[moe].experts[0].w2.dtype));
  EXPECT_FALSE(IsQuantized((*kept)->weights->layers[0].q_proj.dtype));
  EXPECT_THAT((*kept)->summary, HasSubstr("experts kept quantized"));
  const std::vector<int32_t> tokens = Prompt((*exact)->config);
  const double nmse = LogitsNmse(Logits(std::move(*kept), tokens), Logits(std::move(*exact), tokens));
  std::cout << "[ nmse     ] " << c.arch << " " << c.type << ": quantized experts vs exact dequantization " << nmse
            << "\n";
  // The non-expert matrices are BF16 in one and F32 in the other.
  EXPECT_LT(nmse, 3e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Types, GgufQuantizedTest,
    ::testing::Values(
        QuantCase{"mixtral", "q8_0", 5e-4}, QuantCase{"mixtral", "q6_k", 2e-2}, QuantCase{"mixtral", "q5_k_m", 0.1},
        QuantCase{"mixtral", "q4_k_m", 0.15}, QuantCase{"mixtral", "q4_0", 0.2}, QuantCase{"phimoe", "q8_0", 5e-3},
        QuantCase{"phimoe", "q6_k", 0.08}, QuantCase{"phimoe", "q5_k_m", 0.2}, QuantCase{"phimoe", "q4_k_m", 0.4},
        QuantCase{"phimoe", "q4_0", 0.5}, QuantCase{"qwen3moe", "q8_0", 5e-4}, QuantCase{"qwen3moe", "q4_k_m", 0.06},
        QuantCase{"qwen2moe", "q8_0", 5e-4}, QuantCase{"qwen2moe", "q4_k_m", 0.06}, QuantCase{"olmoe", "q8_0", 4e-3},
        QuantCase{"olmoe", "q4_k_m", 0.06}, QuantCase{"qwen3moe-dense", "q8_0", 5e-4},
        QuantCase{"qwen3moe-dense", "q4_k_m", 0.06}, QuantCase{"qwen2moe-dense", "q4_k_m", 0.06},
        // GLM: a flip of the group-limited router swaps several experts
        // at once, scaled by routed_scaling_factor 2.5
        QuantCase{"glm4moe", "q8_0", 0.03}, QuantCase{"glm4moe", "q4_k_m", 0.25},
        QuantCase{"deepseek-v2", "q8_0", 0.03}, QuantCase{"deepseek-v2", "q4_k_m", 0.25},
        QuantCase{"deepseek-v3", "q8_0", 0.03}, QuantCase{"deepseek-v3", "q4_k_m", 0.25}),
    [](const auto& info) {
      std::string name = absl::StrCat(info.param.arch, "_", info.param.type);
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// ------------------------------------------------------------ streaming

TEST_F(GgufModelTest, SmallChunksWriteTheSameFileWithProgress) {
  const fs::path small = dir_->path() / "chunked.gguf";
  std::vector<QuantizeProgress> progress;
  auto result = QuantizeModel({.model_dir = Folder("mixtral"),
                               .file_type = GgufFileType::kQ4_K_M,
                               .out = small,
                               .num_threads = 2,
                               .chunk_bytes = 4096,
                               .progress = [&](const QuantizeProgress& p) { progress.push_back(p); }});
  ASSERT_OK(result);
  std::cout << "[ quantize ] " << result->tensors << " tensors, " << result->bytes_written << " bytes, peak RSS "
            << result->peak_rss_bytes / 1e6 << " MB, last progress: " << FormatQuantizeProgress(progress.back())
            << "\n";
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  };
  EXPECT_EQ(read(small), read(Gguf("mixtral", "q4_k_m")));
  ASSERT_GT(progress.size(), static_cast<size_t>(result->tensors));  // several chunks per big tensor
  for (size_t i = 1; i < progress.size(); ++i) EXPECT_GE(progress[i].bytes_written, progress[i - 1].bytes_written);
  EXPECT_LE(progress.back().bytes_written, progress.back().total_bytes);
  EXPECT_GT(result->peak_rss_bytes, 0);
}

// ------------------------------------------------------------ tokenizer

TEST_F(GgufModelTest, GgufVocabularyTokenizesAsTheSentencePieceModel) {
  for (const std::string arch : {"mixtral", "phimoe"}) {
    auto original = SentencePieceTokenizer::Load(Folder(arch) / "tokenizer.model");
    ASSERT_OK(original);
    auto model = LoadModel(Gguf(arch, "q8_0"));
    ASSERT_OK(model);
    auto tokenizer = (*model)->RequireTokenizer();
    ASSERT_OK(tokenizer);
    EXPECT_EQ((*tokenizer)->vocab_size(), (*original)->vocab_size());  // the converter's [PAD] rows left out
    EXPECT_EQ((*tokenizer)->bos_id(), (*original)->bos_id());
    EXPECT_EQ((*tokenizer)->eos_id(), (*original)->eos_id());
    int64_t lines = 0, tokens = 0;
    for (const fs::path& file : DefaultTokenizerCorpus()) {
      std::ifstream in(file);
      std::string line;
      for (int n = 0; n < 200 && std::getline(in, line); ++n) {
        auto want = (*original)->Encode(line, true);
        auto got = (*tokenizer)->Encode(line, true);
        ASSERT_OK(want);
        ASSERT_OK(got);
        ASSERT_EQ(*got, *want) << file << ": " << line;
        auto text = (*tokenizer)->Decode(*got);
        ASSERT_OK(text);
        EXPECT_EQ(*text, *(*original)->Decode(*want));
        ++lines, tokens += static_cast<int64_t>(got->size());
      }
    }
    std::cout << "[ tokens   ] " << arch << ": " << lines << " lines, " << tokens << " tokens identical\n";
    EXPECT_GT(lines, 1000);
    for (const char* text : {"naïve café — 日本語 ✓", "  two  spaces\tand a tab", "digits 1234567890", ""}) {
      EXPECT_EQ(*(*tokenizer)->Encode(text, false), *(*original)->Encode(text, false)) << text;
    }
  }
}

// ------------------------------------------------------------ bad files

// Copies `from` to `to` with edited metadata and tensors (name, type, dims
// and bytes may all change; the layout is recomputed).
struct TensorEdit {
  std::string name;
  GgmlType type;
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;
};
void RewriteGguf(const fs::path& from, const fs::path& to, const std::function<void(GgufMetadata&)>& edit_metadata,
                 const std::function<bool(TensorEdit&)>& edit_tensor) {
  auto checkpoint = GgufCheckpoint::Open(from);
  ASSERT_OK(checkpoint);
  GgufMetadata metadata = (*checkpoint)->metadata();
  edit_metadata(metadata);
  std::vector<TensorEdit> tensors;
  for (const GgufTensor& t : (*checkpoint)->tensors()) {
    TensorEdit e{t.info->name, t.info->type, t.info->dims, {t.data.begin(), t.data.end()}};
    if (edit_tensor(e)) tensors.push_back(std::move(e));
  }
  std::vector<GgufTensorSpec> specs;
  for (const TensorEdit& e : tensors) specs.push_back({e.name, e.dims, e.type});
  auto writer = GgufWriter::Create(to, metadata, specs);
  ASSERT_OK(writer);
  for (const TensorEdit& e : tensors) ASSERT_OK((*writer)->Write(e.name, e.bytes));
  ASSERT_OK((*writer)->Finish());
}

TEST_F(GgufModelTest, BadFilesAreRefusedNamingTheFileAndTheKeyOrTensor) {
  const fs::path good = Gguf("mixtral", "q8_0");
  const fs::path bad = dir_->path() / "bad.gguf";
  auto expect_error = [&](absl::StatusCode code, const std::vector<std::string>& words) {
    auto model = LoadModel(bad);
    ASSERT_FALSE(model.ok());
    EXPECT_EQ(model.status().code(), code) << model.status();
    EXPECT_THAT(std::string(model.status().message()), HasSubstr(bad.string()));
    for (const std::string& w : words) EXPECT_THAT(std::string(model.status().message()), HasSubstr(w));
  };
  auto keep = [](TensorEdit&) { return true; };
  auto same = [](GgufMetadata&) {};

  RewriteGguf(
      good, bad, [](GgufMetadata& m) { m.Erase("llama.block_count"); }, keep);
  expect_error(absl::StatusCode::kNotFound, {"llama.block_count"});

  RewriteGguf(
      good, bad, [](GgufMetadata& m) { m.Set("general.architecture", "qwen2"); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"general.architecture", "qwen2"});

  // Hyperparameters and tensors that disagree.
  RewriteGguf(
      good, bad, [](GgufMetadata& m) { m.Set("llama.feed_forward_length", uint32_t{256}); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"blk.0.ffn_gate_exps.weight", "{256, 512, 4}", "{256, 256, 4}"});

  RewriteGguf(good, bad, same, [](TensorEdit& t) { return t.name != "output_norm.weight"; });
  expect_error(absl::StatusCode::kNotFound, {"output_norm.weight"});

  // GLM-4.5's router: groups that do not split the experts, a gating
  // function other than sigmoid, MTP layers past the blocks, a missing bias.
  const fs::path glm = Gguf("glm4moe", "q8_0");
  RewriteGguf(
      glm, bad, [](GgufMetadata& m) { m.Set("glm4moe.expert_group_count", uint32_t{3}); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"glm4moe.expert_group_count", "(3)"});
  RewriteGguf(
      glm, bad, [](GgufMetadata& m) { m.Set("glm4moe.expert_gating_func", uint32_t{1}); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"glm4moe.expert_gating_func", "sigmoid"});
  RewriteGguf(
      glm, bad, [](GgufMetadata& m) { m.Set("glm4moe.nextn_predict_layers", uint32_t{3}); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"glm4moe.nextn_predict_layers"});
  RewriteGguf(glm, bad, same, [](TensorEdit& t) { return t.name != "blk.1.exp_probs_b.bias"; });
  expect_error(absl::StatusCode::kNotFound, {"blk.1.exp_probs_b.bias"});

  // DeepSeek: a latent rank the tensors do not have, a gating function
  // deepseek2 does not define, a rope part as wide as the head.
  const fs::path deepseek = Gguf("deepseek-v2", "q8_0");
  RewriteGguf(
      deepseek, bad, [](GgufMetadata& m) { m.Set("deepseek2.attention.kv_lora_rank", uint32_t{128}); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"blk.0.attn_kv_a_mqa.weight", "{256, 160}"});
  RewriteGguf(
      deepseek, bad, [](GgufMetadata& m) { m.Set("deepseek2.expert_gating_func", uint32_t{3}); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"deepseek2.expert_gating_func", "softmax"});
  RewriteGguf(
      deepseek, bad, [](GgufMetadata& m) { m.Set("deepseek2.rope.dimension_count", uint32_t{96}); }, keep);
  expect_error(absl::StatusCode::kInvalidArgument, {"deepseek2.rope.dimension_count"});

  // A type tandem does not run: iq2_xxs (id 16, 66 bytes per 256 values).
  RewriteGguf(good, bad, same, [](TensorEdit& t) {
    if (t.name == "blk.1.ffn_down_exps.weight") {
      t.type = GgmlType::kIQ2_XXS;
      t.bytes.assign(static_cast<size_t>(*GgmlTensorBytes(GgmlType::kIQ2_XXS, t.dims)), 0);
    }
    return true;
  });
  expect_error(absl::StatusCode::kInvalidArgument,
               {"blk.1.ffn_down_exps.weight", "iq2_xxs", "which tandem does not run"});

  // A tokenizer tandem does not read: the model still loads (token ids work); text is refused naming it.
  RewriteGguf(
      good, bad, [](GgufMetadata& m) { m.Set("tokenizer.ggml.model", "rwkv"); }, keep);
  auto model = LoadModel(bad);
  ASSERT_OK(model);
  auto tokenizer = (*model)->RequireTokenizer();
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("\"rwkv\""));
  EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr("tokenizer.ggml.model"));
}

// A "gpt2" vocabulary (byte-level BPE, as Qwen, DeepSeek, GLM, GPT-OSS ship)
// loads the BPE tokenizer, with the pre-tokenizer tokenizer.ggml.pre names.
TEST_F(GgufModelTest, ByteLevelBpeVocabularyTokenizesText) {
  const fs::path good = Gguf("mixtral", "q8_0");
  const fs::path bpe = dir_->path() / "bpe-vocab.gguf";
  RewriteGguf(
      good, bpe,
      [](GgufMetadata& m) {
        std::vector<std::string> tokens;
        int next = 256;
        for (int b = 0; b < 256; ++b) {
          // GPT-2's byte-level alphabet: printable bytes as themselves, the others from U+0100.
          const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
          const int c = printable ? b : next++;
          std::string utf8 =
              c < 0x80 ? std::string(1, static_cast<char>(c))
                       : std::string{static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
          tokens.push_back(utf8);
        }
        tokens.push_back("he");
        m.Set("tokenizer.ggml.model", "gpt2");
        m.Set("tokenizer.ggml.pre", "qwen2");
        m.Set("tokenizer.ggml.tokens", GgufArray(tokens));
        m.Set("tokenizer.ggml.token_type", GgufArray(std::vector<int32_t>(tokens.size(), 1)));
        m.Set("tokenizer.ggml.merges", GgufArray(std::vector<std::string>{"h e"}));
        m.Erase("tokenizer.ggml.scores");
        m.Set("tokenizer.ggml.bos_token_id", uint32_t{256});
        m.Set("tokenizer.ggml.eos_token_id", uint32_t{256});
        m.Erase("tokenizer.ggml.unknown_token_id");
        m.Erase("tokenizer.ggml.padding_token_id");
      },
      [](TensorEdit&) { return true; });
  auto model = LoadModel(bpe);
  ASSERT_OK(model);
  auto tokenizer = (*model)->RequireTokenizer();
  ASSERT_OK(tokenizer);
  auto ids = (*tokenizer)->Encode("hehe", /*add_bos=*/false);
  ASSERT_OK(ids);
  EXPECT_EQ(*ids, (std::vector<int32_t>{256, 256}));
  auto text = (*tokenizer)->Decode(*ids);
  ASSERT_OK(text);
  EXPECT_EQ(*text, "hehe");
}

TEST_F(GgufModelTest, OlderPerExpertLayoutLoadsTheSameWeights) {
  const fs::path stacked = Gguf("mixtral", "q4_k_m");
  const fs::path split = dir_->path() / "per-expert.gguf";
  const int64_t experts = KConfig("mixtral").num_local_experts;
  auto checkpoint = GgufCheckpoint::Open(stacked);
  ASSERT_OK(checkpoint);
  GgufMetadata metadata = (*checkpoint)->metadata();
  std::vector<TensorEdit> tensors;
  for (const GgufTensor& t : (*checkpoint)->tensors()) {
    const std::string& n = t.info->name;
    const size_t at = n.find("_exps.weight");
    if (at == std::string::npos) {
      tensors.push_back({n, t.info->type, t.info->dims, {t.data.begin(), t.data.end()}});
      continue;
    }
    const size_t per = t.data.size() / static_cast<size_t>(experts);
    for (int64_t e = 0; e < experts; ++e) {
      tensors.push_back({absl::StrCat(n.substr(0, at), ".", e, ".weight"),
                         t.info->type,
                         {t.info->dims[0], t.info->dims[1]},
                         {t.data.begin() + e * per, t.data.begin() + (e + 1) * per}});
    }
  }
  std::vector<GgufTensorSpec> specs;
  for (const TensorEdit& e : tensors) specs.push_back({e.name, e.dims, e.type});
  auto writer = GgufWriter::Create(split, metadata, specs);
  ASSERT_OK(writer);
  for (const TensorEdit& e : tensors) ASSERT_OK((*writer)->Write(e.name, e.bytes));
  ASSERT_OK((*writer)->Finish());

  auto a = LoadModel(stacked, {.quantized = QuantizedWeights::kKeep});
  auto b = LoadModel(split, {.quantized = QuantizedWeights::kKeep});
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_THAT((*b)->summary, HasSubstr("one tensor per expert"));
  for (size_t l = 0; l < (*a)->weights->layers.size(); ++l) {
    for (size_t e = 0; e < (*a)->weights->layers[l].experts.size(); ++e) {
      const LinearWeight& x = (*a)->weights->layers[l].experts[e].w2;
      const LinearWeight& y = (*b)->weights->layers[l].experts[e].w2;
      ASSERT_EQ(x.dtype, y.dtype);
      ASSERT_EQ(x.bytes(), y.bytes());
      EXPECT_EQ(0, std::memcmp(x.data, y.data, static_cast<size_t>(x.bytes()))) << l << " " << e;
    }
  }
}

// A split set as gguf-split writes it: the first file has the metadata, every
// file the split keys; loading starts from the first file.
TEST_F(GgufModelTest, SplitSetLoadsFromItsFirstFile) {
  const fs::path whole = Gguf("phimoe", "q6_k");
  auto checkpoint = GgufCheckpoint::Open(whole);
  ASSERT_OK(checkpoint);
  const std::vector<GgufTensor>& all = (*checkpoint)->tensors();
  const std::string prefix = (dir_->path() / "split").string();
  for (int part = 0; part < 2; ++part) {
    GgufMetadata metadata(prefix);
    if (part == 0) metadata = (*checkpoint)->metadata();
    metadata.Set(kGgufSplitNoKey, static_cast<uint16_t>(part));
    metadata.Set(kGgufSplitCountKey, static_cast<uint16_t>(2));
    metadata.Set(kGgufSplitTensorsCountKey, static_cast<int32_t>(all.size()));
    std::vector<GgufTensorSpec> specs;
    const size_t begin = part == 0 ? 0 : all.size() / 2, end = part == 0 ? all.size() / 2 : all.size();
    for (size_t i = begin; i < end; ++i) specs.push_back({all[i].info->name, all[i].info->dims, all[i].info->type});
    auto writer = GgufWriter::Create(GgufSplitPath(prefix, part, 2), metadata, specs);
    ASSERT_OK(writer);
    for (size_t i = begin; i < end; ++i) ASSERT_OK((*writer)->Write(all[i].info->name, all[i].data));
    ASSERT_OK((*writer)->Finish());
  }
  auto split = LoadModel(GgufSplitPath(prefix, 0, 2));
  ASSERT_OK(split);
  EXPECT_THAT((*split)->origin, HasSubstr("2 files"));
  auto single = LoadModel(whole);
  ASSERT_OK(single);
  const std::vector<int32_t> tokens = Prompt((*single)->config);
  EXPECT_EQ(Logits(std::move(*split), tokens), Logits(std::move(*single), tokens));
  auto second = LoadModel(GgufSplitPath(prefix, 1, 2));
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("00002-of-00002"));
}

TEST_F(GgufModelTest, QuantizeRefusesWhatLlamaCppCannotWriteEitherAndFallsBackAsItDoes) {
  ScopedTempDir dir;
  ASSERT_OK(WriteSyntheticModel({.preset = "tiny-phimoe", .seed = 1}, dir.path() / "phi", {.with_tokenizer = false}));
  // ffn_down rows of 80 values: no whole q4_0 blocks, and llama.cpp has no fallback for q4_0.
  auto q4 =
      QuantizeModel({.model_dir = dir.path() / "phi", .file_type = GgufFileType::kQ4_0, .out = dir.path() / "x.gguf"});
  ASSERT_FALSE(q4.ok());
  EXPECT_THAT(std::string(q4.status().message()), HasSubstr("ffn_down_exps.weight"));
  EXPECT_THAT(std::string(q4.status().message()), HasSubstr("q4_0"));
  EXPECT_FALSE(fs::exists(dir.path() / "x.gguf"));
  EXPECT_FALSE(fs::exists(dir.path() / "x.gguf.partial"));
  // Rows of 64: q5_K falls back to q5_1 as in llama.cpp (the 1408-wide experts
  // of Qwen1.5-MoE, DeepSeek-V2-Lite, GLM-4.5-Air), and loads.
  ASSERT_OK(WriteSyntheticModel({.preset = "tiny", .seed = 1}, dir.path() / "tiny", {.with_tokenizer = false}));
  auto q5 = QuantizeModel(
      {.model_dir = dir.path() / "tiny", .file_type = GgufFileType::kQ5_K_M, .out = dir.path() / "y.gguf"});
  ASSERT_OK(q5);
  auto q5_model = LoadModel(dir.path() / "y.gguf");
  ASSERT_OK(q5_model);
  EXPECT_THAT((*q5_model)->summary, HasSubstr("q5_1"));
  // q4_k_m on rows of 64 falls back as llama.cpp does (q5_0 / q8_0), and loads.
  auto q4k = QuantizeModel(
      {.model_dir = dir.path() / "tiny", .file_type = GgufFileType::kQ4_K_M, .out = dir.path() / "z.gguf"});
  ASSERT_OK(q4k);
  auto model = LoadModel(dir.path() / "z.gguf");
  ASSERT_OK(model);
  EXPECT_THAT((*model)->summary, HasSubstr("q5_0"));
  EXPECT_EQ((*model)->tokenizer, nullptr);
}

// ------------------------------------------------------------ consumers refuse blocks

TEST(QuantizedDTypeTest, ConsumersThatCannotComputeBlocksRefuseThem) {
  EXPECT_EQ(DTypeRowBytes(DType::kQ4_K, 512), 2 * 144);
  EXPECT_EQ(DTypeRowBytes(DType::kBF16, 512), 1024);
  auto synthetic = SyntheticConfig({.preset = "tiny", .dtype = DType::kQ8_0});
  ASSERT_FALSE(synthetic.ok());
  EXPECT_THAT(std::string(synthetic.status().message()), HasSubstr("Q8_0"));
  ScopedTempDir dir;
  TensorToWrite t{"w", DType::kQ4_0, {2, 32}, std::vector<uint8_t>(36)};
  absl::Status st = WriteSafetensors(dir.path() / "m.safetensors", {&t});
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(std::string(st.message()), HasSubstr("Q4_0"));
}

// Newer converters split attn_kv_b into attn_k_b (each head's key rows
// transposed, {nope, R, H}) and attn_v_b ({R, v, H}) and may drop attn_kv_b:
// such a file gives the logits of the one with attn_kv_b.
TEST_F(GgufModelTest, DeepseekSplitKvBGivesTheJoinedLogits) {
  const fs::path joined = Gguf("deepseek-v2", "f32");
  const fs::path split = dir_->path() / "deepseek-v2-split.gguf";
  const ModelConfig c = KConfig("deepseek-v2");
  const int64_t heads = c.num_attention_heads, rank = c.kv_lora_rank, nope = c.qk_nope_head_dim, v = c.v_head_dim;
  auto checkpoint = GgufCheckpoint::Open(joined);
  ASSERT_OK(checkpoint);
  std::vector<TensorEdit> tensors;
  for (const GgufTensor& t : (*checkpoint)->tensors()) {
    TensorEdit e{t.info->name, t.info->type, t.info->dims, {t.data.begin(), t.data.end()}};
    if (!e.name.ends_with("attn_kv_b.weight")) {
      tensors.push_back(std::move(e));
      continue;
    }
    ASSERT_EQ(e.type, GgmlType::kF32);
    const float* kv_b = reinterpret_cast<const float*>(e.bytes.data());  // [H (nope + v), R]
    std::vector<float> k_b(static_cast<size_t>(heads * rank * nope)), v_b(static_cast<size_t>(heads * v * rank));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < nope; ++i)
        for (int64_t r = 0; r < rank; ++r)
          k_b[static_cast<size_t>((h * rank + r) * nope + i)] = kv_b[(h * (nope + v) + i) * rank + r];
      for (int64_t j = 0; j < v; ++j)
        for (int64_t r = 0; r < rank; ++r)
          v_b[static_cast<size_t>((h * v + j) * rank + r)] = kv_b[(h * (nope + v) + nope + j) * rank + r];
    }
    const std::string layer = e.name.substr(0, e.name.size() - std::string("attn_kv_b.weight").size());
    auto bytes = [](const std::vector<float>& f) {
      return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(f.data()),
                                  reinterpret_cast<const uint8_t*>(f.data() + f.size()));
    };
    tensors.push_back({layer + "attn_k_b.weight", GgmlType::kF32, {nope, rank, heads}, bytes(k_b)});
    tensors.push_back({layer + "attn_v_b.weight", GgmlType::kF32, {rank, v, heads}, bytes(v_b)});
  }
  std::vector<GgufTensorSpec> specs;
  for (const TensorEdit& e : tensors) specs.push_back({e.name, e.dims, e.type});
  auto writer = GgufWriter::Create(split, (*checkpoint)->metadata(), specs);
  ASSERT_OK(writer);
  for (const TensorEdit& e : tensors) ASSERT_OK((*writer)->Write(e.name, e.bytes));
  ASSERT_OK((*writer)->Finish());

  auto a = LoadModel(joined), b = LoadModel(split);
  ASSERT_OK(a);
  ASSERT_OK(b);
  const std::vector<int32_t> tokens = Prompt((*a)->config);
  const double nmse = LogitsNmse(Logits(std::move(*b), tokens), Logits(std::move(*a), tokens));
  std::cout << "[ nmse     ] deepseek-v2 f32 attn_k_b + attn_v_b vs attn_kv_b: " << nmse << "\n";
  EXPECT_LT(nmse, 1e-12);
}

}  // namespace
}  // namespace tandem
