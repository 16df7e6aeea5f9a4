// GgufWriter -> ParseGguf / GgufMappedFile round trips: every metadata value
// type (arrays and arrays of arrays included), tensors of every kind of
// shape and type, streaming in chunks, alignment, and the writer's refusals.
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "common/gguf/gguf_mapped_file.h"
#include "common/gguf/gguf_parser.h"
#include "common/gguf/gguf_serializer.h"
#include "common/gguf/gguf_writer.h"
#include "common/quant/quantize.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class GgufRoundTripTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "gguf_roundtrip_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
};

GgufMetadata EveryValueType() {
  GgufMetadata m;
  m.Set("general.architecture", "llama");
  m.Set("t.uint8", uint8_t{200});
  m.Set("t.int8", int8_t{-100});
  m.Set("t.uint16", uint16_t{60000});
  m.Set("t.int16", int16_t{-30000});
  m.Set("t.uint32", uint32_t{4000000000u});
  m.Set("t.int32", int32_t{-2000000000});
  m.Set("t.float32", 1.25f);
  m.Set("t.bool.true", true);
  m.Set("t.bool.false", false);
  m.Set("t.string", std::string("h\xc3\xa9llo"));
  m.Set("t.string.empty", std::string());
  m.Set("t.string.binary", std::string("a\0b\xff", 4));
  m.Set("t.uint64", uint64_t{18000000000000000000u});
  m.Set("t.int64", int64_t{-9000000000000000000});
  m.Set("t.float64", 3.141592653589793);
  m.Set("a.uint8", GgufArray(std::vector<uint8_t>{0, 1, 255}));
  m.Set("a.int8", GgufArray(std::vector<int8_t>{-128, 0, 127}));
  m.Set("a.uint16", GgufArray(std::vector<uint16_t>{1, 65535}));
  m.Set("a.int16", GgufArray(std::vector<int16_t>{-32768, 32767}));
  m.Set("a.uint32", GgufArray(std::vector<uint32_t>{7, 4294967295u}));
  m.Set("a.int32", GgufArray(std::vector<int32_t>{-1, 3, 1 << 30}));
  m.Set("a.float32", GgufArray(std::vector<float>{-0.0f, 1e-30f, 3.5f}));
  m.Set("a.bool", GgufArray(std::vector<bool>{true, false, true, true}));
  m.Set("a.string", GgufArray(std::vector<std::string>{"<s>", "", "\xe2\x96\x81the"}));
  m.Set("a.uint64", GgufArray(std::vector<uint64_t>{0, std::numeric_limits<uint64_t>::max()}));
  m.Set("a.int64", GgufArray(std::vector<int64_t>{std::numeric_limits<int64_t>::min(), 5}));
  m.Set("a.float64", GgufArray(std::vector<double>{1e300, -2.5}));
  m.Set("a.empty", GgufArray(std::vector<float>{}));
  m.Set("a.nested",
        GgufArray(std::vector<GgufArray>{GgufArray(std::vector<int32_t>{1, 2}), GgufArray(std::vector<int32_t>{}),
                                         GgufArray(std::vector<int32_t>{3})}));
  m.Set("a.nested.strings", GgufArray(std::vector<GgufArray>{
                                GgufArray(std::vector<GgufArray>{GgufArray(std::vector<std::string>{"x", "y"})})}));
  return m;
}

std::vector<uint8_t> Pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(seed + i * 31 + (i >> 8));
  return bytes;
}

std::vector<uint8_t> ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(GgufRoundTripTest, EveryMetadataTypeSurvives) {
  const GgufMetadata metadata = EveryValueType();
  const fs::path path = dir_ / "meta.gguf";
  auto writer = GgufWriter::Create(path, metadata, {});
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->Finish());

  auto file = GgufMappedFile::Open(path);
  ASSERT_OK(file);
  const GgufFile& gguf = (*file)->gguf();
  EXPECT_EQ(gguf.version(), 3u);
  EXPECT_TRUE(gguf.tensors().empty());
  ASSERT_EQ(gguf.metadata().entries().size(), metadata.entries().size());
  for (size_t i = 0; i < metadata.entries().size(); ++i) {
    const auto& [key, value] = metadata.entries()[i];
    EXPECT_EQ(gguf.metadata().entries()[i].first, key);
    EXPECT_EQ(gguf.metadata().entries()[i].second, value)
        << key << ": " << value.DebugString() << " vs " << gguf.metadata().entries()[i].second.DebugString();
  }
  EXPECT_EQ(*gguf.metadata().GetString("general.architecture"), "llama");
  EXPECT_EQ(*gguf.metadata().GetInteger("t.uint32"), 4000000000);
  EXPECT_EQ(*gguf.metadata().GetInteger("t.int8"), -100);
  EXPECT_EQ(*gguf.metadata().GetFloat("t.float32"), 1.25);
  EXPECT_TRUE(*gguf.metadata().GetBool("t.bool.true"));
  const GgufArray* tokens = *gguf.metadata().GetArray("a.string", GgufValueType::kString);
  EXPECT_EQ(*tokens->As<std::string>(), (std::vector<std::string>{"<s>", "", "\xe2\x96\x81the"}));
  const GgufArray* nested = *gguf.metadata().GetArray("a.nested", GgufValueType::kArray);
  EXPECT_EQ((*nested->As<GgufArray>())[2].As<int32_t>()->at(0), 3);
}

