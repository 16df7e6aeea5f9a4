#include "common/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/pattern.h"

namespace tandem {
namespace {

// NFC, NFD, NFKC or NFKD through ICU's UTF-8 API; text already in the form
// (most text, for NFC) is recognised without a copy.
class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(const icu::Normalizer2* normalizer, std::string name) : normalizer_(normalizer), name_(name) {}

  absl::Status Normalize(std::string* text) const override {
    UErrorCode error = U_ZERO_ERROR;
    const icu::StringPiece piece(text->data(), static_cast<int32_t>(text->size()));
    if (normalizer_->isNormalizedUTF8(piece, error) && U_SUCCESS(error)) return absl::OkStatus();
    error = U_ZERO_ERROR;
    std::string out;
    out.reserve(text->size() + text->size() / 8);
    icu::StringByteSink<std::string> sink(&out);
    normalizer_->normalizeUTF8(0, piece, sink, nullptr, error);
    if (U_FAILURE(error)) {
      return absl::InternalError(absl::StrCat(name_, " normalization failed: ", u_errorName(error)));
    }
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  const icu::Normalizer2* normalizer_;  // owned by ICU, lives for the process
  std::string name_;
};

// Puts a string in front of non-empty text.
class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  absl::Status Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prepend_);
    return absl::OkStatus();
  }

 private:
  std::string prepend_;
};

// Every match of a pattern becomes `content`.
class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status Normalize(std::string* text) const override {
    std::vector<PatternSpan> spans;
    TANDEM_RETURN_IF_ERROR(pattern_->FindMatches(*text, &spans));
    std::string out;
    out.reserve(text->size());
    for (const PatternSpan& span : spans) {
      if (span.is_match) {
        out.append(content_);
      } else {
        out.append(*text, span.begin, span.end - span.begin);
      }
    }
    *text = std::move(out);
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> normalizers)
      : normalizers_(std::move(normalizers)) {}
  absl::Status Normalize(std::string* text) const override {
    for (const auto& normalizer : normalizers_) TANDEM_RETURN_IF_ERROR(normalizer->Normalize(text));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> normalizers_;
};

absl::StatusOr<std::unique_ptr<Normalizer>> UnicodeNormalizerNamed(const std::string& type, const std::string& where) {
  UErrorCode error = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = type == "NFC"    ? icu::Normalizer2::getNFCInstance(error)
                                       : type == "NFD"  ? icu::Normalizer2::getNFDInstance(error)
                                       : type == "NFKC" ? icu::Normalizer2::getNFKCInstance(error)
                                                        : icu::Normalizer2::getNFKDInstance(error);
  if (U_FAILURE(error) || normalizer == nullptr) {
    return absl::InternalError(absl::StrCat(where, ": ICU has no ", type, " normalizer: ", u_errorName(error)));
  }
  return std::make_unique<UnicodeNormalizer>(normalizer, type);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const Json& json, const std::string& where) {
  if (json.is_null()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(const std::string type, ReadType(json, where));
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") return UnicodeNormalizerNamed(type, where);
  if (type == "Prepend") {
    TANDEM_ASSIGN_OR_RETURN(std::string prepend, ReadString(json, "prepend", where));
    return std::make_unique<PrependNormalizer>(std::move(prepend));
  }
  if (type == "Replace") {
    const Json* pattern = FindField(json, "pattern");
    if (pattern == nullptr) return JsonError(FieldPath(where, "pattern"), "missing");
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Pattern> compiled, PatternFromJson(*pattern, FieldPath(where, "pattern")));
    TANDEM_ASSIGN_OR_RETURN(std::string content, ReadString(json, "content", where));
    return std::make_unique<ReplaceNormalizer>(std::move(compiled), std::move(content));
  }
  if (type == "Sequence") {
    const Json* list = FindField(json, "normalizers");
    const std::string list_where = FieldPath(where, "normalizers");
    if (list == nullptr || !list->is_array()) return JsonError(list_where, "expected a list of normalizers");
    std::vector<std::unique_ptr<Normalizer>> normalizers;
    for (size_t i = 0; i < list->size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> normalizer,
                              NormalizerFromJson((*list)[i], ElementPath(list_where, i)));
      if (normalizer == nullptr) return JsonError(ElementPath(list_where, i), "null is not a normalizer");
      normalizers.push_back(std::move(normalizer));
    }
    return std::make_unique<SequenceNormalizer>(std::move(normalizers));
  }
  return JsonError(where, absl::StrCat("normalizer type \"", type,
                                       "\" is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, "
                                       "Sequence)"));
}

}  // namespace tandem
