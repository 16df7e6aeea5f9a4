#include "coordinator/generation/grammar_matcher.h"

#include <algorithm>
#include <cstdint>

namespace tandem {
namespace {

using Kind = GrammarNode::Kind;

// How many Push/Done steps one byte may cause: a schema that refers to
// itself without consuming anything ({"anyOf": [{"$ref": "#"}]}) stops here.
constexpr int kMaxHops = 96;

bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// Continuation bytes after a UTF-8 lead byte; 0 for a byte that cannot lead.
int Utf8Continuations(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 1;
  if (lead >= 0xE0 && lead <= 0xEF) return 2;
  if (lead >= 0xF0 && lead <= 0xF4) return 3;
  return 0;
}

// Whether `byte` may follow: the first continuation after E0, ED, F0 and
// F4 is narrower (no overlong forms, no surrogates, nothing past U+10FFFF);
// `lead` is 0 past the first.
bool IsUtf8Continuation(uint8_t lead, uint8_t byte) {
  uint8_t lo = 0x80, hi = 0xBF;
  if (lead == 0xE0) lo = 0xA0;
  if (lead == 0xED) hi = 0x9F;
  if (lead == 0xF0) lo = 0x90;
  if (lead == 0xF4) hi = 0x8F;
  return byte >= lo && byte <= hi;
}

// Object and array phases.
enum : uint8_t {
  kOpen = 0,        // before '{' or '['
  kFirst = 1,       // after it
  kInKey = 2,       // inside a key
  kAfterKey = 3,    // before ':'
  kAfterColon = 4,  // before the value
  kAfterValue = 5,  // before ',' or the close
  kAfterComma = 6,  // before the next key
};
// Array phases reuse kOpen, kFirst, kAfterValue, kAfterComma.
// String phases.
enum : uint8_t { kStrOpen = 0, kStrBody = 1, kStrEscape = 2, kStrHex = 3 };
// Number phases; the accepting ones are kZero, kInt, kFrac and kExp.
enum : uint8_t { kNumStart, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp };

bool NumberAccepts(uint8_t phase) {
  return phase == kNumZero || phase == kNumInt || phase == kNumFrac || phase == kNumExp;
}

// Consumes a whitespace byte where JSON allows one; false when `byte` is
// not whitespace or the run may not go on. f.ws: 0 none yet, kOneSpace
// after a space, 1 + n after a newline and n indentation bytes.
constexpr uint8_t kOneSpace = 255;
bool TakeWhitespace(GrammarFrame& f, uint8_t byte) {
  if (f.ws == 0 && (byte == ' ' || byte == '\n')) {
    f.ws = byte == ' ' ? kOneSpace : 1;
    return true;
  }
  if (f.ws == kOneSpace || f.ws == 0 || (byte != ' ' && byte != '\t') || f.ws > kMaxJsonIndent) return false;
  ++f.ws;
  return true;
}

// The properties `next` may choose among: from `next` up to the first
// required one.
uint64_t KeyCandidates(const GrammarNode& n, int32_t next) {
  uint64_t mask = 0;
  for (size_t i = static_cast<size_t>(next); i < n.properties.size(); ++i) {
    mask |= uint64_t{1} << i;
    if (n.properties[i].required) break;
  }
  return mask;
}

bool RequiredFrom(const GrammarNode& n, int32_t next) {
  for (size_t i = static_cast<size_t>(next); i < n.properties.size(); ++i) {
    if (n.properties[i].required) return true;
  }
  return false;
}

// Exponent digits: 1e99 at most, so every number parses as a double.
constexpr int kMaxExponentDigits = 2;

// Free keys an object may hold.
constexpr int32_t kMaxFreeKeys = 1024;

}  // namespace

bool IsWholeUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const uint8_t lead = static_cast<uint8_t>(text[i++]);
    if (lead < 0x80) continue;
    const int due = Utf8Continuations(lead);
    if (due == 0 || i + static_cast<size_t>(due) > text.size()) return false;
    for (int k = 0; k < due; ++k) {
      if (!IsUtf8Continuation(k == 0 ? lead : 0, static_cast<uint8_t>(text[i++]))) return false;
    }
  }
  return true;
}

