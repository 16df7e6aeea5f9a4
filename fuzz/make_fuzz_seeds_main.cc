// tandem-fuzz-seeds DIR: writes the seed corpus, DIR/<target>/<seed>, with
// tandem's own writers (safetensors, config.json, SentencePiece proto, GGUF,
// worker requests; the expert store region from its header structs;
// tokenizer.json documents written here), and
// checks that every seed passes its target's parse, so the fuzzers start
// from inputs that reach the deepest checks. fuzz/corpus/ in the repository
// is its output.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/gguf/gguf_writer.h"
#include "common/model/expert_store_view.h"
#include "common/model/gguf_model_config.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/model_config.h"
#include "common/model/safetensors.h"
#include "common/model/sentencepiece_proto.h"
#include "common/model/synthetic_model.h"
#include "fuzz/fuzz_scratch.h"
#include "fuzz/fuzz_targets.h"
#include "tandem/v1/expert_worker.pb.h"

namespace tandem::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(std::string_view text) { return {text.begin(), text.end()}; }

absl::StatusOr<std::vector<uint8_t>> ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

absl::StatusOr<std::vector<uint8_t>> SafetensorsSeed() {
  TensorToWrite f32{.name = "model.norm.weight", .dtype = DType::kF32, .shape = {4}, .data = std::vector<uint8_t>(16)};
  TensorToWrite f16{.name = "lm_head.weight", .dtype = DType::kF16, .shape = {2, 3}, .data = std::vector<uint8_t>(12)};
  TensorToWrite bf16{.name = "empty", .dtype = DType::kBF16, .shape = {0, 8}, .data = {}};
  const fs::path path = FuzzScratchDir() / "seed.safetensors";
  TANDEM_RETURN_IF_ERROR(WriteSafetensors(path, {&f32, &f16, &bf16}, {{"format", "pt"}}));
  return ReadAll(path);
}

// The index of FuzzSafetensorsIndex's folder, as the writer writes it.
absl::StatusOr<std::vector<uint8_t>> SafetensorsIndexSeed() {
  const fs::path dir = FuzzScratchDir() / "seed-index-model";
  std::error_code ec;
  fs::create_directory(dir, ec);
  const std::vector<TensorToWrite> tensors = IndexFolderTensors();
  TANDEM_RETURN_IF_ERROR(WriteSafetensorsCheckpoint(dir, {&tensors[0], &tensors[1]}, kIndexFolderShards));
  return ReadAll(dir / "model.safetensors.index.json");
}

// A 16-piece BPE vocabulary: the special pieces, the bytes a test text needs, merges.
std::string SmallTokenizerProto() {
  SentencePieceBpeSpec spec;
  spec.bos_id = 1, spec.eos_id = 2;
  spec.pieces = {
      {"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {"a", -0.5f, 1}, {"\xe2\x96\x81", -1, 1},  {"e", -2, 1},
      {"l", -3, 1},    {"o", -4, 1},  {"H", -5, 1},   {"ll", -6, 1},   {"\xe2\x96\x81H", -7, 1}, {"lo", -8, 1},
      {"el", -9, 1},   {"w", -10, 1}, {"d", -11, 1},  {"r", -12, 1}};
  return SerializeSentencePieceBpe(spec);
}

absl::StatusOr<std::vector<uint8_t>> GgufSeed() {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .num_layers = 1}));
  config.vocab_size = 16;
  GgufMetadata metadata;
  TANDEM_RETURN_IF_ERROR(AddModelConfigToGguf(config, "fuzz-seed", &metadata));
  TANDEM_RETURN_IF_ERROR(AddSentencePieceVocabToGguf(SmallTokenizerProto(), config, "seed", &metadata));
  metadata.Set(kGgufChatTemplateKey, "{% for m in messages %}{{ m['content'] }}{% endfor %}");
  const GgufTensorSpec embedding{.name = "token_embd.weight", .dims = {config.hidden_size, 16}, .type = GgmlType::kF16};
  const fs::path path = FuzzScratchDir() / "seed.gguf";
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufWriter> writer, GgufWriter::Create(path, metadata, {&embedding, 1}));
  const std::vector<uint8_t> zeros(static_cast<size_t>(config.hidden_size) * 16 * 2);
  TANDEM_RETURN_IF_ERROR(writer->Write(embedding.name, zeros));
  TANDEM_RETURN_IF_ERROR(writer->Finish());
  return ReadAll(path);
}

