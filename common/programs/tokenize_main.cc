// tandem-tokenize: text -> token ids and back with a model's tokenizer, loaded
// by the same code the server uses (common/model/model_tokenizer.h).
//   printf 'Hello world' | tandem-tokenize --model DIR          -> [9707, 1879]
//   tandem-tokenize --model tokenizer.json --text 'Hello' --add_special
//   echo '[9707, 1879]' | tandem-tokenize --model FILE.gguf --decode
// --model: a Hugging Face folder, a tokenizer.json or tokenizer.model, or a
// GGUF file (vocabulary-only files too). Encoding reads stdin byte for byte
// (echo adds a newline, which is text too) unless --text is given, and
// prints the ids as a JSON array, with no BOS unless --add_special. Decoding
// reads ids (a JSON array, or numbers split by commas or spaces) and prints
// the text exactly, nothing appended.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/flags_usage.h"
#include "common/base/status_macros.h"
#include "common/model/model_tokenizer.h"

ABSL_FLAG(std::string, model, "", "a model folder, tokenizer.json, tokenizer.model or .gguf file");
ABSL_FLAG(std::string, text, "", "the text to encode (default: all of stdin)");
ABSL_FLAG(bool, add_special, false, "add the special tokens the tokenizer puts around a text (BOS...)");
ABSL_FLAG(bool, decode, false, "read token ids, print their text");
ABSL_FLAG(bool, skip_special_tokens, true, "when decoding, leave special tokens (<s>, <|im_end|>...) out");

namespace {

// stdin is read up to this size: larger input is refused, never buffered.
constexpr size_t kMaxInputBytes = size_t{256} << 20;

absl::StatusOr<std::string> ReadStdin() {
  std::string input;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, stdin)) > 0) {
    if (input.size() + n > kMaxInputBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stdin holds more than ", kMaxInputBytes >> 20, " MB"));
    }
    input.append(buffer, n);
  }
  if (std::ferror(stdin)) return absl::DataLossError("cannot read stdin");
  return input;
}

// A JSON array of integers, or integers split by commas and whitespace.
absl::StatusOr<std::vector<int32_t>> ParseIdList(const std::string& input) {
  const nlohmann::json json = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  std::vector<int32_t> ids;
  if (json.is_array()) {
    for (size_t i = 0; i < json.size(); ++i) {
      if (!json[i].is_number_integer() || json[i].get<int64_t>() < INT32_MIN || json[i].get<int64_t>() > INT32_MAX) {
        return absl::InvalidArgumentError(absl::StrCat("ids[", i, "] is ", json[i].dump(), ", not a token id"));
      }
      ids.push_back(static_cast<int32_t>(json[i].get<int64_t>()));
    }
    return ids;
  }
  for (absl::string_view part : absl::StrSplit(input, absl::ByAnyChar(", \t\r\n[]"), absl::SkipEmpty())) {
    int32_t id;
    if (!absl::SimpleAtoi(part, &id)) {
      return absl::InvalidArgumentError(absl::StrCat("\"", part, "\" is not a token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

absl::Status Run() {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model.empty()) return absl::InvalidArgumentError("--model is required");
  TANDEM_ASSIGN_OR_RETURN(const std::unique_ptr<tandem::Tokenizer> tokenizer, tandem::LoadTokenizerAt(model));
  std::string input = absl::GetFlag(FLAGS_text);
  if (input.empty()) {
    TANDEM_ASSIGN_OR_RETURN(input, ReadStdin());
  }
  if (absl::GetFlag(FLAGS_decode)) {
    TANDEM_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, ParseIdList(input));
    TANDEM_ASSIGN_OR_RETURN(const std::string text,
                            tokenizer->Decode(ids, {.skip_special_tokens = absl::GetFlag(FLAGS_skip_special_tokens)}));
    std::fwrite(text.data(), 1, text.size(), stdout);
    return absl::OkStatus();
  }
  TANDEM_ASSIGN_OR_RETURN(const std::vector<int32_t> ids, tokenizer->Encode(input, absl::GetFlag(FLAGS_add_special)));
  std::cout << "[" << absl::StrJoin(ids, ", ") << "]\n";
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      "Token ids of a text, or the text of token ids, with a model's tokenizer.\n"
      "  printf 'Hello world' | tandem-tokenize --model DIR|tokenizer.json|FILE.gguf [--add_special]\n"
      "  echo '[9707, 1879]' | tandem-tokenize --model DIR --decode");
  tandem::ParseProgramFlags(argc, argv);
  if (absl::Status status = Run(); !status.ok()) {
    std::cerr << "tandem-tokenize: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
