// What constrained decoding costs per generated token: the grammar's mask
// over the whole vocabulary (what sampling with a temperature needs), the
// one-token check greedy decoding makes first, and advancing the grammar,
// on a JSON document read token by token, for a JSON schema and for
// json_object; and building the vocabulary index once per model.
//
// The vocabulary is the union of the pieces of --vocab_files (GGUF
// vocabularies, in order, each piece once): one file for a real 32k
// vocabulary, several for a 150k one when no such file is at hand (cut at
// --max_pieces). The
// document is split into the longest pieces that match, as a model's
// tokens would be.
//
// One JSON line per (grammar, measure): mean, median and p99 microseconds.
//   tandem-structured-output-bench --vocab_files ggml-vocab-llama-spm.gguf
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "common/model/model_tokenizer.h"
#include "coordinator/generation/grammar_constraint.h"
#include "coordinator/generation/json_schema_grammar.h"

ABSL_FLAG(std::string, vocab_files, "", "GGUF vocabularies whose pieces make the vocabulary, comma-separated");
ABSL_FLAG(int, rounds, 5, "times the document is read");
ABSL_FLAG(int, max_pieces, 151936, "pieces kept at most (151936: Qwen's vocabulary)");

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// The pieces of several tokenizers as one vocabulary (id = first seen).
class UnionVocabulary : public Tokenizer {
 public:
  void AddPieces(const Tokenizer& t, size_t max_pieces) {
    for (int32_t id = 0; id < t.vocab_size() && pieces_.size() < max_pieces; ++id) {
      std::string p = t.PieceText(id);
      if (!p.empty() && seen_.emplace(p, static_cast<int32_t>(pieces_.size())).second) pieces_.push_back(p);
    }
  }
  int32_t AddEnd() {
    pieces_.push_back("");
    return static_cast<int32_t>(pieces_.size()) - 1;
  }
  // The longest piece at each position.
  std::vector<int32_t> Split(std::string_view text) const {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size();) {
      size_t best = 0;
      int32_t id = -1;
      for (size_t n = std::min<size_t>(32, text.size() - i); n > 0 && id < 0; --n) {
        auto it = seen_.find(std::string(text.substr(i, n)));
        if (it != seen_.end()) id = it->second, best = n;
      }
      if (id < 0) return {};
      ids.push_back(id);
      i += best;
    }
    return ids;
  }
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view, bool) const override { return Split(""); }
  void AddSpecialTokens(std::vector<int32_t>*) const override {}
  using Tokenizer::Decode;
  absl::StatusOr<std::string> Decode(std::span<const int32_t>, const DecodeOptions&) const override { return ""; }
  std::string PieceText(int32_t id) const override { return pieces_[static_cast<size_t>(id)]; }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return -1; }

 private:
  std::vector<std::string> pieces_;
  std::map<std::string, int32_t> seen_;
};

constexpr char kSchema[] = R"({"type": "object", "properties": {
  "city": {"type": "string"}, "country": {"type": "string", "maxLength": 60},
  "population": {"type": "integer"}, "area_km2": {"type": "number"},
  "climate": {"enum": ["arid", "temperate", "tropical", "polar", "continental"]},
  "landmarks": {"type": "array", "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "year_built": {"type": ["integer", "null"]}}, "required": ["name", "year_built"]}},
  "capital": {"type": "boolean"}},
  "required": ["city", "country", "population", "area_km2", "climate", "landmarks", "capital"],
  "additionalProperties": false})";

constexpr char kDocument[] =
    "{\"city\": \"Lisbon\", \"country\": \"Portugal\", \"population\": 545923, \"area_km2\": 100.05, "
    "\"climate\": \"temperate\", \"landmarks\": [{\"name\": \"Belém Tower\", \"year_built\": 1519}, "
    "{\"name\": \"São Jorge Castle, on the hill above the Alfama district\", \"year_built\": null}, "
    "{\"name\": \"Jerónimos Monastery\", \"year_built\": 1601}], \"capital\": true}";

void Measure(const std::string& grammar_name, std::shared_ptr<TokenGrammar> grammar, const std::vector<int32_t>& ids,
             int rounds) {
  std::map<std::string, std::vector<double>> times;
  std::vector<uint8_t> allowed;
  size_t allowed_total = 0, steps = 0;
  for (int round = 0; round < rounds; ++round) {
    GrammarConstraint c(grammar);
    for (int32_t id : ids) {
      auto t0 = Clock::now();
      c.AllowedTokens(&allowed);
      auto t1 = Clock::now();
      const bool ok = c.Allows(id);
      auto t2 = Clock::now();
      if (!ok || !allowed[static_cast<size_t>(id)]) {
        std::fprintf(stderr, "the document's token %d does not follow the grammar\n", id);
        return;
      }
      (void)c.Accept(id);
      auto t3 = Clock::now();
      times["mask"].push_back(Micros(t1 - t0));
      times["allows"].push_back(Micros(t2 - t1));
      times["accept"].push_back(Micros(t3 - t2));
      allowed_total += static_cast<size_t>(std::count(allowed.begin(), allowed.end(), 1));
      ++steps;
    }
  }
  for (auto& [measure, t] : times) {
    const Summary s = Summarise(t);
    EmitJsonLine({{"bench", "structured_output"},
                  {"grammar", grammar_name},
                  {"measure", measure},
                  {"vocab", grammar->vocabulary->vocab_size()},
                  {"tokens", ids.size()},
                  {"mean_allowed", static_cast<double>(allowed_total) / static_cast<double>(steps)},
                  {"mean_us", s.mean},
                  {"median_us", s.median},
                  {"p99_us", s.p99}});
  }
}

int Main() {
  UnionVocabulary vocab;
  std::vector<std::string> files = absl::StrSplit(absl::GetFlag(FLAGS_vocab_files), ',', absl::SkipEmpty());
  if (files.empty()) {
    std::fprintf(stderr, "tandem-structured-output-bench: give --vocab_files\n");
    return 2;
  }
  for (const std::string& f : files) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = LoadTokenizerAt(f);
    if (!t.ok()) {
      std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    vocab.AddPieces(**t, static_cast<size_t>(absl::GetFlag(FLAGS_max_pieces)));
  }
  const int32_t end = vocab.AddEnd();
  const auto t0 = Clock::now();
  std::shared_ptr<const VocabularyIndex> index = VocabularyIndex::Build(vocab, vocab.vocab_size());
  EmitJsonLine({{"bench", "structured_output"},
                {"measure", "vocabulary index build"},
                {"vocab", vocab.vocab_size()},
                {"vocab_files", absl::GetFlag(FLAGS_vocab_files)},
                {"ms", Micros(Clock::now() - t0) / 1000.0}});
  std::vector<int32_t> ids = vocab.Split(kDocument);
  if (ids.empty()) {
    std::fprintf(stderr, "the vocabulary cannot spell the document\n");
    return 1;
  }
  ids.push_back(end);
  auto schema = std::make_shared<TokenGrammar>();
  schema->vocabulary = index;
  schema->grammar.end_ids = {end};
  absl::StatusOr<int32_t> root = AddJsonSchema(Json::parse(kSchema), "schema", &schema->grammar);
  if (!root.ok()) return 1;
  schema->grammar.root = *root;
  Measure("json_schema", schema, ids, absl::GetFlag(FLAGS_rounds));
  auto object = std::make_shared<TokenGrammar>();
  object->vocabulary = index;
  object->grammar.end_ids = {end};
  object->grammar.root = AddAnyJsonObject(&object->grammar);
  Measure("json_object", object, ids, absl::GetFlag(FLAGS_rounds));
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Main();
}
