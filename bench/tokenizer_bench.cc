// What tokenizing a long prompt costs on the request path: tandem's tokenizer
// beside Hugging Face's tokenizers (the Rust library through its Node
// binding, tests/node/tokenizer_bench.mjs) on the same machine and the same
// ~1 MB of mixed text (prose, code, CJK, other scripts, numbers, emoji:
// tests/tokenizer_strings_testlib.h), rounds alternating tandem / HF.
//
// Per model and round one JSON line per implementation (seconds, MB/s,
// tokens), then a summary line: medians, HF's time over tandem's, and
// whether both gave the same ids.
//   tandem-tokenizer-bench --models FILE.gguf,DIR,tokenizer.json --rounds 5
// --node_prefix is a folder holding node_modules/tokenizers (build/node once
// tokenizer_oracle_test has run: it installs tests/node's packages there).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_stats.h"
#include "bench/json_lines.h"
#include "common/base/status_macros.h"
#include "common/gguf/gguf_checkpoint.h"
#include "common/model/gguf_tokenizer.h"
#include "common/model/model_tokenizer.h"
#include "tests/tokenizer_strings_testlib.h"

ABSL_FLAG(std::string, models, "", "comma-separated tokenizers: GGUF files, model folders or tokenizer.json files");
ABSL_FLAG(int64_t, text_bytes, 1 << 20, "bytes of generated mixed text to tokenize");
ABSL_FLAG(std::string, text, "", "tokenize this file instead of generated text");
ABSL_FLAG(int, rounds, 5, "timed rounds per implementation, alternating");
ABSL_FLAG(std::string, node_prefix, "", "folder with node_modules/tokenizers (default: build/node beside bin/)");
ABSL_FLAG(bool, hf, true, "time Hugging Face's tokenizers too (needs node)");

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

fs::path DefaultNodePrefix() {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  return exe.parent_path().parent_path() / "node";
}

// The tokenizer.json HF reads for `model`: the file, a folder's, or the one a
// GGUF vocabulary stands for (written to `scratch`).
absl::StatusOr<fs::path> HfTokenizerJson(const fs::path& model, const fs::path& scratch) {
  if (fs::is_directory(model)) return model / "tokenizer.json";
  if (model.extension() != ".gguf") return model;
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<GgufCheckpoint> checkpoint, GgufCheckpoint::Open(model));
  TANDEM_ASSIGN_OR_RETURN(const Json document, TokenizerJsonFromGguf(checkpoint->metadata(), model.string()));
  const fs::path out = scratch / (model.stem().string() + ".tokenizer.json");
  std::ofstream(out) << document.dump();
  return out;
}

// One round of HF through node: its seconds and ids.
absl::StatusOr<std::pair<double, std::vector<int32_t>>> RunHf(const fs::path& prefix, const fs::path& json,
                                                              const fs::path& text, const fs::path& scratch) {
  const fs::path ids_file = scratch / "hf_ids.json";
  const std::string command =
      absl::StrCat("cd ", Quote(prefix.string()), " && node tokenizer_bench.mjs ", Quote(json.string()), " ",
                   Quote(text.string()), " 1 ", Quote(ids_file.string()));
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError("cannot start node");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  if (const int status = pclose(pipe); status != 0) {
    return absl::InternalError(absl::StrCat("node tokenizer_bench.mjs failed (", status, "): ", out));
  }
  const Json result = Json::parse(out, nullptr, false);
  const Json ids = Json::parse(ReadFile(ids_file), nullptr, false);
  if (!result.is_object() || !ids.is_array()) return absl::InternalError(absl::StrCat("unexpected node output: ", out));
  return std::make_pair(result["seconds"][0].get<double>(), ids.get<std::vector<int32_t>>());
}