GrammarState GrammarMatcher::Start() const {
  GrammarState s;
  Push(GrammarThread(), g_.root, s);
  return s;
}

void GrammarMatcher::Add(GrammarThread t, GrammarState& out) {
  if (out.threads.size() >= kMaxGrammarThreads) return;
  for (const GrammarThread& have : out.threads) {
    if (have == t) return;
  }
  out.threads.push_back(std::move(t));
}

void GrammarMatcher::Push(GrammarThread t, int32_t node, GrammarState& out) const {
  thread_local int hops = 0;
  if (hops >= kMaxHops || t.size() >= kMaxGrammarDepth) return;
  ++hops;
  const GrammarNode& n = g_.nodes[static_cast<size_t>(node)];
  switch (n.kind) {
    case Kind::kAnyOf:
      for (int32_t child : n.children) Push(t, child, out);
      break;
    case Kind::kSequence:
      if (n.children.empty()) {
        Done(std::move(t), out);
      } else {
        t.push_back({.node = node});
        Push(std::move(t), n.children[0], out);
      }
      break;
    case Kind::kRepeat:
      if (n.max != 0) {
        GrammarThread more = t;
        more.push_back({.node = node});
        Push(std::move(more), n.children[0], out);
      }
      if (n.min == 0) Done(std::move(t), out);
      break;
    case Kind::kLiterals:
      t.push_back({.node = node, .a = 0, .b = static_cast<int32_t>(n.literals.size())});
      if (!n.literals.empty()) Add(std::move(t), out);
      break;
    default:
      t.push_back({.node = node});
      Add(std::move(t), out);
  }
  --hops;
}

void GrammarMatcher::Done(GrammarThread t, GrammarState& out) const {
  thread_local int hops = 0;
  if (t.empty()) return Add(std::move(t), out);
  if (hops >= kMaxHops) return;
  ++hops;
  GrammarFrame& top = t.back();
  const GrammarNode& n = g_.nodes[static_cast<size_t>(top.node)];
  switch (n.kind) {
    case Kind::kSequence:
      if (++top.phase == n.children.size()) {
        t.pop_back();
        Done(std::move(t), out);
      } else {
        const int32_t next = n.children[top.phase];
        Push(std::move(t), next, out);
      }
      break;
    case Kind::kRepeat:
      if (top.phase == 1) {  // the separator: the next item
        top.phase = 0;
        Push(std::move(t), n.children[0], out);
        break;
      }
      ++top.a;
      if (n.max == kGrammarUnbounded || top.a < n.max) {
        GrammarThread more = t;
        const int32_t separator = n.children.size() > 1 ? n.children[1] : -1;
        if (separator >= 0) more.back().phase = 1;
        Push(std::move(more), separator >= 0 ? separator : n.children[0], out);
      }
      if (top.a >= n.min) {
        t.pop_back();
        Done(std::move(t), out);
      }
      break;
    case Kind::kArray:
      ++top.a;
      top.phase = kAfterValue;
      top.ws = 0;
      Add(std::move(t), out);
      break;
    case Kind::kObject:
      if (top.phase == kInKey) {  // a free key
        top.phase = kAfterKey;
      } else {
        if (n.properties.empty()) ++top.a;
        top.phase = kAfterValue;
      }
      top.ws = 0;
      Add(std::move(t), out);
      break;
    default:
      break;  // not a container
  }
  --hops;
}

void GrammarMatcher::PushAndStep(GrammarThread t, int32_t node, uint8_t byte, GrammarState& out) const {
  GrammarState started;
  Push(std::move(t), node, started);
  for (GrammarThread& s : started.threads) StepThread(std::move(s), byte, out);
}

