// A grammar an output must follow, compiled into nodes: JSON values shaped
// by a JSON schema (json_schema_grammar.h), literal text, special tokens,
// sequences, alternatives and bounded repetition (a tool call's markup
// around its JSON arguments). GrammarMatcher walks it byte by byte;
// GrammarConstraint turns that into a mask over the vocabulary.
//
// Immutable once built: any thread may read it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

inline constexpr int32_t kGrammarUnbounded = -1;

struct GrammarProperty {
  std::string key;  // as it is written: JSON-encoded, with its quotes
  int32_t value = -1;
  bool required = false;
};

struct GrammarNode {
  enum class Kind : uint8_t {
    kLiterals,  // one of `literals` (sorted, distinct), byte for byte
    kToken,     // the special token `token` (it has no text to match)
    kString,    // a JSON string of [min, max] characters
    kNumber,    // a JSON number (`integer`: no fraction, no exponent)
    kObject,    // a JSON object: `properties` in order, or free keys of `free_value`
    kArray,     // a JSON array of [min, max] `items`
    kAnyOf,     // one of `children`
    kSequence,  // `children` one after the other
    kRepeat,    // children[0] [min, max] times, children[1] (if any) between
  };
  Kind kind = Kind::kSequence;
  bool json_value = false;  // kLiterals: a JSON value (whitespace may lead)
  bool integer = false;     // kNumber
  int32_t min = 0;          // kString: characters; kArray, kRepeat: items
  int32_t max = kGrammarUnbounded;
  int32_t token = -1;        // kToken
  int32_t items = -1;        // kArray: its items; kObject without properties: its keys (a kString)
  int32_t free_value = -1;   // kObject without properties: the value of every key
  std::vector<std::string> literals;
  std::vector<GrammarProperty> properties;  // kObject
  std::vector<int32_t> children;
};

struct Grammar {
  std::vector<GrammarNode> nodes;
  int32_t root = -1;
  // What may end the output once the grammar is complete (the model's end
  // of sequence and stop ids); nothing else can end it.
  std::vector<int32_t> end_ids;

  int32_t Add(GrammarNode node) {
    nodes.push_back(std::move(node));
    return static_cast<int32_t>(nodes.size()) - 1;
  }
  // Literal text (sorted and deduplicated here).
  int32_t AddLiterals(std::vector<std::string> literals, bool json_value);
  int32_t AddLiteral(std::string text) { return AddLiterals({std::move(text)}, false); }
  int32_t AddToken(int32_t id);
  int32_t AddSequence(std::vector<int32_t> parts);
  int32_t AddAnyOf(std::vector<int32_t> alternatives);
  int32_t AddRepeat(int32_t item, int32_t separator, int32_t min, int32_t max);
};

}  // namespace tandem
