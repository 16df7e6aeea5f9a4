// Python string formatting: printf-style `%` (the % operator and the format
// filter) and str.format's braces, for the conversions templates use.
#include <cmath>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/chat/jinja_builtins.h"
#include "common/chat/unicode.h"

namespace tandem::jinja {
namespace {

struct Spec {
  char fill = ' ';
  char align = '\0';  // '<', '>', '^', '=' or none
  char sign = '-';    // '-', '+' or ' '
  bool alternate = false;
  bool zero = false;
  int64_t width = -1;
  int64_t precision = -1;
  char type = '\0';
};

std::string Pad(const std::string& text, const Spec& spec, char default_align) {
  const auto length = static_cast<int64_t>(CodePointCount(text));
  if (spec.width <= length) return text;
  const int64_t pad = spec.width - length;
  const char align = spec.align != '\0' ? spec.align : default_align;
  const std::string fill(1, spec.fill);
  std::string out;
  if (align == '<') {
    out = text;
    for (int64_t i = 0; i < pad; ++i) out += fill;
  } else if (align == '^') {
    for (int64_t i = 0; i < pad / 2; ++i) out += fill;
    out += text;
    for (int64_t i = 0; i < pad - pad / 2; ++i) out += fill;
  } else if (align == '=' && !text.empty() && (text[0] == '-' || text[0] == '+' || text[0] == ' ')) {
    out = text.substr(0, 1);
    for (int64_t i = 0; i < pad; ++i) out += fill;
    out += text.substr(1);
  } else {
    for (int64_t i = 0; i < pad; ++i) out += fill;
    out += text;
  }
  return out;
}

// A number through snprintf with the spec's sign, '#', precision and type.
absl::StatusOr<std::string> FormatNumber(const Value& value, const Spec& spec, char type) {
  std::string flags;
  if (spec.sign == '+' || spec.sign == ' ') flags.push_back(spec.sign);
  if (spec.alternate) flags.push_back('#');
  char buf[512];
  switch (type) {
    case 'd':
    case 'i':
    case 'u': {
      if (!value.is_number()) {
        return absl::InvalidArgumentError(absl::StrCat("%d format: a real number is required, not ", value.TypeName()));
      }
      const double d = value.as_float();
      if (value.is_float() && (!std::isfinite(d) || std::fabs(d) >= 9.2e18)) {
        return absl::InvalidArgumentError("cannot convert float to integer");
      }
      const long long i = value.is_float() ? static_cast<long long>(d) : value.as_int();
      std::snprintf(buf, sizeof(buf), ("%" + flags + "lld").c_str(), i);
      return std::string(buf);
    }
    case 'x':
    case 'X':
    case 'o':
    case 'b': {
      if (!value.is_int() && !value.is_bool()) {
        return absl::InvalidArgumentError(
            absl::StrCat("%", std::string(1, type), " format: an integer is required, not ", value.TypeName()));
      }
      const int64_t i = value.as_int();
      const uint64_t magnitude = i < 0 ? -static_cast<uint64_t>(i) : static_cast<uint64_t>(i);
      std::string digits;
      const unsigned base = type == 'o' ? 8 : type == 'b' ? 2 : 16;
      for (uint64_t m = magnitude; digits.empty() || m > 0; m /= base) {
        digits.insert(digits.begin(), "0123456789abcdef"[m % base]);
      }
      if (type == 'X') digits = absl::AsciiStrToUpper(digits);
      std::string prefix = i < 0 ? "-" : (spec.sign == '+' ? "+" : spec.sign == ' ' ? " " : "");
      if (spec.alternate) prefix += type == 'o' ? "0o" : type == 'b' ? "0b" : (type == 'X' ? "0X" : "0x");
      return prefix + digits;
    }
    case 'f':
    case 'F':
    case 'e':
    case 'E':
    case 'g':
    case 'G':
    case '%': {
      if (!value.is_number()) {
        return absl::InvalidArgumentError(absl::StrCat("must be real number, not ", value.TypeName()));
      }
      double d = value.as_float();
      char conversion = type;
      std::string suffix;
      if (type == '%') {
        d *= 100;
        conversion = 'f';
        suffix = "%";
      }
      const int precision = spec.precision >= 0 ? static_cast<int>(std::min<int64_t>(spec.precision, 100)) : 6;
      std::snprintf(buf, sizeof(buf), ("%" + flags + ".*" + std::string(1, conversion)).c_str(), precision, d);
      return std::string(buf) + suffix;
    }
    case 'c': {
      std::string out;
      if (value.is_string() && CodePointCount(value.as_string()) == 1) return value.as_string();
      if (!value.is_int()) return absl::InvalidArgumentError("%c requires int or char");
      if (value.as_int() < 0 || value.as_int() > 0x10FFFF)
        return absl::InvalidArgumentError("%c arg not in range(0x110000)");
      AppendUtf8(&out, static_cast<char32_t>(value.as_int()));
      return out;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("unsupported format character '", std::string(1, type), "'"));
  }
}

std::string Truncate(const std::string& text, int64_t precision) {
  if (precision < 0) return text;
  const std::vector<size_t> offsets = CodePointOffsets(text);
  if (static_cast<size_t>(precision) + 1 >= offsets.size()) return text;
  return text.substr(0, offsets[precision]);
}

absl::StatusOr<std::string> ApplySpec(const Value& value, Spec spec) {
  if (spec.zero && spec.align == '\0') {
    spec.fill = '0';
    spec.align = '=';
  }
  const char type = spec.type;
  if (type == '\0' || type == 's') {
    if (type == 's' || value.is_string() || !value.is_number()) {
      return Pad(Truncate(value.is_string() ? value.as_string() : Str(value), spec.precision), spec, '<');
    }
    // A number with no type: str() unless a precision asks for 'g'-like output.
    if (spec.precision < 0 && spec.sign == '-') return Pad(Str(value), spec, '>');
    TANDEM_ASSIGN_OR_RETURN(std::string text, FormatNumber(value, spec, value.is_float() ? 'g' : 'd'));
    return Pad(text, spec, '>');
  }
  TANDEM_ASSIGN_OR_RETURN(std::string text, FormatNumber(value, spec, type == 'n' ? 'g' : type));
  return Pad(text, spec, '>');
}

// str.format's spec mini-language: [[fill]align][sign][#][0][width][.precision][type].
absl::StatusOr<Spec> ParseBraceSpec(absl::string_view s) {
  Spec spec;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = s[i++];
  if (i < s.size() && s[i] == '#') {
    spec.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    spec.zero = true;
    ++i;
  }
  size_t start = i;
  while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
  if (i > start && !absl::SimpleAtoi(s.substr(start, i - start), &spec.width))
    return absl::InvalidArgumentError("width too big");
  if (i < s.size() && s[i] == '.') {
    start = ++i;
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
    if (i == start || !absl::SimpleAtoi(s.substr(start, i - start), &spec.precision)) {
      return absl::InvalidArgumentError("Format specifier missing precision");
    }
  }
  if (i < s.size()) spec.type = s[i++];
  if (i != s.size()) return absl::InvalidArgumentError(absl::StrCat("Invalid format specifier '", s, "'"));
  if (spec.width > (int64_t{1} << 20)) return absl::InvalidArgumentError("format width too big");
  return spec;
}

}  // namespace

absl::StatusOr<Value> FormatPercent(Interpreter& interpreter, const std::string& format, const Value& args) {
  const bool mapping = args.is_dict();
  ValueList positional;
  if (args.is_tuple()) {
    positional = args.as_list();
  } else if (!mapping) {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out.push_back(format[i]);
      continue;
    }
    if (++i >= format.size()) return absl::InvalidArgumentError("incomplete format");
    const Value* value = nullptr;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos) return absl::InvalidArgumentError("incomplete format key");
      if (!mapping) return absl::InvalidArgumentError("format requires a mapping");
      value = args.as_dict().Find(absl::string_view(format).substr(i + 1, close - i - 1));
      if (value == nullptr)
        return absl::InvalidArgumentError(absl::StrCat("KeyError: '", format.substr(i + 1, close - i - 1), "'"));
      i = close + 1;
    }
    Spec spec;
    for (; i < format.size(); ++i) {
      const char c = format[i];
      if (c == '-') {
        spec.align = '<';
      } else if (c == '+' || c == ' ') {
        spec.sign = c;
      } else if (c == '#') {
        spec.alternate = true;
      } else if (c == '0') {
        spec.zero = true;
      } else {
        break;
      }
    }
    size_t start = i;
    while (i < format.size() && absl::ascii_isdigit(format[i])) ++i;
    if (i > start) (void)absl::SimpleAtoi(absl::string_view(format).substr(start, i - start), &spec.width);
    if (i < format.size() && format[i] == '.') {
      start = ++i;
      while (i < format.size() && absl::ascii_isdigit(format[i])) ++i;
      spec.precision = 0;
      if (i > start) (void)absl::SimpleAtoi(absl::string_view(format).substr(start, i - start), &spec.precision);
    }
    while (i < format.size() && (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) ++i;
    if (i >= format.size()) return absl::InvalidArgumentError("incomplete format");
    if (spec.width > (int64_t{1} << 20)) return absl::InvalidArgumentError("format width too big");
    const char conversion = format[i];
    if (conversion == '%') {
      out.push_back('%');
      continue;
    }
    if (value == nullptr) {
      if (mapping) {
        value = &args;
      } else {
        if (next >= positional.size()) return absl::InvalidArgumentError("not enough arguments for format string");
        value = &positional[next++];
      }
    }
    if (spec.zero && spec.align != '<') {
      spec.fill = '0';
      spec.align = '=';
    }
    std::string text;
    if (conversion == 's') {
      text = Pad(Truncate(Str(*value), spec.precision), spec, '>');
    } else if (conversion == 'r' || conversion == 'a') {
      text = Pad(Truncate(Repr(*value), spec.precision), spec, '>');
    } else {
      TANDEM_ASSIGN_OR_RETURN(std::string number, FormatNumber(*value, spec, conversion));
      text = Pad(number, spec, '>');
    }
    out += text;
    TANDEM_RETURN_IF_ERROR(interpreter.CheckString(out.size()));
  }
  if (!mapping && next < positional.size()) {
    return absl::InvalidArgumentError("not all arguments converted during string formatting");
  }
  return interpreter.NewString(std::move(out));
}

