#include "fuzz/fuzz_targets.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::fuzz {
namespace {

constexpr FuzzTarget kTargets[] = {
    {"safetensors_file", FuzzSafetensorsFile},
    {"safetensors_index", FuzzSafetensorsIndex},
    {"model_config", FuzzModelConfig},
    {"tokenizer_model", FuzzTokenizerModel},
    {"gguf_file", FuzzGgufFile},
    {"tokenizer_json", FuzzTokenizerJson},
    {"worker_request", FuzzWorkerRequest},
    {"expert_store_region", FuzzExpertStoreRegion},
    {"http_request", FuzzHttpRequestBody},
};

}  // namespace

std::span<const FuzzTarget> FuzzTargets() { return kTargets; }

absl::StatusOr<FuzzTarget> FindFuzzTarget(std::string_view name) {
  for (const FuzzTarget& target : kTargets) {
    if (target.name == name) return target;
  }
  return absl::NotFoundError(absl::StrCat("no fuzz target \"", std::string(name), "\"; known: ",
                                          absl::StrJoin(kTargets, ", ", [](std::string* out, const FuzzTarget& t) {
                                            absl::StrAppend(out, std::string(t.name));
                                          })));
}

}  // namespace tandem::fuzz
