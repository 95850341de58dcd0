// Chat templates (chat_template.h): a Jinja subset evaluated over JSON values, as transformers'
// apply_chat_template renders them with jinja2 (trim_blocks, lstrip_blocks, loop controls, HF's tojson).
//
// Three stages: the lexer cuts the source into text and tags, applying Jinja's whitespace rules; the
// parser turns tags into statements and expressions (jinja2's grammar and precedence); the renderer
// walks them with Python's semantics for the values JSON holds (str(), ==, +, slices, truthiness).
#include "twell/model/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/json_util.h"
#include "core/utf8.h"
#include "twell/error.h"

namespace twell::model {

namespace {

using Json = nlohmann::ordered_json;

// ---- UTF-8 and Python's str helpers ----------------------------------------------------------

// Byte offsets of the code points of `s` (utf8.h's: an invalid byte is one), and s.size() at the end.
std::vector<size_t> code_points(const std::string& s) {
  std::vector<size_t> at;
  at.reserve(s.size() + 1);
  for (const utf8::CodePoint& c : utf8::code_points(s)) at.push_back(c.pos);
  at.push_back(s.size());
  return at;
}

// Python's str.isspace() for one code point.
bool py_space(uint32_t cp) {
  return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// str.strip / lstrip / rstrip: of whitespace, or of the code points in `chars`.
std::string py_strip(const std::string& s, bool left, bool right, const std::string* chars) {
  const std::vector<utf8::CodePoint> cps = utf8::code_points(s);
  const std::vector<utf8::CodePoint> set = chars ? utf8::code_points(*chars) : std::vector<utf8::CodePoint>{};
  auto stripped = [&](size_t k) {
    if (!chars) return py_space(cps[k].cp);
    return std::any_of(set.begin(), set.end(), [&](const utf8::CodePoint& c) { return c.cp == cps[k].cp; });
  };
  size_t begin = 0, end = cps.size();
  if (left) while (begin < end && stripped(begin)) ++begin;
  if (right) while (end > begin && stripped(end - 1)) --end;
  if (begin == end) return "";
  return s.substr(cps[begin].pos, cps[end - 1].pos + cps[end - 1].len - cps[begin].pos);
}

// repr() of a float, as Python writes it: the shortest digits that read back the same, fixed notation
// for exponents in [-4, 16), else scientific with a two-digit exponent at least.
std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const std::to_chars_result r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  *r.ptr = '\0';
  const std::string sci = buf;  // the shortest digits that read back the same: d.ddde±XX
  const size_t e_at = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e_at + 1);
  std::string digits;
  for (size_t i = 0; i < e_at; ++i)
    if (std::isdigit(static_cast<unsigned char>(sci[i]))) digits += sci[i];
  const bool negative = v < 0 || (v == 0 && std::signbit(v));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exponent) + 1) + "." + digits.substr(static_cast<size_t>(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  std::snprintf(buf, sizeof buf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + buf;
}

// Python's str.isprintable() for a code point beyond ASCII: false for controls, format characters,
// separators other than the space, surrogates and private use (the ones with no glyph, which repr()
// escapes); unassigned code points, which Python also escapes, are taken as printable.
bool py_printable(uint32_t cp) {
  static constexpr uint32_t kNot[][2] = {
      {0x7F, 0xA0}, {0xAD, 0xAD}, {0x0600, 0x0605}, {0x061C, 0x061C}, {0x06DD, 0x06DD}, {0x070F, 0x070F},
      {0x0890, 0x0891}, {0x08E2, 0x08E2}, {0x1680, 0x1680}, {0x180E, 0x180E}, {0x2000, 0x200F}, {0x2028, 0x202F},
      {0x205F, 0x2064}, {0x2066, 0x206F}, {0x3000, 0x3000}, {0xD800, 0xF8FF}, {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB},
      {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
      {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0x10FFFF}};
  if (cp < 0x20) return false;
  for (const auto& r : kNot)
    if (cp >= r[0] && cp <= r[1]) return false;
  return true;
}

// repr() of a str: single quotes unless the text holds one and no double quote; what is not printable
// escaped as \xhh, \uhhhh or \Uhhhhhhhh.
std::string py_repr_string(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const utf8::CodePoint& c : utf8::code_points(s)) {
    const uint32_t cp = c.cp;
    char buf[16];
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == utf8::kInvalid) {
      out.append(s, c.pos, c.len);
    } else if (cp < 0x7F ? cp < 0x20 : !py_printable(cp)) {
      std::snprintf(buf, sizeof buf, cp <= 0xFF ? "\\x%02x" : cp <= 0xFFFF ? "\\u%04x" : "\\U%08x", cp);
      out += buf;
    } else {
      out.append(s, c.pos, c.len);
    }
  }
  return out + q;
}

std::string py_str(const Json& j, bool repr = false);

// str() of a value in a container: repr() of its items.
std::string py_str(const Json& j, bool repr) {
  switch (j.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return j.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(j.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(j.get<uint64_t>());
    case Json::value_t::number_float: return py_float(j.get<double>());
    case Json::value_t::string: return repr ? py_repr_string(j.get_ref<const std::string&>()) : j.get<std::string>();
    case Json::value_t::array: {
      std::string out = "[";
      for (size_t i = 0; i < j.size(); ++i) out += (i ? ", " : "") + py_str(j[i], true);
      return out + "]";
    }
    case Json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : j.items()) {
        out += (first ? "" : ", ") + py_repr_string(k) + ": " + py_str(v, true);
        first = false;
      }
      return out + "}";
    }
    default: return "";
  }
}

// json.dumps with Python's defaults as transformers' tojson calls it.
struct DumpOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;  // None; an int n is n spaces
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (const utf8::CodePoint& c : utf8::code_points(s)) {
    const uint32_t cp = c.cp;
    char buf[16];
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    if (cp < 0x20 || (ensure_ascii && cp > 0x7E && cp != utf8::kInvalid)) {  // (an invalid byte as it is)
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      }
      out += buf;
    } else {
      out.append(s, c.pos, c.len);
    }
  }
  out += '"';
}

void json_dump(const Json& j, const DumpOptions& o, int depth, std::string& out) {
  auto newline = [&](int d) {
    if (!o.indent) return;
    out += '\n';
    for (int k = 0; k < d; ++k) out += *o.indent;
  };
  const std::string item_sep = !o.indent ? o.item_sep : (o.item_sep == ", " ? "," : o.item_sep);
  switch (j.type()) {
    case Json::value_t::null: out += "null"; return;
    case Json::value_t::boolean: out += j.get<bool>() ? "true" : "false"; return;
    case Json::value_t::number_float: {
      const double v = j.get<double>();
      out += std::isnan(v) ? "NaN" : std::isinf(v) ? (v > 0 ? "Infinity" : "-Infinity") : py_float(v);
      return;
    }
    case Json::value_t::string: json_string(j.get_ref<const std::string&>(), o.ensure_ascii, out); return;
    case Json::value_t::array: {
      if (j.empty()) { out += "[]"; return; }
      out += '[';
      for (size_t i = 0; i < j.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_dump(j[i], o, depth + 1, out);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Json::value_t::object: {
      if (j.empty()) { out += "{}"; return; }
      std::vector<std::pair<std::string, const Json*>> items;
      for (const auto& [k, v] : j.items()) items.emplace_back(k, &v);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(items[i].first, o.ensure_ascii, out);
        out += o.key_sep;
        json_dump(*items[i].second, o, depth + 1, out);
      }
      newline(depth);
      out += '}';
      return;
    }
    default: out += j.dump(); return;  // integers
  }
}

// ---- values ----------------------------------------------------------------------------------

struct Value;
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};
using Function = std::function<Value(Args&)>;

// A value in a template: JSON data, a namespace (shared, so that `set ns.x` is seen through every copy),
// a function or method, or Jinja's undefined (printed as nothing, false, an error where used further).
struct Value {
  enum class Kind { kUndefined, kData, kNamespace, kFunction } kind = Kind::kUndefined;
  std::shared_ptr<const Json> shared;  // kData: shared, so that passing `messages` around copies no text
  std::shared_ptr<Json> ns;
  std::shared_ptr<const Function> fn;
  std::string name;  // of what is undefined, or of the function, for messages
  // kData of a list that jinja2 gives as a generator (select, reject, selectattr, rejectattr, map): true
  // however empty, without a length or items, not printable; |list makes it a list.
  bool generator = false;
  // kData of a list whose items stand for jinja2's undefined (map(attribute=) of items without it): they
  // join as "", but printing or serializing the list is refused (jinja2 writes Undefined there).
  bool holds_undefined = false;

  static Value undefined(std::string what) {
    Value v;
    v.name = std::move(what);
    return v;
  }
  static Value of(Json j) {
    Value v;
    v.kind = Kind::kData;
    v.shared = std::make_shared<const Json>(std::move(j));
    return v;
  }
  // An item or member of `whole`'s data, sharing it (no copy: data is never changed in place).
  static Value part(const Value& whole, const Json& item) {
    Value v;
    v.kind = Kind::kData;
    v.shared = std::shared_ptr<const Json>(whole.shared, &item);
    return v;
  }
  const Json& data() const {
    static const Json kNull;
    return shared ? *shared : kNull;
  }
  static Value function(std::string what, Function f) {
    Value v;
    v.kind = Kind::kFunction;
    v.name = std::move(what);
    v.fn = std::make_shared<const Function>(std::move(f));
    return v;
  }
  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_data() const { return kind == Kind::kData; }
  bool is_string() const { return is_data() && data().is_string(); }
  bool is_number() const { return is_data() && (data().is_number() || data().is_boolean()); }
  const std::string& str_ref() const { return data().get_ref<const std::string&>(); }
};

struct RenderError {
  std::string message;
};

[[noreturn]] void fail(const std::string& message) { throw RenderError{message}; }

// Python's name of a JSON value's type, for messages.
const char* py_type(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return "NoneType";
    case Json::value_t::boolean: return "bool";
    case Json::value_t::number_float: return "float";
    case Json::value_t::string: return "str";
    case Json::value_t::array: return "list";
    case Json::value_t::object: return "dict";
    default: return "int";
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNamespace: return "Namespace";
    case Value::Kind::kFunction: return "function";
    case Value::Kind::kData: break;
  }
  return v.generator ? "generator" : py_type(v.data());
}

// Where a value is used as data: undefined and namespaces are errors, as jinja2 raises them.
const Json& data_of(const Value& v, const std::string& use) {
  if (v.is_undefined()) fail(str("'", v.name, "' is undefined"));
  if (!v.is_data()) fail(str("a ", type_name(v), " cannot be ", use));
  return v.data();
}

bool truthy(const Value& v) {
  if (v.generator) return true;
  switch (v.kind) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kNamespace:
    case Value::Kind::kFunction: return true;
    case Value::Kind::kData: break;
  }
  const Json& j = v.data();
  switch (j.type()) {
    case Json::value_t::null: return false;
    case Json::value_t::boolean: return j.get<bool>();
    case Json::value_t::number_float: return j.get<double>() != 0;
    case Json::value_t::number_integer: return j.get<int64_t>() != 0;
    case Json::value_t::number_unsigned: return j.get<uint64_t>() != 0;
    case Json::value_t::string: return !j.get_ref<const std::string&>().empty();  // (json::empty() is false for any string)
    case Json::value_t::array:
    case Json::value_t::object: return !j.empty();
    default: return true;
  }
}

std::string to_text(const Value& v) {
  if (v.is_undefined()) return "";
  if (v.kind == Value::Kind::kNamespace) return "<Namespace " + py_str(*v.ns, true) + ">";
  if (v.kind == Value::Kind::kFunction) fail(str("cannot print the function '", v.name, "' (call it)"));
  if (v.generator) fail("cannot print a generator (the result of select, reject or map): |list or |join it");
  if (v.holds_undefined) fail("cannot print a list holding undefined items (map's attribute missing from some)");
  return py_str(v.data());
}

// Python's integers have no bounds; twell's are 64 bits, and past them an error, not a wrapped value.
[[noreturn]] Value overflow() { fail("integer overflow: twell's chat templates compute integers in 64 bits"); }

bool is_int(const Json& j) { return j.is_number_integer() || j.is_boolean(); }
int64_t as_int(const Json& j) {
  if (j.is_boolean()) return j.get<bool>() ? 1 : 0;
  if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) overflow();
  return j.get<int64_t>();
}
double as_double(const Json& j) { return j.is_boolean() ? (j.get<bool>() ? 1.0 : 0.0) : j.get<double>(); }
bool is_num(const Json& j) { return j.is_number() || j.is_boolean(); }

// int(text, base) and float(text) as Python reads them: surrounding whitespace, a sign, digits with single
// underscores between them (a base prefix 0x, 0o, 0b where the base is 0 or that one); float() also
// takes inf, infinity and nan. nullopt where Python raises ValueError; an error past 64 bits.
std::optional<int64_t> py_parse_int(const std::string& text, int base) {
  const std::string s = py_strip(text, true, true, nullptr);
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i + 1 < s.size() && s[i] == '0') {
    const char x = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i + 1])));
    const int prefixed = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
    if (prefixed != 0 && (base == 0 || base == prefixed)) {
      base = prefixed;
      i += 2;
      if (i < s.size() && s[i] == '_') ++i;
    }
  }
  if (base == 0) {
    base = 10;
    if (s.size() - i > 1 && s[i] == '0' && s.find_first_not_of("0_", i) != std::string::npos) return std::nullopt;
  }
  __int128 value = 0;
  bool digit_before = false;
  for (; i < s.size(); ++i) {
    if (s[i] == '_') {
      if (!digit_before || i + 1 >= s.size() || s[i + 1] == '_') return std::nullopt;
      continue;
    }
    const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(s[i])));
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    value = value * base + d;
    if (value > static_cast<__int128>(INT64_MAX) + 1) overflow();
    digit_before = true;
  }
  if (!digit_before) return std::nullopt;
  if (negative) value = -value;
  if (value > INT64_MAX) overflow();
  return static_cast<int64_t>(value);
}

std::optional<double> py_parse_float(const std::string& text) {
  std::string s = py_strip(text, true, true, nullptr);
  std::string lower = s;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const size_t sign = !lower.empty() && (lower[0] == '+' || lower[0] == '-') ? 1 : 0;
  const std::string word = lower.substr(sign);
  if (word == "inf" || word == "infinity" || word == "nan") {
    const double v = word == "nan" ? std::nan("") : HUGE_VAL;
    return sign && lower[0] == '-' ? -v : v;
  }
  // digits [. digits] [e [sign] digits], underscores only between digits, at least one digit before the e
  std::string plain;
  size_t i = sign;
  bool digits = false, prev_digit = false;
  if (sign) plain += s[0];
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      plain += c;
      digits = prev_digit = true;
    } else if (c == '_') {
      if (!prev_digit || i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i + 1]))) return std::nullopt;
      prev_digit = false;
    } else if (c == '.' && plain.find_first_of(".eE") == std::string::npos) {
      plain += c;
      prev_digit = false;
    } else if ((c == 'e' || c == 'E') && digits && plain.find_first_of("eE") == std::string::npos) {
      plain += c;
      prev_digit = false;
      if (i + 1 < s.size() && (s[i + 1] == '+' || s[i + 1] == '-')) plain += s[++i];
      if (i + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i + 1]))) return std::nullopt;
    } else {
      return std::nullopt;
    }
  }
  if (!digits) return std::nullopt;
  return std::strtod(plain.c_str(), nullptr);
}