// The same model with a "gpt2" (byte-level BPE) vocabulary: the 256 byte
// characters, two merges, a control and a user-defined token.
absl::StatusOr<std::vector<uint8_t>> GgufGpt2Seed() {
  TANDEM_ASSIGN_OR_RETURN(ModelConfig config, SyntheticConfig(SyntheticModelSpec{.preset = "tiny", .num_layers = 1}));
  config.vocab_size = 260;  // the tokens below
  GgufMetadata metadata;
  TANDEM_RETURN_IF_ERROR(AddModelConfigToGguf(config, "fuzz-seed", &metadata));
  std::vector<std::string> tokens;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int c = printable ? b : next++;
    tokens.push_back(c < 0x80 ? std::string(1, static_cast<char>(c))
                              : std::string{static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))});
  }
  for (const char* t : {"he", "hel", "<|endoftext|>", "<tool>"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[258] = 3;
  types[259] = 4;
  metadata.Set("tokenizer.ggml.model", "gpt2");
  metadata.Set("tokenizer.ggml.pre", "qwen2");
  metadata.Set("tokenizer.ggml.tokens", GgufArray(tokens));
  metadata.Set("tokenizer.ggml.token_type", GgufArray(types));
  metadata.Set("tokenizer.ggml.merges", GgufArray(std::vector<std::string>{"h e", "he l"}));
  metadata.Set("tokenizer.ggml.bos_token_id", uint32_t{258});
  metadata.Set("tokenizer.ggml.eos_token_id", uint32_t{258});
  metadata.Set("tokenizer.ggml.add_bos_token", false);
  const GgufTensorSpec embedding{
      .name = "token_embd.weight", .dims = {config.hidden_size, config.vocab_size}, .type = GgmlType::kF16};
  const fs::path path = FuzzScratchDir() / "seed-gpt2.gguf";
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufWriter> writer, GgufWriter::Create(path, metadata, {&embedding, 1}));
  const std::vector<uint8_t> zeros(static_cast<size_t>(config.hidden_size) * config.vocab_size * 2);
  TANDEM_RETURN_IF_ERROR(writer->Write(embedding.name, zeros));
  TANDEM_RETURN_IF_ERROR(writer->Finish());
  return ReadAll(path);
}

// A byte-level tokenizer.json reaching every component kind of that
// pipeline: NFC, a Split regex and ByteLevel, merges, added tokens with
// flags, a BOS template, the ByteLevel decoder.
std::string ByteLevelTokenizerJson() {
  return R"({"version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 9, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": true, "normalized": false, "special": true},
                   {"id": 10, "content": "[W]", "single_word": true, "lstrip": true, "rstrip": false, "normalized": true, "special": false}],
  "normalizer": {"type": "NFC"},
  "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
    {"type": "Digits", "individual_digits": true},
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]},
  "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [9], "tokens": ["<s>"]}}},
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null,
    "fuse_unk": false, "byte_fallback": false, "ignore_merges": true,
    "vocab": {"H": 0, "e": 1, "l": 2, "o": 3, "He": 4, "ll": 5, "Hell": 6, "Hello": 7, "Ġ": 8},
    "merges": [["H", "e"], "l l", ["He", "ll"], ["Hell", "o"]]}})";
}

// A SentencePiece-style tokenizer.json: Prepend and Replace normalizers,
// Metaspace, byte fallback with a fused unknown token, and the Replace /
// ByteFallback / Fuse / Strip / Metaspace decoders.
std::string SentencePieceTokenizerJson() {
  return R"({"version": "1.0",
  "added_tokens": [{"id": 0, "content": "<unk>", "special": true, "normalized": false},
                   {"id": 1, "content": "<s>", "special": true, "normalized": false}],
  "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                     {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
  "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
  "post_processor": {"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}]},
  "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0},
    {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}]},
  "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
    "vocab": {"<unk>": 0, "<s>": 1, "▁": 2, "a": 3, "b": 4, "▁a": 5, "<0x0A>": 6, "<0xC3>": 7, "<0xB6>": 8},
    "merges": ["▁ a"]}})";
}