TEST_F(GgufRoundTripTest, TypedGettersNameTheFileAndKey) {
  GgufMetadata m("model.gguf");
  m.Set("general.name", uint32_t{3});
  m.Set("big", uint64_t{1} << 63);
  EXPECT_EQ(m.GetString("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.GetString("nope").status().message(), HasSubstr("model.gguf: metadata key \"nope\" is missing"));
  EXPECT_THAT(m.GetString("general.name").status().message(),
              HasSubstr("model.gguf: metadata key \"general.name\" is uint32 3, expected a string"));
  EXPECT_THAT(m.GetInteger("big").status().message(), HasSubstr("expected an integer"));
  EXPECT_THAT(m.GetArray("general.name", GgufValueType::kFloat32).status().message(),
              HasSubstr("expected an array of float32"));
  EXPECT_THAT(m.Add("general.name", true).message(), HasSubstr("\"general.name\" appears twice"));
  EXPECT_THAT(m.Add("", true).message(), HasSubstr("is empty"));
  m.Erase("general.name");
  EXPECT_FALSE(m.Contains("general.name"));
  EXPECT_TRUE(m.Contains("big"));
}

TEST_F(GgufRoundTripTest, TensorsStreamInChunksAndReadBackExactly) {
  GgufMetadata metadata;
  metadata.Set("general.architecture", "llama");
  const std::vector<GgufTensorSpec> tensors = {
      {"output_norm.weight", {96}, GgmlType::kF32},
      {"token_embd.weight", {256, 10}, GgmlType::kQ4_K},
      {"blk.0.ffn_gate_exps.weight", {512, 3, 4}, GgmlType::kQ6_K},
      {"blk.0.attn_q.weight", {64, 7}, GgmlType::kQ8_0},
      {"empty", {32, 0}, GgmlType::kQ4_0},
      {"scalar", {}, GgmlType::kF16},
      {"blk.0.attn_k.weight", {32, 2, 1, 3}, GgmlType::kBF16},
  };
  const fs::path path = dir_ / "t.gguf";
  auto writer = GgufWriter::Create(path, metadata, tensors);
  ASSERT_OK(writer);
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& info = (*writer)->tensors()[i];
    if (info.size_bytes == 0) {
      data.emplace_back();
      continue;
    }
    ASSERT_EQ((*writer)->next_tensor()->name, tensors[i].name);
    data.push_back(Pattern(info.size_bytes, static_cast<uint8_t>(i)));
    // Three uneven chunks, as a quantizer streaming rows would write.
    const size_t a = data.back().size() / 3, b = data.back().size() / 2;
    absl::Span<const uint8_t> all(data.back());
    ASSERT_OK((*writer)->Write(info.name, all.subspan(0, a)));
    ASSERT_OK((*writer)->Write(info.name, all.subspan(a, b - a)));
    ASSERT_OK((*writer)->Write(info.name, all.subspan(b)));
  }
  EXPECT_EQ((*writer)->next_tensor(), nullptr);
  const absl::Status finished = (*writer)->Finish();
  ASSERT_OK(finished);
  EXPECT_EQ((*writer)->bytes_written(), (*writer)->total_bytes());
  EXPECT_EQ(fs::file_size(path), (*writer)->total_bytes());
  EXPECT_FALSE(fs::exists(dir_ / "t.gguf.partial"));

  auto file = GgufMappedFile::Open(path);
  ASSERT_OK(file);
  const GgufFile& gguf = (*file)->gguf();
  EXPECT_EQ(gguf.alignment(), 32u);
  EXPECT_EQ(gguf.data_offset() % 32, 0u);
  ASSERT_EQ(gguf.tensors().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const GgufTensorInfo& info = gguf.tensors()[i];
    SCOPED_TRACE(info.name);
    EXPECT_EQ(info, (*writer)->tensors()[i]);
    EXPECT_EQ(info.name, tensors[i].name);
    EXPECT_EQ(info.dims, tensors[i].dims);
    EXPECT_EQ(info.type, tensors[i].type);
    EXPECT_EQ(info.offset % 32, 0u);
    EXPECT_EQ(info.size_bytes, *GgmlTensorBytes(tensors[i].type, tensors[i].dims));
    absl::Span<const uint8_t> got = (*file)->TensorData(info);
    EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.end()), data[i]);
    EXPECT_EQ(gguf.FindTensor(info.name), &info);
  }
  EXPECT_EQ(gguf.FindTensor("missing"), nullptr);
  // ggml lays tensors out back to back, each padded to the alignment.
  EXPECT_EQ(gguf.tensors()[0].offset, 0u);
  EXPECT_EQ(gguf.tensors()[1].offset, 384u);  // 96 f32 = 384 bytes

  // The writer's file is exactly header + laid-out data.
  const std::vector<uint8_t> bytes = ReadAll(path);
  const std::string header = *SerializeGgufHeader(metadata, (*writer)->tensors());
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + header.size()), header);
  EXPECT_EQ(gguf.data_offset(), header.size());
}