// Python's ==: numbers (and bools) by value, containers item by item, other types never equal.
bool py_eq(const Json& a, const Json& b) {
  if (is_num(a) && is_num(b)) {
    if (is_int(a) && is_int(b)) return as_int(a) == as_int(b);
    return as_double(a) == as_double(b);
  }
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!py_eq(a[i], b[i])) return false;
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a.items()) {
      const auto it = b.find(k);
      if (it == b.end() || !py_eq(v, *it)) return false;
    }
    return true;
  }
  return a == b;
}

bool values_eq(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) return a.is_undefined() && b.is_undefined();
  if (a.kind != b.kind) return false;
  if (a.is_data()) return py_eq(a.data(), b.data());
  if (a.kind == Value::Kind::kNamespace) return a.ns == b.ns;
  return a.fn == b.fn;
}

// Python's <: numbers, strings (by code point: UTF-8's byte order), lists item by item.
int py_compare(const Json& a, const Json& b) {
  if (is_num(a) && is_num(b)) {
    if (is_int(a) && is_int(b)) return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b);
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.get_ref<const std::string&>().compare(b.get_ref<const std::string&>());
    return c < 0 ? -1 : c > 0;
  }
  if (a.is_array() && b.is_array()) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (py_eq(a[i], b[i])) continue;
      return py_compare(a[i], b[i]);
    }
    return a.size() < b.size() ? -1 : a.size() > b.size();
  }
  fail(str("'<' is not supported between ", py_type(a), " and ", py_type(b)));
}

// Python's floor division and modulo for ints.
int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) fail("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// len() of a string (code points), list or dict.
int64_t py_len(const Json& j) {
  if (j.is_string()) return static_cast<int64_t>(code_points(j.get_ref<const std::string&>()).size() - 1);
  if (j.is_array() || j.is_object()) return static_cast<int64_t>(j.size());
  fail(str("object of type '", py_type(j), "' has no len()"));
}

// The items a for loop, a filter or `in` walks: a list's, a dict's keys, a string's characters.
std::vector<Json> iterate(const Value& v) {
  if (v.is_undefined()) return {};
  const Json& j = data_of(v, "iterated");
  std::vector<Json> items;
  if (j.is_array()) {
    items.assign(j.begin(), j.end());
  } else if (j.is_object()) {
    for (const auto& [k, _] : j.items()) items.emplace_back(k);
  } else if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    const std::vector<size_t> at = code_points(s);
    for (size_t k = 0; k + 1 < at.size(); ++k) items.emplace_back(s.substr(at[k], at[k + 1] - at[k]));
  } else {
    fail(str("'", py_type(j), "' object is not iterable"));
  }
  return items;
}

// A Python slice of a list or string.
Json slice(const Json& j, std::optional<int64_t> start, std::optional<int64_t> stop, std::optional<int64_t> step_) {
  const int64_t step = step_.value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<size_t> at;
  int64_t n;
  if (j.is_string()) {
    at = code_points(j.get_ref<const std::string&>());
    n = static_cast<int64_t>(at.size()) - 1;
  } else if (j.is_array()) {
    n = static_cast<int64_t>(j.size());
  } else {
    fail(str("a ", py_type(j), " cannot be sliced"));
  }
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x < 0 ? *x + n : *x;
    if (step > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), e = clamp(stop, step > 0 ? n : -1);
  std::vector<int64_t> picked;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) picked.push_back(i);
  if (j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    std::string out;
    for (const int64_t i : picked) out.append(s, at[static_cast<size_t>(i)], at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]);
    return out;
  }
  Json out = Json::array();
  for (const int64_t i : picked) out.push_back(j[static_cast<size_t>(i)]);
  return out;
}

// ---- the lexer -------------------------------------------------------------------------------

// A prefixed integer literal's value (py_parse_int with base 0), nullopt where it is not one; an error
// where it does not fit 64 bits is the parser's to name, so it is caught here.
std::optional<int64_t> py_parse_int_literal(const std::string& literal) {
  try {
    return py_parse_int(literal, 0);
  } catch (const RenderError&) {
    return std::nullopt;
  }
}

// The bytes of the whitespace (Python's, Unicode's too, as jinja2's \s) at the start or the end of `s`.
size_t leading_space(std::string_view s) {
  size_t n = 0;
  while (n < s.size()) {
    const utf8::CodePoint c = utf8::decode(s, n);
    if (!py_space(c.cp)) break;
    n += c.len;
  }
  return n;
}

size_t trailing_space(std::string_view s) {
  size_t n = 0;
  for (const utf8::CodePoint& c : utf8::code_points(s)) n = py_space(c.cp) ? n + c.len : 0;
  return n;
}

struct Token {
  enum class Type { kName, kString, kInt, kFloat, kOp, kEnd } type = Type::kEnd;
  std::string text;  // a name, an operator, a string's value
  int64_t int_value = 0;
  double float_value = 0;
};

struct Piece {
  enum class Type { kText, kOutput, kStatement } type;
  std::string text;           // kText
  std::vector<Token> tokens;  // kOutput, kStatement (ending with kEnd)
  int line = 1;
};

class Lexer {
 public:
  Lexer(std::string source, const std::string& name) : name_(name) {
    // jinja2 reads \r\n and \r as \n and drops one newline at the end (keep_trailing_newline off).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Piece> run() {
    size_t pos = 0;
    bool strip_next = false;  // the last tag ended with '-': the text after it loses its leading whitespace
    while (pos <= src_.size()) {
      size_t open = find_open(pos);
      std::string text = src_.substr(pos, open == std::string::npos ? std::string::npos : open - pos);
      size_t text_start = pos;  // where the last tag's match ended
      if (strip_next) {
        const size_t k = leading_space(text);
        text.erase(0, k);
        text_start += k;
      }
      if (open == std::string::npos) {
        add_text(std::move(text));
        break;
      }
      const char kind = src_[open + 1];  // '{', '%' or '#'
      size_t inner = open + 2;
      const char sign = inner < src_.size() ? src_[inner] : '\0';
      if (sign == '-') {
        text.erase(text.size() - trailing_space(text));
        ++inner;
      } else if (kind != '{' && sign == '+') {
        ++inner;
      } else if (kind != '{') {
        lstrip_block(text, text_start);
      }
      add_text(std::move(text));
      const int line = line_at(open);
      if (kind == '#') {
        const size_t close = src_.find("#}", inner);
        if (close == std::string::npos) error(line, "a comment {# is not closed");
        const bool minus = close > inner && src_[close - 1] == '-';
        pos = close + 2;
        strip_next = minus;
        if (!minus) trim_block(pos, close > inner && src_[close - 1] == '+');
        continue;
      }
      Piece piece;
      piece.type = kind == '{' ? Piece::Type::kOutput : Piece::Type::kStatement;
      piece.line = line;
      bool minus = false, plus = false;
      pos = tokenize(inner, kind == '{' ? '}' : '%', line, piece.tokens, minus, plus);
      if (kind == '%' && is_raw(piece.tokens)) {  // its text as it stands: no trim_blocks after {% raw %}
        pos = raw_block(pos, line, minus);
        strip_next = false;  // (raw_block takes an {% endraw -%}'s whitespace itself)
        continue;
      }
      strip_next = minus;
      if (kind == '%' && !minus) trim_block(pos, plus);
      pieces_.push_back(std::move(piece));
    }
    return std::move(pieces_);
  }

 private:
  [[noreturn]] void error(int line, const std::string& what) const { throw Error(str(name_, ":", line, ": ", what)); }

  // The line of `pos`, counted on from the last position asked (they only grow).
  int line_at(size_t pos) {
    if (pos < line_pos_) line_pos_ = 0, line_ = 1;
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<std::ptrdiff_t>(line_pos_),
                                         src_.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
    line_pos_ = pos;
    return line_;
  }

  size_t find_open(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1))
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) return p;
    return std::string::npos;
  }

  void add_text(std::string text) {
    if (text.empty()) return;
    if (!pieces_.empty() && pieces_.back().type == Piece::Type::kText) {
      pieces_.back().text += text;
      return;
    }
    Piece p;
    p.type = Piece::Type::kText;
    p.text = std::move(text);
    pieces_.push_back(std::move(p));
  }

  // lstrip_blocks: the spaces and tabs between a line's start and a block or comment tag go.
  void lstrip_block(std::string& text, size_t text_start) const {
    const size_t nl = text.rfind('\n');
    size_t from;
    if (nl != std::string::npos) {
      from = nl + 1;
    } else {
      // No newline in the text: the tag's line began before it, at the template's start or where the
      // last tag's match ended with a newline.
      const bool line_starting = text_start == 0 || src_[text_start - 1] == '\n';
      if (!line_starting) return;
      from = 0;
    }
    if (leading_space(std::string_view(text).substr(from)) != text.size() - from) return;
    text.erase(from);
  }

  // trim_blocks: the first newline after a block or comment tag goes (not after `+%}`).
  void trim_block(size_t& pos, bool plus) const {
    if (!plus && pos < src_.size() && src_[pos] == '\n') ++pos;
  }

  static bool is_raw(const std::vector<Token>& t) {
    return t.size() == 2 && t[0].type == Token::Type::kName && t[0].text == "raw";
  }

  // The text of {% raw %} ... {% endraw %} as it stands.
  size_t raw_block(size_t pos, int line, bool strip_start) {
    for (size_t p = src_.find("{%", pos); p != std::string::npos; p = src_.find("{%", p + 2)) {
      size_t k = p + 2;
      const bool minus = k < src_.size() && src_[k] == '-', plus = k < src_.size() && src_[k] == '+';
      if (minus || plus) ++k;
      while (k < src_.size() && std::isspace(static_cast<unsigned char>(src_[k]))) ++k;
      if (src_.compare(k, 6, "endraw") != 0) continue;
      k += 6;
      while (k < src_.size() && std::isspace(static_cast<unsigned char>(src_[k]))) ++k;
      bool end_minus = false, end_plus = false;
      if (k < src_.size() && (src_[k] == '-' || src_[k] == '+')) (src_[k] == '-' ? end_minus : end_plus) = true, ++k;
      if (src_.compare(k, 2, "%}") != 0) continue;
      std::string text = src_.substr(pos, p - pos);
      size_t text_start = pos;
      if (strip_start) {
        const size_t n = leading_space(text);
        text.erase(0, n);
        text_start += n;
      }
      if (minus) text.erase(text.size() - trailing_space(text));
      else if (!plus) lstrip_block(text, text_start);
      add_text(std::move(text));
      size_t after = k + 2;
      if (!end_minus) trim_block(after, end_plus);
      else after += leading_space(std::string_view(src_).substr(after));
      return after;
    }
    error(line, "{% raw %} has no {% endraw %}");
  }

  // The tokens of a tag's inside, up to its closing `}}` or `%}` outside brackets; returns the
  // position after it.
  size_t tokenize(size_t pos, char close, int line, std::vector<Token>& out, bool& minus, bool& plus) {
    int depth = 0;
    while (true) {
      while (pos < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos]))) ++pos;
      if (pos >= src_.size()) error(line, close == '}' ? "a {{ is not closed" : "a {% is not closed");
      const char c = src_[pos];
      if (depth == 0) {
        if ((c == '-' || c == '+') && src_.compare(pos + 1, 1, std::string(1, close)) == 0 &&
            pos + 2 < src_.size() && src_[pos + 2] == '}') {
          if (c == '+' && close == '}') error(line, "'+' before }} is not Jinja");
          (c == '-' ? minus : plus) = true;
          out.push_back(Token{});
          return pos + 3;
        }
        if (c == close && pos + 1 < src_.size() && src_[pos + 1] == '}') {
          out.push_back(Token{});
          return pos + 2;
        }
      }
      Token t;
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        t.type = Token::Type::kName;
        t.text = src_.substr(pos, e - pos);
        pos = e;
      } else if (c == '0' && pos + 2 < src_.size() && std::strchr("xXoObB", src_[pos + 1]) != nullptr &&
                 std::isalnum(static_cast<unsigned char>(src_[pos + 2]))) {  // 0x1f, 0o17, 0b101 (underscores between)
        size_t e = pos + 2;
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        const std::string literal = src_.substr(pos, e - pos);
        const std::optional<int64_t> v = py_parse_int_literal(literal);
        if (!v) error(line, "a bad integer literal " + literal);
        t.type = Token::Type::kInt;
        t.int_value = *v;
        pos = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = pos;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t k = e + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && std::isdigit(static_cast<unsigned char>(src_[k]))) {
            is_float = true;
            e = k;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string digits = src_.substr(pos, e - pos);
        digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
        if (is_float) {
          t.type = Token::Type::kFloat;
          t.float_value = std::strtod(digits.c_str(), nullptr);
        } else {
          t.type = Token::Type::kInt;
          errno = 0;
          t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) error(line, "the integer " + digits + " is out of range");
        }
        pos = e;
      } else if (c == '\'' || c == '"') {
        t.type = Token::Type::kString;
        pos = read_string(pos, line, t.text);
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                           ">", "=", "|", ".", ",", ":", "(", ")", "[", "]", "{", "}"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (src_.compare(pos, std::strlen(o), o) == 0) {
            op = o;
            break;
          }
        if (!op) error(line, str("unexpected character '", printable(std::string(1, c)), "' in a tag"));
        t.type = Token::Type::kOp;
        t.text = op;
        pos += t.text.size();
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if (t.text == ")" || t.text == "]" || t.text == "}") {
          if (depth == 0) error(line, "unbalanced '" + t.text + "'");
          --depth;
        }
      }
      out.push_back(std::move(t));
    }
  }

  // A string literal with Python's escapes.
  size_t read_string(size_t pos, int line, std::string& out) const {
    const char q = src_[pos++];
    while (pos < src_.size() && src_[pos] != q) {
      char c = src_[pos++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos >= src_.size()) break;
      c = src_[pos++];
      switch (c) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case '0': out += '\0'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case 'a': out += '\a'; break;
        case '\\': case '\'': case '"': out += c; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
          const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          if (pos + n > src_.size()) error(line, "a truncated \\" + std::string(1, c) + " escape");
          const std::string hex = src_.substr(pos, n);
          if (hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
            error(line, "a bad \\" + std::string(1, c) + " escape");
          const uint32_t cp = static_cast<uint32_t>(std::strtoul(hex.c_str(), nullptr, 16));
          pos += n;
          if (cp >= 0x110000) error(line, "a \\U escape past U+10FFFF");
          utf8::append(out, cp);
          break;
        }
        default: out += '\\'; out += c; break;  // Python keeps unknown escapes as they are
      }
    }
    if (pos >= src_.size()) error(line, "a string literal is not closed");
    return pos + 1;
  }

  std::string src_;
  const std::string& name_;
  std::vector<Piece> pieces_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---- expressions -----------------------------------------------------------------------------

struct Context;

