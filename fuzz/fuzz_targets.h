// The parsing entry points tandem's fuzzers drive (fuzz/fuzzer_main.cc), one
// per kind of untrusted input, as functions over bytes: the libFuzzer
// binaries call them, and tests/fuzz_regressions_test.cc replays every input
// kept under fuzz/regressions/<target>/ through exactly the same path.
//
// Each returns the status of the first step that refused the bytes (OK when
// every step accepted them); the point of fuzzing them is that it never
// crashes, hangs, reads out of bounds or allocates without bound instead.
// Where the real API takes a path, the bytes go to a file in a private
// temporary folder of this process (FuzzScratchDir). Not thread-safe: one
// caller at a time (libFuzzer runs one input at a time).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/safetensors.h"

namespace tandem::fuzz {

using FuzzBytes = std::span<const uint8_t>;

// One safetensors file (SafetensorsFile::Open): header length, JSON header, tensors.
absl::Status FuzzSafetensorsFile(FuzzBytes bytes);
// model.safetensors.index.json in a folder holding the valid two-shard
// checkpoint of IndexFolderTensors (SafetensorsCheckpoint::Open).
absl::Status FuzzSafetensorsIndex(FuzzBytes bytes);
std::vector<TensorToWrite> IndexFolderTensors();
inline constexpr int kIndexFolderShards = 2;
// config.json (ParseModelConfig, which validates).
absl::Status FuzzModelConfig(FuzzBytes bytes);
// tokenizer.model: ParseSentencePiecePieces, then SentencePieceTokenizer::FromModelProto
// and an encode / decode round of a fixed text.
absl::Status FuzzTokenizerModel(FuzzBytes bytes);
// One .gguf file: GgufCheckpoint::Open (mapping + ParseGguf), then the
// model config and the tokenizer read from its metadata.
absl::Status FuzzGgufFile(FuzzBytes bytes);
// tokenizer.json: ParseTokenizerJson (JSON, every component, the BPE model,
// added tokens), then the encode / decode / PieceText round of
// tokenizer_model and a decode keeping special tokens.
absl::Status FuzzTokenizerJson(FuzzBytes bytes);
// A serialized tandem.v1.RunExpertsRequest handed to WorkerService::Run of an
// echo worker with a shm arena (so inline rows and arena descriptors are both
// resolved); the session is set to the one holding the worker, and the
// request id's low bit picks the doorbell or the gRPC path.
absl::Status FuzzWorkerRequest(FuzzBytes bytes);
// A request body of the OpenAI HTTP API: parsed under the JSON limits, read
// as a completions and a chat request, the chat's messages and tools
// through a chat template (fuzz/http_targets.cc).
absl::Status FuzzHttpRequestBody(FuzzBytes bytes);
// An expert store region (IndexExpertStoreRegion) at a page-aligned address,
// then every indexed matrix's first and last byte read.
absl::Status FuzzExpertStoreRegion(FuzzBytes bytes);

struct FuzzTarget {
  std::string_view name;  // the folder name under fuzz/corpus/ and fuzz/regressions/
  absl::Status (*run)(FuzzBytes bytes);
};
std::span<const FuzzTarget> FuzzTargets();
// NotFound listing the known names.
absl::StatusOr<FuzzTarget> FindFuzzTarget(std::string_view name);

}  // namespace tandem::fuzz