// ReadInto (the weight copy at load) gives the mapping's bytes, refuses a
// range outside the file, and names the file and offset when the file
// shrank under it (pread, not the mapping, so no SIGBUS).
TEST_F(GgufRoundTripTest, ReadIntoCopiesTensorBytesAndReportsAFileThatShrank) {
  GgufMetadata metadata;
  metadata.Set("general.architecture", "llama");
  const std::vector<GgufTensorSpec> tensors = {{"blk.0.attn_q.weight", {64, 40}, GgmlType::kQ8_0}};
  const fs::path path = dir_ / "read.gguf";
  auto writer = GgufWriter::Create(path, metadata, tensors);
  ASSERT_OK(writer);
  const std::vector<uint8_t> data = Pattern((*writer)->tensors()[0].size_bytes, 7);
  ASSERT_OK((*writer)->Write(tensors[0].name, data));
  ASSERT_OK((*writer)->Finish());

  auto file = GgufMappedFile::Open(path);
  ASSERT_OK(file);
  const absl::Span<const uint8_t> tensor = (*file)->TensorData((*file)->gguf().tensors()[0]);
  std::vector<uint8_t> out(tensor.size());
  ASSERT_OK((*file)->ReadInto(tensor, out.data()));
  EXPECT_EQ(out, data);
  std::vector<uint8_t> part(100);
  ASSERT_OK((*file)->ReadInto(tensor.subspan(33, 100), part.data()));
  EXPECT_EQ(part, std::vector<uint8_t>(data.begin() + 33, data.begin() + 133));

  const std::vector<uint8_t> elsewhere(16);
  const absl::Status outside = (*file)->ReadInto(absl::MakeConstSpan(elsewhere), out.data());
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("outside the file"));

  fs::resize_file(path, fs::file_size(path) - 50);
  const absl::Status shrank = (*file)->ReadInto(tensor, out.data());
  EXPECT_EQ(shrank.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shrank.message(), HasSubstr("read.gguf ends at byte"));
  EXPECT_THAT(shrank.message(), HasSubstr("shrink"));
}

TEST_F(GgufRoundTripTest, QuantizedRowsDecodeAfterTheTrip) {
  std::vector<float> x(512);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.1f * i) * 0.05f;
  std::vector<uint8_t> q(*GgmlRowBytes(GgmlType::kQ6_K, 512));
  ASSERT_OK(QuantizeRow(GgmlType::kQ6_K, x, absl::MakeSpan(q)));
  GgufMetadata metadata;
  const fs::path path = dir_ / "q.gguf";
  auto writer = GgufWriter::Create(path, metadata, {{"w", {256, 2}, GgmlType::kQ6_K}});
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->Write("w", q));
  ASSERT_OK((*writer)->Finish());
  auto file = GgufMappedFile::Open(path);
  ASSERT_OK(file);
  std::vector<float> y(512);
  ASSERT_OK(DequantizeRow(GgmlType::kQ6_K, (*file)->TensorData((*file)->gguf().tensors()[0]), absl::MakeSpan(y)));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 0.002) << i;
}