// Requests for FuzzWorkerRequest's worker (tiny model, hidden 64, 4 experts).
std::vector<uint8_t> Serialized(const v1::RunExpertsRequest& request) { return Bytes(request.SerializeAsString()); }

std::vector<uint8_t> InlineRequestSeed() {
  v1::RunExpertsRequest request;
  request.set_request_id(2);  // even: the gRPC path
  request.set_layer(1);
  request.set_transport(v1::TRANSPORT_INLINE);
  for (int expert : {0, 3}) {
    v1::ExpertTask* task = request.add_tasks();
    task->set_expert(expert);
    task->set_num_rows(1);
    task->set_inline_rows(std::string(64 * sizeof(float), '\0'));
  }
  return Serialized(request);
}

std::vector<uint8_t> ShmRequestSeed() {
  v1::RunExpertsRequest request;
  request.set_request_id(1);  // odd: the doorbell path
  request.set_layer(0);
  request.set_transport(v1::TRANSPORT_SHM);
  for (int expert : {1, 2}) {
    v1::ExpertTask* task = request.add_tasks();
    task->set_expert(expert);
    task->set_num_rows(2);
    const uint64_t offset = static_cast<uint64_t>(expert - 1) * 2 * 64 * sizeof(float);
    for (v1::TensorDescriptor* d : {task->mutable_shm_rows(), task->mutable_shm_output()}) {
      d->set_slot(1);
      d->set_offset(offset);
      d->add_shape(2);
      d->add_shape(64);
      d->set_dtype(v1::DTYPE_F32);
      d->set_sequence(0);
    }
  }
  return Serialized(request);
}

// One layer, two experts split in two slices each... kept minimal: one
// slice per expert, BF16 [4, 8] matrices, each on its own page.
std::vector<uint8_t> ExpertStoreSeed() {
  constexpr int64_t kHidden = 8, kIntermediate = 4, kExperts = 2;
  constexpr uint64_t kMatrixBytes = kHidden * kIntermediate * 2;
  ExpertStoreHeader header;
  header.version = kExpertStoreVersion;
  header.dtype = static_cast<uint32_t>(DType::kBF16);
  header.table_offset = sizeof(ExpertStoreHeader);
  header.data_offset = kExpertStoreAlignment;
  header.slice_count = kExperts;
  header.hidden_size = kHidden;
  header.intermediate_size = kIntermediate;
  header.num_layers = 1;
  header.num_experts = kExperts;
  header.division = static_cast<uint32_t>(ExpertDivision::kSplit);
  header.num_workers = 1;
  const uint64_t last_matrix = kExpertStoreAlignment * (1 + 3 * kExperts - 1);
  header.region_bytes = last_matrix + kMatrixBytes;
  header.magic = kExpertStoreMagic;
  std::vector<uint8_t> region(header.region_bytes);
  std::memcpy(region.data(), &header, sizeof(header));
  for (int e = 0; e < kExperts; ++e) {
    const uint64_t first = kExpertStoreAlignment * (1 + 3 * e);
    const ExpertStoreEntry entry{.layer = 0,
                                 .expert = e,
                                 .intermediate_begin = 0,
                                 .intermediate_end = kIntermediate,
                                 .w1_offset = first,
                                 .w3_offset = first + kExpertStoreAlignment,
                                 .w2_offset = first + 2 * kExpertStoreAlignment};
    std::memcpy(region.data() + sizeof(header) + e * sizeof(entry), &entry, sizeof(entry));
  }
  return region;
}

struct Seed {
  std::string target;
  std::string name;
  absl::StatusOr<std::vector<uint8_t>> bytes;
};

