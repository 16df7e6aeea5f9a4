#include "common/model/sentencepiece_proto.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void PutTag(std::string& out, uint32_t field, WireType type) { PutVarint(out, (uint64_t{field} << 3) | type); }
void PutInt(std::string& out, uint32_t field, int64_t v) {
  PutTag(out, field, kVarint);
  PutVarint(out, static_cast<uint64_t>(v));  // negative int32: ten bytes, as protobuf writes them
}
void PutBytes(std::string& out, uint32_t field, std::string_view bytes) {
  PutTag(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out.append(bytes);
}
void PutFloat(std::string& out, uint32_t field, float v) {
  PutTag(out, field, kFixed32);
  char bytes[4];
  std::memcpy(bytes, &v, 4);  // little-endian host, as the wire format
  out.append(bytes, 4);
}

// A cursor over one message's bytes; every read is bounds-checked.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return pos_ >= bytes_.size(); }

  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= bytes_.size()) return false;
      const uint8_t b = static_cast<uint8_t>(bytes_[pos_++]);
      *v |= uint64_t{b & 0x7fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  bool Bytes(std::string_view* out) {
    uint64_t n;
    if (!Varint(&n) || n > bytes_.size() - pos_) return false;
    *out = bytes_.substr(pos_, n);
    pos_ += n;
    return true;
  }
  bool Fixed32(uint32_t* v) {
    if (bytes_.size() - pos_ < 4) return false;
    std::memcpy(v, bytes_.data() + pos_, 4);
    pos_ += 4;
    return true;
  }
  bool Skip(uint32_t type) {
    uint64_t v;
    std::string_view s;
    uint32_t f;
    switch (type) {
      case kVarint: return Varint(&v);
      case kFixed64:
        if (bytes_.size() - pos_ < 8) return false;
        pos_ += 8;
        return true;
      case kLengthDelimited: return Bytes(&s);
      case kFixed32: return Fixed32(&f);
      default: return false;
    }
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

bool ParsePiece(std::string_view bytes, SentencePieceEntry* out) {
  WireReader r(bytes);
  while (!r.done()) {
    uint64_t tag;
    if (!r.Varint(&tag)) return false;
    const uint32_t field = static_cast<uint32_t>(tag >> 3), type = static_cast<uint32_t>(tag & 7);
    if (field == 1 && type == kLengthDelimited) {
      std::string_view s;
      if (!r.Bytes(&s)) return false;
      out->piece.assign(s);
    } else if (field == 2 && type == kFixed32) {
      uint32_t bits;
      if (!r.Fixed32(&bits)) return false;
      std::memcpy(&out->score, &bits, 4);
    } else if (field == 3 && type == kVarint) {
      uint64_t v;
      if (!r.Varint(&v)) return false;
      out->type = static_cast<int32_t>(v);
    } else if (!r.Skip(type)) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string SerializeSentencePieceBpe(const SentencePieceBpeSpec& spec) {
  std::string out;
  for (const SentencePieceEntry& p : spec.pieces) {
    std::string piece;
    PutBytes(piece, 1, p.piece);
    PutFloat(piece, 2, p.score);
    PutInt(piece, 3, p.type);
    PutBytes(out, 1, piece);
  }
  auto piece_or = [&](int32_t id, std::string_view fallback) -> std::string_view {
    return id >= 0 && static_cast<size_t>(id) < spec.pieces.size() ? std::string_view(spec.pieces[id].piece) : fallback;
  };
  std::string trainer;
  PutInt(trainer, 3, 2);  // BPE
  PutInt(trainer, 4, static_cast<int64_t>(spec.pieces.size()));
  PutInt(trainer, 35, spec.byte_fallback ? 1 : 0);
  PutInt(trainer, 40, spec.unk_id);
  PutInt(trainer, 41, spec.bos_id);
  PutInt(trainer, 42, spec.eos_id);
  PutInt(trainer, 43, spec.pad_id);
  // The processor finds its special ids by these pieces; a piece no id has
  // (the defaults) finds nothing.
  PutBytes(trainer, 45, piece_or(spec.unk_id, "<unk>"));
  PutBytes(trainer, 46, piece_or(spec.bos_id, "<s>"));
  PutBytes(trainer, 47, piece_or(spec.eos_id, "</s>"));
  PutBytes(trainer, 48, piece_or(spec.pad_id, "<pad>"));
  PutBytes(out, 2, trainer);
  std::string normalizer;
  PutBytes(normalizer, 1, "identity");
  PutInt(normalizer, 3, spec.add_dummy_prefix ? 1 : 0);
  PutInt(normalizer, 4, 0);  // keep whitespace as written, as Llama's tokenizer and llama.cpp do
  PutInt(normalizer, 5, 1);
  PutBytes(out, 3, normalizer);
  return out;
}

absl::StatusOr<std::vector<SentencePieceEntry>> ParseSentencePiecePieces(std::string_view proto,
                                                                         const std::string& source) {
  std::vector<SentencePieceEntry> pieces;
  WireReader r(proto);
  auto bad = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not a SentencePiece model (malformed protobuf after ", pieces.size(), " pieces)"));
  };
  while (!r.done()) {
    uint64_t tag;
    if (!r.Varint(&tag)) return bad();
    const uint32_t field = static_cast<uint32_t>(tag >> 3), type = static_cast<uint32_t>(tag & 7);
    if (field == 1 && type == kLengthDelimited) {
      std::string_view bytes;
      SentencePieceEntry entry;
      if (!r.Bytes(&bytes) || !ParsePiece(bytes, &entry)) return bad();
      pieces.push_back(std::move(entry));
    } else if (!r.Skip(type)) {
      return bad();
    }
  }
  if (pieces.empty()) return absl::InvalidArgumentError(absl::StrCat(source, ": SentencePiece model has no pieces"));
  return pieces;
}

}  // namespace tandem
