#include "common/tokenizer/post_processor.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem {
namespace {

// The single-sequence template: a list of pieces, each the text ($A) or the
// ids of a special token.
class TemplatePostProcessor final : public PostProcessor {
 public:
  struct Piece {
    bool is_sequence = false;
    std::vector<int32_t> ids;  // a special token's ids
  };
  explicit TemplatePostProcessor(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  void Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    if (!add_special_tokens) return;
    std::vector<int32_t> out;
    out.reserve(ids->size() + pieces_.size());
    for (const Piece& piece : pieces_) {
      if (piece.is_sequence) {
        out.insert(out.end(), ids->begin(), ids->end());
      } else {
        out.insert(out.end(), piece.ids.begin(), piece.ids.end());
      }
    }
    *ids = std::move(out);
  }
  int32_t LeadingId() const override {
    return !pieces_.empty() && !pieces_[0].is_sequence && pieces_[0].ids.size() == 1 ? pieces_[0].ids[0] : -1;
  }

 private:
  std::vector<Piece> pieces_;
};

// Adds nothing to the ids (HF's ByteLevel post-processor trims offsets only).
class NoOpPostProcessor final : public PostProcessor {
 public:
  void Process(std::vector<int32_t>*, bool) const override {}
};

class SequencePostProcessor final : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void Process(std::vector<int32_t>* ids, bool add_special_tokens) const override {
    for (const auto& step : steps_) step->Process(ids, add_special_tokens);
  }
  int32_t LeadingId() const override {
    for (const auto& step : steps_) {
      if (step->LeadingId() >= 0) return step->LeadingId();
    }
    return -1;
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> TemplateFromJson(const Json& json, const std::string& where,
                                                                int64_t id_limit) {
  const Json* single = FindField(json, "single");
  const std::string single_where = FieldPath(where, "single");
  if (single == nullptr || !single->is_array()) return JsonError(single_where, "expected a list of template pieces");
  const Json* special_tokens = FindField(json, "special_tokens");
  const std::string tokens_where = FieldPath(where, "special_tokens");
  if (special_tokens != nullptr && !special_tokens->is_object()) return JsonError(tokens_where, "expected an object");
  std::vector<TemplatePostProcessor::Piece> pieces;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& entry = (*single)[i];
    const std::string entry_where = ElementPath(single_where, i);
    if (FindField(entry, "Sequence") != nullptr) {
      pieces.push_back({.is_sequence = true});
      continue;
    }
    const Json* special = FindField(entry, "SpecialToken");
    if (special == nullptr) return JsonError(entry_where, "expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    TANDEM_ASSIGN_OR_RETURN(const std::string name, ReadString(*special, "id", FieldPath(entry_where, "SpecialToken")));
    const Json* token = special_tokens != nullptr ? FindField(*special_tokens, name) : nullptr;
    if (token == nullptr) return JsonError(tokens_where, absl::StrCat("no entry for \"", name, "\""));
    const std::string token_where = FieldPath(tokens_where, name);
    const Json* ids = FindField(*token, "ids");
    if (ids == nullptr || !ids->is_array()) return JsonError(FieldPath(token_where, "ids"), "expected a list of ids");
    TemplatePostProcessor::Piece piece;
    for (size_t k = 0; k < ids->size(); ++k) {
      const Json& id = (*ids)[k];
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= id_limit) {
        return JsonError(ElementPath(FieldPath(token_where, "ids"), k),
                         absl::StrCat(id.dump(), " is not a token id of this vocabulary [0, ", id_limit, ")"));
      }
      piece.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    pieces.push_back(std::move(piece));
  }
  return std::make_unique<TemplatePostProcessor>(std::move(pieces));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessorFromJson(const Json& json, const std::string& where,
                                                                     int64_t id_limit) {
  if (json.is_null()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(const std::string type, ReadType(json, where));
  if (type == "TemplateProcessing") return TemplateFromJson(json, where, id_limit);
  if (type == "ByteLevel") return std::make_unique<NoOpPostProcessor>();
  if (type == "Sequence") {
    const Json* list = FindField(json, "processors");
    const std::string list_where = FieldPath(where, "processors");
    if (list == nullptr || !list->is_array()) return JsonError(list_where, "expected a list of post-processors");
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (size_t i = 0; i < list->size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<PostProcessor> step,
                              PostProcessorFromJson((*list)[i], ElementPath(list_where, i), id_limit));
      if (step == nullptr) return JsonError(ElementPath(list_where, i), "null is not a post-processor");
      steps.push_back(std::move(step));
    }
    return std::make_unique<SequencePostProcessor>(std::move(steps));
  }
  return JsonError(where, absl::StrCat("post-processor type \"", type,
                                       "\" is not supported (supported: TemplateProcessing, ByteLevel, Sequence)"));
}

std::unique_ptr<PostProcessor> BosEosPostProcessor(int32_t bos_id, int32_t eos_id) {
  std::vector<TemplatePostProcessor::Piece> pieces;
  if (bos_id >= 0) pieces.push_back({.ids = {bos_id}});
  pieces.push_back({.is_sequence = true});
  if (eos_id >= 0) pieces.push_back({.ids = {eos_id}});
  return std::make_unique<TemplatePostProcessor>(std::move(pieces));
}

}  // namespace tandem
