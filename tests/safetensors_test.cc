#include "common/model/safetensors.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

// `shape` filled with 0.5 * i (exact in f16 and bf16 for the sizes used here).
TensorToWrite MakeTensor(std::string name, DType dtype, std::vector<int64_t> shape) {
  TensorToWrite t{.name = std::move(name), .dtype = dtype, .shape = std::move(shape)};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.data.resize(static_cast<size_t>(n) * DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float v = 0.5f * static_cast<float>(i);
    if (dtype == DType::kF32) {
      std::memcpy(t.data.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? F32ToF16(v) : F32ToBf16(v);
      std::memcpy(t.data.data() + 2 * i, &h, 2);
    }
  }
  return t;
}

std::vector<const TensorToWrite*> Pointers(const std::vector<TensorToWrite>& tensors) {
  std::vector<const TensorToWrite*> out;
  for (const TensorToWrite& t : tensors) out.push_back(&t);
  return out;
}

void ExpectSameTensor(const TensorToWrite& want, const TensorView& got) {
  EXPECT_EQ(got.name, want.name);
  EXPECT_EQ(got.dtype, want.dtype);
  EXPECT_EQ(got.shape, want.shape);
  ASSERT_EQ(got.size_bytes, want.data.size());
  EXPECT_EQ(std::memcmp(got.data, want.data.data(), got.size_bytes), 0) << want.name;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "safetensors_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes exactly `bytes` to dir_/name.
  fs::path WriteBytes(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // A hand-made safetensors file: little-endian length, `header`, `data_bytes` zeros.
  fs::path WriteRaw(const std::string& name, const std::string& header, size_t data_bytes) {
    std::string bytes(8, '\0');
    for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return WriteBytes(name, bytes + header + std::string(data_bytes, '\0'));
  }

  fs::path dir_;
};

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndMetadata) {
  const std::vector<TensorToWrite> tensors = {
      MakeTensor("w.f32", DType::kF32, {3, 5}), MakeTensor("w.f16", DType::kF16, {7}),
      MakeTensor("w.bf16", DType::kBF16, {2, 3, 4}), MakeTensor("scalar", DType::kF32, {})};
  const fs::path path = dir_ / "x.safetensors";
  ASSERT_OK(WriteSafetensors(path, Pointers(tensors), {{"format", "pt"}}));

  auto file = SafetensorsFile::Open(path);
  ASSERT_OK(file);
  EXPECT_EQ((*file)->metadata().at("format"), "pt");
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    auto view = (*file)->Get(t.name);
    ASSERT_OK(view);
    ExpectSameTensor(t, *view);
  }
  const auto bf16 = *(*file)->Get("w.bf16");
  EXPECT_EQ(LoadAsF32(bf16.data, bf16.dtype, 5), 2.5f);

  // The header is padded so the data section starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  EXPECT_EQ(header_bytes % 8, 0u);
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors.tmp"));
}

TEST_F(SafetensorsTest, ShardedCheckpointRoundTrips) {
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 7; ++i) tensors.push_back(MakeTensor(absl::StrCat("layer.", i), DType::kBF16, {16, 8 * (i + 1)}));
  ASSERT_OK(WriteSafetensorsCheckpoint(dir_, Pointers(tensors), 3));
  for (const char* shard : {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                            "model-00003-of-00003.safetensors", "model.safetensors.index.json"}) {
    EXPECT_TRUE(fs::exists(dir_ / shard)) << shard;
  }
  std::ifstream index(dir_ / "model.safetensors.index.json");
  const std::string index_text((std::istreambuf_iterator<char>(index)), std::istreambuf_iterator<char>());
  EXPECT_THAT(index_text, HasSubstr("\"total_size\": 7168"));  // 2 bytes * 16 * 8 * (1 + ... + 7)

  auto checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_OK(checkpoint);
  ASSERT_EQ((*checkpoint)->files().size(), 3u);
  for (const auto& file : (*checkpoint)->files()) EXPECT_FALSE(file->tensors().empty()) << file->path();
  EXPECT_EQ((*checkpoint)->Names().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    auto view = (*checkpoint)->Get(t.name);
    ASSERT_OK(view);
    ExpectSameTensor(t, *view);
  }
}