void GrammarMatcher::StepLiterals(GrammarThread& t, uint8_t byte, GrammarState& out) const {
  GrammarFrame& f = t.back();
  const GrammarNode& n = g_.nodes[static_cast<size_t>(f.node)];
  if (f.pos == 0 && n.json_value && TakeWhitespace(f, byte)) return Add(std::move(t), out);
  const size_t pos = f.pos;
  // Every literal in [a, b) shares the first `pos` bytes and is longer:
  // those with `byte` next are a contiguous run of them.
  auto first = n.literals.begin() + f.a, last = n.literals.begin() + f.b;
  auto lo = std::partition_point(first, last, [&](const std::string& s) { return uint8_t(s[pos]) < byte; });
  auto hi = std::partition_point(lo, last, [&](const std::string& s) { return uint8_t(s[pos]) == byte; });
  if (lo == hi) return;
  f.a = static_cast<int32_t>(lo - n.literals.begin());
  f.b = static_cast<int32_t>(hi - n.literals.begin());
  f.pos = static_cast<uint16_t>(pos + 1);
  if (n.literals[static_cast<size_t>(f.a)].size() != f.pos) return Add(std::move(t), out);
  // One literal ends here (the shortest sorts first); longer ones may go on.
  if (f.b - f.a > 1) {
    GrammarThread longer = t;
    ++longer.back().a;
    Add(std::move(longer), out);
  }
  t.pop_back();
  Done(std::move(t), out);
}

void GrammarMatcher::StepString(GrammarThread& t, uint8_t byte, GrammarState& out) const {
  GrammarFrame& f = t.back();
  const GrammarNode& n = g_.nodes[static_cast<size_t>(f.node)];
  const bool full = n.max != kGrammarUnbounded && f.a >= n.max;
  switch (f.phase) {
    case kStrOpen:
      if (TakeWhitespace(f, byte)) break;
      if (byte != '"') return;
      f.phase = kStrBody;
      break;
    case kStrBody:
      if (f.pos > 0) {  // inside a UTF-8 character
        if (!IsUtf8Continuation(static_cast<uint8_t>(f.b), byte)) return;
        f.b = 0;
        --f.pos;
        break;
      }
      if (byte == '"') {
        if (f.a < n.min) return;
        t.pop_back();
        return Done(std::move(t), out);
      }
      if (byte < 0x20 || full) return;
      if (byte == '\\') {
        f.phase = kStrEscape;
        break;
      }
      if (byte >= 0x80) {
        const int due = Utf8Continuations(byte);
        if (due == 0) return;
        f.pos = static_cast<uint16_t>(due);
        f.b = byte;  // the lead byte bounds the next one
      }
      ++f.a;
      break;
    case kStrEscape:
      if (byte == 'u') {
        f.phase = kStrHex;
        f.b = 4;
        break;
      }
      if (byte != '"' && byte != '\\' && byte != '/' && byte != 'b' && byte != 'f' && byte != 'n' && byte != 'r' &&
          byte != 't') {
        return;
      }
      ++f.a;
      f.phase = kStrBody;
      break;
    case kStrHex:
      if (!IsHex(byte)) return;
      if (--f.b == 0) {
        ++f.a;
        f.phase = kStrBody;
      }
      break;
    default:
      return;
  }
  Add(std::move(t), out);
}

void GrammarMatcher::StepNumber(GrammarThread& t, uint8_t byte, GrammarState& out) const {
  GrammarFrame& f = t.back();
  const bool integer = g_.nodes[static_cast<size_t>(f.node)].integer;
  const uint8_t phase = f.phase;
  int next = -1;
  if (phase == kNumStart && TakeWhitespace(f, byte)) return Add(std::move(t), out);
  switch (phase) {
    case kNumStart:
      next = byte == '-' ? kNumMinus : byte == '0' ? kNumZero : IsDigit(byte) ? kNumInt : -1;
      break;
    case kNumMinus: next = byte == '0' ? kNumZero : IsDigit(byte) ? kNumInt : -1; break;
    case kNumZero:
    case kNumInt:
      if (phase == kNumInt && IsDigit(byte)) next = kNumInt;
      if (!integer && byte == '.') next = kNumDot;
      if (!integer && (byte == 'e' || byte == 'E')) next = kNumE;
      break;
    case kNumDot: next = IsDigit(byte) ? kNumFrac : -1; break;
    case kNumFrac: next = IsDigit(byte) ? kNumFrac : (byte == 'e' || byte == 'E') ? kNumE : -1; break;
    case kNumE: next = (byte == '+' || byte == '-') ? kNumESign : IsDigit(byte) ? kNumExp : -1; break;
    case kNumESign:
    case kNumExp: next = IsDigit(byte) ? kNumExp : -1; break;
  }
  if (next >= 0) {
    if (++f.a > kMaxNumberChars) return;
    if (next == kNumExp && ++f.b > kMaxExponentDigits) return;
    f.phase = static_cast<uint8_t>(next);
    return Add(std::move(t), out);
  }
  if (!NumberAccepts(phase)) return;
  // The number ended before this byte: it belongs to what follows.
  t.pop_back();
  GrammarState after;
  Done(std::move(t), after);
  for (GrammarThread& s : after.threads) StepThread(std::move(s), byte, out);
}

