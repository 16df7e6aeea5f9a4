#include "common/gguf/gguf_metadata.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status GgufMetadata::Add(std::string key, GgufValue value) {
  if (key.empty())
    return absl::InvalidArgumentError(absl::StrCat(source_, ": metadata key ", entries_.size(), " is empty"));
  if (index_.contains(key)) {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": metadata key \"", key, "\" appears twice"));
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
  return absl::OkStatus();
}

void GgufMetadata::Set(std::string key, GgufValue value) {
  if (auto it = index_.find(key); it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(key, entries_.size());
  entries_.emplace_back(std::move(key), std::move(value));
}

void GgufMetadata::Erase(absl::string_view key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
}

const GgufValue* GgufMetadata::Find(absl::string_view key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

absl::StatusOr<const GgufValue*> GgufMetadata::FindOrNotFound(absl::string_view key) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return absl::NotFoundError(absl::StrCat(source_, ": metadata key \"", key, "\" is missing"));
  return value;
}

absl::Status GgufMetadata::WrongType(absl::string_view key, const GgufValue& value, absl::string_view wanted) const {
  std::string got = GgufValueTypeName(value.type());
  if (const GgufArray* array = value.As<GgufArray>()) {
    absl::StrAppend(&got, " of ", GgufValueTypeName(array->element_type()));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(source_, ": metadata key \"", key, "\" is ", got, " ", value.DebugString(), ", expected ", wanted));
}

absl::StatusOr<std::string> GgufMetadata::GetString(absl::string_view key) const {
  auto value = FindOrNotFound(key);
  if (!value.ok()) return value.status();
  if (const std::string* s = (*value)->As<std::string>()) return *s;
  return WrongType(key, **value, "a string");
}

absl::StatusOr<int64_t> GgufMetadata::GetInteger(absl::string_view key) const {
  auto value = FindOrNotFound(key);
  if (!value.ok()) return value.status();
  int64_t v;
  if ((*value)->AsInt64(&v)) return v;
  return WrongType(key, **value, "an integer");
}

absl::StatusOr<double> GgufMetadata::GetFloat(absl::string_view key) const {
  auto value = FindOrNotFound(key);
  if (!value.ok()) return value.status();
  double v;
  if ((*value)->AsDouble(&v)) return v;
  return WrongType(key, **value, "a float");
}

absl::StatusOr<bool> GgufMetadata::GetBool(absl::string_view key) const {
  auto value = FindOrNotFound(key);
  if (!value.ok()) return value.status();
  if (const bool* b = (*value)->As<bool>()) return *b;
  return WrongType(key, **value, "a bool");
}

absl::StatusOr<const GgufArray*> GgufMetadata::GetArray(absl::string_view key, GgufValueType element_type) const {
  auto value = FindOrNotFound(key);
  if (!value.ok()) return value.status();
  const GgufArray* array = (*value)->As<GgufArray>();
  if (array == nullptr || array->element_type() != element_type) {
    return WrongType(key, **value, absl::StrCat("an array of ", GgufValueTypeName(element_type)));
  }
  return array;
}

}  // namespace tandem
