#include "coordinator/serving/http/bounded_json.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

// nlohmann's SAX events into a tree, as its own DOM parser builds one, with
// the limits checked at every event. The parser itself keeps its nesting on
// a heap stack, not the call stack; returning false stops it at once.
class BoundedBuilder {
 public:
  BoundedBuilder(Json& root, const JsonLimits& limits) : root_(root), limits_(limits) {}

  bool null() { return Value(nullptr); }
  bool boolean(bool v) { return Value(v); }
  bool number_integer(Json::number_integer_t v) { return Value(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return Value(v); }
  bool number_float(Json::number_float_t v, const Json::string_t&) { return Value(v); }
  bool string(Json::string_t& v) {
    string_bytes_ += static_cast<int64_t>(v.size());
    return Value(std::move(v));
  }
  bool binary(Json::binary_t&) { return Fail(absl::InvalidArgumentError("binary values are not JSON")); }

  bool start_object(std::size_t) { return Open(Json::value_t::object); }
  bool key(Json::string_t& k) {
    if (++keys_.back() > limits_.max_object_keys) {
      return Fail(
          absl::InvalidArgumentError(absl::StrCat("an object has more than ", limits_.max_object_keys, " keys")));
    }
    string_bytes_ += static_cast<int64_t>(k.size());
    object_element_ = &(*open_.back())[k];
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(std::size_t) { return Open(Json::value_t::array); }
  bool end_array() { return Close(); }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("is not valid JSON (at byte ", position, ")")));
  }

  const absl::Status& status() const { return status_; }
  int64_t values() const { return values_; }
  int64_t string_bytes() const { return string_bytes_; }

 private:
  bool Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
    return false;
  }

  bool Count() {
    if (++values_ > limits_.max_values) {
      return Fail(absl::OutOfRangeError(absl::StrCat("holds more than ", limits_.max_values, " JSON values")));
    }
    return true;
  }

  // Where the next value goes: the root, the end of the open array, or the
  // slot key() made in the open object.
  template <typename V>
  Json* Place(V&& v) {
    if (open_.empty()) {
      root_ = Json(std::forward<V>(v));
      return &root_;
    }
    Json& parent = *open_.back();
    if (parent.is_array()) {
      parent.emplace_back(std::forward<V>(v));
      return &parent.back();
    }
    *object_element_ = Json(std::forward<V>(v));
    return object_element_;
  }

  template <typename V>
  bool Value(V&& v) {
    if (!Count()) return false;
    Place(std::forward<V>(v));
    return true;
  }

  bool Open(Json::value_t type) {
    if (static_cast<int>(open_.size()) >= limits_.max_depth) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("nests arrays and objects deeper than ", limits_.max_depth, " levels")));
    }
    if (!Count()) return false;
    // Pointers to open containers stay valid: nothing is added to a parent
    // while one of its children is open.
    open_.push_back(Place(Json(type)));
    keys_.push_back(0);
    return true;
  }

  bool Close() {
    open_.pop_back();
    keys_.pop_back();
    return true;
  }

  Json& root_;
  const JsonLimits& limits_;
  std::vector<Json*> open_;
  std::vector<int64_t> keys_;  // keys of each open object so far
  Json* object_element_ = nullptr;
  int64_t values_ = 0;
  int64_t string_bytes_ = 0;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<ParsedJson> ParseBoundedJson(absl::string_view text, const JsonLimits& limits, absl::string_view what) {
  ParsedJson out;
  BoundedBuilder builder(out.value, limits);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &builder, nlohmann::detail::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok || !builder.status().ok()) {
    const absl::Status& s = builder.status();
    if (s.ok()) return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is not valid JSON"));
    return absl::Status(s.code(), absl::StrCat(std::string(what), " ", s.message()));
  }
  out.values = builder.values();
  out.estimated_bytes = out.values * kJsonBytesPerValue + builder.string_bytes();
  return out;
}

}  // namespace tandem