void GrammarMatcher::StepArray(GrammarThread& t, uint8_t byte, GrammarState& out) const {
  GrammarFrame& f = t.back();
  const GrammarNode& n = g_.nodes[static_cast<size_t>(f.node)];
  const bool room = n.max == kGrammarUnbounded || f.a < n.max;
  if (TakeWhitespace(f, byte)) return Add(std::move(t), out);
  f.ws = 0;
  switch (f.phase) {
    case kOpen:
      if (byte != '[') return;
      f.phase = kFirst;
      return Add(std::move(t), out);
    case kFirst:
      if (byte == ']') {
        if (n.min > 0) return;
        t.pop_back();
        return Done(std::move(t), out);
      }
      if (!room) return;
      return PushAndStep(std::move(t), n.items, byte, out);
    case kAfterValue:
      if (byte == ',' && room) {
        f.phase = kAfterComma;
        return Add(std::move(t), out);
      }
      if (byte == ']' && f.a >= n.min) {
        t.pop_back();
        return Done(std::move(t), out);
      }
      return;
    case kAfterComma:
      return PushAndStep(std::move(t), n.items, byte, out);
  }
}

void GrammarMatcher::StartKey(GrammarThread& t, uint8_t byte, GrammarState& out) const {
  GrammarFrame& f = t.back();
  const GrammarNode& n = g_.nodes[static_cast<size_t>(f.node)];
  if (byte != '"') return;
  f.phase = kInKey;
  if (n.properties.empty()) return PushAndStep(std::move(t), n.items, byte, out);
  f.mask = KeyCandidates(n, f.a);
  f.pos = 1;
  if (f.mask != 0) Add(std::move(t), out);
}

void GrammarMatcher::StepObject(GrammarThread& t, uint8_t byte, GrammarState& out) const {
  GrammarFrame& f = t.back();
  const GrammarNode& n = g_.nodes[static_cast<size_t>(f.node)];
  const bool free = n.properties.empty();
  if (f.phase != kInKey && TakeWhitespace(f, byte)) return Add(std::move(t), out);
  f.ws = 0;
  const bool can_close = free || !RequiredFrom(n, f.a);
  const bool more_keys =
      free ? f.a < kMaxFreeKeys : static_cast<size_t>(f.a) < n.properties.size();
  switch (f.phase) {
    case kOpen:
      if (byte != '{') return;
      f.phase = kFirst;
      return Add(std::move(t), out);
    case kFirst:
      if (byte == '}' && can_close) {
        t.pop_back();
        return Done(std::move(t), out);
      }
      return StartKey(t, byte, out);
    case kInKey: {
      uint64_t kept = 0;
      int32_t chosen = -1;
      for (uint64_t m = f.mask; m != 0; m &= m - 1) {
        const int i = __builtin_ctzll(m);
        const std::string& key = n.properties[static_cast<size_t>(i)].key;
        if (key.size() <= f.pos || uint8_t(key[f.pos]) != byte) continue;
        kept |= uint64_t{1} << i;
        if (key.size() == f.pos + 1u) chosen = i;
      }
      if (kept == 0) return;
      f.mask = kept;
      ++f.pos;
      if (chosen >= 0) {
        f.b = chosen;
        f.a = chosen + 1;
        f.phase = kAfterKey;
      }
      return Add(std::move(t), out);
    }
    case kAfterKey:
      if (byte != ':') return;
      f.phase = kAfterColon;
      return Add(std::move(t), out);
    case kAfterColon: {
      const int32_t value = free ? n.free_value : n.properties[static_cast<size_t>(f.b)].value;
      return PushAndStep(std::move(t), value, byte, out);
    }
    case kAfterValue:
      if (byte == ',' && more_keys) {
        f.phase = kAfterComma;
        return Add(std::move(t), out);
      }
      if (byte == '}' && can_close) {
        t.pop_back();
        return Done(std::move(t), out);
      }
      return;
    case kAfterComma:
      return StartKey(t, byte, out);
  }
}

