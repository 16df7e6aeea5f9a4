#include "coordinator/generation/grammar_constraint.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// Whether `text` continues any free JSON string as it stands: no quote,
// backslash or control byte, and whole UTF-8 characters only.
bool IsPlainStringText(std::string_view text) {
  for (unsigned char c : text) {
    if (c < 0x20 || c == '"' || c == '\\') return false;
  }
  return IsWholeUtf8(text);
}

VocabularyIndex::Walk SortedWalk(const VocabularyIndex& index, std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return index.text(a) < index.text(b); });
  VocabularyIndex::Walk walk;
  walk.shared.reserve(ids.size());
  std::string_view previous;
  for (int32_t id : ids) {
    const std::string_view t = index.text(id);
    size_t n = 0;
    while (n < t.size() && n < previous.size() && t[n] == previous[n] && n < 65535) ++n;
    walk.shared.push_back(static_cast<uint16_t>(n));
    previous = t;
  }
  walk.ids = std::move(ids);
  return walk;
}

}  // namespace

std::shared_ptr<const VocabularyIndex> VocabularyIndex::Build(const Tokenizer& tokenizer, int32_t vocab_size) {
  auto index = std::make_shared<VocabularyIndex>();
  index->offsets_.reserve(static_cast<size_t>(vocab_size) + 1);
  index->offsets_.push_back(0);
  const int32_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (id < known) index->bytes_ += tokenizer.PieceText(id);
    index->offsets_.push_back(static_cast<uint32_t>(index->bytes_.size()));
  }
  index->plain_chars_.resize(static_cast<size_t>(vocab_size));
  std::vector<int32_t> with_text, not_plain;
  for (int32_t id = 0; id < vocab_size; ++id) {
    const std::string_view t = index->text(id);
    if (t.empty()) continue;
    with_text.push_back(id);
    size_t chars = 0;
    for (char c : t) chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    if (IsPlainStringText(t) && chars < 256) {
      index->plain_chars_[static_cast<size_t>(id)] = static_cast<uint8_t>(chars);
    } else {
      not_plain.push_back(id);
    }
  }
  index->all_ = SortedWalk(*index, std::move(with_text));
  index->not_plain_ = SortedWalk(*index, std::move(not_plain));
  return index;
}

GrammarConstraint::GrammarConstraint(std::shared_ptr<const TokenGrammar> grammar)
    : grammar_(std::move(grammar)), matcher_(&grammar_->grammar), state_(matcher_.Start()) {}

bool GrammarConstraint::IsEnd(int32_t id) const {
  const std::vector<int32_t>& ends = grammar_->grammar.end_ids;
  return std::find(ends.begin(), ends.end(), id) != ends.end();
}

bool GrammarConstraint::complete() const {
  for (const GrammarThread& t : state_.threads) {
    if (!t.empty()) return false;
  }
  return true;
}

int32_t GrammarConstraint::EndId() const {
  if (grammar_->grammar.end_ids.empty() || !matcher_.CanEnd(state_)) return -1;
  return grammar_->grammar.end_ids.front();
}

bool GrammarConstraint::Allows(int32_t id) const {
  const VocabularyIndex& vocab = *grammar_->vocabulary;
  if (id < 0 || id >= vocab.vocab_size()) return false;
  if (IsEnd(id)) return matcher_.CanEnd(state_);
  const std::string_view text = vocab.text(id);
  if (text.empty()) return matcher_.WaitsForToken(state_, id);
  trial_ = state_;
  return matcher_.StepText(&trial_, text, &scratch_);
}

void GrammarConstraint::MarkWalk(const VocabularyIndex::Walk& walk, std::vector<uint8_t>& allowed) {
  const VocabularyIndex& vocab = *grammar_->vocabulary;
  if (depth_states_.empty()) depth_states_.resize(1);
  depth_states_[0] = state_;
  size_t stepped = 0;  // bytes of the previous text stepped (depth_states_[0..stepped] hold)
  bool failed = false;
  for (size_t k = 0; k < walk.ids.size(); ++k) {
    const size_t shared = walk.shared[k];
    if (failed && shared > stepped) continue;  // behind the rejected prefix
    const std::string_view text = vocab.text(walk.ids[k]);
    if (depth_states_.size() < text.size() + 1) depth_states_.resize(text.size() + 1);
    failed = false;
    for (size_t j = std::min(shared, stepped); j < text.size(); ++j) {
      if (!matcher_.Step(depth_states_[j], static_cast<uint8_t>(text[j]), &depth_states_[j + 1])) {
        stepped = j;
        failed = true;
        break;
      }
    }
    if (failed) continue;
    stepped = text.size();
    allowed[static_cast<size_t>(walk.ids[k])] = 1;
  }
}

void GrammarConstraint::AllowedTokens(std::vector<uint8_t>* allowed) {
  const VocabularyIndex& vocab = *grammar_->vocabulary;
  const size_t n = static_cast<size_t>(vocab.vocab_size());
  allowed->assign(n, 0);
  if (const int32_t room = matcher_.PlainStringRoom(state_); room >= 0) {
    for (size_t id = 0; id < n; ++id) {
      const int32_t chars = vocab.plain_chars(static_cast<int32_t>(id));
      (*allowed)[id] = chars > 0 && chars <= room ? 1 : 0;
    }
    MarkWalk(vocab.not_plain(), *allowed);
  } else {
    MarkWalk(vocab.all(), *allowed);
  }
  // Special tokens: an end where the grammar may end, a marker it waits for.
  for (const GrammarThread& t : state_.threads) {
    if (t.empty()) continue;
    const GrammarNode& node = grammar_->grammar.nodes[static_cast<size_t>(t.back().node)];
    if (node.kind == GrammarNode::Kind::kToken && node.token >= 0 && static_cast<size_t>(node.token) < n) {
      (*allowed)[static_cast<size_t>(node.token)] = 1;
    }
  }
  const bool can_end = matcher_.CanEnd(state_);
  for (int32_t id : grammar_->grammar.end_ids) {
    if (id >= 0 && static_cast<size_t>(id) < n) (*allowed)[static_cast<size_t>(id)] = can_end ? 1 : 0;
  }
}

absl::Status GrammarConstraint::Accept(int32_t id) {
  const VocabularyIndex& vocab = *grammar_->vocabulary;
  if (id < 0 || id >= vocab.vocab_size()) {
    return absl::FailedPreconditionError(absl::StrCat("token ", id, " is outside the grammar's vocabulary"));
  }
  if (IsEnd(id)) {
    if (!matcher_.CanEnd(state_)) {
      return absl::FailedPreconditionError(absl::StrCat("the grammar cannot end at token ", id));
    }
    state_.threads.assign(1, GrammarThread());
    return absl::OkStatus();
  }
  const std::string_view text = vocab.text(id);
  bool ok = false;
  if (text.empty()) {
    ok = matcher_.StepToken(state_, id, &scratch_);
    if (ok) std::swap(state_, scratch_);
  } else {
    trial_ = state_;
    ok = matcher_.StepText(&trial_, text, &scratch_);
    if (ok) std::swap(state_, trial_);
  }
  if (!ok) return absl::FailedPreconditionError(absl::StrCat("token ", id, " does not follow the grammar"));
  return absl::OkStatus();
}

}  // namespace tandem