absl::Status BenchModel(const fs::path& model, const std::string& text, const fs::path& text_file,
                        const fs::path& scratch, const fs::path& node_prefix, bool hf) {
  TANDEM_ASSIGN_OR_RETURN(const std::unique_ptr<Tokenizer> tokenizer, LoadTokenizerAt(model));
  fs::path json;
  if (hf) {
    TANDEM_ASSIGN_OR_RETURN(json, HfTokenizerJson(model, scratch));
  }
  TANDEM_RETURN_IF_ERROR(tokenizer->Encode(text.substr(0, 4096), false).status());  // warm up
  std::vector<double> tandem_seconds, hf_seconds;
  std::vector<int32_t> tandem_ids, hf_ids;
  const double mb = static_cast<double>(text.size()) / 1e6;
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    const auto start = std::chrono::steady_clock::now();
    TANDEM_ASSIGN_OR_RETURN(tandem_ids, tokenizer->Encode(text, false));
    tandem_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    EmitJsonLine({{"bench", "tokenizer"},
                  {"model", model.string()},
                  {"impl", "tandem"},
                  {"round", round},
                  {"bytes", text.size()},
                  {"tokens", tandem_ids.size()},
                  {"seconds", tandem_seconds.back()},
                  {"mb_per_s", mb / tandem_seconds.back()}});
    if (!hf) continue;
    TANDEM_ASSIGN_OR_RETURN(auto hf_round, RunHf(node_prefix, json, text_file, scratch));
    hf_seconds.push_back(hf_round.first);
    hf_ids = std::move(hf_round.second);
    EmitJsonLine({{"bench", "tokenizer"},
                  {"model", model.string()},
                  {"impl", "hf-tokenizers-node"},
                  {"round", round},
                  {"bytes", text.size()},
                  {"tokens", hf_ids.size()},
                  {"seconds", hf_seconds.back()},
                  {"mb_per_s", mb / hf_seconds.back()}});
  }
  const Summary ours = Summarise(tandem_seconds), theirs = Summarise(hf_seconds);
  Json summary = {{"bench", "tokenizer"},
                  {"model", model.string()},
                  {"summary", true},
                  {"bytes", text.size()},
                  {"tokens", tandem_ids.size()},
                  {"tandem_median_s", ours.median},
                  {"tandem_mb_per_s", mb / ours.median}};
  if (hf) {
    summary["hf_median_s"] = theirs.median;
    summary["hf_mb_per_s"] = mb / theirs.median;
    summary["hf_over_tandem"] = theirs.median / ours.median;
    summary["same_ids"] = hf_ids == tandem_ids;
  }
  EmitJsonLine(summary);
  return absl::OkStatus();
}

int Main() {
  const std::vector<std::string> models = absl::StrSplit(absl::GetFlag(FLAGS_models), ',', absl::SkipEmpty());
  if (models.empty() || absl::GetFlag(FLAGS_rounds) < 1) {
    std::fprintf(stderr, "tandem-tokenizer-bench: give --models and --rounds >= 1\n");
    return 2;
  }
  const bool hf = absl::GetFlag(FLAGS_hf);
  const fs::path node_prefix =
      absl::GetFlag(FLAGS_node_prefix).empty() ? DefaultNodePrefix() : fs::path(absl::GetFlag(FLAGS_node_prefix));
  if (hf && !fs::exists(node_prefix / "node_modules" / "tokenizers" / "package.json")) {
    std::fprintf(stderr,
                 "tandem-tokenizer-bench: no node_modules/tokenizers in %s: run tokenizer_oracle_test once (it "
                 "installs tests/node's packages there) or pass --node_prefix, or --hf=false\n",
                 node_prefix.c_str());
    return 2;
  }
  if (hf) {
    fs::copy_file(fs::path(TANDEM_SOURCE_DIR) / "tests" / "node" / "tokenizer_bench.mjs",
                  node_prefix / "tokenizer_bench.mjs", fs::copy_options::overwrite_existing);
  }
  std::string pattern = (fs::temp_directory_path() / "tokenizer_bench_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) return 2;
  const fs::path scratch = pattern;
  const std::string text = absl::GetFlag(FLAGS_text).empty()
                               ? MixedText(static_cast<size_t>(absl::GetFlag(FLAGS_text_bytes)), /*seed=*/1)
                               : ReadFile(absl::GetFlag(FLAGS_text));
  const fs::path text_file = scratch / "text.txt";
  std::ofstream(text_file, std::ios::binary) << text;
  int failures = 0;
  for (const std::string& model : models) {
    if (absl::Status status = BenchModel(model, text, text_file, scratch, node_prefix, hf); !status.ok()) {
      std::fprintf(stderr, "tandem-tokenizer-bench: %s: %s\n", model.c_str(), std::string(status.message()).c_str());
      ++failures;
    }
  }
  fs::remove_all(scratch);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::Main();
}