absl::StatusOr<Value> FormatBraces(Interpreter& interpreter, const std::string& format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return absl::InvalidArgumentError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos) return absl::InvalidArgumentError("Single '{' encountered in format string");
    absl::string_view field = absl::string_view(format).substr(i + 1, close - i - 1);
    i = close;
    absl::string_view spec_text;
    if (const size_t colon = field.find(':'); colon != absl::string_view::npos) {
      spec_text = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    char conversion = '\0';
    if (const size_t bang = field.find('!'); bang != absl::string_view::npos) {
      if (bang + 2 != field.size()) return absl::InvalidArgumentError("expected ':' after conversion specifier");
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    // The argument: a name or index, then .attr and [key] parts.
    size_t name_end = 0;
    while (name_end < field.size() && field[name_end] != '.' && field[name_end] != '[') ++name_end;
    const absl::string_view name = field.substr(0, name_end);
    Value value;
    size_t index = 0;
    if (name.empty()) {
      index = auto_index++;
    }
    if (name.empty() || absl::SimpleAtoi(name, &index)) {
      if (index >= args.positional.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("Replacement index ", index, " out of range for positional args tuple"));
      }
      value = args.positional[index];
    } else {
      bool found = false;
      for (const auto& [key, v] : args.keyword) {
        if (key == name) {
          value = v;
          found = true;
        }
      }
      if (!found) return absl::InvalidArgumentError(absl::StrCat("KeyError: '", name, "'"));
    }
    for (size_t p = name_end; p < field.size();) {
      if (field[p] == '.') {
        size_t q = p + 1;
        while (q < field.size() && field[q] != '.' && field[q] != '[') ++q;
        TANDEM_ASSIGN_OR_RETURN(value, GetAttribute(interpreter, value, std::string(field.substr(p + 1, q - p - 1))));
        p = q;
      } else {
        const size_t q = field.find(']', p);
        if (q == absl::string_view::npos) return absl::InvalidArgumentError("Missing ']' in format string");
        const absl::string_view key = field.substr(p + 1, q - p - 1);
        int64_t key_index;
        Value key_value = absl::SimpleAtoi(key, &key_index) ? Value::Int(key_index) : Value::String(std::string(key));
        TANDEM_ASSIGN_OR_RETURN(value, GetItem(interpreter, value, key_value));
        p = q + 1;
      }
    }
    if (conversion == 'r' || conversion == 'a') {
      value = Value::String(Repr(value));
    } else if (conversion == 's') {
      value = Value::String(Str(value));
    } else if (conversion != '\0') {
      return absl::InvalidArgumentError(absl::StrCat("Unknown conversion specifier ", std::string(1, conversion)));
    }
    TANDEM_ASSIGN_OR_RETURN(Spec spec, ParseBraceSpec(spec_text));
    TANDEM_ASSIGN_OR_RETURN(std::string text, ApplySpec(value, spec));
    out += text;
    TANDEM_RETURN_IF_ERROR(interpreter.CheckString(out.size()));
  }
  return interpreter.NewString(std::move(out));
}

}  // namespace tandem::jinja