// The load-time copy into huge pages: the named tensors (over shards, in
// order, until the budget is spent) come back byte for byte from outside
// every file's mapping; the rest, and names it does not hold, stay as they
// were; a shard that shrinks under it is an error naming the tensor.
TEST_F(SafetensorsTest, CopyToMemoryServesTheSameBytesFromOutsideTheMappings) {
  std::vector<TensorToWrite> tensors;
  for (int i = 0; i < 6; ++i) tensors.push_back(MakeTensor(absl::StrCat("layer.", i), DType::kBF16, {16, 8 * (i + 1)}));
  ASSERT_OK(WriteSafetensorsCheckpoint(dir_, Pointers(tensors), 3));
  auto checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_OK(checkpoint);
  auto mapped = [&](const void* p) {
    for (const auto& file : (*checkpoint)->files())
      if (file->Holds(p)) return true;
    return false;
  };
  // layer.0..3 are 256, 512, 768 and 1024 bytes: a 1500-byte budget takes
  // layer.0 and layer.2, and then neither layer.3 nor layer.1 fits.
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2, .name = "copy-test"});
  ASSERT_OK((*checkpoint)->CopyToMemory({"layer.0", "absent", "layer.2", "layer.3", "layer.1"}, 1500, &pool));
  EXPECT_EQ((*checkpoint)->copied_bytes(), 256 + 768);
  EXPECT_EQ((*checkpoint)->left_mapped_bytes(), 1024 + 512);
  for (const TensorToWrite& t : tensors) {
    auto view = (*checkpoint)->Get(t.name);
    ASSERT_OK(view);
    ExpectSameTensor(t, *view);
    EXPECT_EQ(mapped(view->data), t.name != "layer.0" && t.name != "layer.2") << t.name;
  }
  // A second call copies only what is still mapped.
  ASSERT_OK((*checkpoint)->CopyToMemory({"layer.0", "layer.4"}, int64_t{1} << 30, nullptr));
  EXPECT_EQ((*checkpoint)->copied_bytes(), 256 + 768 + 1280);
  EXPECT_FALSE(mapped((*(*checkpoint)->Get("layer.4")).data));

  const fs::path last = dir_ / "model-00003-of-00003.safetensors";
  fs::resize_file(last, fs::file_size(last) - 10);
  const absl::Status shrank = (*checkpoint)->CopyToMemory({"layer.5"}, int64_t{1} << 30, nullptr);
  EXPECT_EQ(shrank.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(shrank.message(), AllOf(HasSubstr("tensor layer.5"), HasSubstr("model-00003-of-00003.safetensors ends")));
}

TEST_F(SafetensorsTest, CheckpointWithoutIndexReadsEveryFile) {
  const std::vector<TensorToWrite> a = {MakeTensor("a", DType::kF32, {4})};
  const std::vector<TensorToWrite> b = {MakeTensor("b", DType::kF16, {4})};
  ASSERT_OK(WriteSafetensors(dir_ / "one.safetensors", Pointers(a)));
  ASSERT_OK(WriteSafetensors(dir_ / "two.safetensors", Pointers(b)));
  auto checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_OK(checkpoint);
  EXPECT_EQ((*checkpoint)->Names(), (std::vector<std::string>{"a", "b"}));
}

TEST_F(SafetensorsTest, WriteRejectsDataOfWrongSize) {
  TensorToWrite t = MakeTensor("w", DType::kF16, {4});
  t.data.pop_back();
  const fs::path path = dir_ / "x.safetensors";
  const absl::Status status = WriteSafetensors(path, {&t});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(path.string()), HasSubstr("\"w\"")));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, FileShorterThanLengthPrefix) {
  const fs::path path = WriteBytes("tiny.safetensors", "abc");
  const absl::Status status = SafetensorsFile::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr(path.string()));
}

TEST_F(SafetensorsTest, TruncatedDataNamesTheTensor) {
  const std::vector<TensorToWrite> tensors = {MakeTensor("first", DType::kF32, {8}),
                                              MakeTensor("last", DType::kF32, {8})};
  const fs::path path = dir_ / "cut.safetensors";
  ASSERT_OK(WriteSafetensors(path, Pointers(tensors)));
  fs::resize_file(path, fs::file_size(path) - 3);
  const absl::Status status = SafetensorsFile::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(path.string()), HasSubstr("\"last\"")));
}

TEST_F(SafetensorsTest, HeaderLengthPastEndOfFile) {
  const fs::path path = WriteBytes("long.safetensors", std::string("\x00\x01\x00\x00\x00\x00\x00\x00{}", 10));
  const absl::Status status = SafetensorsFile::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(path.string()), HasSubstr("header length 256")));
}

TEST_F(SafetensorsTest, AbsurdHeaderLength) {
  const fs::path path = WriteBytes("huge.safetensors", std::string("\x00\x00\x00\x00\x01\x00\x00\x00{}", 10));
  const absl::Status status = SafetensorsFile::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(path.string()), HasSubstr("100 MB")));
}

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const fs::path path = dir_ / "absent.safetensors";
  const absl::Status status = SafetensorsFile::Open(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(path.string()));
}

// Malformed headers: each case names the tensor (or field) its message must carry.
struct BadHeader {
  const char* label;
  std::string header;
  size_t data_bytes;
  absl::StatusCode code;
  std::string must_name;
};

