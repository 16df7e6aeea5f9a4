// tandem-make-model: write a synthetic Hugging Face-layout model folder.
//   tandem-make-model --preset demo --out models/demo
//   tandem-make-model --preset mixtral-8x7b --layers 2 --shards 4 --out models/mixtral-2l
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "common/base/dtype.h"
#include "common/base/flags_usage.h"
#include "common/base/thread_pool.h"
#include "common/model/synthetic_model.h"

ABSL_FLAG(std::string, preset, "tiny", "a preset from the list above (docs/models.md describes each)");
ABSL_FLAG(int64_t, layers, 0, "number of layers; 0 = the preset's own");
ABSL_FLAG(int64_t, vocab_size, 0,
          "vocabulary size; 0 = the preset's own (a Qwen preset's 151936 is past its synthetic tokenizer's 32000 "
          "pieces: --vocab_size 32000 makes every id decodable, for comparisons with other engines)");
ABSL_FLAG(uint64_t, seed, 0, "weights are a pure function of this seed");
ABSL_FLAG(std::string, out, "", "output directory");
ABSL_FLAG(int32_t, shards, 1, "number of safetensors shards (>1 writes model.safetensors.index.json)");
ABSL_FLAG(std::string, dtype, "BF16", "BF16 | F16 | F32");
ABSL_FLAG(bool, tokenizer, true, "train tokenizer.model on /usr/share/common-licenses");
ABSL_FLAG(int32_t, threads, 0, "generation threads; 0 = all available cores");

int main(int argc, char** argv) {
  tandem::SetProgramUsage(
      absl::StrCat("Write a synthetic model. Presets: ", absl::StrJoin(tandem::SyntheticPresets(), ", ")));
  tandem::ParseProgramFlags(argc, argv);
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::fprintf(stderr, "tandem-make-model: --out is required (the model directory to write)\n");
    return 1;
  }
  auto dtype = tandem::ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) {
    std::fprintf(stderr, "tandem-make-model: --dtype: %s\n", std::string(dtype.status().message()).c_str());
    return 1;
  }
  tandem::SyntheticModelSpec spec{.preset = absl::GetFlag(FLAGS_preset),
                                  .num_layers = absl::GetFlag(FLAGS_layers),
                                  .vocab_size = absl::GetFlag(FLAGS_vocab_size),
                                  .seed = absl::GetFlag(FLAGS_seed),
                                  .dtype = *dtype};
  const int threads = absl::GetFlag(FLAGS_threads);
  tandem::WriteSyntheticOptions options{.num_shards = absl::GetFlag(FLAGS_shards),
                                        .with_tokenizer = absl::GetFlag(FLAGS_tokenizer),
                                        .num_threads = threads > 0 ? threads : tandem::AvailableCores()};
  absl::Status status = tandem::WriteSyntheticModel(spec, absl::GetFlag(FLAGS_out), options);
  if (!status.ok()) {
    std::fprintf(stderr, "tandem-make-model: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
