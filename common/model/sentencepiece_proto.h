// The part of SentencePiece's ModelProto (sentencepiece_model.proto) tandem
// reads and writes, in protobuf's wire format by hand: Debian ships no
// header for the proto, and a second generated copy of it would clash with
// the one inside libsentencepiece. Fields used:
//   ModelProto      1 pieces (repeated SentencePiece), 2 trainer_spec, 3 normalizer_spec
//   SentencePiece   1 piece (string), 2 score (float), 3 type (enum, below)
//   TrainerSpec     3 model_type (BPE = 2), 4 vocab_size, 35 byte_fallback,
//                   40..43 unk/bos/eos/pad id, 45..48 unk/bos/eos/pad piece
//   NormalizerSpec  1 name, 3 add_dummy_prefix, 4 remove_extra_whitespaces,
//                   5 escape_whitespaces
// Pure functions over bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// SentencePiece's piece types, numbered as the proto (and GGUF's
// tokenizer.ggml.token_type) number them.
enum class PieceType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

struct SentencePieceEntry {
  std::string piece;
  float score = 0;
  int32_t type = static_cast<int32_t>(PieceType::kNormal);
  bool operator==(const SentencePieceEntry&) const = default;
};

// What a BPE model proto needs to load and encode like the original.
struct SentencePieceBpeSpec {
  std::vector<SentencePieceEntry> pieces;
  bool byte_fallback = false;
  int32_t unk_id = 0, bos_id = -1, eos_id = -1, pad_id = -1;  // -1: none
  bool add_dummy_prefix = true;
};

// A serialized ModelProto: model_type BPE, identity normalizer without
// whitespace collapsing (Llama's), special pieces named by their ids.
std::string SerializeSentencePieceBpe(const SentencePieceBpeSpec& spec);

// The pieces of a serialized ModelProto (other fields skipped).
// InvalidArgument naming `source` for bytes that are not such a proto.
absl::StatusOr<std::vector<SentencePieceEntry>> ParseSentencePiecePieces(std::string_view proto,
                                                                         const std::string& source);

}  // namespace tandem
