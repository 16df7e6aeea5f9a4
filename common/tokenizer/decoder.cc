#include "common/tokenizer/decoder.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {
namespace {

constexpr char kReplacementCharacter[] = "\xEF\xBF\xBD";  // U+FFFD

// Byte-level characters back to bytes; a token holding any character outside
// the alphabet (an added token's plain text) keeps its own bytes. The whole
// sequence becomes one text, made valid UTF-8 as Rust's from_utf8_lossy does.
class ByteLevelDecoder final : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState* state) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& token : *tokens) {
      token_bytes.clear();
      bool in_alphabet = true;
      for (size_t pos = 0; pos < token.size() && in_alphabet;) {
        const int byte = ByteLevelByte(NextCodePoint(token, &pos));
        if (byte < 0) {
          in_alphabet = false;
        } else {
          token_bytes.push_back(static_cast<char>(byte));
        }
      }
      bytes.append(in_alphabet ? token_bytes : token);
    }
    tokens->assign(1, state->piece ? std::move(bytes) : Utf8Lossy(bytes));
    return absl::OkStatus();
  }
};

// The byte of a "<0xNN>" token (Rust's u8::from_str_radix, which takes a
// leading '+'), or -1.
int FallbackByte(std::string_view token) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token.back() != '>') return -1;
  std::string_view hex = token.substr(3, 2);
  if (hex[0] == '+') hex.remove_prefix(1);
  int value = 0;
  for (char c : hex) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// Runs of <0xNN> tokens become the text they spell, or one U+FFFD per byte
// when that is not valid UTF-8.
class ByteFallbackDecoder final : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState* state) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (state->piece || CheckUtf8(pending, "").ok()) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementCharacter);
      }
      pending.clear();
    };
    for (std::string& token : *tokens) {
      const int byte = FallbackByte(token);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        continue;
      }
      flush();
      out.push_back(std::move(token));
    }
    flush();
    *tokens = std::move(out);
    return absl::OkStatus();
  }
};

enum class PrependScheme { kFirst, kNever, kAlways };

// The replacement character ("▁") back to spaces; the first token's markers
// vanish unless the scheme is "never" (they were prepended).
class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, PrependScheme scheme)
      : replacement_(std::move(replacement)), scheme_(scheme) {}
  absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState* state) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      const bool drop = i == 0 && !state->piece && scheme_ != PrependScheme::kNever;
      std::string& token = (*tokens)[i];
      std::string out;
      out.reserve(token.size());
      for (size_t at = 0; at < token.size();) {
        if (token.compare(at, replacement_.size(), replacement_) == 0) {
          if (!drop) out.push_back(' ');
          at += replacement_.size();
        } else {
          out.push_back(token[at++]);
        }
      }
      token = std::move(out);
    }
    return absl::OkStatus();
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
};

