// GgufCheckpoint over single files and llama.cpp-style split sets
// (PREFIX-0000i-of-0000N.gguf with split.no / split.count /
// split.tensors.count), and every way a set can be inconsistent.
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "common/gguf/gguf_checkpoint.h"
#include "common/gguf/gguf_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class GgufSplitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::path(::testing::TempDir()) / "gguf_split_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes one file holding f32 tensors `names` (8 values each, value = file
  // index + position), with split keys when `split_count` is set.
  void WriteFile(const fs::path& path, const std::vector<std::string>& names, std::optional<uint16_t> split_no,
                 std::optional<uint16_t> split_count, std::optional<int32_t> tensors_count, bool full_metadata) {
    GgufMetadata metadata;
    if (full_metadata) {
      metadata.Set("general.architecture", "llama");
      metadata.Set("llama.expert_count", uint32_t{8});
    }
    if (split_no) metadata.Set(kGgufSplitNoKey, *split_no);
    if (split_count) metadata.Set(kGgufSplitCountKey, *split_count);
    if (tensors_count) metadata.Set(kGgufSplitTensorsCountKey, *tensors_count);
    std::vector<GgufTensorSpec> specs;
    for (const std::string& name : names) specs.push_back({name, {8}, GgmlType::kF32});
    auto writer = GgufWriter::Create(path, metadata, specs);
    ASSERT_OK(writer);
    for (size_t i = 0; i < names.size(); ++i) {
      std::vector<float> values(8, static_cast<float>(split_no.value_or(0) * 100 + i));
      ASSERT_OK((*writer)->Write(names[i], absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(values.data()), 32)));
    }
    ASSERT_OK((*writer)->Finish());
  }

  // The three files of m-0000i-of-00003.gguf, holding 2, 1 and 2 tensors.
  void WriteSet(int32_t tensors_count = 5) {
    WriteFile(Split(0), {"token_embd.weight", "blk.0.attn_q.weight"}, 0, 3, tensors_count, true);
    WriteFile(Split(1), {"blk.0.ffn_gate_exps.weight"}, 1, 3, std::nullopt, false);
    WriteFile(Split(2), {"blk.1.attn_q.weight", "output.weight"}, 2, 3, std::nullopt, false);
  }
  fs::path Split(int i) const { return GgufSplitPath((dir_ / "m").string(), i, 3); }

  fs::path dir_;
};

TEST_F(GgufSplitTest, SplitPathsFollowLlamaCppNaming) {
  EXPECT_EQ(GgufSplitPath("/x/mixtral-q4_k_m", 0, 3), "/x/mixtral-q4_k_m-00001-of-00003.gguf");
  EXPECT_EQ(GgufSplitPath("m", 11, 12), "m-00012-of-00012.gguf");
}

TEST_F(GgufSplitTest, SingleFile) {
  const fs::path path = dir_ / "model.gguf";
  WriteFile(path, {"a", "b"}, std::nullopt, std::nullopt, std::nullopt, true);
  auto checkpoint = GgufCheckpoint::Open(path);
  ASSERT_OK(checkpoint);
  EXPECT_EQ((*checkpoint)->files().size(), 1u);
  EXPECT_EQ((*checkpoint)->tensors().size(), 2u);
  EXPECT_EQ((*checkpoint)->Describe(), path.string());
  EXPECT_EQ(*(*checkpoint)->metadata().GetString("general.architecture"), "llama");
  auto b = (*checkpoint)->Get("b");
  ASSERT_OK(b);
  float v;
  std::memcpy(&v, b->data.data(), 4);
  EXPECT_EQ(v, 1.0f);
  EXPECT_EQ(b->data.size(), 32u);
  EXPECT_EQ((*checkpoint)->Get("zz").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT((*checkpoint)->Get("zz").status().message(), HasSubstr("model.gguf: no tensor \"zz\""));

  // split.count 1 is a single file whatever its name.
  const fs::path one = dir_ / "one.gguf";
  WriteFile(one, {"a"}, 0, 1, 1, true);
  EXPECT_OK(GgufCheckpoint::Open(one));
}

TEST_F(GgufSplitTest, ASplitSetOpensFromItsFirstFile) {
  WriteSet();
  auto checkpoint = GgufCheckpoint::Open(Split(0));
  ASSERT_OK(checkpoint);
  const GgufCheckpoint& c = **checkpoint;
  EXPECT_EQ(c.files().size(), 3u);
  EXPECT_THAT(c.Describe(), HasSubstr("m-00001-of-00003.gguf (3 files)"));
  ASSERT_EQ(c.tensors().size(), 5u);
  EXPECT_EQ(c.tensors()[2].info->name, "blk.0.ffn_gate_exps.weight");
  EXPECT_EQ(*c.metadata().GetInteger("llama.expert_count"), 8);
  auto out = c.Get("output.weight");
  ASSERT_OK(out);
  EXPECT_EQ(out->file, c.files()[2].get());
  float v;
  std::memcpy(&v, out->data.data(), 4);
  EXPECT_EQ(v, 201.0f);  // file 2, second tensor
}

TEST_F(GgufSplitTest, ALaterFileOfTheSetPointsToTheFirst) {
  WriteSet();
  auto checkpoint = GgufCheckpoint::Open(Split(1));
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("m-00002-of-00003.gguf is file 2 of a 3-file split set: open the first file, "));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("m-00001-of-00003.gguf"));
}