struct Expr {
  int line = 0;
  virtual ~Expr() = default;
  virtual Value eval(Context& c) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct CallArgs {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
};

struct Frame {
  std::unordered_map<std::string, Value> vars;
};

struct Context {
  std::vector<std::shared_ptr<Frame>> frames;
  const std::unordered_map<std::string, Value>* globals = nullptr;
  const std::string* source = nullptr;
  int depth = 0;  // of macro calls

  Value lookup(const std::string& name) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it) {
      const auto found = (*it)->vars.find(name);
      if (found != (*it)->vars.end()) return found->second;
    }
    const auto g = globals->find(name);
    if (g != globals->end()) return g->second;
    return Value::undefined(name);
  }
  void set(const std::string& name, Value v) { frames.back()->vars[name] = std::move(v); }
};

// A scope of its own (a loop's iteration, its else), left however the block ends.
struct Scope {
  Context& c;
  explicit Scope(Context& context) : c(context) { c.frames.push_back(std::make_shared<Frame>()); }
  ~Scope() { c.frames.pop_back(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
};

Args eval_args(Context& c, const CallArgs& a) {
  Args out;
  for (const ExprPtr& e : a.pos) out.pos.push_back(e->eval(c));
  for (const auto& [k, e] : a.kw) out.kw.emplace_back(k, e->eval(c));
  return out;
}

// The arguments of a builtin by name: `names` in order; positional first, then by keyword.
struct Bound {
  std::vector<std::optional<Value>> v;
  const std::optional<Value>& operator[](size_t i) const { return v[i]; }
};

Bound bind(const std::string& what, Args& a, std::initializer_list<const char*> names) {
  Bound b;
  b.v.resize(names.size());
  if (a.pos.size() > names.size()) fail(str(what, "() takes at most ", names.size(), " arguments (", a.pos.size(), " given)"));
  for (size_t i = 0; i < a.pos.size(); ++i) b.v[i] = a.pos[i];
  for (auto& [k, val] : a.kw) {
    size_t i = 0;
    for (const char* n : names) {
      if (k == n) break;
      ++i;
    }
    if (i == names.size()) fail(str(what, "() got an unexpected keyword argument '", k, "'"));
    if (b.v[i]) fail(str(what, "() got multiple values for argument '", k, "'"));
    b.v[i] = val;
  }
  return b;
}

std::string arg_string(const std::optional<Value>& v, const std::string& what) {
  if (!v || !v->is_string()) fail(str(what, " must be a string"));
  return v->str_ref();
}

int64_t arg_int(const std::optional<Value>& v, const std::string& what) {
  if (!v || !v->is_data() || !is_int(v->data())) fail(str(what, " must be an integer"));
  return as_int(v->data());
}

// ---- methods of strings and dicts --------------------------------------------------------------

// Whether a code point beyond ASCII is in a block of letters that have case (Latin, Greek, Cyrillic, ...),
// which twell does not convert: text of other scripts, emoji and punctuation have none and pass as they are.
bool cased_beyond_ascii(uint32_t cp) {
  static constexpr uint32_t kRanges[][2] = {
      {0x00B5, 0x00B5}, {0x00C0, 0x024F}, {0x0250, 0x02AF}, {0x0345, 0x0345}, {0x0370, 0x058F}, {0x10A0, 0x10FF},
      {0x13A0, 0x13FF}, {0x1C80, 0x1CBF}, {0x1D00, 0x1FFF}, {0x2100, 0x218F}, {0x24B6, 0x24E9}, {0x2C00, 0x2D2F},
      {0xA640, 0xA69F}, {0xA720, 0xA7FF}, {0xAB30, 0xABBF}, {0xFB00, 0xFB4F}, {0xFF21, 0xFF5A}, {0x10400, 0x104FF},
      {0x10570, 0x105BF}, {0x10C80, 0x10CFF}, {0x118A0, 0x118FF}, {0x16E40, 0x16E9F}, {0x1E900, 0x1E95F}};
  for (const auto& r : kRanges)
    if (cp >= r[0] && cp <= r[1]) return true;
  return false;
}

enum class Case { kLower, kUpper, kTitle, kCapitalize, kJinjaTitle };

// Python's str.lower / upper / title / capitalize, and jinja2's title filter (a word begins after -,
// whitespace, (, {, [ or <), for ASCII letters; a cased letter beyond ASCII is an error, not left as it is.
// Refuses `s` for `what` where it holds a cased letter beyond ASCII (twell knows ASCII's case alone).
void refuse_cased_beyond_ascii(const std::string& s, const char* what) {
  for (const utf8::CodePoint& c : utf8::code_points(s))
    if (c.cp >= 0x80 && c.cp != utf8::kInvalid && cased_beyond_ascii(c.cp))
      fail(str(what, " of letters beyond ASCII (", printable(s.substr(c.pos, c.len)), ") is not supported by twell's chat templates"));
}

std::string convert_case(const std::string& s, const char* what, Case mode) {
  refuse_cased_beyond_ascii(s, what);
  std::string out = s;
  bool word_start = true;
  for (size_t i = 0; i < out.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(out[i]);
    switch (mode) {
      case Case::kLower: out[i] = static_cast<char>(std::tolower(c)); break;
      case Case::kUpper: out[i] = static_cast<char>(std::toupper(c)); break;
      case Case::kTitle:
        out[i] = static_cast<char>(word_start ? std::toupper(c) : std::tolower(c));
        word_start = !std::isalpha(c);
        break;
      case Case::kJinjaTitle: {
        const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || std::isspace(c);
        out[i] = static_cast<char>(word_start ? std::toupper(c) : std::tolower(c));
        word_start = separator;
        break;
      }
      case Case::kCapitalize: out[i] = static_cast<char>(i == 0 ? std::toupper(c) : std::tolower(c)); break;
    }
  }
  return out;
}

// Python's str.islower() / isupper(): some cased letter, and none of the other case.
bool is_case(const std::string& s, bool lower) {
  refuse_cased_beyond_ascii(s, lower ? "islower()" : "isupper()");
  bool cased = false;
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (!std::isalpha(c)) continue;
    if ((lower && std::isupper(c)) || (!lower && std::islower(c))) return false;
    cased = true;
  }
  return cased;
}

// Python's str.splitlines(): at \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028 and U+2029.
std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> lines;
  size_t from = 0;
  for (size_t i = 0; i < s.size();) {
    const utf8::CodePoint c = utf8::decode(s, i);
    const bool brk = c.cp == '\n' || c.cp == '\r' || c.cp == '\v' || c.cp == '\f' || (c.cp >= 0x1C && c.cp <= 0x1E) ||
                     c.cp == 0x85 || c.cp == 0x2028 || c.cp == 0x2029;
    size_t next = i + c.len;
    if (brk) {
      if (c.cp == '\r' && next < s.size() && s[next] == '\n') ++next;
      lines.push_back(s.substr(from, (keepends ? next : i) - from));
      from = next;
    }
    i = next;
  }
  if (from < s.size()) lines.push_back(s.substr(from));
  return lines;
}

Json py_split(const std::string& s, const std::optional<Value>& sep_v, int64_t maxsplit, bool from_right) {
  Json out = Json::array();
  if (!sep_v || (sep_v->is_data() && sep_v->data().is_null())) {
    // Runs of whitespace, none at the ends: each word's byte range.
    const std::vector<utf8::CodePoint> cps = utf8::code_points(s);
    const size_t n = cps.size();
    auto space = [&](size_t i) { return py_space(cps[i].cp); };
    auto at = [&](size_t i) { return i < n ? cps[i].pos : s.size(); };  // the byte offset of code point i
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t k = 0; k < n;) {
      while (k < n && space(k)) ++k;
      if (k == n) break;
      size_t e = k;
      while (e < n && !space(e)) ++e;
      words.emplace_back(at(k), at(e));
      k = e;
    }
    auto word = [&](size_t i) { return s.substr(words[i].first, words[i].second - words[i].first); };
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      if (!from_right) {
        const size_t cut = static_cast<size_t>(maxsplit);
        for (size_t i = 0; i < cut; ++i) out.push_back(word(i));
        out.push_back(py_strip(s.substr(words[cut].first), false, true, nullptr));
      } else {
        const size_t keep = words.size() - static_cast<size_t>(maxsplit);
        out.push_back(py_strip(s.substr(0, words[keep - 1].second), true, false, nullptr));
        for (size_t i = keep; i < words.size(); ++i) out.push_back(word(i));
      }
      return out;
    }
    for (size_t i = 0; i < words.size(); ++i) out.push_back(word(i));
    return out;
  }
  const std::string sep = arg_string(sep_v, "split()'s separator");
  if (sep.empty()) fail("split(): empty separator");
  std::vector<std::string> parts;
  if (!from_right) {
    size_t from = 0;
    int64_t splits = 0;
    for (size_t p = s.find(sep); p != std::string::npos && (maxsplit < 0 || splits < maxsplit); p = s.find(sep, from)) {
      parts.push_back(s.substr(from, p - from));
      from = p + sep.size();
      ++splits;
    }
    parts.push_back(s.substr(from));
  } else {
    size_t end = s.size();
    int64_t splits = 0;
    std::vector<std::string> rev;
    while (maxsplit < 0 || splits < maxsplit) {
      if (end < sep.size()) break;
      const size_t p = s.rfind(sep, end - sep.size());
      if (p == std::string::npos) break;
      rev.push_back(s.substr(p + sep.size(), end - p - sep.size()));
      end = p;
      ++splits;
    }
    rev.push_back(s.substr(0, end));
    parts.assign(rev.rbegin(), rev.rend());
  }
  for (std::string& p : parts) out.push_back(std::move(p));
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    const std::vector<size_t> at = code_points(s);
    int64_t done = 0;
    for (size_t k = 0; k + 1 < at.size(); ++k) {
      if (count < 0 || done < count) out += to, ++done;
      out.append(s, at[k], at[k + 1] - at[k]);
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t from_pos = 0;
  int64_t done = 0;
  for (size_t p = s.find(from); p != std::string::npos && (count < 0 || done < count); p = s.find(from, from_pos)) {
    out.append(s, from_pos, p - from_pos);
    out += to;
    from_pos = p + from.size();
    ++done;
  }
  out.append(s, from_pos, std::string::npos);
  return out;
}

// The code point index of a byte offset (find()'s result).
int64_t cp_index(const std::string& s, size_t byte) {
  const std::vector<size_t> at = code_points(s);
  return static_cast<int64_t>(std::lower_bound(at.begin(), at.end(), byte) - at.begin());
}

