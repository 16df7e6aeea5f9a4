#include "coordinator/generation/grammar.h"

#include <algorithm>

namespace tandem {

int32_t Grammar::AddLiterals(std::vector<std::string> literals, bool json_value) {
  std::sort(literals.begin(), literals.end());
  literals.erase(std::unique(literals.begin(), literals.end()), literals.end());
  GrammarNode n;
  n.kind = GrammarNode::Kind::kLiterals;
  n.json_value = json_value;
  n.literals = std::move(literals);
  return Add(std::move(n));
}

int32_t Grammar::AddToken(int32_t id) {
  GrammarNode n;
  n.kind = GrammarNode::Kind::kToken;
  n.token = id;
  return Add(std::move(n));
}

int32_t Grammar::AddSequence(std::vector<int32_t> parts) {
  GrammarNode n;
  n.kind = GrammarNode::Kind::kSequence;
  n.children = std::move(parts);
  return Add(std::move(n));
}

int32_t Grammar::AddAnyOf(std::vector<int32_t> alternatives) {
  GrammarNode n;
  n.kind = GrammarNode::Kind::kAnyOf;
  n.children = std::move(alternatives);
  return Add(std::move(n));
}

int32_t Grammar::AddRepeat(int32_t item, int32_t separator, int32_t min, int32_t max) {
  GrammarNode n;
  n.kind = GrammarNode::Kind::kRepeat;
  n.children = {item, separator};
  n.min = min;
  n.max = max;
  return Add(std::move(n));
}

}  // namespace tandem