absl::StatusOr<std::vector<Seed>> MakeSeeds() {
  std::vector<Seed> seeds;
  seeds.push_back({"safetensors_file", "three_tensors.safetensors", SafetensorsSeed()});
  seeds.push_back({"safetensors_index", "two_shards.index.json", SafetensorsIndexSeed()});
  for (const char* preset : {"tiny", "tiny-phimoe"}) {
    absl::StatusOr<ModelConfig> config = SyntheticConfig(SyntheticModelSpec{.preset = preset});
    if (!config.ok()) return config.status();
    seeds.push_back({"model_config", absl::StrCat(preset, ".config.json"), Bytes(ModelConfigToJson(*config))});
  }
  seeds.push_back({"tokenizer_model", "small_bpe.model", Bytes(SmallTokenizerProto())});
  absl::StatusOr<std::string> trained = SyntheticTokenizerModel(SyntheticModelSpec{.preset = "tiny"});
  if (!trained.ok()) return trained.status();
  seeds.push_back({"tokenizer_model", "tiny_trained.model", Bytes(*trained)});
  seeds.push_back({"gguf_file", "tiny_with_vocab.gguf", GgufSeed()});
  seeds.push_back({"gguf_file", "tiny_with_gpt2_vocab.gguf", GgufGpt2Seed()});
  seeds.push_back({"tokenizer_json", "byte_level.tokenizer.json", Bytes(ByteLevelTokenizerJson())});
  seeds.push_back({"tokenizer_json", "sentencepiece_style.tokenizer.json", Bytes(SentencePieceTokenizerJson())});
  seeds.push_back({"worker_request", "inline.pb", InlineRequestSeed()});
  seeds.push_back({"worker_request", "shm_doorbell.pb", ShmRequestSeed()});
  seeds.push_back({"expert_store_region", "two_experts.region", ExpertStoreSeed()});
  seeds.push_back({"http_request", "chat.json",
                   Bytes(R"({"model":"m","messages":[{"role":"system","content":"Be brief."},)"
                         R"({"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":8,)"
                         R"("temperature":0.7,"top_p":0.9,"stop":["\n"],"stream":true,)"
                         R"("stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,)"
                         R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]})")});
  seeds.push_back({"http_request", "structured.json",
                   Bytes(R"({"messages":[{"role":"user","content":"{\"a\": [1, {\"b\": null}], \"c\": \"\u00e9\"}"}],)"
                         R"("response_format":{"type":"json_schema","json_schema":{"name":"s","schema":)"
                         R"({"type":"object","properties":{"a":{"type":"array","items":{"anyOf":[{"type":"integer"},)"
                         R"({"$ref":"#/$defs/o"}]},"maxItems":4},"c":{"type":"string","maxLength":3},)"
                         R"("d":{"enum":[1,"x",null]}},"required":["a"],"$defs":{"o":{"type":"object",)"
                         R"("additionalProperties":{"type":["null","boolean"]}}}}}}})")});
  seeds.push_back({"http_request", "completion.json",
                   Bytes(R"({"prompt":[1,17,33],"max_tokens":4,"n":2,"seed":7,"logprobs":1,"json_schema":{"type":"integer"}})")});
  return seeds;
}

absl::Status WriteSeeds(const fs::path& out) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<Seed> seeds, MakeSeeds());
  for (const Seed& seed : seeds) {
    if (!seed.bytes.ok()) return seed.bytes.status();
    TANDEM_ASSIGN_OR_RETURN(const FuzzTarget target, FindFuzzTarget(seed.target));
    if (absl::Status parsed = target.run(*seed.bytes); !parsed.ok()) {
      return absl::InternalError(
          absl::StrCat("seed ", seed.target, "/", seed.name, " is refused: ", parsed.ToString()));
    }
    std::error_code ec;
    fs::create_directories(out / seed.target, ec);
    TANDEM_RETURN_IF_ERROR(WriteFuzzFile(out / seed.target / seed.name, *seed.bytes));
    std::printf("%s/%s: %zu bytes\n", seed.target.c_str(), seed.name.c_str(), seed.bytes->size());
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR  (writes OUT_DIR/<target>/<seed>)\n", argv[0]);
    return 2;
  }
  const absl::Status status = tandem::fuzz::WriteSeeds(argv[1]);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-fuzz-seeds: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
