#include "common/tokenizer/bpe_tokenizer.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {

absl::Status BpeTokenizer::EncodeText(TextPiece piece, std::vector<PreToken>* words, std::vector<int32_t>* ids) const {
  words->clear();
  words->push_back({std::move(piece.text), piece.at_origin});
  if (parts_.pre_tokenizer != nullptr) TANDEM_RETURN_IF_ERROR(parts_.pre_tokenizer->PreTokenize(words));
  for (const PreToken& word : *words) parts_.model.Tokenize(word.text, ids);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text, bool add_bos) const {
  TANDEM_RETURN_IF_ERROR(CheckUtf8(text, absl::StrCat(parts_.name, ": text to encode")));
  // 1. Added tokens that match the raw text; 2. the rest normalized; 3. the
  // added tokens that match normalized text; 4. each plain piece
  // pre-tokenized and encoded; 5. the post-processor's special tokens.
  std::vector<TextPiece> pieces;
  pieces.push_back({std::string(text), -1, true});
  parts_.added.Split(/*normalized=*/false, &pieces);
  if (parts_.normalizer != nullptr) {
    for (TextPiece& piece : pieces) {
      if (piece.token_id < 0) TANDEM_RETURN_IF_ERROR(parts_.normalizer->Normalize(&piece.text));
    }
  }
  parts_.added.Split(/*normalized=*/true, &pieces);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  std::vector<PreToken> words;
  for (TextPiece& piece : pieces) {
    if (piece.token_id >= 0) {
      ids.push_back(piece.token_id);
    } else {
      TANDEM_RETURN_IF_ERROR(EncodeText(std::move(piece), &words, &ids));
    }
  }
  if (parts_.post_processor != nullptr) parts_.post_processor->Process(&ids, add_bos);
  return ids;
}

const std::string* BpeTokenizer::TokenText(int32_t id) const {
  if (const AddedVocabulary::Token* token = parts_.added.Find(id)) return &parts_.added.DecodedText(*token);
  return parts_.model.IdToToken(id);
}

absl::StatusOr<std::string> BpeTokenizer::Decode(std::span<const int32_t> ids, const DecodeOptions& options) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* text = TokenText(id);
    if (text == nullptr) continue;
    if (options.skip_special_tokens && parts_.added.IsSpecialContent(*text)) continue;
    tokens.push_back(*text);
  }
  std::string out;
  if (parts_.decoder == nullptr) {
    for (size_t i = 0; i < tokens.size(); ++i) absl::StrAppend(&out, i == 0 ? "" : " ", tokens[i]);
    return out;
  }
  DecodeChainState state;
  TANDEM_RETURN_IF_ERROR(parts_.decoder->DecodeChain(&tokens, &state));
  for (const std::string& token : tokens) out.append(token);
  return out;
}

std::string BpeTokenizer::PieceText(int32_t id) const {
  const std::string* text = TokenText(id);
  if (text == nullptr || parts_.added.IsSpecialContent(*text)) return "";
  if (parts_.decoder == nullptr) return *text;
  std::vector<std::string> tokens{*text};
  DecodeChainState state{.piece = true};
  // Only a Replace decoder's regex can fail, and only on pathological
  // patterns; the token's own string is then the best there is.
  if (!parts_.decoder->DecodeChain(&tokens, &state).ok()) return *text;
  std::string out;
  for (const std::string& token : tokens) out.append(token);
  return out;
}

int32_t BpeTokenizer::vocab_size() const { return std::max(parts_.model.id_limit(), parts_.added.id_limit()); }

}  // namespace tandem