TEST_F(GgufSplitTest, AMissingFileIsNotFound) {
  WriteSet();
  fs::remove(Split(2));
  auto checkpoint = GgufCheckpoint::Open(Split(0));
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("m-00003-of-00003.gguf"));
}

TEST_F(GgufSplitTest, ARenamedFirstFileCannotFindItsSet) {
  WriteSet();
  fs::rename(Split(0), dir_ / "renamed.gguf");
  auto checkpoint = GgufCheckpoint::Open(dir_ / "renamed.gguf");
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("renamed.gguf: its metadata says it is file 1 of a 3-file split set, but its name does not "
                        "end in -00001-of-00003.gguf"));
}

TEST_F(GgufSplitTest, SplitKeysMustAgreeWithTheNames) {
  WriteSet();
  WriteFile(Split(1), {"blk.0.ffn_gate_exps.weight"}, 2, 3, std::nullopt, false);  // says it is file 3
  auto checkpoint = GgufCheckpoint::Open(Split(0));
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("m-00002-of-00003.gguf: metadata says it is file 3 of 3 (keys \"split.no\", \"split.count\"), "
                        "but its name makes it file 2 of 3"));

  WriteFile(Split(1), {"blk.0.ffn_gate_exps.weight"}, 1, 4, std::nullopt, false);  // other count
  EXPECT_THAT(GgufCheckpoint::Open(Split(0)).status().message(), HasSubstr("file 2 of 4"));

  WriteFile(Split(1), {"x"}, 5, 3, std::nullopt, false);
  EXPECT_THAT(GgufCheckpoint::Open(Split(0)).status().message(),
              HasSubstr("metadata key \"split.no\" is 5, not in 0..2"));
}

TEST_F(GgufSplitTest, TheTensorCountMustMatch) {
  WriteSet(/*tensors_count=*/6);
  auto checkpoint = GgufCheckpoint::Open(Split(0));
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("metadata key \"split.tensors.count\" is 6 but the 3 files hold 5 tensors"));
}

TEST_F(GgufSplitTest, EveryFilesTensorCountMustAgree) {
  WriteSet();
  WriteFile(Split(2), {"blk.1.attn_q.weight", "output.weight"}, 2, 3, 4, false);
  auto checkpoint = GgufCheckpoint::Open(Split(0));
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(),
              HasSubstr("m-00003-of-00003.gguf: metadata key \"split.tensors.count\" is 4 but the first file of the "
                        "set says 5"));
  WriteFile(Split(2), {"blk.1.attn_q.weight", "output.weight"}, 2, 3, 5, false);  // as gguf-split writes it
  EXPECT_OK(GgufCheckpoint::Open(Split(0)));
}

TEST_F(GgufSplitTest, ATensorInTwoFilesIsRefused) {
  WriteSet();
  WriteFile(Split(2), {"blk.1.attn_q.weight", "token_embd.weight"}, 2, 3, std::nullopt, false);
  auto checkpoint = GgufCheckpoint::Open(Split(0));
  ASSERT_FALSE(checkpoint.ok());
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("tensor \"token_embd.weight\" is in both "));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("m-00003-of-00003.gguf"));
}

TEST_F(GgufSplitTest, BadFilesAreReportedByName) {
  const fs::path empty = dir_ / "empty.gguf";
  { std::ofstream(empty).flush(); }
  auto checkpoint = GgufCheckpoint::Open(empty);
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("empty.gguf: only 0 bytes"));
  EXPECT_EQ(GgufCheckpoint::Open(dir_ / "absent.gguf").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(GgufCheckpoint::Open(dir_).status().message(), HasSubstr("is not a regular file"));

  WriteSet();
  fs::resize_file(Split(1), fs::file_size(Split(1)) - 10);  // the middle file truncated
  checkpoint = GgufCheckpoint::Open(Split(0));
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("m-00002-of-00003.gguf: tensor \"blk.0.ffn_gate_exps.weight\""));
}

}  // namespace
}  // namespace tandem
