// Hugging Face's own tokenizers (the Rust library, through the official
// `tokenizers` Node binding installed from tests/node's lock file) as the
// oracle: for each vocabulary, thousands of hard strings
// (tokenizer_strings_testlib.h) are encoded with and without special tokens
// and decoded both ways by HF and by tandem, and random id sequences are
// decoded; every id and every decoded byte must agree.
//
// Vocabularies: the GGUF "gpt2" files of ../shared/tokenizer-vectors (tandem
// loads the GGUF itself, HF the tokenizer.json it stands for); OpenAI's
// o200k_base and cl100k_base from js-tiktoken (converted as transformers
// converts tiktoken vocabularies), cl100k with added tokens of every flag,
// cl100k with each GGUF pre-tokenizer that has no vocabulary file here;
// and two SentencePiece-style tokenizer.json files built from a trained
// SentencePiece model (Llama 2's legacy Prepend/Replace/ByteFallback/Strip
// pipeline, and NFKC + Digits + Metaspace with flagged added tokens).
// Without node/npm or the registry the whole suite skips, saying why.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/model_tokenizer.h"
#include "common/model/sentencepiece_proto.h"
#include "common/model/sentencepiece_tokenizer.h"
#include "common/tokenizer/gguf_pre_tokenizers.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/unicode_text.h"
#include "gtest/gtest.h"
#include "tests/node_testlib.h"
#include "tests/sdk_testlib.h"
#include "tests/status_testlib.h"
#include "tests/temp_dir_testlib.h"
#include "tests/tokenizer_strings_testlib.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

constexpr size_t kStringsPerVocabulary = 2500;
constexpr size_t kIdSequencesPerVocabulary = 300;
constexpr char kMetaspace[] = "\xE2\x96\x81";  // ▁

fs::path VectorsDir() {
  if (const char* dir = std::getenv("TANDEM_TOKENIZER_VECTORS")) return dir;
  return fs::path(TANDEM_SOURCE_DIR).parent_path() / "shared" / "tokenizer-vectors";
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void WriteJson(const fs::path& path, const Json& json) {
  std::ofstream(path, std::ios::binary) << json.dump(-1, ' ', false, Json::error_handler_t::strict);
}

// The merges transformers' SentencePiece converter writes for a BPE model:
// every split of a normal piece into two pieces, ranked by the piece's id.
Json SentencePieceMerges(const std::vector<SentencePieceEntry>& pieces) {
  std::map<std::string, int32_t> id;
  for (size_t i = 0; i < pieces.size(); ++i) id.emplace(pieces[i].piece, static_cast<int32_t>(i));
  Json merges = Json::array();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].type != static_cast<int32_t>(PieceType::kNormal)) continue;
    const std::string& piece = pieces[i].piece;
    std::vector<std::pair<int32_t, int32_t>> local;
    for (size_t cut = 1; cut < piece.size(); ++cut) {
      if ((static_cast<uint8_t>(piece[cut]) & 0xC0) == 0x80) continue;  // inside a character
      auto left = id.find(piece.substr(0, cut)), right = id.find(piece.substr(cut));
      if (left != id.end() && right != id.end()) local.emplace_back(left->second, right->second);
    }
    std::sort(local.begin(), local.end());
    for (auto [l, r] : local) merges.push_back(Json::array({pieces[l].piece, pieces[r].piece}));
  }
  return merges;
}

