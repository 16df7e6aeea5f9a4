// Where an output stands in a Grammar, advanced byte by byte (and by special
// token): a set of threads, each a stack of frames, one per way the bytes so
// far can still be read (anyOf alternatives, an enum literal that may go on,
// a repetition that may end). A byte no thread can take is rejected and
// leaves the state unchanged.
//
// GrammarState is a value (copied to try a token and drop it); the matcher
// functions are const and hold no state: any thread may call them.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "coordinator/generation/grammar.h"

namespace tandem {

// Deeper nesting (objects in arrays in objects...) is not generated.
inline constexpr size_t kMaxGrammarDepth = 48;
// Parallel readings kept at once; more (a schema of many overlapping
// anyOf alternatives) are dropped, the first kept.
inline constexpr size_t kMaxGrammarThreads = 32;
// Whitespace between JSON tokens, as llama.cpp's JSON grammar allows it:
// one space, or a newline and at most this much indentation (spaces,
// tabs). Pretty-printing, not an endless run of padding.
inline constexpr int kMaxJsonIndent = 20;
// Digits in one JSON number.
inline constexpr int kMaxNumberChars = 40;

// Whether `text` is whole, well-formed UTF-8 (no overlong form, surrogate
// or code point past U+10FFFF): what a JSON string may hold.
bool IsWholeUtf8(std::string_view text);

struct GrammarFrame {
  int32_t node = 0;
  uint8_t phase = 0;
  uint8_t ws = 0;    // the whitespace run: none, a space, or a newline and its indentation
  uint16_t pos = 0;  // literal or key byte; UTF-8 continuation bytes still due
  int32_t a = 0;     // literal range start; items, characters, next property
  int32_t b = 0;     // literal range end; \u digits due; the chosen property
  uint64_t mask = 0;  // key candidates
  bool operator==(const GrammarFrame&) const = default;
};

// Empty thread: the grammar is complete on it.
using GrammarThread = absl::InlinedVector<GrammarFrame, 8>;
struct GrammarState {
  absl::InlinedVector<GrammarThread, 2> threads;
  bool operator==(const GrammarState&) const = default;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(const Grammar* grammar) : g_(*grammar) {}

  // The state before any output.
  GrammarState Start() const;
  // `in` advanced by `byte` into `out` (cleared first); false when no
  // thread takes it.
  bool Step(const GrammarState& in, uint8_t byte, GrammarState* out) const;
  // `state` advanced by every byte of `text`; false (state undefined) when
  // one is rejected.
  bool StepText(GrammarState* state, std::string_view text, GrammarState* scratch) const;
  // Advanced by the special token `id`; false when no thread waits for it.
  bool StepToken(const GrammarState& in, int32_t id, GrammarState* out) const;
  // Whether the output may end here.
  bool CanEnd(const GrammarState& state) const;
  // When every thread is inside a JSON string with no character half
  // written (any text without a quote, backslash or control byte that is
  // whole UTF-8 continues it, up to the string's length bound): how many
  // characters more it may take (INT32_MAX: unbounded). -1 otherwise.
  int32_t PlainStringRoom(const GrammarState& state) const;
  // Whether a thread waits for the special token `id`.
  bool WaitsForToken(const GrammarState& state, int32_t id) const;

 private:
  void Push(GrammarThread t, int32_t node, GrammarState& out) const;
  void Done(GrammarThread t, GrammarState& out) const;
  void StepThread(GrammarThread t, uint8_t byte, GrammarState& out) const;
  void StepLiterals(GrammarThread& t, uint8_t byte, GrammarState& out) const;
  void StepString(GrammarThread& t, uint8_t byte, GrammarState& out) const;
  void StepNumber(GrammarThread& t, uint8_t byte, GrammarState& out) const;
  void StepArray(GrammarThread& t, uint8_t byte, GrammarState& out) const;
  void StepObject(GrammarThread& t, uint8_t byte, GrammarState& out) const;
  void StartKey(GrammarThread& t, uint8_t byte, GrammarState& out) const;
  void PushAndStep(GrammarThread t, int32_t node, uint8_t byte, GrammarState& out) const;
  static void Add(GrammarThread t, GrammarState& out);

  const Grammar& g_;
};

}  // namespace tandem