Value string_method(const std::string& s, const std::string& name) {
  auto m = [&](Function f) { return Value::function("str." + name, std::move(f)); };
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return m([s, name](Args& a) {
      const Bound b = bind(name, a, {"chars"});
      std::optional<std::string> chars;
      if (b[0] && !(b[0]->is_data() && b[0]->data().is_null())) chars = arg_string(b[0], name + "()'s chars");
      return Value::of(py_strip(s, name != "rstrip", name != "lstrip", chars ? &*chars : nullptr));
    });
  if (name == "split" || name == "rsplit")
    return m([s, name](Args& a) {
      const Bound b = bind(name, a, {"sep", "maxsplit"});
      return Value::of(py_split(s, b[0], b[1] ? arg_int(b[1], "maxsplit") : -1, name == "rsplit"));
    });
  if (name == "startswith" || name == "endswith")
    return m([s, name](Args& a) {
      const Bound b = bind(name, a, {"prefix"});
      if (!b[0] || !b[0]->is_data()) fail(name + "() takes a string or a tuple of strings");
      std::vector<std::string> options;
      if (b[0]->data().is_array()) {
        for (const Json& j : b[0]->data()) {
          if (!j.is_string()) fail(name + "() takes a string or a tuple of strings");
          options.push_back(j.get<std::string>());
        }
      } else {
        options.push_back(arg_string(b[0], name + "()'s argument"));
      }
      for (const std::string& o : options) {
        const bool hit = name == "startswith" ? s.compare(0, o.size(), o) == 0
                                              : s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0;
        if (hit) return Value::of(true);
      }
      return Value::of(false);
    });
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize")
    return m([s, name](Args& a) {
      bind(name, a, {});
      const Case mode = name == "lower" ? Case::kLower : name == "upper" ? Case::kUpper
                        : name == "title" ? Case::kTitle : Case::kCapitalize;
      return Value::of(convert_case(s, ("str." + name + "()").c_str(), mode));
    });
  if (name == "replace")
    return m([s](Args& a) {
      const Bound b = bind("replace", a, {"old", "new", "count"});
      return Value::of(py_replace(s, arg_string(b[0], "replace()'s old"), arg_string(b[1], "replace()'s new"),
                                  b[2] ? arg_int(b[2], "replace()'s count") : -1));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count")
    return m([s, name](Args& a) {
      const Bound b = bind(name, a, {"sub"});
      const std::string sub = arg_string(b[0], name + "()'s argument");
      if (name == "count") {
        if (sub.empty()) return Value::of(py_len(s) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::of(n);
      }
      const size_t p = name == "find" || name == "index" ? s.find(sub) : s.rfind(sub);
      if (p == std::string::npos && (name == "index" || name == "rindex")) fail("substring not found");
      return Value::of(p == std::string::npos ? int64_t{-1} : cp_index(s, p));
    });
  if (name == "join")
    return m([s](Args& a) {
      const Bound b = bind("join", a, {"iterable"});
      if (!b[0]) fail("join() takes one argument");
      std::string out;
      bool first = true;
      for (const Json& j : iterate(*b[0])) {
        if (!j.is_string()) fail(str("join(): expected str items, found ", py_type(j)));
        if (!first) out += s;
        out += j.get_ref<const std::string&>();
        first = false;
      }
      return Value::of(out);
    });
  if (name == "splitlines")
    return m([s](Args& a) {
      const Bound b = bind("splitlines", a, {"keepends"});
      return Value::of(Json(py_splitlines(s, b[0] && truthy(*b[0]))));
    });
  if (name == "removeprefix" || name == "removesuffix")
    return m([s, name](Args& a) {
      const std::string x = arg_string(bind(name, a, {"affix"})[0], name + "()'s argument");
      if (name == "removeprefix") return Value::of(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
      const bool ends = s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
      return Value::of(ends ? s.substr(0, s.size() - x.size()) : s);
    });
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum")
    return m([s, name](Args& a) {
      bind(name, a, {});
      if (s.empty()) return Value::of(false);
      for (const char ch : s) {
        const unsigned char c = static_cast<unsigned char>(ch);
        if (c >= 0x80) fail(str("str.", name, "() of text beyond ASCII is not supported by twell's chat templates"));
        const bool ok = name == "isdigit" ? std::isdigit(c) : name == "isspace" ? std::isspace(c)
                        : name == "isalpha" ? std::isalpha(c) : std::isalnum(c);
        if (!ok) return Value::of(false);
      }
      return Value::of(true);
    });
  return Value::undefined("str." + name);
}

Value dict_method(const Json& d, const std::string& name) {
  auto m = [&](Function f) { return Value::function("dict." + name, std::move(f)); };
  if (name == "items")
    return m([d](Args& a) {
      bind("items", a, {});
      Json out = Json::array();
      for (const auto& [k, v] : d.items()) out.push_back(Json::array({k, v}));
      return Value::of(out);
    });
  if (name == "keys" || name == "values")
    return m([d, name](Args& a) {
      bind(name, a, {});
      Json out = Json::array();
      for (const auto& [k, v] : d.items()) out.push_back(name == "keys" ? Json(k) : v);
      return Value::of(out);
    });
  if (name == "get")
    return m([d](Args& a) {
      const Bound b = bind("get", a, {"key", "default"});
      if (b[0] && b[0]->is_string()) {
        const auto it = d.find(b[0]->str_ref());
        if (it != d.end()) return Value::of(*it);
      }
      return b[1] ? *b[1] : Value::of(nullptr);
    });
  return Value::undefined("dict." + name);
}

// obj.name: a dict's methods first, then its key (jinja2's getattr); a string's methods; a namespace's
// attribute. Undefined where there is none; an error on undefined itself.
Value get_attribute(const Value& base, const std::string& name) {
  if (base.is_undefined()) fail(str("'", base.name, "' is undefined (its attribute '", name, "' was asked for)"));
  if (base.kind == Value::Kind::kNamespace) {
    const auto it = base.ns->find(name);
    return it == base.ns->end() ? Value::undefined(name) : Value::of(*it);
  }
  if (base.kind == Value::Kind::kFunction) return Value::undefined(name);
  const Json& j = base.data();
  if (j.is_object()) {
    Value m = dict_method(j, name);
    if (!m.is_undefined()) return m;
    const auto it = j.find(name);
    return it == j.end() ? Value::undefined(name) : Value::part(base, *it);
  }
  if (j.is_string()) {
    Value m = string_method(j.get_ref<const std::string&>(), name);
    if (!m.is_undefined()) return m;
    // A method of Python's str that twell lacks is an error; any other name is undefined, as in jinja2.
    static const char* const kStrMethods[] = {
        "casefold", "center", "encode", "expandtabs", "format", "format_map", "isascii", "isdecimal", "isidentifier",
        "islower", "isnumeric", "isprintable", "istitle", "isupper", "ljust", "maketrans", "partition", "rjust",
        "rpartition", "swapcase", "translate", "zfill"};
    for (const char* known : kStrMethods)
      if (name == known) fail(str("str.", name, "() is not supported by twell's chat templates"));
    return Value::undefined(name);
  }
  if (j.is_array() && (name == "append" || name == "pop" || name == "extend" || name == "insert"))
    fail(str("list.", name, "() is not allowed: chat templates are immutable (as transformers' sandbox)"));
  return Value::undefined(name);
}

// obj[key]: an item first, then an attribute (jinja2's getitem).
Value get_item(const Value& base, const Value& key) {
  if (base.is_undefined()) fail(str("'", base.name, "' is undefined (an item of it was asked for)"));
  if (base.generator) fail("'generator' object is not subscriptable: |list it first");
  if (base.kind == Value::Kind::kNamespace) {
    if (!key.is_string()) return Value::undefined("[]");
    return get_attribute(base, key.str_ref());
  }
  if (!base.is_data() || !key.is_data()) return Value::undefined("[]");
  const Json& j = base.data();
  const Json& k = key.data();
  if ((j.is_array() || j.is_string()) && is_int(k)) {
    const int64_t n = py_len(j);
    int64_t i = as_int(k);
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(as_int(k)) + "]");
    if (j.is_array()) return Value::part(base, j[static_cast<size_t>(i)]);
    return Value::of(slice(j, i, i + 1, 1));
  }
  if (j.is_object() && k.is_string()) {
    const auto it = j.find(k.get_ref<const std::string&>());
    if (it != j.end()) return Value::part(base, *it);
    return Value::undefined(k.get<std::string>());
  }
  if (k.is_string()) return get_attribute(base, k.get_ref<const std::string&>());
  return Value::undefined("[]");
}

// ---- expression nodes --------------------------------------------------------------------------

struct Literal : Expr {
  Json value;
  Value eval(Context&) const override { return Value::of(value); }
};

struct Name : Expr {
  std::string name;
  Value eval(Context& c) const override { return c.lookup(name); }
};

struct ListExpr : Expr {
  std::vector<ExprPtr> items;
  Value eval(Context& c) const override {
    Json out = Json::array();
    for (const ExprPtr& e : items) out.push_back(data_of(e->eval(c), "put in a list"));
    return Value::of(out);
  }
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Context& c) const override {
    Json out = Json::object();
    for (const auto& [k, v] : items) {
      const Value key = k->eval(c);
      if (!key.is_string()) fail("twell's chat templates take dict keys that are strings");
      out[key.str_ref()] = data_of(v->eval(c), "put in a dict");
    }
    return Value::of(out);
  }
};

struct Attribute : Expr {
  ExprPtr base;
  std::string name;
  Value eval(Context& c) const override { return get_attribute(base->eval(c), name); }
};

struct Subscript : Expr {
  ExprPtr base, key;
  Value eval(Context& c) const override { return get_item(base->eval(c), key->eval(c)); }
};

struct SliceExpr : Expr {
  ExprPtr base, start, stop, step;
  Value eval(Context& c) const override {
    const Value b = base->eval(c);
    auto bound = [&](const ExprPtr& e) -> std::optional<int64_t> {
      if (!e) return std::nullopt;
      const Value v = e->eval(c);
      if (v.is_data() && v.data().is_null()) return std::nullopt;
      return arg_int(v, "a slice index");
    };
    return Value::of(slice(data_of(b, "sliced"), bound(start), bound(stop), bound(step)));
  }
};

struct Call : Expr {
  ExprPtr fn;
  CallArgs args;
  Value eval(Context& c) const override {
    const Value f = fn->eval(c);
    if (f.kind != Value::Kind::kFunction) {
      if (f.is_undefined()) fail(str("'", f.name, "' is undefined (called as a function)"));
      fail(str("a ", type_name(f), " is not callable"));
    }
    Args a = eval_args(c, args);
    return (*f.fn)(a);
  }
};

struct Unary : Expr {
  char op;  // '-', '+', '!'
  ExprPtr operand;
  Value eval(Context& c) const override {
    const Value v = operand->eval(c);
    if (op == '!') return Value::of(!truthy(v));
    const Json& j = data_of(v, "negated");
    if (!is_num(j)) fail(str("bad operand type for unary ", op, ": '", py_type(j), "'"));
    if (op == '+') return Value::of(is_int(j) ? Json(as_int(j)) : Json(as_double(j)));
    if (is_int(j) && as_int(j) == INT64_MIN) overflow();
    return Value::of(is_int(j) ? Json(-as_int(j)) : Json(-as_double(j)));
  }
};

struct Logic : Expr {
  bool is_and;
  ExprPtr a, b;
  Value eval(Context& c) const override {
    Value x = a->eval(c);
    if (truthy(x) != is_and) return x;  // Python's and/or return an operand
    return b->eval(c);
  }
};

struct Conditional : Expr {
  ExprPtr then, cond, otherwise;
  Value eval(Context& c) const override {
    if (truthy(cond->eval(c))) return then->eval(c);
    return otherwise ? otherwise->eval(c) : Value::undefined("the else of a conditional expression");
  }
};

Value arithmetic(const std::string& op, const Value& x, const Value& y) {
  if (op == "~") return Value::of(to_text(x) + to_text(y));
  const Json& a = data_of(x, "an operand of " + op);
  const Json& b = data_of(y, "an operand of " + op);
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::of(a.get<std::string>() + b.get<std::string>());
    if (a.is_array() && b.is_array()) {
      Json out = a;
      for (const Json& j : b) out.push_back(j);
      return Value::of(out);
    }
  }
  if (op == "*" && (((a.is_string() || a.is_array()) && is_int(b)) || ((b.is_string() || b.is_array()) && is_int(a)))) {
    const Json& seq = is_int(b) ? a : b;
    const int64_t n = is_int(b) ? as_int(b) : as_int(a);
    int64_t total;
    if (n > 0 && (__builtin_mul_overflow(py_len(seq), n, &total) || total > 10000000))
      fail("a repetition of over 10 million items");
    Json out = seq.is_string() ? Json("") : Json::array();
    for (int64_t i = 0; i < n; ++i) {
      if (seq.is_string()) out.get_ref<std::string&>() += seq.get_ref<const std::string&>();
      else for (const Json& j : seq) out.push_back(j);
    }
    return Value::of(out);
  }
  if (op == "%" && a.is_string()) fail("string formatting with % is not supported by twell's chat templates");
  if (!is_num(a) || !is_num(b))
    fail(str("unsupported operand types for ", op, ": '", py_type(a), "' and '", py_type(b), "'"));
  if (is_int(a) && is_int(b)) {
    const int64_t p = as_int(a), q = as_int(b);
    int64_t r;
    if (op == "+") return __builtin_add_overflow(p, q, &r) ? overflow() : Value::of(r);
    if (op == "-") return __builtin_sub_overflow(p, q, &r) ? overflow() : Value::of(r);
    if (op == "*") return __builtin_mul_overflow(p, q, &r) ? overflow() : Value::of(r);
    if (op == "//") return Value::of(floor_div(p, q));
    if (op == "%") return Value::of(q == -1 ? 0 : p - floor_div(p, q) * q);
    if (op == "**" && q >= 0) {  // by squaring, checked
      int64_t result = 1, base = p;
      for (int64_t e = q; e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) overflow();
      }
      return Value::of(result);
    }
  }
  const double p = as_double(a), q = as_double(b);
  if (op == "+") return Value::of(p + q);
  if (op == "-") return Value::of(p - q);
  if (op == "*") return Value::of(p * q);
  if (op == "**") {
    if (p == 0 && q < 0) fail("0.0 cannot be raised to a negative power");
    const double r = std::pow(p, q);
    if (std::isnan(r) && !std::isnan(p) && !std::isnan(q)) fail("a negative number to a fractional power is complex");
    if (std::isinf(r) && std::isfinite(p) && std::isfinite(q)) fail("numerical result out of range (a power)");
    return Value::of(r);
  }
  if (q == 0) fail(op == "/" ? "division by zero" : "float floor division or modulo by zero");
  if (op == "/") return Value::of(p / q);
  // Python's float divmod: the remainder by fmod, carrying the divisor's sign; the quotient from it.
  double mod = std::fmod(p, q);
  double div = (p - mod) / q;
  if (mod != 0) {
    if ((q < 0) != (mod < 0)) {
      mod += q;
      div -= 1.0;
    }
  } else {
    mod = std::copysign(0.0, q);
  }
  double floordiv;
  if (div != 0) {
    floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
  } else {
    floordiv = std::copysign(0.0, p / q);
  }
  if (op == "//") return Value::of(floordiv);
  if (op == "%") return Value::of(mod);
  fail("unknown operator " + op);
}

bool contains(const Value& item, const Value& container) {
  if (container.is_undefined()) return false;  // jinja2's undefined iterates as nothing
  const Json& c = data_of(container, "searched with in");
  if (c.is_string()) {
    if (!item.is_string()) fail(str("'in <string>' requires a string on the left, not ", type_name(item)));
    return c.get_ref<const std::string&>().find(item.str_ref()) != std::string::npos;
  }
  if (c.is_object()) {
    if (item.is_data() && (item.data().is_array() || item.data().is_object()))
      fail(str("unhashable type: '", py_type(item.data()), "'"));
    return item.is_string() && c.contains(item.str_ref());
  }
  if (c.is_array()) {
    if (!item.is_data()) return false;
    for (const Json& j : c)
      if (py_eq(j, item.data())) return true;
    return false;
  }
  fail(str("argument of type '", py_type(c), "' is not iterable"));
}

bool compare(const std::string& op, const Value& x, const Value& y) {
  if (op == "==") return values_eq(x, y);
  if (op == "!=") return !values_eq(x, y);
  if (op == "in") return contains(x, y);
  if (op == "notin") return !contains(x, y);
  const int r = py_compare(data_of(x, "compared"), data_of(y, "compared"));
  if (op == "<") return r < 0;
  if (op == "<=") return r <= 0;
  if (op == ">") return r > 0;
  return r >= 0;
}

struct Binary : Expr {
  std::string op;
  ExprPtr a, b;
  Value eval(Context& c) const override { return arithmetic(op, a->eval(c), b->eval(c)); }
};

struct Compare : Expr {
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;
  Value eval(Context& c) const override {
    Value left = first->eval(c);
    for (const auto& [op, e] : rest) {
      Value right = e->eval(c);
      if (!compare(op, left, right)) return Value::of(false);
      left = std::move(right);
    }
    return Value::of(true);
  }
};

// ---- filters and tests ---------------------------------------------------------------------

using TestFn = bool (*)(const Value&, const std::vector<Value>&);

// A list, string or dict (their items, characters, keys), or undefined: the sequence and iterable tests.
bool is_sequence(const Value& v, const std::vector<Value>&) {
  return v.is_undefined() || (v.is_data() && (v.data().is_array() || v.data().is_string() || v.data().is_object()));
}

bool test_arg_count(const std::vector<Value>& a, size_t n, const char* name) {
  if (a.size() != n) fail(str("the test '", name, "' takes ", n, " argument", n == 1 ? "" : "s"));
  return true;
}

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> t = {
      {"defined", [](const Value& v, const std::vector<Value>&) { return !v.is_undefined(); }},
      {"undefined", [](const Value& v, const std::vector<Value>&) { return v.is_undefined(); }},
      {"none", [](const Value& v, const std::vector<Value>&) { return v.is_data() && v.data().is_null(); }},
      {"boolean", [](const Value& v, const std::vector<Value>&) { return v.is_data() && v.data().is_boolean(); }},
      {"true", [](const Value& v, const std::vector<Value>&) { return v.is_data() && v.data().is_boolean() && v.data().get<bool>(); }},
      {"false", [](const Value& v, const std::vector<Value>&) { return v.is_data() && v.data().is_boolean() && !v.data().get<bool>(); }},
      {"integer", [](const Value& v, const std::vector<Value>&) { return v.is_data() && v.data().is_number_integer(); }},
      {"float", [](const Value& v, const std::vector<Value>&) { return v.is_data() && v.data().is_number_float(); }},
      {"number", [](const Value& v, const std::vector<Value>&) { return v.is_number(); }},
      {"string", [](const Value& v, const std::vector<Value>&) { return v.is_string(); }},
      {"mapping", [](const Value& v, const std::vector<Value>&) { return (v.is_data() && v.data().is_object()) || v.kind == Value::Kind::kNamespace; }},
      // jinja2's undefined has a length, items and a call (each an error or nothing): it passes these three.
      {"sequence", is_sequence},
      {"iterable", is_sequence},
      {"callable", [](const Value& v, const std::vector<Value>&) { return v.is_undefined() || v.kind == Value::Kind::kFunction; }},
      {"even", [](const Value& v, const std::vector<Value>&) { return arg_int(v, "the even test's value") % 2 == 0; }},
      {"odd", [](const Value& v, const std::vector<Value>&) { return arg_int(v, "the odd test's value") % 2 != 0; }},
      {"divisibleby", [](const Value& v, const std::vector<Value>& a) {
         test_arg_count(a, 1, "divisibleby");
         const int64_t d = arg_int(a[0], "divisibleby's argument");
         return d != 0 && arg_int(v, "divisibleby's value") % d == 0;
       }},
      {"eq", [](const Value& v, const std::vector<Value>& a) { return test_arg_count(a, 1, "eq") && values_eq(v, a[0]); }},
      {"ne", [](const Value& v, const std::vector<Value>& a) { return test_arg_count(a, 1, "ne") && !values_eq(v, a[0]); }},
      {"lt", [](const Value& v, const std::vector<Value>& a) { return test_arg_count(a, 1, "lt") && compare("<", v, a[0]); }},
      {"le", [](const Value& v, const std::vector<Value>& a) { return test_arg_count(a, 1, "le") && compare("<=", v, a[0]); }},
      {"gt", [](const Value& v, const std::vector<Value>& a) { return test_arg_count(a, 1, "gt") && compare(">", v, a[0]); }},
      {"ge", [](const Value& v, const std::vector<Value>& a) { return test_arg_count(a, 1, "ge") && compare(">=", v, a[0]); }},
      {"in", [](const Value& v, const std::vector<Value>& a) { return test_arg_count(a, 1, "in") && contains(v, a[0]); }},
      {"sameas", [](const Value& v, const std::vector<Value>& a) {
         test_arg_count(a, 1, "sameas");  // `is` of Python: the singletons none, true and false
         return v.is_data() && a[0].is_data() && (v.data().is_null() || v.data().is_boolean()) && v.data() == a[0].data();
       }},
      {"lower", [](const Value& v, const std::vector<Value>&) { return is_case(to_text(v), true); }},  // of str(value)
      {"upper", [](const Value& v, const std::vector<Value>&) { return is_case(to_text(v), false); }},
  };
  return t;
}