class FuseDecoder final : public Decoder {
 public:
  absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState* state) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined.append(token);
    tokens->assign(1, std::move(joined));
    state->fused = true;
    return absl::OkStatus();
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters of
// each token.
class StripDecoder final : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop) : content_(content), start_(start), stop_(stop) {}
  absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState* state) const override {
    if (state->piece && state->fused) return absl::OkStatus();
    for (std::string& token : *tokens) {
      std::vector<size_t> starts;  // byte offset of each character
      for (size_t pos = 0; pos < token.size();) {
        starts.push_back(pos);
        pos += Utf8SequenceLength(static_cast<uint8_t>(token[pos]));
      }
      const size_t chars = starts.size();
      auto char_at = [&](size_t i) {
        size_t pos = starts[i];
        return NextCodePoint(token, &pos);
      };
      size_t start_cut = 0;
      for (size_t i = 0; i < std::min(start_, chars) && char_at(i) == content_; ++i) start_cut = i + 1;
      size_t stop_cut = chars;
      for (size_t i = 0; i < std::min(stop_, chars) && char_at(chars - i - 1) == content_; ++i)
        stop_cut = chars - i - 1;
      if (stop_cut < start_cut) stop_cut = start_cut;
      const size_t begin = start_cut < chars ? starts[start_cut] : token.size();
      const size_t end = stop_cut < chars ? starts[stop_cut] : token.size();
      token = token.substr(begin, end - begin);
    }
    return absl::OkStatus();
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(std::unique_ptr<Pattern> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState*) const override {
    std::vector<PatternSpan> spans;
    for (std::string& token : *tokens) {
      TANDEM_RETURN_IF_ERROR(pattern_->FindMatches(token, &spans));
      std::string out;
      for (const PatternSpan& span : spans) {
        if (span.is_match) {
          out.append(content_);
        } else {
          out.append(token, span.begin, span.end - span.begin);
        }
      }
      token = std::move(out);
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<Pattern> pattern_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> decoders) : decoders_(std::move(decoders)) {}
  absl::Status DecodeChain(std::vector<std::string>* tokens, DecodeChainState* state) const override {
    for (const auto& decoder : decoders_) TANDEM_RETURN_IF_ERROR(decoder->DecodeChain(tokens, state));
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Decoder>> decoders_;
};

absl::StatusOr<std::unique_ptr<Decoder>> MetaspaceFromJson(const Json& json, const std::string& where) {
  TANDEM_ASSIGN_OR_RETURN(std::string replacement, ReadChar(json, "replacement", where));
  TANDEM_ASSIGN_OR_RETURN(const std::string scheme_name, ReadString(json, "prepend_scheme", where, "always"));
  PrependScheme scheme;
  if (scheme_name == "first") {
    scheme = PrependScheme::kFirst;
  } else if (scheme_name == "never") {
    scheme = PrependScheme::kNever;
  } else if (scheme_name == "always") {
    scheme = PrependScheme::kAlways;
  } else {
    return JsonError(FieldPath(where, "prepend_scheme"),
                     absl::StrCat("\"", scheme_name, "\" is not first, never or always"));
  }
  if (const Json* add = FindField(json, "add_prefix_space"); add != nullptr && add->is_boolean() && !add->get<bool>()) {
    scheme = PrependScheme::kNever;
  }
  return std::make_unique<MetaspaceDecoder>(std::move(replacement), scheme);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const Json& json, const std::string& where) {
  if (json.is_null()) return nullptr;
  TANDEM_ASSIGN_OR_RETURN(const std::string type, ReadType(json, where));
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Metaspace") return MetaspaceFromJson(json, where);
  if (type == "Strip") {
    TANDEM_ASSIGN_OR_RETURN(const std::string content, ReadChar(json, "content", where));
    TANDEM_ASSIGN_OR_RETURN(const uint64_t start, ReadUnsigned(json, "start", where, 1 << 20));
    TANDEM_ASSIGN_OR_RETURN(const uint64_t stop, ReadUnsigned(json, "stop", where, 1 << 20));
    size_t pos = 0;
    return std::make_unique<StripDecoder>(NextCodePoint(content, &pos), start, stop);
  }
  if (type == "Replace") {
    const Json* pattern = FindField(json, "pattern");
    if (pattern == nullptr) return JsonError(FieldPath(where, "pattern"), "missing");
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Pattern> compiled, PatternFromJson(*pattern, FieldPath(where, "pattern")));
    TANDEM_ASSIGN_OR_RETURN(std::string content, ReadString(json, "content", where));
    return std::make_unique<ReplaceDecoder>(std::move(compiled), std::move(content));
  }
  if (type == "Sequence") {
    const Json* list = FindField(json, "decoders");
    const std::string list_where = FieldPath(where, "decoders");
    if (list == nullptr || !list->is_array()) return JsonError(list_where, "expected a list of decoders");
    std::vector<std::unique_ptr<Decoder>> decoders;
    for (size_t i = 0; i < list->size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Decoder> decoder,
                              DecoderFromJson((*list)[i], ElementPath(list_where, i)));
      if (decoder == nullptr) return JsonError(ElementPath(list_where, i), "null is not a decoder");
      decoders.push_back(std::move(decoder));
    }
    return std::make_unique<SequenceDecoder>(std::move(decoders));
  }
  return JsonError(where, absl::StrCat("decoder type \"", type,
                                       "\" is not supported (supported: ByteLevel, ByteFallback, Metaspace, Fuse, "
                                       "Strip, Replace, Sequence)"));
}

}  // namespace tandem