void GrammarMatcher::StepThread(GrammarThread t, uint8_t byte, GrammarState& out) const {
  if (t.empty()) return;  // complete: nothing more
  switch (g_.nodes[static_cast<size_t>(t.back().node)].kind) {
    case Kind::kLiterals: return StepLiterals(t, byte, out);
    case Kind::kString: return StepString(t, byte, out);
    case Kind::kNumber: return StepNumber(t, byte, out);
    case Kind::kArray: return StepArray(t, byte, out);
    case Kind::kObject: return StepObject(t, byte, out);
    default: return;  // a special token, or a container between parts
  }
}

bool GrammarMatcher::Step(const GrammarState& in, uint8_t byte, GrammarState* out) const {
  out->threads.clear();
  for (const GrammarThread& t : in.threads) StepThread(t, byte, *out);
  return !out->threads.empty();
}

bool GrammarMatcher::StepText(GrammarState* state, std::string_view text, GrammarState* scratch) const {
  for (char c : text) {
    if (!Step(*state, static_cast<uint8_t>(c), scratch)) return false;
    std::swap(*state, *scratch);
  }
  return true;
}

bool GrammarMatcher::StepToken(const GrammarState& in, int32_t id, GrammarState* out) const {
  out->threads.clear();
  for (const GrammarThread& t : in.threads) {
    if (t.empty()) continue;
    const GrammarNode& n = g_.nodes[static_cast<size_t>(t.back().node)];
    if (n.kind != Kind::kToken || n.token != id) continue;
    GrammarThread next = t;
    next.pop_back();
    Done(std::move(next), *out);
  }
  return !out->threads.empty();
}

bool GrammarMatcher::CanEnd(const GrammarState& state) const {
  for (const GrammarThread& t : state.threads) {
    if (t.empty()) return true;
    const GrammarFrame& top = t.back();
    if (g_.nodes[static_cast<size_t>(top.node)].kind != Kind::kNumber || !NumberAccepts(top.phase)) continue;
    GrammarThread ended = t;
    ended.pop_back();
    GrammarState after;
    Done(std::move(ended), after);
    for (const GrammarThread& a : after.threads) {
      if (a.empty()) return true;
    }
  }
  return false;
}

int32_t GrammarMatcher::PlainStringRoom(const GrammarState& state) const {
  if (state.threads.empty()) return -1;
  int32_t room = INT32_MAX;
  for (const GrammarThread& t : state.threads) {
    if (t.empty()) return -1;
    const GrammarFrame& f = t.back();
    const GrammarNode& n = g_.nodes[static_cast<size_t>(f.node)];
    if (n.kind != Kind::kString || f.phase != kStrBody || f.pos != 0) return -1;
    if (n.max != kGrammarUnbounded) room = std::min(room, n.max - f.a);
  }
  return room;
}

bool GrammarMatcher::WaitsForToken(const GrammarState& state, int32_t id) const {
  for (const GrammarThread& t : state.threads) {
    if (t.empty()) continue;
    const GrammarNode& n = g_.nodes[static_cast<size_t>(t.back().node)];
    if (n.kind == Kind::kToken && n.token == id) return true;
  }
  return false;
}

}  // namespace tandem