const std::map<std::string, std::string>& test_aliases() {
  static const std::map<std::string, std::string> a = {{"equalto", "eq"}, {"==", "eq"}, {"!=", "ne"},
      {"<", "lt"}, {"lessthan", "lt"}, {"<=", "le"}, {">", "gt"}, {"greaterthan", "gt"}, {">=", "ge"}};
  return a;
}

std::string test_name(const std::string& name) {
  const auto alias = test_aliases().find(name);
  return alias == test_aliases().end() ? name : alias->second;
}

bool run_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
  const auto it = tests().find(test_name(name));
  if (it == tests().end()) fail(str("no test named '", name, "' in twell's chat templates"));
  return it->second(v, args);
}

using FilterFn = Value (*)(Context&, const Value&, Args&);

Value apply_filter(Context& c, const std::string& name, const Value& v, Args& a);

// The attribute of an item a filter names ("content", or "a.b" dotted).
Value item_attribute(const Json& item, const std::string& path) {
  Value v = Value::of(item);
  size_t from = 0;
  while (true) {
    const size_t dot = path.find('.', from);
    const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
    if (v.is_undefined()) return v;
    const bool digits = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    v = digits && v.is_data() && v.data().is_array() ? get_item(v, Value::of(std::stoll(part)))
                                                   : get_item(v, Value::of(part));
    if (dot == std::string::npos) return v;
    from = dot + 1;
  }
}

Value as_generator(Value v) {
  v.generator = true;
  return v;
}

Value select_filter(const Value& v, Args& a, bool attr, bool keep, const char* what) {
  if (a.pos.empty() && attr) fail(str(what, "() needs an attribute"));
  size_t next = 0;
  std::string attribute;
  if (attr) attribute = arg_string(a.pos[next++], str(what, "()'s attribute"));
  std::optional<std::string> test;
  if (next < a.pos.size()) test = arg_string(a.pos[next++], str(what, "()'s test"));
  if (!a.kw.empty()) fail(str(what, "() takes no keyword arguments in twell's chat templates"));
  const std::vector<Value> test_args(a.pos.begin() + static_cast<std::ptrdiff_t>(next), a.pos.end());
  Json out = Json::array();
  for (const Json& item : iterate(v)) {
    const Value x = attr ? item_attribute(item, attribute) : Value::of(item);
    const bool hit = test ? run_test(*test, x, test_args) : truthy(x);
    if (hit == keep) out.push_back(item);
  }
  return as_generator(Value::of(out));
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

// The key unique, min and max compare by: the item, or its attribute; strings lowered unless case_sensitive.
std::function<Json(const Json&)> comparison_key(const std::optional<Value>& case_sensitive,
                                                const std::optional<Value>& attribute, const char* what) {
  const bool sensitive = case_sensitive && truthy(*case_sensitive);
  std::optional<std::string> path;
  if (attribute) path = arg_string(attribute, str(what, "()'s attribute"));
  return [sensitive, path, what](const Json& item) {
    Json k = path ? data_of(item_attribute(item, *path), str("a key of ", what, "()")) : item;
    if (k.is_string() && !sensitive) k = convert_case(k.get<std::string>(), what, Case::kLower);
    return k;
  };
}

Value extreme(const Value& v, Args& a, const char* what) {
  const Bound b = bind(what, a, {"case_sensitive", "attribute"});
  const auto key = comparison_key(b[0], b[1], what);
  const std::vector<Json> items = iterate(v);
  if (items.empty()) return Value::undefined(str(what, " of nothing"));
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const int c = py_compare(key(items[i]), key(items[best]));
    if (std::string(what) == "min" ? c < 0 : c > 0) best = i;
  }
  return Value::of(items[best]);
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> f = {
      {"length", [](Context&, const Value& v, Args& a) {
         bind("length", a, {});
         if (v.is_undefined()) return Value::of(0);  // jinja2's undefined has length 0
         if (v.generator) fail("object of type 'generator' has no len(): |list it first");
         return Value::of(py_len(data_of(v, "measured")));
       }},
      {"trim", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("trim", a, {"chars"});
         std::optional<std::string> chars;
         if (b[0]) chars = arg_string(b[0], "trim()'s chars");
         return Value::of(py_strip(to_text(v), true, true, chars ? &*chars : nullptr));
       }},
      {"tojson", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
         DumpOptions o;
         if (b[0]) o.ensure_ascii = truthy(*b[0]);
         if (b[1] && !(b[1]->is_data() && b[1]->data().is_null())) {
           const int64_t n = b[1]->is_string() ? 0 : arg_int(b[1], "tojson()'s indent");
           if (n > 1000) fail("tojson()'s indent is over 1000");
           o.indent = b[1]->is_string() ? b[1]->str_ref() : std::string(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
           o.item_sep = ",";
         }
         if (b[2] && !(b[2]->is_data() && b[2]->data().is_null())) {
           const Json& s = data_of(*b[2], "tojson()'s separators");
           if (!s.is_array() || s.size() != 2 || !s[0].is_string() || !s[1].is_string())
             fail("tojson()'s separators must be two strings");
           o.item_sep = s[0].get<std::string>();
           o.key_sep = s[1].get<std::string>();
         }
         if (b[3]) o.sort_keys = truthy(*b[3]);
         std::string out;
         if (v.kind == Value::Kind::kNamespace || v.generator || v.holds_undefined)
           fail(str("Object of type ", v.holds_undefined ? "Undefined" : type_name(v), " is not JSON serializable"));
         json_dump(data_of(v, "written as JSON"), o, 0, out);
         return Value::of(out);
       }},
      {"upper", [](Context&, const Value& v, Args& a) { bind("upper", a, {}); return Value::of(convert_case(to_text(v), "upper", Case::kUpper)); }},
      {"lower", [](Context&, const Value& v, Args& a) { bind("lower", a, {}); return Value::of(convert_case(to_text(v), "lower", Case::kLower)); }},
      {"title", [](Context&, const Value& v, Args& a) { bind("title", a, {}); return Value::of(convert_case(to_text(v), "title", Case::kJinjaTitle)); }},
      {"capitalize", [](Context&, const Value& v, Args& a) { bind("capitalize", a, {}); return Value::of(convert_case(to_text(v), "capitalize", Case::kCapitalize)); }},
      {"string", [](Context&, const Value& v, Args& a) { bind("string", a, {}); return Value::of(to_text(v)); }},
      {"safe", [](Context&, const Value& v, Args& a) { bind("safe", a, {}); return v; }},
      {"escape", [](Context&, const Value& v, Args& a) { bind("escape", a, {}); return Value::of(html_escape(to_text(v))); }},
      {"int", [](Context&, const Value& v, Args& a) {  // jinja2's: int(value), else int(float(value)), else default
         const Bound b = bind("int", a, {"default", "base"});
         const Json dflt = b[0] ? data_of(*b[0], "int()'s default") : Json(0);
         const int base = b[1] ? static_cast<int>(arg_int(b[1], "int()'s base")) : 10;
         if (v.is_undefined()) fail(str("'", v.name, "' is undefined"));
         if (base != 0 && (base < 2 || base > 36)) fail("int() base must be >= 2 and <= 36, or 0");
         if (!v.is_data()) return Value::of(dflt);
         const Json& j = v.data();
         if (is_int(j)) return Value::of(as_int(j));
         std::optional<double> d;
         if (j.is_number_float()) d = j.get<double>();
         if (j.is_string()) {
           if (const std::optional<int64_t> i = py_parse_int(j.get_ref<const std::string&>(), base)) return Value::of(*i);
           d = py_parse_float(j.get_ref<const std::string&>());
         }
         if (!d || std::isnan(*d)) return Value::of(dflt);
         if (std::isinf(*d)) return Value::of(dflt);  // OverflowError: the default, as jinja2
         if (std::trunc(*d) >= 9223372036854775808.0 || std::trunc(*d) < -9223372036854775808.0) overflow();
         return Value::of(static_cast<int64_t>(std::trunc(*d)));
       }},
      {"float", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("float", a, {"default"});
         const Json dflt = b[0] ? data_of(*b[0], "float()'s default") : Json(0.0);
         if (v.is_undefined()) fail(str("'", v.name, "' is undefined"));
         if (v.is_number()) return Value::of(as_double(v.data()));
         if (v.is_string())
           if (const std::optional<double> d = py_parse_float(v.str_ref())) return Value::of(*d);
         return Value::of(dflt);
       }},
      {"abs", [](Context&, const Value& v, Args& a) {
         bind("abs", a, {});
         const Json& j = data_of(v, "abs()'s value");
         if (!is_num(j)) fail(str("bad operand type for abs(): '", py_type(j), "'"));
         if (is_int(j) && as_int(j) == INT64_MIN) overflow();
         return Value::of(is_int(j) ? Json(std::llabs(as_int(j))) : Json(std::fabs(as_double(j))));
       }},
      {"round", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("round", a, {"precision", "method"});
         const int64_t p = b[0] ? arg_int(b[0], "round()'s precision") : 0;
         const std::string method = b[1] ? arg_string(b[1], "round()'s method") : "common";
         const Json& j = data_of(v, "rounded");
         if (!is_num(j)) fail(str("type ", py_type(j), " doesn't define __round__ method"));
         if (p < -308 || p > 308) fail("round()'s precision is out of range");
         if (method == "common") {  // Python's round(): correctly rounded, ties to even; an int stays one
           if (is_int(j)) {
             const int64_t x = as_int(j);
             if (p >= 0 || p < -18) return Value::of(p >= 0 ? x : int64_t{0});
             int64_t unit = 1;
             for (int64_t k = 0; k < -p; ++k) unit *= 10;
             const int64_t q = floor_div(x, unit), r = x - q * unit;
             const int64_t up = 2 * r > unit || (2 * r == unit && (q & 1)) ? 1 : 0;
             int64_t out;
             if (__builtin_mul_overflow(q + up, unit, &out)) overflow();
             return Value::of(out);
           }
           const double x = as_double(j);
           if (!std::isfinite(x)) return Value::of(x);
           if (p >= 0) {
             std::vector<char> buf(static_cast<size_t>(p) + 400);
             std::snprintf(buf.data(), buf.size(), "%.*f", static_cast<int>(p), x);  // exact decimal, ties to even
             return Value::of(std::strtod(buf.data(), nullptr));
           }
           const double unit = std::pow(10.0, static_cast<double>(-p));
           return Value::of(std::nearbyint(x / unit) * unit);
         }
         const double scale = std::pow(10.0, static_cast<double>(p)), x = as_double(j);
         if (method == "floor") return Value::of(std::floor(x * scale) / scale);
         if (method == "ceil") return Value::of(std::ceil(x * scale) / scale);
         fail("round()'s method must be common, floor or ceil");
       }},
      {"first", [](Context&, const Value& v, Args& a) {
         bind("first", a, {});
         const std::vector<Json> items = iterate(v);
         return items.empty() ? Value::undefined("first of nothing") : Value::of(items.front());
       }},
      {"last", [](Context&, const Value& v, Args& a) {
         bind("last", a, {});
         const std::vector<Json> items = iterate(v);
         return items.empty() ? Value::undefined("last of nothing") : Value::of(items.back());
       }},
      {"list", [](Context&, const Value& v, Args& a) {
         bind("list", a, {});
         Json out = Json::array();
         for (Json& j : iterate(v)) out.push_back(std::move(j));
         Value list = Value::of(out);
         list.holds_undefined = v.holds_undefined;
         return list;
       }},
      {"reverse", [](Context&, const Value& v, Args& a) {
         bind("reverse", a, {});
         if (v.is_string()) return Value::of(slice(v.data(), std::nullopt, std::nullopt, -1));
         std::vector<Json> items = iterate(v);  // an iterator in jinja2: no length, true however empty
         return as_generator(Value::of(Json(std::vector<Json>(items.rbegin(), items.rend()))));
       }},
      {"join", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("join", a, {"d", "attribute"});
         const std::string sep = b[0] ? arg_string(b[0], "join()'s separator") : "";
         std::optional<std::string> attribute;
         if (b[1]) attribute = arg_string(b[1], "join()'s attribute");
         std::string out;
         bool first = true;
         for (const Json& item : iterate(v)) {
           if (!first) out += sep;
           out += to_text(attribute ? item_attribute(item, *attribute) : Value::of(item));
           first = false;
         }
         return Value::of(out);
       }},
      {"default", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("default", a, {"default_value", "boolean"});
         const bool boolean = b[1] && truthy(*b[1]);
         if (v.is_undefined() || (boolean && !truthy(v))) return b[0] ? *b[0] : Value::of("");
         return v;
       }},
      {"replace", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("replace", a, {"old", "new", "count"});
         return Value::of(py_replace(to_text(v), arg_string(b[0], "replace()'s old"), arg_string(b[1], "replace()'s new"),
                                     b[2] ? arg_int(b[2], "replace()'s count") : -1));
       }},
      {"selectattr", [](Context&, const Value& v, Args& a) { return select_filter(v, a, true, true, "selectattr"); }},
      {"rejectattr", [](Context&, const Value& v, Args& a) { return select_filter(v, a, true, false, "rejectattr"); }},
      {"select", [](Context&, const Value& v, Args& a) { return select_filter(v, a, false, true, "select"); }},
      {"reject", [](Context&, const Value& v, Args& a) { return select_filter(v, a, false, false, "reject"); }},
      {"map", [](Context& c, const Value& v, Args& a) {
         Json out = Json::array();
         std::optional<std::string> attribute;
         std::optional<Value> dflt;
         for (auto it = a.kw.begin(); it != a.kw.end(); ++it) {
           if (it->first == "attribute") attribute = arg_string(it->second, "map()'s attribute");
           else if (it->first == "default") dflt = it->second;
           else if (!attribute && a.pos.empty()) fail(str("map() got an unexpected keyword argument '", it->first, "'"));
         }
         if (attribute) {
           if (!a.pos.empty()) fail("map() takes an attribute or a filter, not both");
           bool missing = false;
           for (const Json& item : iterate(v)) {
             Value x = item_attribute(item, *attribute);
             if (x.is_undefined() && dflt) x = *dflt;
             // An item without it is undefined in jinja2, which joins as nothing: here "", marked.
             out.push_back(x.is_undefined() ? Json("") : data_of(x, "an item of map()"));
             missing = missing || x.is_undefined();
           }
           Value result = as_generator(Value::of(out));
           result.holds_undefined = missing;
           return result;
         }
         if (a.pos.empty()) fail("map() needs a filter name or attribute=");
         const std::string name = arg_string(a.pos[0], "map()'s filter");
         for (const Json& item : iterate(v)) {
           Args rest;
           rest.pos.assign(a.pos.begin() + 1, a.pos.end());
           rest.kw = a.kw;  // the filter's keyword arguments (map('tojson', indent=2))
           out.push_back(data_of(apply_filter(c, name, Value::of(item), rest), "an item of map()"));
         }
         return as_generator(Value::of(out));
       }},
      {"items", [](Context&, const Value& v, Args& a) {
         bind("items", a, {});
         if (v.is_undefined()) return Value::of(Json::array());
         const Json& j = data_of(v, "items()'s value");
         if (!j.is_object()) fail("items() takes a dict");
         Json out = Json::array();
         for (const auto& [k, x] : j.items()) out.push_back(Json::array({k, x}));
         return Value::of(out);
       }},
      {"unique", [](Context&, const Value& v, Args& a) {  // the first of each, ignoring case by default
         const Bound b = bind("unique", a, {"case_sensitive", "attribute"});
         const auto key = comparison_key(b[0], b[1], "unique");
         Json out = Json::array();
         std::vector<Json> seen;
         for (const Json& item : iterate(v)) {
           const Json k = key(item);
           if (!k.is_string() && !is_num(k) && !k.is_null()) fail(str("unhashable type: '", py_type(k), "'"));
           if (std::any_of(seen.begin(), seen.end(), [&](const Json& o) { return py_eq(o, k); })) continue;
           seen.push_back(k);
           out.push_back(item);
         }
         return as_generator(Value::of(out));
       }},
      {"sort", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("sort", a, {"reverse", "case_sensitive", "attribute"});
         const bool reverse = b[0] && truthy(*b[0]);
         if (b[1] && truthy(*b[1])) {}  // strings compare as they are either way below, except:
         std::optional<std::string> attribute;
         if (b[2]) attribute = arg_string(b[2], "sort()'s attribute");
         std::vector<Json> items = iterate(v);
         auto key = [&](const Json& j) {
           Json k = attribute ? data_of(item_attribute(j, *attribute), "a sort key") : j;
           if (k.is_string() && !(b[1] && truthy(*b[1]))) k = convert_case(k.get<std::string>(), "sort", Case::kLower);
           return k;
         };
         std::stable_sort(items.begin(), items.end(), [&](const Json& x, const Json& y) {
           return reverse ? py_compare(key(y), key(x)) < 0 : py_compare(key(x), key(y)) < 0;
         });
         return Value::of(Json(items));
       }},
      {"sum", [](Context&, const Value& v, Args& a) {
         const Bound b = bind("sum", a, {"attribute", "start"});
         Value total = b[1] ? *b[1] : Value::of(0);
         for (const Json& item : iterate(v))
           total = arithmetic("+", total, b[0] ? item_attribute(item, arg_string(b[0], "sum()'s attribute")) : Value::of(item));
         return total;
       }},
      {"min", [](Context&, const Value& v, Args& a) { return extreme(v, a, "min"); }},
      {"max", [](Context&, const Value& v, Args& a) { return extreme(v, a, "max"); }},
      {"dictsort", [](Context&, const Value& v, Args& a) {  // a dict's (key, value) pairs, sorted
         const Bound b = bind("dictsort", a, {"case_sensitive", "by", "reverse"});
         const Json& d = data_of(v, "sorted by dictsort");
         if (!d.is_object()) fail("dictsort() takes a dict");
         const bool case_sensitive = b[0] && truthy(*b[0]), reverse = b[2] && truthy(*b[2]);
         const std::string by = b[1] ? arg_string(b[1], "dictsort()'s by") : "key";
         if (by != "key" && by != "value") fail("dictsort()'s by must be 'key' or 'value'");
         std::vector<Json> pairs;
         for (const auto& [k, x] : d.items()) pairs.push_back(Json::array({k, x}));
         auto key = [&](const Json& pair) {
           Json k = pair[by == "key" ? 0 : 1];
           if (k.is_string() && !case_sensitive) k = convert_case(k.get<std::string>(), "dictsort", Case::kLower);
           return k;
         };
         std::stable_sort(pairs.begin(), pairs.end(), [&](const Json& x, const Json& y) {
           return reverse ? py_compare(key(y), key(x)) < 0 : py_compare(key(x), key(y)) < 0;
         });
         return Value::of(Json(pairs));
       }},
      {"indent", [](Context&, const Value& v, Args& a) {  // jinja2's: lines after the first, blank ones skipped
         const Bound b = bind("indent", a, {"width", "first", "blank"});
         std::string pad = "    ";
         if (b[0]) pad = b[0]->is_string() ? b[0]->str_ref() : std::string(static_cast<size_t>(std::clamp<int64_t>(arg_int(b[0], "indent()'s width"), 0, 1000)), ' ');
         const bool first = b[1] && truthy(*b[1]), blank = b[2] && truthy(*b[2]);
         if (!v.is_string()) fail(str("indent() takes a str, not ", type_name(v)));
         const std::vector<std::string> lines = py_splitlines(v.str_ref() + "\n", false);
         std::string out;
         for (size_t i = 0; i < lines.size(); ++i) {
           if (i > 0) out += '\n';
           if (i > 0 && (blank || !lines[i].empty())) out += pad;
           out += lines[i];
         }
         return Value::of(first ? pad + out : out);
       }},
  };
  return f;
}

