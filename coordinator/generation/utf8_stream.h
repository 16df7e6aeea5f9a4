// Token pieces are bytes, not text: a byte-fallback tokenizer spells a
// character outside its vocabulary as several <0xNN> pieces, so one token's
// piece can end in the middle of a UTF-8 sequence. Protobuf `string` fields
// (and every client) need valid UTF-8, so the streamed text holds back an
// incomplete sequence until the next piece completes it, and replaces bytes
// that can never form a character with U+FFFD.
#pragma once

#include <string>
#include <string_view>

namespace tandem {

// Valid UTF-8 for `bytes`: each invalid byte (or truncated sequence) becomes U+FFFD.
std::string SanitizeUtf8(std::string_view bytes);

// One stream's assembler; one thread at a time.
class Utf8Stream {
 public:
  // The complete characters available after appending `bytes`; an
  // incomplete trailing sequence (at most 3 bytes) is kept for later.
  std::string Push(std::string_view bytes);
  // What is held back, sanitized (the stream ends).
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace tandem
