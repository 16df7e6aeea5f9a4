// ParseGguf on damaged and hostile bytes: one test per class of bad file,
// each asserting the status code and a message that names the file and the
// key, tensor or field; truncation at every byte; and random mutations,
// which must only ever produce errors, never a crash.
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/gguf/gguf_parser.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/status_testlib.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kName[] = "bad.gguf";

// Little-endian encoders for building files field by field.
template <typename T>
std::string Le(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}
std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }
std::string Kv(const std::string& key, uint32_t type, const std::string& payload) {
  return Str(key) + Le<uint32_t>(type) + payload;
}
std::string KvU32(const std::string& key, uint32_t v) { return Kv(key, 4, Le(v)); }
std::string KvString(const std::string& key, const std::string& v) { return Kv(key, 8, Str(v)); }
std::string ArrayPayload(uint32_t element_type, uint64_t count, const std::string& elements) {
  return Le(element_type) + Le(count) + elements;
}

struct RawTensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};

struct RawFile {
  uint32_t magic = 0x46554747;
  uint32_t version = 3;
  std::optional<uint64_t> tensor_count;  // overrides tensors.size()
  std::optional<uint64_t> kv_count;      // overrides kvs.size()
  std::vector<std::string> kvs;          // encoded entries
  std::vector<RawTensor> tensors;
  uint64_t alignment = 32;
  uint64_t data_bytes = 0;
};

struct Built {
  std::string bytes;
  size_t kv_start, tensors_start, data_start;
};

Built Build(const RawFile& f) {
  Built b;
  b.bytes = Le(f.magic) + Le(f.version) + Le<uint64_t>(f.tensor_count.value_or(f.tensors.size())) +
            Le<uint64_t>(f.kv_count.value_or(f.kvs.size()));
  b.kv_start = b.bytes.size();
  for (const std::string& kv : f.kvs) b.bytes += kv;
  b.tensors_start = b.bytes.size();
  for (const RawTensor& t : f.tensors) {
    b.bytes += Str(t.name) + Le<uint32_t>(t.dims.size());
    for (uint64_t d : t.dims) b.bytes += Le(d);
    b.bytes += Le(t.type) + Le(t.offset);
  }
  b.bytes.resize((b.bytes.size() + f.alignment - 1) / f.alignment * f.alignment, '\0');
  b.data_start = b.bytes.size();
  for (uint64_t i = 0; i < f.data_bytes; ++i) b.bytes.push_back(static_cast<char>(i * 7));
  return b;
}

// A small valid file: three metadata entries (one a string array) and two
// tensors, q8_0 [32, 2] (68 bytes at 0) and f32 [8] (32 bytes at 96).
RawFile ValidFile() {
  RawFile f;
  f.kvs = {KvString("general.architecture", "llama"), KvU32("llama.block_count", 2),
           Kv("tokenizer.ggml.tokens", 9, ArrayPayload(8, 2, Str("a") + Str("bc")))};
  f.tensors = {{"a", {32, 2}, 8, 0}, {"b", {8}, 0, 96}};
  f.data_bytes = 128;
  return f;
}

absl::StatusOr<GgufFile> Parse(const std::string& bytes) {
  return ParseGguf(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), kName);
}
absl::Status ParseStatus(const RawFile& f) { return Parse(Build(f).bytes).status(); }

void ExpectError(const absl::Status& status, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), AllOf(StartsWith(std::string(kName) + ": "), HasSubstr(text)));
}

TEST(GgufMalformedTest, TheValidFileParses) {
  const Built built = Build(ValidFile());
  absl::StatusOr<GgufFile> file = Parse(built.bytes);
  ASSERT_OK(file);
  EXPECT_EQ(file->data_offset(), built.data_start);
  EXPECT_EQ(file->tensors()[1].size_bytes, 32u);
  EXPECT_EQ(*file->metadata().GetString("general.architecture"), "llama");
  RawFile v2 = ValidFile();
  v2.version = 2;
  EXPECT_OK(ParseStatus(v2));
}