TEST_F(GgufRoundTripTest, CustomAlignmentIsHonoured) {
  GgufMetadata metadata;
  metadata.Set(kGgufAlignmentKey, uint32_t{256});
  const fs::path path = dir_ / "a.gguf";
  auto writer = GgufWriter::Create(path, metadata, {{"a", {3}, GgmlType::kF32}, {"b", {5}, GgmlType::kF32}});
  ASSERT_OK(writer);
  ASSERT_OK((*writer)->Write("a", Pattern(12, 1)));
  ASSERT_OK((*writer)->Write("b", Pattern(20, 2)));
  ASSERT_OK((*writer)->Finish());
  auto file = GgufMappedFile::Open(path);
  ASSERT_OK(file);
  EXPECT_EQ((*file)->gguf().alignment(), 256u);
  EXPECT_EQ((*file)->gguf().data_offset() % 256, 0u);
  EXPECT_EQ((*file)->gguf().tensors()[1].offset, 256u);
  EXPECT_EQ(fs::file_size(path), (*file)->gguf().data_offset() + 512);
}

TEST_F(GgufRoundTripTest, WriterRefusesBadSpecsAndOutOfOrderData) {
  GgufMetadata metadata;
  const fs::path path = dir_ / "bad.gguf";
  auto create = [&](std::vector<GgufTensorSpec> specs) { return GgufWriter::Create(path, metadata, specs).status(); };
  EXPECT_THAT(create({{std::string(64, 'x'), {32}, GgmlType::kF32}}).message(),
              HasSubstr("name of 64 bytes; ggml readers take at most 63"));
  EXPECT_THAT(create({{"a", {32}, GgmlType::kF32}, {"a", {32}, GgmlType::kF32}}).message(),
              HasSubstr("tensor \"a\" appears twice"));
  EXPECT_THAT(create({{"a", {1, 1, 1, 1, 1}, GgmlType::kF32}}).message(), HasSubstr("5 dimensions"));
  EXPECT_THAT(create({{"a", {100, 2}, GgmlType::kQ4_K}}).message(),
              HasSubstr("tensor \"a\": shape [100, 2]: row length 100 is not a multiple of q4_K's block of 256"));
  EXPECT_THAT(create({{"", {32}, GgmlType::kF32}}).message(), HasSubstr("has no name"));
  metadata.Set(kGgufAlignmentKey, uint32_t{48});
  EXPECT_THAT(create({}).message(), HasSubstr("\"general.alignment\" is 48, not a power of two"));
  metadata.Set(kGgufAlignmentKey, uint64_t{64});
  EXPECT_THAT(create({}).message(), HasSubstr("\"general.alignment\" is uint64, expected uint32"));
  metadata.Erase(kGgufAlignmentKey);

  auto writer = GgufWriter::Create(path, metadata, {{"a", {8}, GgmlType::kF32}, {"b", {8}, GgmlType::kF32}});
  ASSERT_OK(writer);
  EXPECT_THAT((*writer)->Write("b", Pattern(32, 0)).message(), HasSubstr("\"b\" written out of order: \"a\" is due"));
  EXPECT_THAT((*writer)->Write("a", Pattern(33, 0)).message(), HasSubstr("33 more bytes after 0 exceed its 32"));
  ASSERT_OK((*writer)->Write("a", Pattern(32, 0)));
  ASSERT_OK((*writer)->Write("b", Pattern(10, 0)));
  EXPECT_THAT((*writer)->Finish().message(), HasSubstr("tensor \"b\" has 10 of its 32 bytes"));
  EXPECT_TRUE(fs::exists(dir_ / "bad.gguf.partial"));
  EXPECT_FALSE(fs::exists(path));
  writer->reset();  // an unfinished writer leaves nothing behind
  EXPECT_FALSE(fs::exists(dir_ / "bad.gguf.partial"));
  EXPECT_FALSE(fs::exists(path));

  EXPECT_FALSE(GgufWriter::Create(dir_ / "no_such_dir" / "x.gguf", metadata, {}).ok());
}

TEST_F(GgufRoundTripTest, ZeroByteTensorsNeedNoWrites) {
  GgufMetadata metadata;
  const fs::path path = dir_ / "z.gguf";
  auto writer = GgufWriter::Create(path, metadata, {{"e0", {0}, GgmlType::kF32}, {"e1", {32, 0}, GgmlType::kQ8_0}});
  ASSERT_OK(writer);
  EXPECT_EQ((*writer)->next_tensor(), nullptr);
  ASSERT_OK((*writer)->Finish());
  auto file = GgufMappedFile::Open(path);
  ASSERT_OK(file);
  EXPECT_EQ((*file)->gguf().tensors().size(), 2u);
}

}  // namespace
}  // namespace tandem
