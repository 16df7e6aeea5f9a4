// Decoders: how token strings become text again, as tokenizer.json's
// "decoder" gives them. Supported: ByteLevel, ByteFallback, Metaspace, Fuse,
// Strip, Replace and Sequence; any other type is refused by name. Each is
// immutable after creation: any thread may decode with it.
//
// Two uses: Decode of a whole sequence, exactly as HF's decode_chain; and
// the text of one token in the middle of a stream (a piece), where nothing
// depends on position: ByteLevel and ByteFallback give raw bytes (a
// character may end in the next token), Metaspace turns every marker into a
// space, and a Strip after Fuse (which HF applies to the whole fused text)
// is left out.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/tokenizer/json_fields.h"

namespace tandem {

struct DecodeChainState {
  bool piece = false;  // decoding one token of a stream
  bool fused = false;  // a Fuse ran: the tokens are one text now
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Rewrites the token strings in place (HF's decode_chain). Fails only if
  // a Replace regex gives up.
  virtual absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState* state) const = 0;
};

// The decoder `json` describes: nullptr for JSON null. InvalidArgument naming
// the field for a malformed one or an unsupported type.
absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const Json& json, const std::string& where);

}  // namespace tandem