TEST(GgufMalformedTest, TruncationAnywhereIsDataLoss) {
  const Built built = Build(ValidFile());
  for (size_t n = 0; n < built.bytes.size(); ++n) {
    const absl::Status s = Parse(built.bytes.substr(0, n)).status();
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "cut at " << n << ": " << s;
    ASSERT_TRUE(absl::StartsWith(s.message(), "bad.gguf: ")) << s;
  }
}

TEST(GgufMalformedTest, TruncationNamesTheSectionItCutInto) {
  const Built built = Build(ValidFile());
  auto cut = [&](size_t n) { return Parse(built.bytes.substr(0, n)).status(); };
  ExpectError(cut(2), absl::StatusCode::kDataLoss, "only 2 bytes: too short for a GGUF header");
  ExpectError(cut(12), absl::StatusCode::kDataLoss, "tensor count");
  ExpectError(cut(built.kv_start + 5), absl::StatusCode::kDataLoss,
              "the header lists 3 metadata entries and 2 tensors");
  const size_t tokens = built.bytes.find("tokenizer.ggml.tokens");
  ExpectError(cut(tokens + 30), absl::StatusCode::kDataLoss, "metadata key \"tokenizer.ggml.tokens\"");
  ExpectError(cut(built.tensors_start + 14), absl::StatusCode::kDataLoss, "tensor \"a\"");
  ExpectError(cut(built.tensors_start + 3), absl::StatusCode::kDataLoss, "tensor #0 name");
  ExpectError(cut(built.data_start + 50), absl::StatusCode::kDataLoss,
              "tensor \"a\": its 68 bytes at offset 0 run past the end of the data section (50 bytes");
  ExpectError(cut(built.data_start + 100), absl::StatusCode::kDataLoss, "tensor \"b\"");
  ExpectError(cut(built.data_start - 1), absl::StatusCode::kDataLoss, "the data section would start at byte");
}

TEST(GgufMalformedTest, BadMagic) {
  RawFile f = ValidFile();
  f.magic = 0x4c4d4747;  // "GGML"
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "not a GGUF file: it starts with bytes 47 47 4d 4c, expected \"GGUF\"");
  ExpectError(Parse(std::string(64, '\0')).status(), absl::StatusCode::kInvalidArgument, "not a GGUF file");
}

TEST(GgufMalformedTest, BadVersion) {
  RawFile f = ValidFile();
  f.version = 1;
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "GGUF version 1 is not supported");
  f.version = 4;
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "unsupported GGUF version 4");
  f.version = 0x03000000;
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "big-endian GGUF (version 3 byte-swapped)");
}

TEST(GgufMalformedTest, HugeCounts) {
  RawFile f = ValidFile();
  f.tensor_count = uint64_t{1} << 62;
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss,
              "the header lists 3 metadata entries and 4611686018427387904 tensors");
  f = ValidFile();
  f.kv_count = std::numeric_limits<uint64_t>::max();
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss, "18446744073709551615 metadata entries");
  f = ValidFile();
  f.kvs[2] = Kv("tokenizer.ggml.tokens", 9, ArrayPayload(8, uint64_t{1} << 61, Str("a") + Str("bc")));
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss,
              "metadata key \"tokenizer.ggml.tokens\": array of 2305843009213693952 string at byte");
  f.kvs[2] = Kv("tokenizer.ggml.tokens", 9, ArrayPayload(0, std::numeric_limits<uint64_t>::max(), ""));
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss, "array of 18446744073709551615 uint8");
}