Json Added(int64_t id, const std::string& content, bool special, bool lstrip = false, bool rstrip = false,
           bool normalized = false, bool single_word = false) {
  return {{"id", id},         {"content", content},       {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

Json Template(const std::vector<std::pair<std::string, int32_t>>& before,
              const std::vector<std::pair<std::string, int32_t>>& after) {
  Json single = Json::array(), special = Json::object();
  auto add = [&](const std::pair<std::string, int32_t>& token) {
    single.push_back({{"SpecialToken", {{"id", token.first}, {"type_id", 0}}}});
    special[token.first] = {{"id", token.first}, {"ids", {token.second}}, {"tokens", {token.first}}};
  };
  for (const auto& token : before) add(token);
  single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
  for (const auto& token : after) add(token);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", Json::array()}, {"special_tokens", special}};
}

// Two SentencePiece-style tokenizer.json files from a trained SentencePiece
// BPE model (byte fallback, <unk>=0, <s>=1, </s>=2).
std::pair<Json, Json> SentencePieceStyleJsons(const std::string& model_proto) {
  absl::StatusOr<std::vector<SentencePieceEntry>> pieces = ParseSentencePiecePieces(model_proto, "trained");
  EXPECT_TRUE(pieces.ok()) << pieces.status();
  Json vocab = Json::object();
  for (size_t i = 0; i < pieces->size(); ++i) vocab[(*pieces)[i].piece] = i;
  const Json merges = SentencePieceMerges(*pieces);
  const int64_t n = static_cast<int64_t>(pieces->size());
  auto model = [&](bool fuse_unk) {
    return Json{{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", "<unk>"},
                {"fuse_unk", fuse_unk},
                {"byte_fallback", true},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merges},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}};
  };
  const Json specials = Json::array({Added(0, "<unk>", true), Added(1, "<s>", true), Added(2, "</s>", true)});
  // Llama 2 (legacy): the space marker prepended and substituted by
  // normalizers, decoded back with Replace, ByteFallback, Fuse and Strip.
  Json legacy = {{"version", "1.0"},
                 {"added_tokens", specials},
                 {"normalizer",
                  {{"type", "Sequence"},
                   {"normalizers",
                    {{{"type", "Prepend"}, {"prepend", kMetaspace}},
                     {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMetaspace}}}}}},
                 {"pre_tokenizer", nullptr},
                 {"post_processor", Template({{"<s>", 1}}, {})},
                 {"decoder",
                  {{"type", "Sequence"},
                   {"decoders",
                    {{{"type", "Replace"}, {"pattern", {{"String", kMetaspace}}}, {"content", " "}},
                     {{"type", "ByteFallback"}},
                     {{"type", "Fuse"}},
                     {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
                 {"model", model(true)}};
  // NFKC, digits one by one, Metaspace marking only the first word; added
  // tokens with every flag, one of them normalized.
  Json added = specials;
  added.push_back(Added(n, "<mask>", true, /*lstrip=*/true, /*rstrip=*/true));
  added.push_back(Added(n + 1, "[DAY]", false, false, false, false, /*single_word=*/true));
  added.push_back(Added(n + 2, "<|user|>", true, false, /*rstrip=*/true));
  added.push_back(Added(n + 3, "\xEF\xBD\x94\xEF\xBD\x85\xEF\xBD\x93\xEF\xBD\x94", false, false, false,
                        /*normalized=*/true));  // fullwidth "test": matched as "test" after NFKC
  added.push_back(Added(n + 4, " sep ", false, /*lstrip=*/true));
  Json metaspace = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", {{"type", "NFKC"}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "Metaspace"}, {"replacement", kMetaspace}, {"prepend_scheme", "first"}, {"split", true}}}}}},
      {"post_processor", Template({{"<s>", 1}}, {{"</s>", 2}})},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Metaspace"}, {"replacement", kMetaspace}, {"prepend_scheme", "first"}, {"split", true}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}}}}}},
      {"model", model(false)}};
  return {legacy, metaspace};
}

// cl100k with added tokens of every flag (ChatML's, and some stripping ones).
Json WithFlaggedAddedTokens(Json tokenizer) {
  int64_t next = 0;
  for (const auto& [token, id] : tokenizer["model"]["vocab"].items())
    next = std::max<int64_t>(next, id.get<int64_t>() + 1);
  for (const Json& token : tokenizer["added_tokens"]) next = std::max<int64_t>(next, token["id"].get<int64_t>() + 1);
  next = std::max<int64_t>(next, static_cast<int64_t>(tokenizer["model"]["vocab"].size()));
  Json& added = tokenizer["added_tokens"];
  added.push_back(Added(next++, "<|im_start|>", true, false, /*rstrip=*/false));
  added.push_back(Added(next++, "<|im_end|>", true, /*lstrip=*/true, /*rstrip=*/true));
  added.push_back(Added(next++, "<think>", false, false, false, /*normalized=*/true));
  added.push_back(Added(next++, "[word]", false, false, false, false, /*single_word=*/true));
  added.push_back(Added(next++, "  ", false));  // two spaces, as GPT-NeoX adds
  tokenizer["post_processor"] = Template({{"<|endoftext|>", 100257}}, {});
  return tokenizer;
}

// One vocabulary under test: the file HF reads and the tokenizer tandem uses.
struct Vocabulary {
  std::string name;
  fs::path json_file;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<std::string> strings;
  std::vector<std::vector<int32_t>> id_sequences;
};

// `base` with the vocabulary's added tokens' contents spliced into a quarter
// of the strings, so that added-token splitting meets every flag.
std::vector<std::string> WithAddedTokens(const std::vector<std::string>& base, const Json& document) {
  std::vector<std::string> contents;
  if (const Json* added = FindField(document, "added_tokens")) {
    for (const Json& token : *added) contents.push_back(token["content"].get<std::string>());
  }
  std::vector<std::string> out = base;
  if (contents.empty()) return out;
  for (size_t i = 0; i < out.size(); i += 4) {
    std::string& s = out[i];
    size_t at = (i * 7919) % (s.size() + 1);
    while (at > 0 && at < s.size() && (static_cast<uint8_t>(s[at]) & 0xC0) == 0x80) --at;
    const std::string& content = contents[(i / 4) % contents.size()];
    s.insert(at, (i % 8 == 0) ? " " + content + "  " : content);
  }
  return out;
}

std::vector<std::vector<int32_t>> RandomIdSequences(int32_t vocab_size, const Json& document, uint64_t seed) {
  std::vector<int32_t> added;
  if (const Json* list = FindField(document, "added_tokens")) {
    for (const Json& token : *list) added.push_back(token["id"].get<int32_t>());
  }
  uint64_t state = seed;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  std::vector<std::vector<int32_t>> sequences;
  for (size_t i = 0; i < kIdSequencesPerVocabulary; ++i) {
    std::vector<int32_t> ids;
    const size_t n = 1 + next() % 24;
    for (size_t k = 0; k < n; ++k) {
      const uint64_t kind = next() % 10;
      if (kind == 0 && !added.empty()) {
        ids.push_back(added[next() % added.size()]);
      } else if (kind == 1) {
        ids.push_back(static_cast<int32_t>(next() % 300));  // single bytes, byte-fallback pieces
      } else {
        ids.push_back(static_cast<int32_t>(next() % static_cast<uint64_t>(vocab_size)));
      }
    }
    sequences.push_back(std::move(ids));
  }
  return sequences;
}

class TokenizerOracleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite() {
    delete vocabularies_;
    delete results_;
    delete dir_;
  }
  static inline std::string skip_reason_;
  static inline ScopedTempDir* dir_ = nullptr;
  static inline std::map<std::string, Vocabulary>* vocabularies_ = nullptr;
  static inline Json* results_ = nullptr;
};

void TokenizerOracleTest::SetUpTestSuite() {
  dir_ = new ScopedTempDir;
  vocabularies_ = new std::map<std::string, Vocabulary>;
  results_ = new Json;
  absl::StatusOr<fs::path> prefix = InstallNodePackages("tokenizers", dir_->path());
  if (absl::IsFailedPrecondition(prefix.status()) || absl::IsUnavailable(prefix.status())) {
    skip_reason_ = absl::StrCat("Hugging Face's tokenizers cannot run: ", prefix.status().message());
    return;
  }
  ASSERT_OK(prefix);
  const std::string node = FindOnPath("node");
  const fs::path& dir = dir_->path();
  const std::vector<std::string> base = TokenizerTestStrings(/*seed=*/50, kStringsPerVocabulary);
  for (const std::string& s : base) ASSERT_OK(CheckUtf8(s, "test string"));

  auto add = [&](const std::string& name, const Json& document, std::unique_ptr<Tokenizer> tokenizer) {
    Vocabulary v{.name = name, .json_file = dir / (name + ".json"), .tokenizer = std::move(tokenizer)};
    WriteJson(v.json_file, document);
    if (v.tokenizer == nullptr) {
      absl::StatusOr<std::unique_ptr<BpeTokenizer>> loaded = LoadTokenizerJson(v.json_file);
      ASSERT_OK(loaded) << name;
      v.tokenizer = std::move(*loaded);
    }
    v.strings = WithAddedTokens(base, document);
    v.id_sequences = RandomIdSequences(v.tokenizer->vocab_size(), document, std::hash<std::string>()(name));
    (*vocabularies_)[name] = std::move(v);
  };

  // The GGUF vocabularies: tandem reads the GGUF, HF its tokenizer.json.
  for (const char* name : {"gpt-2", "deepseek-llm", "deepseek-coder", "falcon", "mpt", "starcoder", "refact"}) {
    const fs::path gguf = VectorsDir() / absl::StrCat("ggml-vocab-", name, ".gguf");
    if (!fs::exists(gguf)) continue;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<GgufCheckpoint> checkpoint, GgufCheckpoint::Open(gguf));
    ASSERT_OK_AND_ASSIGN(Json document, TokenizerJsonFromGguf(checkpoint->metadata(), gguf.string()));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizerAt(gguf));
    add(name, document, std::move(tokenizer));
  }
  // OpenAI's vocabularies, converted by node from js-tiktoken's ranks.
  for (const char* encoding : {"o200k_base", "cl100k_base"}) {
    const fs::path file = dir / absl::StrCat(encoding, ".tiktoken.json");
    ASSERT_OK_AND_ASSIGN(ProcessResult converted,
                         RunProcess({node, (*prefix / "tiktoken_tokenizer_json.mjs").string(), encoding, file.string()},
                                    {}, *prefix, absl::Seconds(300)));
    ASSERT_EQ(converted.exit_code, 0) << converted.err;
    ASSERT_OK_AND_ASSIGN(Json document, ParseJsonText(ReadFile(file), file.string()));
    add(encoding, document, nullptr);
    if (std::string(encoding) != "cl100k_base") continue;
    add("cl100k_added_tokens", WithFlaggedAddedTokens(document), nullptr);
    // The GGUF pre-tokenizers with no vocabulary file here run on cl100k's
    // vocabulary (Qwen2's is built on it): their normalizers and regexes
    // (look-ahead, possessive quantifiers, \x{...}, CJK ranges) as HF runs them.
    for (const char* pre : {"llama-bpe", "qwen2", "deepseek-v3", "gpt-4o", "tekken", "bailingmoe"}) {
      ASSERT_OK_AND_ASSIGN(const GgufPreTokenizer pipeline, GgufPreTokenizerNamed(pre));
      Json with_pre = document;
      with_pre["normalizer"] = pipeline.normalizer;
      with_pre["pre_tokenizer"] = pipeline.pre_tokenizer;
      with_pre["model"]["ignore_merges"] = pipeline.ignore_merges;
      add(absl::StrCat("cl100k+", pre), with_pre, nullptr);
    }
  }
  // SentencePiece-style pipelines from a trained SentencePiece model.
  TokenizerTrainOptions train{.input_files = DefaultTokenizerCorpus(), .model_prefix = "oracle", .vocab_size = 2000};
  ASSERT_OK_AND_ASSIGN(const std::string proto, TrainTokenizerInMemory(train));
  auto [legacy, metaspace] = SentencePieceStyleJsons(proto);
  add("sentencepiece_legacy", legacy, nullptr);
  add("sentencepiece_metaspace", metaspace, nullptr);

  Json job = {{"tokenizers", Json::array()}};
  for (const auto& [name, v] : *vocabularies_) {
    job["tokenizers"].push_back(
        {{"name", name}, {"file", v.json_file.string()}, {"strings", v.strings}, {"id_sequences", v.id_sequences}});
  }
  WriteJson(dir / "job.json", job);
  ASSERT_OK_AND_ASSIGN(ProcessResult oracle, RunProcess({node, (*prefix / "tokenizer_oracle.mjs").string(),
                                                         (dir / "job.json").string(), (dir / "results.json").string()},
                                                        {}, *prefix, absl::Seconds(540)));
  ASSERT_EQ(oracle.exit_code, 0) << oracle.err;
  ASSERT_OK_AND_ASSIGN(*results_, ParseJsonText(ReadFile(dir / "results.json"), "results.json"));
}

std::vector<int32_t> Ids(const Json& json) { return json.get<std::vector<int32_t>>(); }

// One vocabulary's encodings and decodings against HF's; prints the counts.
void CompareWithHuggingFace(const Vocabulary& v, const Json& expected) {
  SCOPED_TRACE(v.name);
  const Tokenizer& tokenizer = *v.tokenizer;
  ASSERT_EQ(expected["encoded"].size(), v.strings.size());
  int encode_differ = 0, decode_differ = 0;
  for (size_t i = 0; i < v.strings.size(); ++i) {
    const Json& hf = expected["encoded"][i];
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> ids, tokenizer.Encode(v.strings[i], /*add_bos=*/false));
    ASSERT_OK_AND_ASSIGN(const std::vector<int32_t> with_special, tokenizer.Encode(v.strings[i], /*add_bos=*/true));
    ASSERT_OK_AND_ASSIGN(const std::string decoded, tokenizer.Decode(ids, {.skip_special_tokens = true}));
    ASSERT_OK_AND_ASSIGN(const std::string decoded_all, tokenizer.Decode(with_special, {.skip_special_tokens = false}));
    const bool encode_same = ids == Ids(hf["ids"]) && with_special == Ids(hf["with_special"]);
    const bool decode_same =
        decoded == hf["decoded"].get<std::string>() && decoded_all == hf["decoded_all"].get<std::string>();
    encode_differ += !encode_same;
    decode_differ += !decode_same;
    if (encode_differ + decode_differ <= 10) {
      EXPECT_EQ(absl::StrJoin(ids, " "), absl::StrJoin(Ids(hf["ids"]), " "))
          << v.name << " string " << i << ": \"" << v.strings[i] << "\"";
      EXPECT_EQ(absl::StrJoin(with_special, " "), absl::StrJoin(Ids(hf["with_special"]), " ")) << v.name << " " << i;
      EXPECT_EQ(decoded, hf["decoded"].get<std::string>()) << v.name << " string " << i;
      EXPECT_EQ(decoded_all, hf["decoded_all"].get<std::string>()) << v.name << " string " << i;
    }
  }
  int sequence_differ = 0;
  for (size_t i = 0; i < v.id_sequences.size(); ++i) {
    const Json& hf = expected["decoded"][i];
    ASSERT_OK_AND_ASSIGN(const std::string skip, tokenizer.Decode(v.id_sequences[i], {.skip_special_tokens = true}));
    ASSERT_OK_AND_ASSIGN(const std::string keep, tokenizer.Decode(v.id_sequences[i], {.skip_special_tokens = false}));
    const bool same = skip == hf["skip"].get<std::string>() && keep == hf["keep"].get<std::string>();
    sequence_differ += !same;
    if (!same && sequence_differ <= 5) {
      EXPECT_EQ(skip, hf["skip"].get<std::string>()) << v.name << " ids " << absl::StrJoin(v.id_sequences[i], " ");
      EXPECT_EQ(keep, hf["keep"].get<std::string>()) << v.name << " ids " << absl::StrJoin(v.id_sequences[i], " ");
    }
  }
  EXPECT_EQ(encode_differ, 0);
  EXPECT_EQ(decode_differ, 0);
  EXPECT_EQ(sequence_differ, 0);
  std::cout << v.name << ": " << v.strings.size() << " strings, " << encode_differ << " differing encodings, "
            << decode_differ << " differing decodings; " << v.id_sequences.size() << " id sequences, "
            << sequence_differ << " differing decodings\n";
}

// One test (one process) for every vocabulary: the set-up runs HF once.
TEST_F(TokenizerOracleTest, EveryVocabularyEncodesAndDecodesAsHuggingFace) {
  if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
  for (const char* name :
       {"gpt-2", "deepseek-llm", "deepseek-coder", "falcon", "mpt", "starcoder", "refact", "o200k_base", "cl100k_base",
        "cl100k_added_tokens", "cl100k+llama-bpe", "cl100k+qwen2", "cl100k+deepseek-v3", "cl100k+gpt-4o",
        "cl100k+tekken", "cl100k+bailingmoe", "sentencepiece_legacy", "sentencepiece_metaspace"}) {
    auto it = vocabularies_->find(name);
    if (it == vocabularies_->end()) {
      std::cout << name << ": skipped, its vocabulary file is not in " << VectorsDir() << "\n";
      continue;
    }
    CompareWithHuggingFace(it->second, (*results_)[name]);
  }
}

// Invalid UTF-8 (which HF's API cannot even be given) is refused naming the
// tokenizer and the byte, never tokenized into something.
TEST(TokenizerInvalidUtf8Test, IsRefusedNamingTheByte) {
  const fs::path gguf = VectorsDir() / "ggml-vocab-gpt-2.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " is not there";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizerAt(gguf));
  for (const std::string& text : InvalidUtf8Strings()) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(text, false);
    ASSERT_FALSE(ids.ok()) << text;
    EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ids.status().message().find("not valid UTF-8 at byte"), std::string::npos) << ids.status();
  }
}

}  // namespace
}  // namespace tandem