TEST_F(SafetensorsTest, MalformedHeadersAreRejectedWithFileAndTensor) {
  const std::vector<BadHeader> cases = {
      {"bad json", R"({"w": {"dtype": "F32",)", 0, absl::StatusCode::kInvalidArgument, "not valid JSON"},
      {"not an object", R"([1, 2])", 0, absl::StatusCode::kInvalidArgument, "not an object"},
      {"unknown dtype", R"({"ids": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}})", 16,
       absl::StatusCode::kInvalidArgument, "\"ids\": unsupported dtype \"I64\""},
      {"missing shape", R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4, absl::StatusCode::kInvalidArgument,
       "\"w\": \"shape\""},
      {"string dim", R"({"w": {"dtype": "F32", "shape": ["1"], "data_offsets": [0, 4]}})", 4,
       absl::StatusCode::kInvalidArgument, "\"w\": \"shape\""},
      {"negative dim", R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4,
       absl::StatusCode::kInvalidArgument, "\"w\": negative dimension"},
      {"missing offsets", R"({"w": {"dtype": "F32", "shape": [1]}})", 4, absl::StatusCode::kInvalidArgument,
       "\"w\": \"data_offsets\""},
      {"shape x size mismatch", R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 8]}})", 8,
       absl::StatusCode::kInvalidArgument, "\"w\": BF16 [2, 3] needs 12 bytes"},
      {"begin after end", R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", 8,
       absl::StatusCode::kInvalidArgument, "\"w\": data_offsets [8, 4]"},
      {"range outside file", R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", 16,
       absl::StatusCode::kDataLoss, "\"w\": data_offsets [8, 24] end past the data section"},
      {"overlap", R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
       16, absl::StatusCode::kInvalidArgument, "\"b\": bytes overlap those of tensor \"a\""},
      {"metadata not strings", R"({"__metadata__": {"step": 3}})", 0, absl::StatusCode::kInvalidArgument,
       "__metadata__ value of \"step\""},
  };
  for (const BadHeader& c : cases) {
    const fs::path path = WriteRaw("bad.safetensors", c.header, c.data_bytes);
    const absl::Status status = SafetensorsFile::Open(path).status();
    EXPECT_EQ(status.code(), c.code) << c.label << ": " << status;
    EXPECT_THAT(status.message(), AllOf(HasSubstr(path.string()), HasSubstr(c.must_name))) << c.label;
  }
}

TEST_F(SafetensorsTest, GetOfAbsentTensorIsNotFound) {
  const std::vector<TensorToWrite> tensors = {MakeTensor("w", DType::kF32, {2})};
  ASSERT_OK(WriteSafetensorsCheckpoint(dir_, Pointers(tensors), 1));
  auto file = SafetensorsFile::Open(dir_ / "model.safetensors");
  ASSERT_OK(file);
  absl::Status status = (*file)->Get("missing").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("model.safetensors"), HasSubstr("\"missing\"")));

  auto checkpoint = SafetensorsCheckpoint::Open(dir_);
  ASSERT_OK(checkpoint);
  status = (*checkpoint)->Get("missing").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr(dir_.string()), HasSubstr("\"missing\"")));
}

TEST_F(SafetensorsTest, DirectoryWithoutSafetensorsIsNotFound) {
  const absl::Status status = SafetensorsCheckpoint::Open(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(dir_.string()));
}

TEST_F(SafetensorsTest, IndexNamingMissingShard) {
  std::vector<TensorToWrite> tensors;
  for (const char* name : {"a", "b", "c"}) tensors.push_back(MakeTensor(name, DType::kF32, {4}));
  ASSERT_OK(WriteSafetensorsCheckpoint(dir_, Pointers(tensors), 3));
  fs::remove(dir_ / "model-00002-of-00003.safetensors");
  const absl::Status status = SafetensorsCheckpoint::Open(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("model-00002-of-00003.safetensors"), HasSubstr("\"b\"")));
}

TEST_F(SafetensorsTest, IndexNamingTensorAbsentFromShard) {
  const std::vector<TensorToWrite> tensors = {MakeTensor("a", DType::kF32, {4})};
  ASSERT_OK(WriteSafetensors(dir_ / "shard.safetensors", Pointers(tensors)));
  WriteBytes("model.safetensors.index.json",
             R"({"weight_map": {"a": "shard.safetensors", "ghost": "shard.safetensors"}})");
  const absl::Status status = SafetensorsCheckpoint::Open(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("shard.safetensors"), HasSubstr("\"ghost\"")));
}

TEST_F(SafetensorsTest, TensorInTwoFilesIsRejected) {
  const std::vector<TensorToWrite> tensors = {MakeTensor("dup", DType::kF32, {4})};
  ASSERT_OK(WriteSafetensors(dir_ / "one.safetensors", Pointers(tensors)));
  ASSERT_OK(WriteSafetensors(dir_ / "two.safetensors", Pointers(tensors)));
  const absl::Status status = SafetensorsCheckpoint::Open(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("one.safetensors"), HasSubstr("two.safetensors"), HasSubstr("\"dup\"")));
}