TEST(GgufMalformedTest, StringLengthPastTheEnd) {
  RawFile f = ValidFile();
  f.kvs[0] = Le<uint64_t>(uint64_t{1} << 40) + "general.architecture";
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss,
              "metadata key #0: string of 1099511627776 bytes at byte 24 runs past the end of the file");
  f = ValidFile();
  f.kvs[0] = Str("general.architecture") + Le<uint32_t>(8) + Le<uint64_t>(5000) + "llama";
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss,
              "metadata key \"general.architecture\": string of 5000 bytes");
  f = ValidFile();
  f.tensors[1].name = std::string(3, 'b');
  Built built = Build(f);
  const size_t name_at = built.tensors_start + (8 + 1 + 4 + 16 + 4 + 8);  // second tensor's name length
  const std::string huge = Le<uint64_t>(std::numeric_limits<uint64_t>::max());
  built.bytes.replace(name_at, 8, huge);
  ExpectError(Parse(built.bytes).status(), absl::StatusCode::kDataLoss,
              "tensor #1 name: string of 18446744073709551615");
}

TEST(GgufMalformedTest, OffsetPastTheEnd) {
  RawFile f = ValidFile();
  f.tensors[1].offset = 128;
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss,
              "tensor \"b\": its 32 bytes at offset 128 run past the end of the data section (128 bytes");
  f.tensors[1].offset = std::numeric_limits<uint64_t>::max() - 31;  // aligned, and adding the size would wrap
  ExpectError(ParseStatus(f), absl::StatusCode::kDataLoss, "tensor \"b\": its 32 bytes at offset 18446744073709551584");
}

TEST(GgufMalformedTest, MisalignedOffset) {
  RawFile f = ValidFile();
  f.tensors[1].offset = 100;
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "tensor \"b\": offset 100 is not a multiple of the alignment 32");
  f = ValidFile();
  f.kvs.push_back(KvU32("general.alignment", 64));
  f.alignment = 64;
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "offset 96 is not a multiple of the alignment 64");
  f.tensors[1].offset = 128;
  f.data_bytes = 160;
  absl::StatusOr<GgufFile> ok = Parse(Build(f).bytes);
  ASSERT_OK(ok);
  EXPECT_EQ(ok->data_offset() % 64, 0u);
}

TEST(GgufMalformedTest, OverlappingTensors) {
  RawFile f = ValidFile();
  f.tensors[1].offset = 64;  // inside a's 68 bytes
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "tensor \"b\" at offset 64 overlaps tensor \"a\" (offset 0, 68 bytes)");
}

TEST(GgufMalformedTest, UnknownTypes) {
  RawFile f = ValidFile();
  f.tensors[0].type = 99;
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "tensor \"a\": unknown ggml tensor type id 99");
  f.tensors[0].type = 4;  // retired Q4_2
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "unknown ggml tensor type id 4");
  f = ValidFile();
  f.kvs[1] = Kv("llama.block_count", 13, Le<uint32_t>(2));
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "metadata key \"llama.block_count\": value type 13 is not a GGUF type");
  f.kvs[1] = Kv("llama.block_count", 9, ArrayPayload(77, 1, "x"));
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "value type 77 is not a GGUF type");
}

TEST(GgufMalformedTest, ShapeProblems) {
  RawFile f = ValidFile();
  f.tensors[1].dims = {uint64_t{1} << 32, uint64_t{1} << 32};
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "tensor \"b\": shape [4294967296, 4294967296] of type f32 overflows 63 bits");
  f.tensors[1].dims = {8, std::numeric_limits<uint64_t>::max()};
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "tensor \"b\": dimension 1 is 18446744073709551615, over 2^63 - 1");
  f.tensors[1].dims = {8, 1, 1, 1, 1};
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "tensor \"b\": 5 dimensions, more than ggml's 4");
  f = ValidFile();
  f.tensors[0].dims = {48, 2};
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "tensor \"a\": shape [48, 2]: row length 48 is not a multiple of q8_0's block of 32");
}