const std::map<std::string, std::string>& filter_aliases() {
  static const std::map<std::string, std::string> a = {{"count", "length"}, {"d", "default"}, {"e", "escape"}};
  return a;
}

std::string filter_name(const std::string& name) {
  const auto alias = filter_aliases().find(name);
  return alias == filter_aliases().end() ? name : alias->second;
}

Value apply_filter(Context& c, const std::string& name, const Value& v, Args& a) {
  const auto it = filters().find(filter_name(name));
  if (it == filters().end()) fail(str("no filter named '", name, "' in twell's chat templates"));
  return it->second(c, v, a);
}

struct FilterExpr : Expr {
  ExprPtr base;
  std::string name;
  CallArgs args;
  Value eval(Context& c) const override {
    const Value v = base->eval(c);
    Args a = eval_args(c, args);
    return apply_filter(c, name, v, a);
  }
};

struct TestExpr : Expr {
  ExprPtr base;
  std::string name;
  std::vector<ExprPtr> args;
  bool negated = false;
  Value eval(Context& c) const override {
    const Value v = base->eval(c);
    std::vector<Value> a;
    for (const ExprPtr& e : args) a.push_back(e->eval(c));
    return Value::of(run_test(name, v, a) != negated);
  }
};

// ---- statements ------------------------------------------------------------------------------

enum class Flow { kNormal, kBreak, kContinue };

