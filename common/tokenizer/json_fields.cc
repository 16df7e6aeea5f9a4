#include "common/tokenizer/json_fields.h"

#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode_text.h"

namespace tandem {

std::string FieldPath(const std::string& where, std::string_view key) {
  return absl::StrCat(where, ".", std::string(key));
}

std::string ElementPath(const std::string& where, size_t index) { return absl::StrCat(where, "[", index, "]"); }

absl::Status JsonError(const std::string& where, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", std::string(what)));
}

const Json* FindField(const Json& object, std::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<std::string> ReadString(const Json& object, std::string_view key, const std::string& where,
                                       std::optional<std::string> absent) {
  const Json* value = FindField(object, key);
  if (value == nullptr) {
    if (absent) return *absent;
    return JsonError(FieldPath(where, key), "missing (a string is required)");
  }
  if (!value->is_string())
    return JsonError(FieldPath(where, key), absl::StrCat("expected a string, got ", value->type_name()));
  return value->get_ref<const std::string&>();
}

absl::StatusOr<bool> ReadBool(const Json& object, std::string_view key, const std::string& where,
                              std::optional<bool> absent) {
  const Json* value = FindField(object, key);
  if (value == nullptr) {
    if (absent) return *absent;
    return JsonError(FieldPath(where, key), "missing (true or false is required)");
  }
  if (!value->is_boolean())
    return JsonError(FieldPath(where, key), absl::StrCat("expected true or false, got ", value->type_name()));
  return value->get<bool>();
}

absl::StatusOr<uint64_t> ReadUnsigned(const Json& object, std::string_view key, const std::string& where, uint64_t max,
                                      std::optional<uint64_t> absent) {
  const Json* value = FindField(object, key);
  if (value == nullptr) {
    if (absent) return *absent;
    return JsonError(FieldPath(where, key), "missing (a number is required)");
  }
  // Parsed JSON holds non-negative integers as unsigned, built JSON as signed.
  if (!value->is_number_integer() || value->get<int64_t>() < 0 || value->get<uint64_t>() > max) {
    return JsonError(FieldPath(where, key), absl::StrCat("expected an integer in [0, ", max, "], got ", value->dump()));
  }
  return value->get<uint64_t>();
}

absl::StatusOr<std::string> ReadChar(const Json& object, std::string_view key, const std::string& where,
                                     std::optional<std::string> absent) {
  absl::StatusOr<std::string> text = ReadString(object, key, where, std::move(absent));
  if (!text.ok()) return text.status();
  size_t pos = 0;
  if (!CheckUtf8(*text, "").ok() || text->empty() || (NextCodePoint(*text, &pos), pos != text->size())) {
    return JsonError(FieldPath(where, key), absl::StrCat("expected one character, got \"", *text, "\""));
  }
  return text;
}

absl::StatusOr<std::string> ReadType(const Json& object, const std::string& where) {
  if (!object.is_object()) return JsonError(where, absl::StrCat("expected an object, got ", object.type_name()));
  return ReadString(object, "type", where);
}

}  // namespace tandem