TEST(GgufMalformedTest, EmptyAndDuplicateNames) {
  RawFile f = ValidFile();
  f.kvs.push_back(KvU32("llama.block_count", 3));
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "metadata key \"llama.block_count\" appears twice");
  f = ValidFile();
  f.kvs[1] = KvU32("", 3);
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "metadata key #1 is empty");
  f = ValidFile();
  f.tensors[1].name = "a";
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "tensor \"a\" appears twice");
  f.tensors[1].name = "";
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "tensor #1 has an empty name");
}

TEST(GgufMalformedTest, BadAlignment) {
  RawFile f = ValidFile();
  f.kvs.push_back(KvU32("general.alignment", 0));
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "\"general.alignment\" is 0, not a power of two");
  f.kvs.back() = KvU32("general.alignment", 48);
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "\"general.alignment\" is 48, not a power of two");
  f.kvs.back() = KvString("general.alignment", "32");
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "\"general.alignment\" is string, expected uint32");
}

TEST(GgufMalformedTest, ArraysNestedTooDeep) {
  // depth levels of arrays around one int32 element.
  auto nested = [](int depth) {
    std::string payload = ArrayPayload(5, 1, Le<int32_t>(7));
    for (int i = 1; i < depth; ++i) payload = ArrayPayload(9, 1, payload);
    return payload;
  };
  RawFile f = ValidFile();
  f.kvs.push_back(Kv("deep", 9, nested(kGgufMaxArrayDepth)));
  absl::StatusOr<GgufFile> ok = Parse(Build(f).bytes);
  ASSERT_OK(ok);
  const GgufArray* level = ok->metadata().Find("deep")->As<GgufArray>();
  for (int i = 1; i < kGgufMaxArrayDepth; ++i) level = &level->As<GgufArray>()->at(0);
  EXPECT_EQ(level->As<int32_t>()->at(0), 7);
  f.kvs.back() = Kv("deep", 9, nested(kGgufMaxArrayDepth + 1));
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "metadata key \"deep\": element 0: element 0: element 0: array at byte");
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "nests arrays deeper than 4 levels");
}

TEST(GgufMalformedTest, BoolsAreZeroOrOne) {
  RawFile f = ValidFile();
  f.kvs.push_back(Kv("flag", 7, Le<uint8_t>(2)));
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument,
              "metadata key \"flag\": bool byte 2 is neither 0 nor 1");
  f.kvs.back() = Kv("flags", 9, ArrayPayload(7, 3, std::string("\x01\x00\x05", 3)));
  ExpectError(ParseStatus(f), absl::StatusCode::kInvalidArgument, "metadata key \"flags\": element 2: bool byte 5");
}

TEST(GgufMalformedTest, AFileWithoutTensorsNeedsNoDataSection) {
  RawFile f;
  f.kvs = {KvU32("x", 1)};
  std::string bytes = Build(f).bytes;
  bytes.resize(24 + f.kvs[0].size());  // no padding at all
  absl::StatusOr<GgufFile> file = Parse(bytes);
  ASSERT_OK(file);
  EXPECT_TRUE(file->tensors().empty());
}

// Random damage to a valid file: every outcome is a parse or an error that
// names the file, never a crash or a hang (run under ASan to see more).
TEST(GgufMalformedTest, RandomMutationsNeverCrash) {
  const std::string valid = Build(ValidFile()).bytes;
  std::mt19937 rng(12345);
  int errors = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) {
      const size_t at = rng() % bytes.size();
      switch (rng() % 3) {
        case 0: bytes[at] = static_cast<char>(rng()); break;
        case 1: bytes[at] = static_cast<char>(0xff); break;
        default: bytes[at] ^= static_cast<char>(1u << (rng() % 8)); break;
      }
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    const absl::StatusOr<GgufFile> file = Parse(bytes);
    if (!file.ok()) {
      ++errors;
      ASSERT_TRUE(absl::StartsWith(file.status().message(), "bad.gguf: ")) << file.status();
    }
  }
  EXPECT_GT(errors, 1000);
}

}  // namespace
}  // namespace tandem