// Shard names in the index are plain file names in the model folder: no
// "..", no absolute path, no folder part (they used to be opened as given).
TEST_F(SafetensorsTest, IndexShardNamesOutsideTheFolderAreRefused) {
  const std::vector<TensorToWrite> tensors = {MakeTensor("a", DType::kF32, {4})};
  ASSERT_OK(WriteSafetensors(dir_ / "shard.safetensors", Pointers(tensors)));
  for (const std::string& shard : {std::string("../../etc/passwd"), std::string("/etc/passwd"),
                                   std::string("sub/shard.safetensors"), std::string(".."), std::string("")}) {
    WriteBytes("model.safetensors.index.json", absl::StrCat(R"({"weight_map": {"a": ")", shard, R"("}})"));
    const absl::Status status = SafetensorsCheckpoint::Open(dir_).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << shard << ": " << status;
    EXPECT_THAT(status.message(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("not a plain file name")))
        << shard;
  }
}

// A shard may be a symlink only to a file inside the folder, or (the Hugging
// Face hub cache) into the repository's blobs/ folder.
TEST_F(SafetensorsTest, ShardSymlinksOutOfTheFolderAreRefused) {
  const std::vector<TensorToWrite> tensors = {MakeTensor("a", DType::kF32, {4})};
  const fs::path model = dir_ / "model";
  const fs::path outside = dir_ / "elsewhere";
  fs::create_directories(model);
  fs::create_directories(outside);
  ASSERT_OK(WriteSafetensors(outside / "secret.safetensors", Pointers(tensors)));
  fs::create_symlink(outside / "secret.safetensors", model / "model.safetensors");
  absl::Status status = SafetensorsCheckpoint::Open(model).status();  // no index: every *.safetensors
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("symlink"), HasSubstr("outside the model folder")));
  std::ofstream(model / "model.safetensors.index.json") << R"({"weight_map": {"a": "model.safetensors"}})";
  status = SafetensorsCheckpoint::Open(model).status();  // through the index
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;

  // Inside the folder, and the hub cache layout, are fine.
  const fs::path repo = dir_ / "models--org--name";
  const fs::path snapshot = repo / "snapshots" / "0123abcd";
  fs::create_directories(snapshot);
  fs::create_directories(repo / "blobs");
  ASSERT_OK(WriteSafetensors(repo / "blobs" / "deadbeef", Pointers(tensors)));
  fs::create_symlink("../../blobs/deadbeef", snapshot / "model.safetensors");
  EXPECT_OK(SafetensorsCheckpoint::Open(snapshot));
  fs::remove(model / "model.safetensors.index.json");
  fs::remove(model / "model.safetensors");
  ASSERT_OK(WriteSafetensors(model / "real.bin", Pointers(tensors)));
  fs::create_symlink("real.bin", model / "model.safetensors");
  EXPECT_OK(SafetensorsCheckpoint::Open(model));
}

TEST_F(SafetensorsTest, DuplicateKeysAreRefused) {
  // The same tensor twice in one header: which entry is meant is ambiguous.
  WriteRaw("dup.safetensors",
           R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
           R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
           8);
  absl::Status status = SafetensorsFile::Open(dir_ / "dup.safetensors").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), AllOf(HasSubstr("dup.safetensors"), HasSubstr("\"w\" twice")));
  // A key repeated inside one entry, too.
  WriteRaw("dup2.safetensors", R"({"w": {"dtype": "F32", "dtype": "F16", "shape": [1], "data_offsets": [0, 4]}})", 4);
  status = SafetensorsFile::Open(dir_ / "dup2.safetensors").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("\"dtype\" twice"));
  // And in an index's weight_map.
  fs::remove(dir_ / "dup.safetensors");
  fs::remove(dir_ / "dup2.safetensors");
  const std::vector<TensorToWrite> tensors = {MakeTensor("a", DType::kF32, {4})};
  ASSERT_OK(WriteSafetensors(dir_ / "one.safetensors", Pointers(tensors)));
  WriteBytes("model.safetensors.index.json", R"({"weight_map": {"a": "one.safetensors", "a": "two.safetensors"}})");
  status = SafetensorsCheckpoint::Open(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("\"a\" twice"));
}

TEST_F(SafetensorsTest, AFifoUnderAShardsNameIsRefusedNotWaitedOn) {
  ASSERT_EQ(mkfifo((dir_ / "model.safetensors").c_str(), 0600), 0);
  const absl::Status status = SafetensorsCheckpoint::Open(dir_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace tandem