struct Stmt {
  int line = 0;
  virtual ~Stmt() = default;
  virtual Flow exec(Context& c, std::string& out) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

Flow exec_body(const Body& body, Context& c, std::string& out, const std::string& source) {
  for (const StmtPtr& s : body) {
    Flow f;
    try {
      f = s->exec(c, out);
    } catch (const RenderError& e) {
      if (e.message.rfind(source + ":", 0) == 0) throw;
      throw RenderError{str(source, ":", s->line, ": ", e.message)};
    }
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

struct TextStmt : Stmt {
  std::string text;
  Flow exec(Context&, std::string& out) const override {
    out += text;
    return Flow::kNormal;
  }
};

struct OutputStmt : Stmt {
  ExprPtr expr;
  Flow exec(Context& c, std::string& out) const override {
    out += to_text(expr->eval(c));
    return Flow::kNormal;
  }
};

struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // a null condition: else
  Flow exec(Context& c, std::string& out) const override {
    for (const auto& [cond, body] : branches)
      if (!cond || truthy(cond->eval(c))) return exec_body(body, c, out, *c.source);
    return Flow::kNormal;
  }
};

void assign_targets(Context& c, const std::vector<std::string>& targets, const Value& v) {
  if (targets.size() == 1) {
    c.set(targets[0], v);
    return;
  }
  data_of(v, "unpacked");
  const std::vector<Json> items = iterate(v);
  if (items.size() != targets.size())
    fail(str("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
  for (size_t i = 0; i < targets.size(); ++i) c.set(targets[i], Value::of(items[i]));
}

struct ForStmt : Stmt {
  std::vector<std::string> targets;
  ExprPtr iter, filter;
  Body body, otherwise;
  Flow exec(Context& c, std::string& out) const override {
    const Value seq = iter->eval(c);
    std::vector<Json> items = iterate(seq);
    if (filter) {
      std::vector<Json> kept;
      for (Json& item : items) {
        bool keep;
        {
          const Scope scope(c);
          assign_targets(c, targets, Value::of(item));
          keep = truthy(filter->eval(c));
        }
        if (keep) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const size_t n = items.size();
    for (size_t i = 0; i < n; ++i) {
      Json loop = {{"index", i + 1}, {"index0", i}, {"revindex", n - i}, {"revindex0", n - i - 1},
                   {"first", i == 0}, {"last", i + 1 == n}, {"length", n}, {"depth", 1}, {"depth0", 0}};
      if (i > 0) loop["previtem"] = items[i - 1];
      if (i + 1 < n) loop["nextitem"] = items[i + 1];
      const Scope scope(c);
      c.set("loop", Value::of(std::move(loop)));
      assign_targets(c, targets, Value::of(items[i]));
      if (exec_body(body, c, out, *c.source) == Flow::kBreak) break;
    }
    if (n == 0 && !otherwise.empty()) {  // in a scope of its own, as the loop's body
      const Scope scope(c);
      exec_body(otherwise, c, out, *c.source);
    }
    return Flow::kNormal;
  }
};

struct SetStmt : Stmt {
  std::vector<std::string> targets;  // names, or one "ns.attr" with attribute set
  std::string attribute;
  ExprPtr value;
  Body block;  // {% set x %}...{% endset %}
  std::vector<std::pair<std::string, CallArgs>> block_filters;
  Flow exec(Context& c, std::string& out) const override {
    Value v;
    if (value) {
      v = value->eval(c);
    } else {
      std::string text;
      exec_body(block, c, text, *c.source);
      v = Value::of(text);
      for (const auto& [name, args] : block_filters) {
        Args a = eval_args(c, args);
        v = apply_filter(c, name, v, a);
      }
    }
    if (!attribute.empty()) {
      const Value ns = c.lookup(targets[0]);
      if (ns.kind != Value::Kind::kNamespace)
        fail(str("cannot set an attribute of '", targets[0], "': only a namespace() takes `set ", targets[0], ".",
                 attribute, "`"));
      if (attribute[0] == '_') fail("a namespace's attribute cannot begin with '_'");
      (*ns.ns)[attribute] = data_of(v, "stored in a namespace");
      return Flow::kNormal;
    }
    assign_targets(c, targets, v);
    return Flow::kNormal;
  }
};

struct LoopControl : Stmt {
  Flow flow;
  Flow exec(Context&, std::string&) const override { return flow; }
};

struct Block : Stmt {  // {% generation %}: its body as it stands
  Body body;
  Flow exec(Context& c, std::string& out) const override { return exec_body(body, c, out, *c.source); }
};

constexpr int kMaxMacroDepth = 256;  // calls within calls (jinja2's limit is Python's recursion limit)

struct MacroStmt : Stmt {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default or null
  Body body;
  Flow exec(Context& c, std::string&) const override {
    const MacroStmt* self = this;
    // The scopes where it is defined (a loop's variables too), weakly: the macro lives in one of them.
    std::vector<std::weak_ptr<Frame>> scope(c.frames.begin(), c.frames.end());
    Context* ctx = &c;
    c.set(name, Value::function(name, [self, scope, ctx](Args& a) {
      Context& cc = *ctx;
      if (cc.depth >= kMaxMacroDepth) fail(str("macros nested too deeply (over ", kMaxMacroDepth, " calls)"));
      ++cc.depth;
      auto frame = std::make_shared<Frame>();
      if (a.pos.size() > self->params.size())
        fail(str("macro '", self->name, "' takes at most ", self->params.size(), " arguments (", a.pos.size(), " given)"));
      std::vector<bool> given(self->params.size(), false);
      for (size_t i = 0; i < a.pos.size(); ++i) {
        frame->vars[self->params[i].first] = a.pos[i];
        given[i] = true;
      }
      for (auto& [k, v] : a.kw) {
        size_t i = 0;
        while (i < self->params.size() && self->params[i].first != k) ++i;
        if (i == self->params.size()) fail(str("macro '", self->name, "' takes no keyword argument '", k, "'"));
        frame->vars[k] = v;
        given[i] = true;
      }
      std::vector<std::shared_ptr<Frame>> saved = std::move(cc.frames);
      cc.frames.clear();
      for (const std::weak_ptr<Frame>& f : scope)
        if (std::shared_ptr<Frame> alive = f.lock()) cc.frames.push_back(std::move(alive));
      cc.frames.push_back(frame);
      std::string text;
      try {
        for (size_t i = 0; i < self->params.size(); ++i)
          if (!given[i])
            frame->vars[self->params[i].first] =
                self->params[i].second ? self->params[i].second->eval(cc) : Value::undefined(self->params[i].first);
        exec_body(self->body, cc, text, *cc.source);
      } catch (...) {
        cc.frames = std::move(saved);
        --cc.depth;
        throw;
      }
      cc.frames = std::move(saved);
      --cc.depth;
      return Value::of(text);
    }));
    return Flow::kNormal;
  }
};

// ---- the parser ------------------------------------------------------------------------------

class Parser {
 public:
  Parser(std::vector<Piece> pieces, const std::string& source) : pieces_(std::move(pieces)), source_(source) {}

  Body parse_template() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  [[noreturn]] void error(const std::string& what) const { throw Error(str(source_, ":", line_, ": ", what)); }

  // Statements up to one of `ends` (its keyword in `end`), or the template's end where `ends` is empty.
  Body parse_body(const std::vector<std::string>& ends, std::string& end) {
    Body body;
    while (at_ < pieces_.size()) {
      Piece& p = pieces_[at_++];
      line_ = p.line;
      if (p.type == Piece::Type::kText) {
        auto t = std::make_unique<TextStmt>();
        t->line = p.line;
        t->text = std::move(p.text);
        body.push_back(std::move(t));
        continue;
      }
      toks_ = &p.tokens;
      pos_ = 0;
      if (p.type == Piece::Type::kOutput) {
        auto o = std::make_unique<OutputStmt>();
        o->line = p.line;
        o->expr = parse_tuple_or_expr();
        expect_end();
        body.push_back(std::move(o));
        continue;
      }
      const Token& kw = next();
      if (kw.type != Token::Type::kName) error("a statement must begin with a keyword");
      if (std::find(ends.begin(), ends.end(), kw.text) != ends.end()) {
        end = kw.text;
        return body;
      }
      static const char* const kEnds[] = {"elif", "else", "endif", "endfor", "endset", "endmacro", "endgeneration",
                                          "endraw", "endblock", "endfilter", "endwith", "endcall"};
      if (std::find_if(std::begin(kEnds), std::end(kEnds), [&](const char* e) { return kw.text == e; }) != std::end(kEnds))
        error(str("unexpected '{% ", kw.text, " %}'", ends.empty() ? std::string(" outside any block") : ", expected " + join(ends)));
      const Nested nested(*this);
      body.push_back(parse_statement(kw.text, p.line));
    }
    if (!ends.empty()) error(str("the template ended inside a block: expected ", join(ends)));
    return body;
  }

  static std::string join(const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i) out += (i ? " or " : "") + ("{% " + v[i] + " %}");
    return out;
  }

  StmtPtr parse_statement(const std::string& kw, int line) {
    if (kw == "if") {
      auto s = std::make_unique<IfStmt>();
      s->line = line;
      ExprPtr cond = parse_expression();
      expect_end();
      while (true) {
        std::string end;
        Body body = parse_body({"elif", "else", "endif"}, end);
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "endif") {
          expect_end();
          break;
        }
        if (end == "else") {
          expect_end();
          std::string end2;
          Body other = parse_body({"endif"}, end2);
          expect_end();
          s->branches.emplace_back(nullptr, std::move(other));
          break;
        }
        cond = parse_expression();
        expect_end();
      }
      return s;
    }
    if (kw == "for") {
      auto s = std::make_unique<ForStmt>();
      s->line = line;
      s->targets = parse_targets();
      if (!next_is_name("in")) error("expected 'in' in a for statement");
      ++pos_;
      s->iter = parse_tuple_or_expr(/*with_condition=*/false);
      if (next_is_name("if")) {
        ++pos_;
        s->filter = parse_expression();
      }
      if (next_is_name("recursive")) error("recursive for loops are not supported by twell's chat templates");
      expect_end();
      std::string end;
      ++loop_depth_;
      s->body = parse_body({"else", "endfor"}, end);
      --loop_depth_;
      expect_end();
      if (end == "else") {
        s->otherwise = parse_body({"endfor"}, end);
        expect_end();
      }
      return s;
    }
    if (kw == "set") {
      auto s = std::make_unique<SetStmt>();
      s->line = line;
      s->targets = parse_targets();
      if (s->targets.size() == 1 && peek().type == Token::Type::kOp && peek().text == ".") {
        ++pos_;
        const Token& attr = next();
        if (attr.type != Token::Type::kName) error("expected an attribute name after '.' in set");
        s->attribute = attr.text;
      }
      if (peek().type == Token::Type::kOp && peek().text == "=") {
        ++pos_;
        s->value = parse_tuple_or_expr();
        expect_end();
        return s;
      }
      if (s->targets.size() != 1 || !s->attribute.empty()) error("a block set takes one name");
      while (peek().type == Token::Type::kOp && peek().text == "|") {
        ++pos_;
        std::string name = parse_filter_name();
        CallArgs args;
        if (peek().type == Token::Type::kOp && peek().text == "(") {
          ++pos_;
          args = parse_call_args();
        }
        s->block_filters.emplace_back(std::move(name), std::move(args));
      }
      expect_end();
      std::string end;
      s->block = parse_body({"endset"}, end);
      expect_end();
      return s;
    }
    if (kw == "macro") {
      auto s = std::make_unique<MacroStmt>();
      s->line = line;
      const Token& name = next();
      if (name.type != Token::Type::kName) error("expected the macro's name");
      s->name = name.text;
      expect_op("(");
      while (!(peek().type == Token::Type::kOp && peek().text == ")")) {
        const Token& p = next();
        if (p.type != Token::Type::kName) error("expected a parameter name in the macro");
        ExprPtr dflt;
        if (peek().type == Token::Type::kOp && peek().text == "=") {
          ++pos_;
          dflt = parse_expression();
        } else if (!s->params.empty() && s->params.back().second) {
          error(str("macro '", s->name, "': parameter '", p.text, "' without a default follows one with a default"));
        }
        s->params.emplace_back(p.text, std::move(dflt));
        if (peek().type == Token::Type::kOp && peek().text == ",") ++pos_;
        else break;
      }
      expect_op(")");
      expect_end();
      std::string end;
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, end);
      loop_depth_ = saved;
      if (peek().type == Token::Type::kName) ++pos_;  // {% endmacro name %}
      expect_end();
      return s;
    }
    if (kw == "break" || kw == "continue") {
      if (loop_depth_ == 0) error(str("'", kw, "' outside a for loop"));
      expect_end();
      auto s = std::make_unique<LoopControl>();
      s->line = line;
      s->flow = kw == "break" ? Flow::kBreak : Flow::kContinue;
      return s;
    }
    if (kw == "generation") {
      expect_end();
      auto s = std::make_unique<Block>();
      s->line = line;
      std::string end;
      s->body = parse_body({"endgeneration"}, end);
      expect_end();
      return s;
    }
    error(str("'{% ", kw, " %}' is not supported by twell's chat templates"));
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    const bool paren = peek().type == Token::Type::kOp && peek().text == "(";
    if (paren) ++pos_;
    while (true) {
      const Token& t = next();
      if (t.type != Token::Type::kName) error("expected a name to assign");
      names.push_back(t.text);
      if (peek().type == Token::Type::kOp && peek().text == ",") {
        ++pos_;
        continue;
      }
      break;
    }
    if (paren) expect_op(")");
    return names;
  }

  // ---- tokens

  const Token& peek(size_t ahead = 0) const {
    const size_t i = std::min(pos_ + ahead, toks_->size() - 1);
    return (*toks_)[i];
  }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < toks_->size() - 1) ++pos_;
    return t;
  }
  bool next_is_name(const char* name) const { return peek().type == Token::Type::kName && peek().text == name; }
  bool next_is_op(const char* op) const { return peek().type == Token::Type::kOp && peek().text == op; }
  void expect_op(const char* op) {
    if (!next_is_op(op)) error(str("expected '", op, "'", describe_next()));
    ++pos_;
  }
  void expect_end() {
    if (peek().type != Token::Type::kEnd) error(str("expected the tag's end", describe_next()));
  }
  std::string describe_next() const {
    const Token& t = peek();
    if (t.type == Token::Type::kEnd) return ", found the tag's end";
    if (t.type == Token::Type::kString) return ", found a string";
    if (t.type == Token::Type::kInt || t.type == Token::Type::kFloat) return ", found a number";
    return str(", found '", t.text, "'");
  }

  template <class T>
  std::unique_ptr<T> node() {
    auto n = std::make_unique<T>();
    n->line = line_;
    return n;
  }

  // ---- expressions, in jinja2's precedence

  // An expression, or a tuple of them where commas follow (`{{ a, b }}`, `for x in a, b`).
  ExprPtr parse_tuple_or_expr(bool with_condition = true) {
    ExprPtr first = with_condition ? parse_expression() : parse_or();
    if (!next_is_op(",")) return first;
    auto list = node<ListExpr>();
    list->items.push_back(std::move(first));
    while (next_is_op(",")) {
      ++pos_;
      if (peek().type == Token::Type::kEnd || next_is_name("if")) break;
      list->items.push_back(with_condition ? parse_expression() : parse_or());
    }
    return list;
  }

  ExprPtr parse_expression() {
    const Nested nested(*this);
    ExprPtr e = parse_or();
    while (next_is_name("if")) {
      ++pos_;
      auto c = node<Conditional>();
      c->then = std::move(e);
      c->cond = parse_or();
      if (next_is_name("else")) {
        ++pos_;
        c->otherwise = parse_expression();
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() { return parse_logic(false); }
  ExprPtr parse_and() { return parse_logic(true); }

  // a or b or ... (operands: and-expressions), a and b and ... (operands: not-expressions).
  ExprPtr parse_logic(bool is_and) {
    const auto operand = [&] { return is_and ? parse_not() : parse_and(); };
    ExprPtr e = operand();
    while (next_is_name(is_and ? "and" : "or")) {
      ++pos_;
      auto l = node<Logic>();
      l->is_and = is_and;
      l->a = std::move(e);
      l->b = operand();
      e = std::move(l);
    }
    return e;
  }

  ExprPtr parse_not() {
    const Nested nested(*this);
    if (next_is_name("not")) {
      ++pos_;
      auto u = node<Unary>();
      u->op = '!';
      u->operand = parse_not();
      return u;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    std::unique_ptr<Compare> cmp;
    while (true) {
      std::string op;
      if (peek().type == Token::Type::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (next_is_name("in")) {
        ++pos_;
        op = "in";
      } else if (next_is_name("not") && peek(1).type == Token::Type::kName && peek(1).text == "in") {
        pos_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node<Compare>();
        cmp->first = std::move(e);
      }
      cmp->rest.emplace_back(op, parse_math1());
    }
    if (cmp) return cmp;
    return e;
  }

  ExprPtr binary(std::string op, ExprPtr a, ExprPtr b) {
    auto n = node<Binary>();
    n->op = std::move(op);
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  // Binary operators by precedence, loosest first (jinja2's math1, concat, math2 and pow levels); the
  // operands of the last are unary expressions.
  static constexpr const char* kLevels[][4] = {{"+", "-"}, {"~"}, {"*", "/", "//", "%"}, {"**"}};

  ExprPtr parse_math1() { return parse_binary(0); }

  ExprPtr parse_binary(size_t level) {
    if (level == std::size(kLevels)) return parse_unary();
    ExprPtr e = parse_binary(level + 1);
    while (true) {
      const char* op = nullptr;
      for (const char* candidate : kLevels[level])
        if (candidate != nullptr && next_is_op(candidate)) op = candidate;
      if (op == nullptr) return e;
      ++pos_;
      e = binary(op, std::move(e), parse_binary(level + 1));
    }
  }

  ExprPtr parse_unary(bool with_filter = true) {
    const Nested nested(*this);
    ExprPtr e;
    if (next_is_op("-") || next_is_op("+")) {
      auto u = node<Unary>();
      u->op = next().text[0];
      u->operand = parse_unary(false);
      e = std::move(u);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = next();
    switch (t.type) {
      case Token::Type::kName: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False" || t.text == "none" ||
            t.text == "None") {
          auto l = node<Literal>();
          if (t.text == "none" || t.text == "None") l->value = nullptr;
          else l->value = t.text == "true" || t.text == "True";
          return l;
        }
        auto n = node<Name>();
        n->name = t.text;
        return n;
      }
      case Token::Type::kString: {
        auto l = node<Literal>();
        std::string s = t.text;
        while (peek().type == Token::Type::kString) s += next().text;  // adjacent literals join
        l->value = s;
        return l;
      }
      case Token::Type::kInt: {
        auto l = node<Literal>();
        l->value = t.int_value;
        return l;
      }
      case Token::Type::kFloat: {
        auto l = node<Literal>();
        l->value = t.float_value;
        return l;
      }
      case Token::Type::kOp: {
        if (t.text == "(") {
          if (next_is_op(")")) {
            ++pos_;
            return node<ListExpr>();
          }
          ExprPtr e = parse_expression();
          if (next_is_op(",")) {
            auto list = node<ListExpr>();
            list->items.push_back(std::move(e));
            while (next_is_op(",")) {
              ++pos_;
              if (next_is_op(")")) break;
              list->items.push_back(parse_expression());
            }
            e = std::move(list);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto list = node<ListExpr>();
          while (!next_is_op("]")) {
            list->items.push_back(parse_expression());
            if (!next_is_op(",")) break;
            ++pos_;
          }
          expect_op("]");
          return list;
        }
        if (t.text == "{") {
          auto dict = node<DictExpr>();
          while (!next_is_op("}")) {
            ExprPtr k = parse_expression();
            expect_op(":");
            dict->items.emplace_back(std::move(k), parse_expression());
            if (!next_is_op(",")) break;
            ++pos_;
          }
          expect_op("}");
          return dict;
        }
        error(str("unexpected '", t.text, "'"));
      }
      case Token::Type::kEnd: error("an expression was expected before the tag's end");
    }
    error("unexpected token");
  }

  CallArgs parse_call_args() {  // after '('
    CallArgs args;
    while (!next_is_op(")")) {
      if (next_is_op("*") || next_is_op("**")) error("*args and **kwargs are not supported by twell's chat templates");
      if (peek().type == Token::Type::kName && peek(1).type == Token::Type::kOp && peek(1).text == "=") {
        std::string k = next().text;
        ++pos_;
        args.kw.emplace_back(std::move(k), parse_expression());
      } else {
        if (!args.kw.empty()) error("a positional argument after a keyword argument");
        args.pos.push_back(parse_expression());
      }
      if (!next_is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
    return args;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (next_is_op(".")) {
        ++pos_;
        const Token& t = next();
        if (t.type == Token::Type::kName) {
          auto a = node<Attribute>();
          a->base = std::move(e);
          a->name = t.text;
          e = std::move(a);
        } else if (t.type == Token::Type::kInt) {
          auto s = node<Subscript>();
          s->base = std::move(e);
          auto l = node<Literal>();
          l->value = t.int_value;
          s->key = std::move(l);
          e = std::move(s);
        } else {
          error("expected an attribute name after '.'");
        }
      } else if (next_is_op("[")) {
        ++pos_;
        ExprPtr parts[3];
        int colons = 0;
        for (int k = 0; k < 3; ++k) {
          if (!next_is_op(":") && !next_is_op("]")) parts[k] = parse_expression();
          if (k < 2 && next_is_op(":")) {
            ++pos_;
            ++colons;
          } else {
            break;
          }
        }
        expect_op("]");
        if (colons == 0) {
          if (!parts[0]) error("an empty subscript");
          auto s = node<Subscript>();
          s->base = std::move(e);
          s->key = std::move(parts[0]);
          e = std::move(s);
        } else {
          auto s = node<SliceExpr>();
          s->base = std::move(e);
          s->start = std::move(parts[0]);
          s->stop = std::move(parts[1]);
          s->step = std::move(parts[2]);
          e = std::move(s);
        }
      } else if (next_is_op("(")) {
        ++pos_;
        auto c = node<Call>();
        c->fn = std::move(e);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  std::string parse_filter_name() {
    const Token& t = next();
    if (t.type != Token::Type::kName) error("expected a filter name after '|'");
    std::string name = t.text;
    while (next_is_op(".") && peek(1).type == Token::Type::kName) {
      pos_ += 1;
      name += "." + next().text;
    }
    if (!filters().count(filter_name(name))) error(str("no filter named '", name, "' in twell's chat templates"));
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (next_is_op("|")) {
        ++pos_;
        auto f = node<FilterExpr>();
        f->base = std::move(e);
        f->name = parse_filter_name();
        if (next_is_op("(")) {
          ++pos_;
          f->args = parse_call_args();
        }
        e = std::move(f);
      } else if (next_is_name("is")) {
        ++pos_;
        auto t = node<TestExpr>();
        t->base = std::move(e);
        if (next_is_name("not")) {
          ++pos_;
          t->negated = true;
        }
        const Token& name = next();
        if (name.type != Token::Type::kName && !(name.type == Token::Type::kOp && test_aliases().count(name.text)))
          error("expected a test name after 'is'");
        t->name = name.text;
        if (!tests().count(test_name(t->name))) error(str("no test named '", t->name, "' in twell's chat templates"));
        if (next_is_op("(")) {
          ++pos_;
          CallArgs a = parse_call_args();
          if (!a.kw.empty()) error("tests take no keyword arguments in twell's chat templates");
          t->args = std::move(a.pos);
        } else {
          const Token& p = peek();
          const bool arg = (p.type == Token::Type::kName && p.text != "else" && p.text != "or" && p.text != "and" &&
                            p.text != "if" && p.text != "in" && p.text != "not" && p.text != "is") ||
                           p.type == Token::Type::kString || p.type == Token::Type::kInt ||
                           p.type == Token::Type::kFloat || (p.type == Token::Type::kOp && (p.text == "[" || p.text == "{"));
          if (arg) t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (next_is_op("(")) {
        ++pos_;
        auto c = node<Call>();
        c->fn = std::move(e);
        c->args = parse_call_args();
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // One level of nesting (a block, an expression, a unary operator) while it is parsed: past kMaxNesting,
  // an error rather than a stack that runs out (jinja2 stops at Python's recursion limit).
  static constexpr int kMaxNesting = 200;
  struct Nested {
    Parser& p;
    explicit Nested(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxNesting) p.error(str("nested more than ", kMaxNesting, " levels deep"));
    }
    ~Nested() { --p.nesting_; }
  };
  int nesting_ = 0;

  std::vector<Piece> pieces_;
  const std::string& source_;
  size_t at_ = 0;
  int line_ = 1;
  const std::vector<Token>* toks_ = nullptr;
  size_t pos_ = 0;
  int loop_depth_ = 0;
};

// The functions every template sees.
std::unordered_map<std::string, Value> make_globals(const std::string& source) {
  std::unordered_map<std::string, Value> g;
  g["raise_exception"] = Value::function("raise_exception", [source](Args& a) -> Value {
    const Bound b = bind("raise_exception", a, {"message"});
    throw Error(str(source, ": the template refused the input: ", b[0] ? to_text(*b[0]) : std::string()));
  });
  g["range"] = Value::function("range", [](Args& a) {
    if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) fail("range() takes one to three integers");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = arg_int(a.pos[0], "range()'s argument");
    } else {
      start = arg_int(a.pos[0], "range()'s start");
      stop = arg_int(a.pos[1], "range()'s stop");
      if (a.pos.size() == 3) step = arg_int(a.pos[2], "range()'s step");
    }
    if (step == 0) fail("range() step must not be zero");
    const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 count = span <= 0 ? 0 : (span + (step > 0 ? step : -static_cast<__int128>(step)) - 1) /
                                               (step > 0 ? step : -static_cast<__int128>(step));
    if (count > 100000) fail("range() of more than 100000 items (jinja2's sandbox limit)");
    Json out = Json::array();
    for (__int128 i = 0; i < count; ++i) out.push_back(static_cast<int64_t>(start + i * step));
    return Value::of(out);
  });
  g["namespace"] = Value::function("namespace", [](Args& a) {
    Value v;
    v.kind = Value::Kind::kNamespace;
    v.ns = std::make_shared<Json>(Json::object());
    for (const Value& p : a.pos) {
      const Json& d = data_of(p, "namespace()'s argument");
      if (!d.is_object()) fail("namespace() takes a dict or keyword arguments");
      for (const auto& [k, x] : d.items()) (*v.ns)[k] = x;
    }
    for (const auto& [k, x] : a.kw) {
      if (!k.empty() && k[0] == '_') fail("a namespace's attribute cannot begin with '_'");
      (*v.ns)[k] = data_of(x, "stored in a namespace");
    }
    return v;
  });
  g["dict"] = Value::function("dict", [](Args& a) {
    Json out = Json::object();
    for (const Value& p : a.pos) {
      const Json& d = data_of(p, "dict()'s argument");
      if (!d.is_object()) fail("dict() takes a dict or keyword arguments");
      for (const auto& [k, x] : d.items()) out[k] = x;
    }
    for (const auto& [k, x] : a.kw) out[k] = data_of(x, "put in a dict");
    return Value::of(out);
  });
  g["strftime_now"] = Value::function("strftime_now", [](Args& a) {
    const std::string format = arg_string(bind("strftime_now", a, {"format"})[0], "strftime_now()'s format");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, format.c_str(), &local);
    return Value::of(std::string(buf, n));
  });
  return g;
}

Json parse_object(std::string_view text, const std::string& source, const char* what) {
  if (text.empty()) return Json::object();
  // Through the project's strict parser (no duplicate keys, bounded depth), then as ordered JSON so that
  // dicts keep their order as Python's do.
  io::detail::parse_json_strict(text.data(), text.data() + text.size(), source, what, 64);
  Json j = Json::parse(text.begin(), text.end());
  if (!j.is_object()) throw Error(str(source, ": ", what, " must be a JSON object"));
  return j;
}

}  // namespace

struct ChatTemplate::Impl {
  std::string text, source;
  Body body;
  std::unordered_map<std::string, Value> globals;
};

ChatTemplate::ChatTemplate(std::string_view text, std::string source) {
  auto impl = std::make_shared<Impl>();
  impl->text = std::string(text);
  impl->source = std::move(source);
  Lexer lexer(impl->text, impl->source);
  Parser parser(lexer.run(), impl->source);
  impl->body = parser.parse_template();
  impl->globals = make_globals(impl->source);
  impl_ = std::move(impl);
}

const std::string& ChatTemplate::source() const { return impl_->source; }
const std::string& ChatTemplate::text() const { return impl_->text; }

void ChatTemplate::set_special_tokens(std::string_view json_object) {
  const Json j = parse_object(json_object, impl_->source, "the special tokens");
  Json kept = Json::object();
  for (const auto& [k, v] : j.items()) {
    if (v.is_null()) continue;  // a token the tokenizer does not have
    if (!v.is_string()) throw Error(str(impl_->source, ": the special token '", k, "' must be a string"));
    kept[k] = v;
  }
  special_tokens_json_ = kept.dump();
}

namespace {

// The template rendered with the special tokens and then `given` (a JSON object) as its variables.
std::string render_variables(const ChatTemplate::Impl& impl, const std::string& special_json, Json given) {
  Json vars = parse_object(special_json, impl.source, "the special tokens");
  for (auto& [k, v] : given.items()) vars[k] = std::move(v);
  Context c;
  c.frames.push_back(std::make_shared<Frame>());
  for (auto& [k, v] : vars.items()) c.frames.front()->vars[k] = Value::of(std::move(v));
  c.globals = &impl.globals;
  c.source = &impl.source;
  std::string out;
  try {
    exec_body(impl.body, c, out, impl.source);
  } catch (const RenderError& e) {
    throw Error(e.message);
  }
  return out;
}

}  // namespace

std::string ChatTemplate::render(std::string_view variables_json) const {
  return render_variables(*impl_, special_tokens_json_,
                          parse_object(variables_json, impl_->source, "the template's variables"));
}

std::string ChatTemplate::apply(std::string_view messages_json, bool add_generation_prompt,
                                std::string_view variables_json) const {
  io::detail::parse_json_strict(messages_json.data(), messages_json.data() + messages_json.size(), impl_->source,
                                "the messages", 64);
  const Json given_messages = Json::parse(messages_json.begin(), messages_json.end());
  if (!given_messages.is_array()) throw Error(str(impl_->source, ": the messages must be a JSON array"));
  // As transformers prepares them: keys whose value is null dropped (an API's "content": null, "tool_calls":
  // null), and the reasoning under its other names too (reasoning_content, thinking, from the first of
  // reasoning_content, thinking, reasoning that is given).
  Json messages = Json::array();
  for (const Json& m : given_messages) {
    if (!m.is_object())
      throw Error(str(impl_->source, ": each message must be a JSON object such as {\"role\": \"user\", \"content\": \"...\"}"));
    Json kept = Json::object();
    for (const auto& [k, v] : m.items())
      if (!v.is_null()) kept[k] = v;
    const Json* reasoning = nullptr;
    for (const char* key : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && kept.contains(key)) reasoning = &kept[key];
    if (reasoning) {
      Json aliased = {{"thinking", *reasoning}};
      for (const auto& [k, v] : kept.items()) aliased[k] = v;  // a message's own thinking stays its own
      aliased["reasoning_content"] = *reasoning;
      kept = std::move(aliased);
    }
    messages.push_back(std::move(kept));
  }
  Json vars = {{"messages", messages}, {"tools", nullptr}, {"documents", nullptr},
               {"add_generation_prompt", add_generation_prompt}};
  const Json given = parse_object(variables_json, impl_->source, "the template's variables");
  for (const auto& [k, v] : given.items()) vars[k] = v;
  return render_variables(*impl_, special_tokens_json_, std::move(vars));
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  Json j = Json::array();
  for (const ChatMessage& m : messages) j.push_back({{"role", m.role}, {"content", m.content}});
  return apply(j.dump(), add_generation_prompt);
}

namespace {

// A JSON object file of the model directory, or nullopt where it is not there.
std::optional<Json> read_json_object(const std::filesystem::path& p) {
  std::error_code ec;
  if (!std::filesystem::exists(p, ec)) return std::nullopt;
  const std::string text = io::detail::read_text_file(p.string());
  const std::string name = p.filename().string();
  io::detail::parse_json_strict(text.data(), text.data() + text.size(), p.string(), name.c_str(), 64);
  Json j = Json::parse(text);
  if (!j.is_object()) throw Error(str(p.string(), ": must be a JSON object"));
  return j;
}

// The model directory the chat functions read, refused where it is not one.
std::filesystem::path model_directory(const std::string& model_dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(model_dir, ec)) throw Error(str(model_dir, ": not a directory"));
  return model_dir;
}

}  // namespace

std::string chat_special_tokens(const std::string& model_dir) {
  Json special = Json::object();
  if (model_dir.empty()) return special.dump();
  const std::filesystem::path dir = model_directory(model_dir);
  // tokenizer_config.json's keys, special_tokens_map.json's over them unless the config lists its added tokens
  // (added_tokens_decoder: transformers then reads no map), as transformers 5 loads them.
  Json merged = read_json_object(dir / "tokenizer_config.json").value_or(Json::object());
  if (!merged.contains("added_tokens_decoder"))
    if (const std::optional<Json> map = read_json_object(dir / "special_tokens_map.json"))
      for (const auto& [k, v] : map->items()) merged[k] = v;
  // A token is a string, or {"content": ...} (an AddedToken); null leaves it out.
  const auto token = [](const Json& v) -> std::optional<std::string> {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
    return std::nullopt;
  };
  static const char* const kNamed[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                                       "mask_token"};
  for (const char* key : kNamed)
    if (const auto it = merged.find(key); it != merged.end())
      if (const std::optional<std::string> t = token(*it)) special[key] = *t;
  // The model's own named tokens: extra_special_tokens as a dict, and other keys ending in _token.
  if (const auto it = merged.find("extra_special_tokens"); it != merged.end() && it->is_object())
    for (const auto& [k, v] : it->items())
      if (const std::optional<std::string> t = token(v)) special[k] = *t;
  for (const auto& [k, v] : merged.items()) {
    if (k.size() <= 6 || k.compare(k.size() - 6, 6, "_token") != 0 || special.contains(k)) continue;
    if (std::find(std::begin(kNamed), std::end(kNamed), k) != std::end(kNamed)) continue;
    if (v.is_string() || (v.is_object() && v.value("__type", "") == "AddedToken"))
      if (const std::optional<std::string> t = token(v)) special[k] = *t;
  }
  return special.dump();
}

std::vector<std::pair<std::string, std::string>> chat_templates(const std::string& model_dir,
                                                                 std::vector<std::string>* sources) {
  namespace fs = std::filesystem;
  const fs::path dir = model_directory(model_dir);
  std::error_code ec;
  std::vector<std::pair<std::string, std::string>> named;
  std::vector<std::string> from;
  const auto add = [&](const std::string& name, std::string text, std::string source) {
    for (size_t i = 0; i < named.size(); ++i)
      if (named[i].first == name) {
        named[i].second = std::move(text);
        from[i] = std::move(source);
        return;
      }
    named.emplace_back(name, std::move(text));
    from.push_back(std::move(source));
  };
  const fs::path jinja = dir / "chat_template.jinja";
  if (fs::exists(jinja, ec)) {
    add("default", io::detail::read_text_file(jinja.string()), jinja.string());
  } else if (const std::optional<Json> config = read_json_object(dir / "tokenizer_config.json")) {
    const fs::path p = dir / "tokenizer_config.json";
    const auto it = config->find("chat_template");
    if (it != config->end() && !it->is_null()) {
      if (it->is_string()) {
        add("default", it->get<std::string>(), p.string() + " (chat_template)");
      } else if (it->is_array()) {
        for (const Json& entry : *it) {
          if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() || !entry.contains("template") ||
              !entry["template"].is_string())
            throw Error(str(p.string(), ": chat_template's list entries must be {\"name\": ..., \"template\": ...}"));
          const std::string name = entry["name"].get<std::string>();
          add(name, entry["template"].get<std::string>(), str(p.string(), " (chat_template '", name, "')"));
        }
      } else {
        throw Error(str(p.string(), ": chat_template must be a string or a list of {\"name\", \"template\"}"));
      }
    }
  }
  // additional_chat_templates/NAME.jinja: more named templates (transformers saves them there).
  const fs::path extra = dir / "additional_chat_templates";
  if (fs::is_directory(extra, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(extra, ec))
      if (e.path().extension() == ".jinja") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) add(f.stem().string(), io::detail::read_text_file(f.string()), f.string());
  }
  if (sources) *sources = std::move(from);
  return named;
}

std::optional<ChatTemplate> load_chat_template(const std::string& model_dir, const ChatTemplateChoice& choice) {
  std::optional<ChatTemplate> t;
  if (!choice.file.empty()) {
    t.emplace(io::detail::read_text_file(choice.file), choice.file);
  } else {
    std::vector<std::string> sources;
    const std::vector<std::pair<std::string, std::string>> named = chat_templates(model_dir, &sources);
    if (named.empty()) return std::nullopt;
    auto index = [&](const std::string& name) -> std::optional<size_t> {
      for (size_t i = 0; i < named.size(); ++i)
        if (named[i].first == name) return i;
      return std::nullopt;
    };
    std::optional<size_t> at;
    if (!choice.name.empty()) {
      at = index(choice.name);
      if (!at) return std::nullopt;
    } else {
      at = choice.tools ? index("tool_use") : std::nullopt;  // transformers' choice: tool_use where tools are given
      if (!at) at = index("default");
      if (!at) {
        std::string names;
        for (const auto& n : named) names += (names.empty() ? "" : ", ") + n.first;
        throw Error(str(model_dir, ": the model has several chat templates and none named \"default\" (", names,
                        "): name one"));
      }
    }
    t.emplace(named[*at].second, sources[*at]);
  }
  if (!model_dir.empty()) t->set_special_tokens(chat_special_tokens(model_dir));
  return t;
}

}  // namespace twell::model
